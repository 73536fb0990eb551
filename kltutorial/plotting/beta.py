"""Figures of book section 6: what one β does, on the exact optimum of a listable task.

* :func:`plot_beta_sweep`: two panels against β on a log axis, (a) the KL of :math:`\\pi^*_\\beta` in nats
  with horizontal lines at chosen KL targets and at the largest reachable KL, (b) its expected proxy and
  gold reward, the gold peak and the reference's gold marked, and trained policies as points.

It takes a :class:`~kltutorial.studies.beta_scale.SweepSummary` and computes nothing but positions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from .style import REFERENCE_COLOR, fig_size, new_axes_grid, series_style

__all__ = ["plot_beta_sweep"]

# Series indices of the target lines: not 0 (the KL curve) and not 6 (black, too close to the grey limit).
_TARGET_STYLES = (3, 4, 5, 1, 2)


def plot_beta_sweep(
    sweep: Any,
    *,
    kl_targets: Mapping[str, float] | None = None,
    kl_limit: float | None = None,
    trained: Mapping[str, np.ndarray] | None = None,
    axes: Any = None,
) -> np.ndarray:
    """KL and rewards of :math:`\\pi^*_\\beta` against β (log axis), with targets and trained points.

    Parameters
    ----------
    sweep : SweepSummary
        ``betas``, ``kl``, ``proxy``, ``gold``, ``ref_gold``, ``peak``.
    kl_targets : dict of str to float, optional
        Label → a KL target in nats (per-sequence sum), drawn as a horizontal line in panel (a).
    kl_limit : float, optional
        The largest KL any β reaches (:func:`kltutorial.studies.beta_scale.max_kl`), drawn dotted.
    trained : dict with ``beta``, ``kl``, ``proxy``, ``gold`` arrays, optional
        Trained policies, drawn as open markers on top of the exact curves.
    axes : array of two Axes, optional

    Returns
    -------
    ndarray of two Axes
    """
    betas = np.asarray(sweep.betas, dtype=float)
    curves = {k: np.asarray(getattr(sweep, k), dtype=float) for k in ("kl", "proxy", "gold")}
    if betas.ndim != 1 or betas.size < 2 or any(c.shape != betas.shape for c in curves.values()):
        raise ValueError("sweep: expected betas, kl, proxy, gold of one shape (K,), K >= 2")
    axes = new_axes_grid(axes, 1, 2, figsize=fig_size(4.8))
    ax_kl, ax_r = axes
    s0, s1, s2 = series_style(0), series_style(1), series_style(2)

    ax_kl.plot(betas, curves["kl"], color=s0["color"], linestyle="-", label="KL(π*_β ‖ π_ref)")
    for i, (label, target) in enumerate((kl_targets or {}).items()):
        st = series_style(_TARGET_STYLES[i % len(_TARGET_STYLES)])
        ax_kl.axhline(target, color=st["color"], linestyle=st["linestyle"], linewidth=1.2,
                      label=f"{label}: {target:g} nats")
    if kl_limit is not None:
        ax_kl.axhline(kl_limit, color=REFERENCE_COLOR, linestyle=":", linewidth=1.2,
                      label=f"largest reachable: {kl_limit:.1f} nats")
    ax_kl.set_yscale("log")
    ax_kl.set_xlabel("β (reward units per nat)")
    ax_kl.set_ylabel("KL (nats, per sequence)")
    ax_kl.set_title("(a) KL of the optimum")
    ax_kl.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)

    ax_r.plot(betas, curves["proxy"], color=s1["color"], linestyle=s1["linestyle"], label="proxy reward")
    ax_r.plot(betas, curves["gold"], color=s2["color"], linestyle=s2["linestyle"], label="gold reward")
    ax_r.axhline(sweep.ref_gold, color=REFERENCE_COLOR, linestyle=":", linewidth=1.2, label="gold of π_ref")
    ax_r.plot([sweep.peak_beta], [sweep.peak_gold], marker="*", markersize=12, color=s2["color"],
              linestyle="none", label=f"gold peak, β = {sweep.peak_beta:.2f}")
    if trained is not None:
        tb = np.asarray(trained["beta"], dtype=float)
        for key, st in (("proxy", s1), ("gold", s2)):
            ax_r.plot(tb, np.asarray(trained[key], dtype=float), marker=st["marker"], markersize=7,
                      markerfacecolor="white", color=st["color"], linestyle="none",
                      label=f"trained, {key}")
    ax_r.set_xlabel("β (reward units per nat)")
    ax_r.set_ylabel("expected reward (reward units)")
    ax_r.set_title("(b) rewards of the optimum")
    ax_r.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False, ncol=2)
    for ax in axes:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 3.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax_kl.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    return axes
