"""Figures of the closed-loop study of KL controllers (§7): step responses, the gain sweep, and
several rules on one plant.

Each function takes results of :mod:`kltutorial.studies.control` (or
:func:`kltutorial.studies.dynamics.simulate_training_with_controller`), draws on optional axes and returns
them. Runs over seeds are drawn as the median with a quantile band.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.transforms import blended_transform_factory, offset_copy

from ..studies.control import StepMetrics, StepResponse
from .style import (
    REFERENCE_COLOR,
    ZONE_COLOR,
    check_quantiles,
    fig_size,
    legend_below,
    log_beta_axis,
    new_axes_grid,
    plot_median_band,
    series_style,
)

__all__ = ["plot_step_response", "plot_gain_sweep", "plot_rules_on_plant"]

MARK_LABEL_SIZE = 10.0  #: Font size (pt) of the names of marked gains: the house tick size.
MARK_LABEL_GAP_PT = 3.0  #: Gap (pt) between a marked gain's line and its name, and below the panel's top.


def _check_names(names: object, k: int, what: str) -> list[str]:
    if isinstance(names, str) or not isinstance(names, Sequence) or len(names) != k:
        raise ValueError(f"names: expected {k} names, one per {what}, got {names!r}")
    return [str(n) for n in names]


def _below(ax: Axes) -> str:
    """Where a figure legend goes under the panels: outside them when the layout can make room."""
    return "outside lower center" if isinstance(ax.figure.get_layout_engine(), ConstrainedLayoutEngine) \
        else "lower center"




def _series(ax: Axes, y: np.ndarray, i: int, name: str, band: tuple[float, float], every: int) -> None:
    style = series_style(i)
    x = np.arange(y.shape[-1])
    plot_median_band(ax, x, y, band=band, label=name, color=style["color"],
                     linestyle=style["linestyle"], marker=style["marker"], markevery=every)


def plot_step_response(
    response: StepResponse,
    names: Sequence[str],
    *,
    band: tuple[float, float] = (0.1, 0.9),
    axes: Any = None,
) -> np.ndarray:
    """Step response (§7): KL against the target that changes at the switch, and β (log scale).

    Parameters
    ----------
    response : StepResponse
        K rows, each drawn as its median over seeds with the ``band`` quantiles.
    names : sequence of str, length K
    band : (float, float)
    axes : array of 2 Axes, optional

    Returns
    -------
    ndarray of Axes, shape (2,)
        ``[kl, beta]``.
    """
    if not isinstance(response, StepResponse):
        raise TypeError(f"response: expected a StepResponse, got {type(response).__name__}")
    names = _check_names(names, response.kl.shape[0], "row of the response")
    band = check_quantiles(band)
    ax_kl, ax_beta = new_axes_grid(axes, 1, 2, figsize=fig_size(3.9), sharex=True)
    steps = np.arange(response.n_steps + 1)
    ax_kl.plot(steps, response.target, drawstyle="steps-post", color=REFERENCE_COLOR,
               linestyle="--", linewidth=1.2, label="target")
    every = max(1, response.n_steps // 10)
    for i, name in enumerate(names):
        _series(ax_kl, response.kl[i], i, name, band, every)
        _series(ax_beta, response.beta[i], i, name, band, every)
    for ax in (ax_kl, ax_beta):
        ax.axvline(response.switch_step, color=REFERENCE_COLOR, linewidth=0.8, linestyle=":")
        ax.set_xlabel("training step (one update each)")
    ax_kl.set_ylabel("KL from the reference (nats)")
    ax_kl.set_title(f"KL: target {response.target_before:g} → {response.target_after:g} nats")
    log_beta_axis(ax_beta)
    ax_beta.set_ylabel("β (reward units per nat, log scale)")
    ax_beta.set_title("KL coefficient β")
    handles, labels = ax_kl.get_legend_handles_labels()
    ax_kl.figure.legend(handles, labels, loc=_below(ax_kl), ncol=len(labels),
                        title=f"median over seeds; band: {band[0]:.0%}–{band[1]:.0%} quantiles")
    return np.array([ax_kl, ax_beta], dtype=object)


def plot_gain_sweep(
    gains: np.ndarray,
    metrics: StepMetrics,
    on_target: np.ndarray,
    *,
    critical: float,
    marks: Mapping[str, float] | None = None,
    axes: Any = None,
) -> np.ndarray:
    """The gain sweep (§7): overshoot, rise and settling times, and the share of time on target.

    Parameters
    ----------
    gains : ndarray, shape (G,)
        Gains ``n_steps / horizon`` (> 0), drawn on a log axis.
    metrics : StepMetrics
        Of the noise-free step responses, each field shape (G,); a NaN settling time (never settled)
        is drawn at the top of the panel as a cross.
    on_target : ndarray, shape (G,)
        Share (0 to 1) of the late steps, over seeds, with the KL within 10 % of the target.
    critical : float
        The linearised loop's critical gain, drawn as a dashed vertical line on every panel.
    marks : dict name -> gain, optional
        Further gains to mark (dotted lines, named in the legend).
    axes : array of 3 Axes, optional

    Returns
    -------
    ndarray of Axes, shape (3,)
        ``[overshoot, times, on_target]``.
    """
    gains = np.asarray(gains, dtype=float)
    if gains.ndim != 1 or gains.size < 2 or np.any(gains <= 0):
        raise ValueError(f"gains: expected at least two positive gains, got {gains!r}")
    if not isinstance(metrics, StepMetrics) or np.shape(metrics.overshoot) != gains.shape:
        raise ValueError(f"metrics: expected StepMetrics with fields of shape {gains.shape}")
    on_target = np.asarray(on_target, dtype=float)
    if on_target.shape != gains.shape:
        raise ValueError(f"on_target: expected shape {gains.shape}, got {on_target.shape}")
    ax_o, ax_t, ax_s = new_axes_grid(axes, 1, 3, figsize=fig_size(4.1), sharex=True)
    ax_o.plot(gains, 100 * metrics.overshoot, **series_style(0))
    ax_o.set_ylabel("overshoot (% of the step)")
    ax_o.set_title("overshoot")
    ax_t.plot(gains, metrics.rise_time, label="rise (90 %)", **series_style(0))
    settle = metrics.settling_time
    ax_t.plot(gains, settle, label="settling (±5 %)", **series_style(1))
    never = np.isnan(settle)
    if never.any():
        top = np.nanmax(np.concatenate([metrics.rise_time, settle]))
        ax_t.plot(gains[never], np.full(never.sum(), top), linestyle="none", marker="x",
                  color=series_style(1)["color"], label="never settles")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("steps after the change")
    ax_t.set_title("rise and settling time")
    ax_s.plot(gains, 100 * on_target, **series_style(2))
    ax_s.set_ylim(0, 100)
    ax_s.set_ylabel("late steps on target (%)")
    ax_s.set_title("within 10 %, noisy")
    for ax in (ax_o, ax_t, ax_s):
        ax.set_xscale("log")
        ax.set_xlabel("gain n / H")
        ax.axvline(critical, color=REFERENCE_COLOR, linestyle="--", linewidth=1.0,
                   label=f"critical gain of the linearised loop ({critical:.4f})" if ax is ax_o else None)
        for j, g in enumerate((marks or {}).values()):
            ax.axvline(g, color=REFERENCE_COLOR, linestyle=":", linewidth=1.0, alpha=0.8,
                       label="marked gains (named in the left panel)" if ax is ax_o and j == 0 else None)
    # Each marked gain is named beside its line (a few points to its left, clear of the line and of the
    # critical gain's line just right of the smallest batch), at the top of the overshoot panel, at the
    # house tick size: the overshoot is low left of its jump, so the top of the panel is free there.
    top = offset_copy(blended_transform_factory(ax_o.transData, ax_o.transAxes), fig=ax_o.figure,
                      x=-MARK_LABEL_GAP_PT, y=-MARK_LABEL_GAP_PT, units="points")
    for name, g in (marks or {}).items():
        ax_o.text(g, 1.0, name, transform=top, rotation=90, va="top", ha="right",
                  fontsize=MARK_LABEL_SIZE, color=REFERENCE_COLOR)
    # The times' legend under their panel (no corner inside is sure to miss the curves and the marked
    # gains' lines), the shared one under all three.
    ax_t.legend(**legend_below(ax_t))
    handles, labels = ax_o.get_legend_handles_labels()
    ax_o.figure.legend(handles, labels, loc=_below(ax_o), ncol=2)
    return np.array([ax_o, ax_t, ax_s], dtype=object)


def plot_rules_on_plant(
    results: Mapping[str, Any],
    *,
    window: tuple[int, int],
    band: tuple[float, float] = (0.1, 0.9),
    zone: float = 1.1,
    axes: Any = None,
) -> np.ndarray:
    """Several rules on one plant (§7): KL against the target, and β (log scale), over seeds.

    Parameters
    ----------
    results : dict name -> ControlledTraining
        From :func:`kltutorial.studies.dynamics.simulate_training_with_controller`, one target shared; the
        first row (K = 0) is drawn.
    window : (int, int)
        The steps where the study measures the settled runs, shaded on both panels.
    band : (float, float)
    zone : float
        ``[target / zone, zone · target]`` is shaded on the KL panel (1.1: within 10 %).
    axes : array of 2 Axes, optional

    Returns
    -------
    ndarray of Axes, shape (2,)
    """
    if not isinstance(results, Mapping) or len(results) == 0:
        raise TypeError("results: expected a non-empty dict name -> ControlledTraining")
    targets = {getattr(r, "target_kl", None) for r in results.values()}
    if len(targets) != 1 or None in targets:
        raise ValueError(f"results: expected one shared target_kl, got {targets}")
    target = float(targets.pop())
    band = check_quantiles(band)
    lo, hi = (int(w) for w in window)
    ax_kl, ax_beta = new_axes_grid(axes, 1, 2, figsize=fig_size(4.2), sharex=True)
    ax_kl.axhspan(target / zone, target * zone, color=ZONE_COLOR, alpha=0.18, linewidth=0,
                  label=f"within {zone - 1:.0%} of the target")
    ax_kl.axhline(target, color=REFERENCE_COLOR, linestyle="--", linewidth=1.2,
                  label=f"target = {target:g} nats")
    for i, (name, res) in enumerate(results.items()):
        every = max(1, res.n_steps // 10)
        _series(ax_kl, res.kl[0], i, name, band, every)
        _series(ax_beta, res.beta[0], i, name, band, every)
    for ax in (ax_kl, ax_beta):
        ax.axvspan(lo, hi, color=REFERENCE_COLOR, alpha=0.08, linewidth=0)
        ax.set_xlabel("training step")
    ax_kl.set_ylabel("KL from the reference (nats)")
    ax_kl.set_title("KL (shaded: the measured window)")
    log_beta_axis(ax_beta)
    ax_beta.set_ylabel("β (reward units per nat, log scale)")
    ax_beta.set_title("KL coefficient β")
    handles, labels = ax_kl.get_legend_handles_labels()
    ax_kl.figure.legend(handles, labels, loc=_below(ax_kl), ncol=3, fontsize=8.5,
                        title=f"median over seeds; band: {band[0]:.0%}–{band[1]:.0%} quantiles")
    return np.array([ax_kl, ax_beta], dtype=object)
