"""Figures of estimating a KL from samples (book sections 3 and 4).

* §3 :func:`plot_kl_convergence`: running Monte Carlo estimates of a sequence KL against the number of
  sampled sequences, over many runs, with the exact value and the CLT's spread; and their standard errors;
* §4 :func:`plot_estimator_distributions`: the distribution of k1, k2, k3 on the same draws, one panel
  per pair of distributions, with the exact KL and the negative half-line marked.

They draw results computed elsewhere (:class:`~kltutorial.exact.estimates.MonteCarloConvergence`,
:class:`~kltutorial.studies.estimation.EstimatorSamples`) and never sample.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .style import (
    REFERENCE_COLOR,
    ZONE_COLOR,
    check_quantiles,
    fig_size,
    legend_below,
    new_axes_grid,
    plot_median_band,
    series_style,
)

__all__ = ["plot_kl_convergence", "plot_estimator_distributions"]


def _normal_quantile(q: float) -> float:
    """The standard normal quantile, by bisection on ``erf`` (no SciPy)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < q:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)




def plot_kl_convergence(
    runs: Mapping[str, Any],
    *,
    band: tuple[float, float] = (0.1, 0.9),
    axes: Any = None,
) -> np.ndarray:
    """Monte Carlo estimates of one KL against the number of samples (§3), for several estimators.

    Left: the median over runs of each estimator's running mean with the ``band`` quantiles shaded, the
    exact value as a line, and thin dotted lines at the same quantiles of the normal distribution the
    CLT predicts, :math:`\\mathrm{KL} + z_q\\,\\sigma/\\sqrt{n}`. Right: the median over runs of each run's
    own standard error, markers, against :math:`\\sigma/\\sqrt{n}`, lines; both axes logarithmic, so each
    is a straight line of slope -1/2. Each panel's legend sits under it, clear of the bands and markers.

    Parameters
    ----------
    runs : mapping of str to MonteCarloConvergence
        One entry per estimator of the same quantity (equal ``exact_mean``), each with ``sample_counts``
        (K,), ``estimates`` and ``standard_errors`` (S, K), ``exact_mean``, ``exact_std`` and
        ``clt_standard_error``.
    band : (float, float)
        Quantiles of the shaded band and of the CLT lines.
    axes : 2 Axes, optional

    Returns
    -------
    ndarray of Axes, shape (2,)
    """
    if not runs:
        raise ValueError("runs: expected at least one estimator's MonteCarloConvergence")
    lo, hi = check_quantiles(band)
    first = next(iter(runs.values()))
    exact = float(first.exact_mean)
    for name, run in runs.items():
        if not math.isclose(float(run.exact_mean), exact, rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(
                f"runs: every estimator must estimate the same value, but {name!r} has exact_mean "
                f"{run.exact_mean} against {exact}"
            )
    z_lo, z_hi = _normal_quantile(lo), _normal_quantile(hi)
    ax_est, ax_se = new_axes_grid(axes, 1, 2, figsize=fig_size(4.5))
    for i, (name, run) in enumerate(runs.items()):
        style = series_style(i)
        n = np.asarray(run.sample_counts, dtype=float)
        plot_median_band(ax_est, n, run.estimates, band=band, label=name,
                         color=style["color"], linestyle=style["linestyle"])
        clt = np.asarray(run.clt_standard_error, dtype=float)
        for z in (z_lo, z_hi):
            ax_est.plot(n, exact + z * clt, color=style["color"], linestyle=":", linewidth=1.0)
        ax_se.plot(n, np.median(run.standard_errors, axis=0), color=style["color"], linestyle="none",
                   marker=style["marker"], label=name)
        ax_se.plot(n, clt, color=style["color"], linestyle=style["linestyle"], linewidth=1.2)
    ax_est.axhline(exact, color=REFERENCE_COLOR, linestyle="--", linewidth=1.2, label="exact KL")
    ax_est.set_xscale("log")
    ax_est.set_xlabel("sampled sequences n")
    ax_est.set_ylabel("estimate of KL (nats)")
    ax_est.set_title("running mean over n sequences")
    ax_se.set_xscale("log")
    ax_se.set_yscale("log")
    ax_se.set_xlabel("sampled sequences n")
    ax_se.set_ylabel("standard error (nats)")
    ax_se.set_title("its standard error")
    # The bands fill the left panel at small n and the markers run corner to corner on the right, so
    # no corner inside is free: each legend goes under its panel (placed after the axis labels, whose
    # height it clears).
    handles, labels = ax_est.get_legend_handles_labels()
    handles.append(Line2D([], [], color=REFERENCE_COLOR, linestyle=":", linewidth=1.0))
    labels.append(f"CLT: {lo:.0%}–{hi:.0%} of runs")
    ax_est.legend(handles, labels, **legend_below(ax_est))
    key = [Line2D([], [], color=REFERENCE_COLOR, linestyle="none", marker="o"),
           Line2D([], [], color=REFERENCE_COLOR, linestyle="-", linewidth=1.2)]
    ax_se.legend(key, ["each run's own (median of runs)", "σ/√n, exact σ"], **legend_below(ax_se))
    return np.array([ax_est, ax_se], dtype=object)


def plot_estimator_distributions(
    panels: Mapping[str, Any],
    *,
    bins: int = 120,
    quantiles: tuple[float, float] = (0.001, 0.999),
    axes: Any = None,
) -> np.ndarray:
    """Histograms (densities, log scale) of several estimators on the same draws, one panel per pair (§4).

    Each panel shows the estimators of one :class:`~kltutorial.studies.estimation.EstimatorSamples` as step
    histograms with a common set of bins, the exact KL as a dashed line, and the negative half-line
    shaded (where only k1 goes); one legend for all panels, below them. The x range spans the
    ``quantiles`` of all the values of the panel; values outside it are counted in the densities'
    normalisation but not drawn.

    Parameters
    ----------
    panels : mapping of str to EstimatorSamples
        Panel title -> ``kl`` and ``values`` (estimator name -> (N,) array).
    bins : int
        Bins per panel.
    quantiles : (float, float)
        Lower and upper quantile of the pooled values that bound the x axis.
    axes : Axes, one per panel, optional

    Returns
    -------
    ndarray of Axes, shape (len(panels),)
    """
    if not panels:
        raise ValueError("panels: expected at least one EstimatorSamples")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
        raise ValueError(f"bins: expected an int >= 2, got {bins!r}")
    q_lo, q_hi = check_quantiles(quantiles)
    flat = new_axes_grid(axes, 1, len(panels), figsize=fig_size(3.6))
    for ax, (title, draws) in zip(flat, panels.items(), strict=True):
        values = {k: np.asarray(v, dtype=float) for k, v in draws.values.items()}
        pooled = np.concatenate(list(values.values()))
        x_lo, x_hi = np.quantile(pooled, [q_lo, q_hi])
        x_lo = min(x_lo, 0.0)
        edges = np.linspace(x_lo, x_hi, bins + 1)
        if x_lo < 0:
            ax.axvspan(x_lo, 0.0, color=ZONE_COLOR, alpha=0.15, linewidth=0)
        for i, (name, v) in enumerate(values.items()):
            style = series_style(i)
            counts, _ = np.histogram(v, bins=edges)
            density = counts / (v.size * np.diff(edges))  # (bins,): 1/nat, all draws in the denominator
            ax.stairs(np.where(density > 0, density, np.nan), edges, baseline=None, color=style["color"],
                      linestyle=style["linestyle"], linewidth=1.6, label=name)
        ax.axvline(float(draws.kl), color=REFERENCE_COLOR, linestyle="--", linewidth=1.2)
        ax.set_yscale("log")
        ax.set_xlim(x_lo, x_hi)
        ax.set_xlabel("estimate of KL from one draw (nats)")
        ax.set_ylabel("density (1/nat)")
        ax.set_title(title)
    handles, labels = flat[0].get_legend_handles_labels()
    handles += [Line2D([], [], color=REFERENCE_COLOR, linestyle="--", linewidth=1.2),
                Patch(color=ZONE_COLOR, alpha=0.15, linewidth=0)]
    labels += ["exact KL", "negative estimates"]
    flat[0].figure.legend(handles, labels, loc="outside lower center", ncols=len(labels))
    return flat
