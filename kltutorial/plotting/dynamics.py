"""Figures of book section 10's invented training-dynamics models (:mod:`kltutorial.studies.dynamics`).

* :func:`plot_reward_vs_kl`: reward against KL over training, one trajectory per β, the region where
  the invented reward model is no longer reliable hatched;
* :func:`plot_kl_over_steps`: KL against training step per β, median over seeds with a quantile band;
* :func:`plot_token_kl_patterns`: KL by token position, one panel per (hand-made) pattern.

The fixed-vs-adaptive figure of the same section is a controller figure
(:mod:`kltutorial.plotting.controllers`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from .style import (
    REFERENCE_COLOR,
    ZONE_COLOR,
    beta_styles,
    check_quantiles,
    fig_size,
    new_axes,
    new_axes_grid,
    plot_median_band,
    series_style,
)

__all__ = ["plot_reward_vs_kl", "plot_kl_over_steps", "plot_token_kl_patterns"]


def plot_reward_vs_kl(
    result: Any,
    *,
    ax: Axes | None = None,
    band: tuple[float, float] = (0.1, 0.9),
    unreliable_kl: float | None = 10.0,
    reward_curve: Any = None,
    title: str | None = "Reward vs KL per β (invented model)",
) -> Axes:
    """Reward against KL over training, one trajectory per β (§10, invented model).

    For each β the line is the per-step median over seeds, (median KL, median reward); the
    shaded band is the across-seed ``band`` quantile range of the reward at each step, drawn
    at that step's median KL; the horizontal bar at the end of each line is the ``band``
    quantile range of the final KL over seeds.

    Parameters
    ----------
    result : TrainingTrajectories
        From :func:`kltutorial.studies.dynamics.simulate_training_trajectory`: ``betas`` (K,),
        ``kl`` and ``reward`` (K, N, n_steps + 1).
    ax : Axes, optional
    band : (float, float)
        Quantiles over seeds for the bands (default 10 % and 90 %).
    unreliable_kl : float or None
        KL (nats) beyond which the *illustrative* reward model is declared unreliable; the
        region is hatched. None draws no region.
    reward_curve : callable, optional
        ``reward_curve(kl) -> reward``: the noise-free reward of the model, drawn thin and
        dotted for reference.
    title : str or None

    Returns
    -------
    Axes
    """
    lo, hi = check_quantiles(band)
    betas = np.asarray(result.betas, dtype=float)
    kl = np.asarray(result.kl, dtype=float)
    reward = np.asarray(result.reward, dtype=float)
    if kl.ndim != 3 or reward.shape != kl.shape or kl.shape[0] != betas.shape[0]:
        raise ValueError(
            "result: expected kl and reward of shape (K, N, n_steps + 1) with K = len(betas), "
            f"got {kl.shape}, {reward.shape}, K = {betas.shape[0]}"
        )
    ax = new_axes(ax, figsize=fig_size(4.4))
    kl_med = np.median(kl, axis=1)  # (K, n_steps + 1)
    r_lo, r_med, r_hi = np.quantile(reward, [lo, 0.5, hi], axis=1)  # each (K, n_steps + 1)
    final_lo, final_hi = np.quantile(kl[:, :, -1], [lo, hi], axis=1)  # (K,)
    x_max = max(float(np.quantile(kl, hi)) * 1.08, (unreliable_kl or 0.0) * 1.25)

    if unreliable_kl is not None:
        ax.axvspan(unreliable_kl, x_max, facecolor="none", edgecolor=ZONE_COLOR, hatch="///",
                   linewidth=0, alpha=0.6,
                   label=f"reward model unreliable\n(illustrative: KL > {unreliable_kl:g} nats)")
        ax.axvline(unreliable_kl, color=REFERENCE_COLOR, linestyle=":", linewidth=1.0)
    if reward_curve is not None:
        grid = np.linspace(0.0, x_max, 200)
        ax.plot(grid, reward_curve(grid), color=REFERENCE_COLOR, linestyle=":", linewidth=1.0,
                label="noise-free model reward")
    for k, style in enumerate(beta_styles(betas)):
        color = style["color"]
        ax.fill_between(kl_med[k], r_lo[k], r_hi[k], color=color, alpha=0.15, linewidth=0)
        ax.plot(kl_med[k], r_med[k], color=color, linestyle=style["linestyle"],
                label=f"β = {betas[k]:g}")
        ax.plot(kl_med[k, -1], r_med[k, -1], color=color, marker=style["marker"],
                markersize=7, linestyle="none")
        ax.hlines(r_med[k, -1], final_lo[k], final_hi[k], color=color, linewidth=2.5)
    ax.set_xlim(0.0, x_max)
    ax.set_xlabel("KL from the reference (nats)")
    ax.set_ylabel("learned reward (reward units)")
    if title:
        ax.set_title(title)
    ax.legend(loc="upper left", fontsize=9)
    return ax


def plot_kl_over_steps(
    result: Any,
    *,
    ax: Axes | None = None,
    band: tuple[float, float] = (0.1, 0.9),
    equilibrium_kl: np.ndarray | None = None,
    title: str | None = "KL over training per β (invented model)",
) -> Axes:
    """KL against training step for each β: median over seeds with a quantile band (§10).

    Parameters
    ----------
    result : TrainingTrajectories
        ``betas`` (K,), ``kl`` (K, N, n_steps + 1).
    ax : Axes, optional
    band : (float, float)
        Quantiles over seeds for the band.
    equilibrium_kl : ndarray, shape (K,), optional
        The model's equilibrium KL per β, drawn as thin dashed lines.
    title : str or None

    Returns
    -------
    Axes
    """
    betas = np.asarray(result.betas, dtype=float)
    kl = np.asarray(result.kl, dtype=float)
    ax = new_axes(ax, figsize=fig_size(4.2))
    steps = np.arange(kl.shape[-1])
    equilibrium_style = {"linestyle": (0, (2, 3)), "linewidth": 0.9}
    for k, style in enumerate(beta_styles(betas)):
        plot_median_band(ax, steps, kl[k], band=band, color=style["color"],
                         linestyle=style["linestyle"], label=f"β = {betas[k]:g}")
        if equilibrium_kl is not None:
            ax.axhline(float(np.asarray(equilibrium_kl)[k]), color=style["color"],
                       **equilibrium_style)
    ax.set_xlabel("training step")
    ax.set_ylabel("KL from the reference (nats)")
    if title:
        ax.set_title(title)
    # The legend sits right of the panel: every corner inside holds a curve's rise or plateau.
    handles, labels = ax.get_legend_handles_labels()
    if equilibrium_kl is not None:
        handles.append(Line2D([], [], color=REFERENCE_COLOR, **equilibrium_style))
        labels.append("equilibrium\nKL*(β), per β")
    ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9)
    return ax


# --------------------------------------------------------------------------------------------
# §10 Per-token KL patterns (illustrations)
# --------------------------------------------------------------------------------------------


def plot_token_kl_patterns(
    patterns: Mapping[str, np.ndarray],
    *,
    axes: Any = None,
    title: str | None = "Illustrative per-token KL patterns (hand-made, not measured)",
    ylabel: str = "KL at the token (nats)",
) -> np.ndarray:
    """Per-token KL by position, one panel per pattern (§10), sharing the y axis.

    Parameters
    ----------
    patterns : dict name -> ndarray, shape (T,)
        KL at each token position (nats).
    axes : array of len(patterns) Axes, optional
        Drawn on if given; otherwise a new 1 x len(patterns) figure is created.
    title : str or None
        Figure title. The default says the curves are illustrations; pass another title for
        measured per-token KL.
    ylabel : str
        Label of the first panel's y axis.

    Returns
    -------
    ndarray of Axes, shape (len(patterns),)
    """
    if not isinstance(patterns, Mapping) or len(patterns) == 0:
        raise TypeError("patterns: expected a non-empty dict name -> per-token KL array")
    n = len(patterns)
    created = axes is None
    flat = new_axes_grid(axes, 1, n, figsize=fig_size(3.2), sharey=True)
    for i, (ax, (name, values)) in enumerate(zip(flat, patterns.items(), strict=True)):
        values = np.asarray(values, dtype=float)
        if values.ndim != 1:
            raise ValueError(f"patterns[{name!r}]: expected shape (T,), got {values.shape}")
        style = series_style(i)
        ax.plot(np.arange(values.shape[0]), values, color=style["color"], marker=style["marker"],
                markersize=3, linestyle="-", linewidth=1.2)
        ax.set_title(name)
        ax.set_xlabel("token position")
        ax.set_ylabel(ylabel if i == 0 or not created else "")
    for ax in flat:  # after all data is in, so shared y limits cover every panel
        ax.autoscale_view()
        ax.set_ylim(bottom=0.0)
    if title:
        flat[0].figure.suptitle(title)
    return flat
