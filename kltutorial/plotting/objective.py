"""Figures of book section 5: the KL-penalised objective and its optimum.

* :func:`plot_frontier_tangents`: the exact reward–KL frontier of :math:`\\pi^*_\\beta`, with the line of
  slope β drawn through the frontier's point at a few β (β as the exchange rate of reward for nats);
* :func:`plot_perturbation_gaps`: how much the objective loses when :math:`\\pi^*_\\beta` is perturbed,
  against the perturbation's size on log–log axes, with a line of slope 2 for reference.

They take result objects (a frontier with ``betas``, ``kl``, ``reward``;
:class:`~kltutorial.exact.penalised.PerturbationCheck`) and compute nothing but positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes

from .style import REFERENCE_COLOR, ZONE_COLOR, beta_styles, fig_size, new_axes, series_style

__all__ = ["plot_frontier_tangents", "plot_perturbation_gaps"]


def plot_frontier_tangents(
    frontier: Any, tangent_betas: Sequence[float], *, reward_label: str = "reward", ax: Axes | None = None
) -> Axes:
    """The exact frontier, expected reward against KL, with the line of slope β at chosen β.

    Each tangent passes through :math:`(\\mathrm{KL}(\\pi^*_\\beta\\|\\pi_\\mathrm{ref}),
    \\mathbb{E}_{\\pi^*_\\beta}[r])` with slope β (reward units per nat); where it touches the curve
    without crossing it, β is the frontier's slope there.

    Parameters
    ----------
    frontier : Frontier
        ``betas``, ``kl``, ``reward`` of shape (K,) (from :func:`kltutorial.exact.optimal_frontier`).
    tangent_betas : sequence of float
        β values at which to draw a tangent; each must be one of ``frontier.betas``.
    reward_label : str
        Name of the reward on the y axis.
    ax : Axes, optional

    Returns
    -------
    Axes
    """
    betas = np.asarray(frontier.betas, dtype=float)
    kl, reward = np.asarray(frontier.kl, dtype=float), np.asarray(frontier.reward, dtype=float)
    if betas.ndim != 1 or kl.shape != betas.shape or reward.shape != betas.shape or betas.size < 2:
        raise ValueError(f"frontier: expected betas, kl, reward of one shape (K,), K >= 2; got "
                         f"{betas.shape}, {kl.shape}, {reward.shape}")
    marks = np.asarray(tangent_betas, dtype=float).reshape(-1)
    index = []
    for b in marks:
        hit = np.flatnonzero(np.isclose(betas, b, rtol=1e-9, atol=0.0))
        if hit.size == 0:
            raise ValueError(f"tangent_betas: {b!r} is not one of frontier.betas; add it to the grid")
        index.append(int(hit[0]))
    ax = new_axes(ax, figsize=fig_size(4.2))
    order = np.argsort(kl)
    ax.plot(kl[order], reward[order], color=series_style(6)["color"], linestyle="-", linewidth=2.2,
            label="frontier of π*_β", zorder=3)
    span, rise = kl.max() - kl.min(), reward.max() - reward.min()
    for style, i in zip(beta_styles(marks), index, strict=True):
        half = min(0.3 * span, 0.2 * rise / betas[i])  # short enough to stay near the curve
        x = np.array([max(kl[i] - half, 0.0), min(kl[i] + half, kl.max())])
        ax.plot(x, reward[i] + betas[i] * (x - kl[i]), color=style["color"], linestyle="--", linewidth=1.4,
                label=f"slope β = {betas[i]:g} at π*_β", zorder=2)
        ax.plot(kl[i], reward[i], color=style["color"], marker=style["marker"], markersize=7,
                linestyle="none", zorder=4)
    ax.set_xlabel("KL(π*_β ‖ π_ref) (nats)")
    ax.set_ylabel(f"expected {reward_label} (reward units)")
    ax.set_xlim(left=0.0)
    ax.legend(loc="lower right")
    return ax


def plot_perturbation_gaps(check: Any, *, ax: Axes | None = None) -> Axes:
    """Loss of the objective under random perturbations of :math:`\\pi^*_\\beta`, against their size.

    Every perturbation is a grey dot; the median at each size is joined by a line; a dotted line of
    slope 2 at half the median of the smallest size (below the data, so that both stay visible) shows the
    quadratic growth. Log–log axes.

    Parameters
    ----------
    check : PerturbationCheck
        ``beta``, ``scales`` (S,) and ``gaps`` (S, N), all gaps > 0 (from
        :func:`kltutorial.exact.penalised.perturbation_check`).
    ax : Axes, optional

    Returns
    -------
    Axes
    """
    scales = np.asarray(check.scales, dtype=float)
    gaps = np.asarray(check.gaps, dtype=float)
    if scales.ndim != 1 or gaps.ndim != 2 or gaps.shape[0] != scales.size or scales.size < 2:
        raise ValueError(f"check: expected scales (S,) and gaps (S, N), S >= 2; got {scales.shape}, "
                         f"{gaps.shape}")
    if not np.all(gaps > 0):
        raise ValueError("check: every gap must be > 0 to be drawn on a log axis (some perturbation won)")
    ax = new_axes(ax, figsize=fig_size(3.8))
    n = gaps.shape[1]
    ax.plot(np.repeat(scales, n), gaps.reshape(-1), linestyle="none", marker=".", markersize=3,
            color=ZONE_COLOR, alpha=0.4, label=f"each of {n} random directions")
    median = np.median(gaps, axis=1)
    style = series_style(0)
    ax.plot(scales, median, color=style["color"], linestyle=style["linestyle"], marker=style["marker"],
            label="median")
    ax.plot(scales, 0.5 * median[0] * (scales / scales[0]) ** 2, color=REFERENCE_COLOR, linestyle=":",
            linewidth=1.6, label="∝ δ² (slope 2), drawn at half the median")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("perturbation size δ (nats of logit)")
    ax.set_ylabel("J(π*_β) − J(perturbed) (reward units)")
    ax.set_title(f"β = {float(check.beta):g}: every perturbation scores lower")
    ax.legend(loc="upper left")
    return ax
