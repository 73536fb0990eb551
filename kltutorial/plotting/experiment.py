"""Figures of book section 11, the small exact RLHF experiment (:mod:`kltutorial.toyrlhf`).

* :func:`plot_toy_frontier`: the exact reward–KL frontier, proxy and gold, with trained policies and
  best-of-n on it;
* :func:`plot_bang_histogram`: where the probability mass goes, by the number of ``"!"`` per sequence;
* :func:`plot_data_sweep`: the gold reward of the proxy's optimum for more and more preference data;
* :func:`plot_toy_controllers`: fixed against adaptive β in real training (the layout of
  :func:`~.controllers.plot_control_panels`, shared with section 10);
* :func:`plot_toy_token_kl`: measured per-token KL of trained policies, beside the handbook's hand-made
  patterns of section 10;
* :func:`plot_training_paths`: proxy and gold reward against KL at every step of runs at several β, on
  the exact frontier;
* :func:`plot_gao_fits`: Gao et al.'s functional forms fitted to the exact curves
  (:mod:`kltutorial.studies.scaling_fit`).

They take plain arrays or objects with array attributes (``Frontier``, ``TrainResult``, ``GaoFit``), never
a task or a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes

from .._validation import check_positive
from .controllers import ControlTrace, plot_control_panels
from .style import (
    PALETTE,
    REFERENCE_COLOR,
    ZONE_COLOR,
    beta_colors,
    beta_styles,
    fig_size,
    figure_legend_below,
    new_axes,
    new_axes_grid,
    series_style,
)

__all__ = [
    "plot_toy_frontier",
    "plot_bang_histogram",
    "plot_data_sweep",
    "plot_toy_controllers",
    "plot_toy_token_kl",
    "plot_training_paths",
    "plot_gao_fits",
    "plot_recipe_fixed_points",
    "plot_trl_kl",
]


def plot_toy_frontier(
    frontier: Any,
    *,
    points: Mapping[str, np.ndarray] | None = None,
    best_of_n: Mapping[str, np.ndarray] | None = None,
    axes: Any = None,
    title: str | None = None,
) -> np.ndarray:
    """Exact reward–KL frontier (§11): expected proxy (left) and gold (right) reward against KL.

    Parameters
    ----------
    frontier : Frontier
        From :func:`kltutorial.toyrlhf.exact_frontier`: ``kl``, ``proxy``, ``gold`` of shape (K,),
        the exact optimal policies :math:`\\pi^*_\\beta` for a grid of β (a line).
    points : dict with ``"beta"``, ``"kl"``, ``"proxy"``, ``"gold"`` arrays (M,), optional
        Trained policies, one marker per β (warm = small β).
    best_of_n : dict with ``"n"``, ``"kl"``, ``"proxy"``, ``"gold"`` arrays (L,), optional
        Exact best-of-n under the proxy, drawn as a dashed line with small markers.
    axes : 2 Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (2,)
    """
    flat = new_axes_grid(axes, 1, 2, figsize=fig_size(4.3), sharex=True)
    for ax, key, name in zip(flat, ("proxy", "gold"), ("proxy", "gold"), strict=True):
        ax.plot(frontier.kl, getattr(frontier, key), color=REFERENCE_COLOR, linestyle="-",
                linewidth=1.5, label="exact optimum π*_β (frontier)")
        if best_of_n is not None:
            ax.plot(best_of_n["kl"], best_of_n[key], color=PALETTE[2], linestyle="--", marker=".",
                    markersize=6, label="exact best-of-n (n = 1, 2, 4, …)")
        if points is not None:
            betas = np.asarray(points["beta"], dtype=float)
            for k, style in enumerate(beta_styles(betas)):
                ax.plot(points["kl"][k], points[key][k], color=style["color"],
                        marker=style["marker"], markersize=8, linestyle="none",
                        markeredgecolor="black", markeredgewidth=0.6,
                        label=f"trained, β = {betas[k]:g}")
        ax.set_xlabel("KL(π ‖ π_ref) (nats)")
        ax.set_ylabel(f"expected {name} reward (reward units)")
        ax.set_title(f"{name} reward" + (" (what training optimises)" if key == "proxy"
                                          else " (what we wanted)"))
    figure_legend_below(flat[0], ncol=4 if points is not None else 2)
    if title:
        flat[0].figure.suptitle(title)
    return flat


def plot_bang_histogram(
    distributions: Mapping[str, np.ndarray],
    *,
    betas: Sequence[float] | None = None,
    ax: Axes | None = None,
    title: str | None = "Where the mass goes: number of “!” per sequence",
) -> Axes:
    """Grouped bars: probability of each number of ``"!"`` under several policies (§11).

    Parameters
    ----------
    distributions : dict name -> ndarray, shape (T + 1,)
        ``P(#! = k)`` for k = 0..T. The first entry (the reference) is drawn grey; the others get
        β colours if ``betas`` is given (one β per remaining entry), else the palette.
    betas : sequence of float, optional
    ax : Axes, optional
    title : str or None

    Returns
    -------
    Axes
    """
    if not isinstance(distributions, Mapping) or len(distributions) == 0:
        raise TypeError("distributions: expected a non-empty dict name -> probabilities")
    ax = new_axes(ax, figsize=fig_size(4.0))
    names = list(distributions)
    n_bars = len(names)
    width = 0.8 / n_bars
    colors = ["0.6"] + (beta_colors(betas) if betas is not None
                        else [PALETTE[i % len(PALETTE)] for i in range(n_bars - 1)])
    hatches = ["", "//", "..", "xx", "\\\\", "oo", "--", "++"]
    n_pos = np.asarray(distributions[names[0]]).shape[0]
    x = np.arange(n_pos)
    for i, name in enumerate(names):
        probs = np.asarray(distributions[name], dtype=float)
        ax.bar(x - 0.4 + width * (i + 0.5), probs, width=width, color=colors[i],
               hatch=hatches[i % len(hatches)], edgecolor="white", linewidth=0.3, label=name)
    ax.axvspan(1.5, n_pos - 0.5, color=ZONE_COLOR, alpha=0.12, linewidth=0)
    ax.text(1.6, 0.97, "≥ 2 “!”: rare in the preference data", transform=ax.get_xaxis_transform(),
            va="top", fontsize=9, color=REFERENCE_COLOR)
    ax.set_xticks(x)
    ax.set_xlabel("number of “!” in the sequence")
    ax.set_ylabel("probability")
    ax.set_ylim(0.0, 1.0)
    if title:
        ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8.5)
    return ax


def plot_data_sweep(
    n_pairs: Sequence[int] | np.ndarray,
    kl: np.ndarray,
    gold: np.ndarray,
    *,
    axes: Any = None,
    title: str | None = None,
) -> np.ndarray:
    """More preference data (§11): gold reward of :math:`\\pi^*_\\beta` against KL per data size.

    Left: one curve per N (mean over data sets at each β), its peak marked. Right: the KL and the
    gold reward at the peak against N (log scale).

    Parameters
    ----------
    n_pairs : sequence of int, shape (M,)
    kl, gold : ndarray, shape (M, K)
        Mean over data sets of the exact KL and gold reward of :math:`\\pi^*_\\beta`, K values of β.
    axes : 2 Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (2,)
    """
    n_pairs = np.asarray(n_pairs)
    kl, gold = np.asarray(kl, dtype=float), np.asarray(gold, dtype=float)
    if kl.shape != gold.shape or kl.ndim != 2 or kl.shape[0] != n_pairs.shape[0]:
        raise ValueError(f"kl and gold: expected shape ({n_pairs.shape[0]}, K), "
                         f"got {kl.shape} and {gold.shape}")
    ax, ax_peak = new_axes_grid(axes, 1, 2, figsize=fig_size(4.0))
    peak = gold.argmax(axis=1)
    rows = np.arange(n_pairs.shape[0])
    for i in rows:
        style = series_style(i)
        ax.plot(kl[i], gold[i], color=style["color"], linestyle=style["linestyle"],
                label=f"N = {n_pairs[i]:,} pairs")
        ax.plot(kl[i, peak[i]], gold[i, peak[i]], color=style["color"], marker=style["marker"],
                markersize=8, markeredgecolor="black", markeredgewidth=0.6, linestyle="none")
    ax.set_xlabel("KL(π*_β ‖ π_ref) (nats)")
    ax.set_ylabel("expected gold reward (reward units)")
    ax.set_title("gold reward of π*_β (markers: peaks)")
    figure_legend_below(ax, ncol=3)
    s0, s1 = series_style(0), series_style(1)
    ax_peak.plot(n_pairs, kl[rows, peak], color=s0["color"], marker=s0["marker"],
                 label="KL at the peak (nats)")
    ax_peak.set_xscale("log")
    ax_peak.set_xlabel("preference pairs N (log scale)")
    ax_peak.set_ylabel("KL at the gold peak (nats)")
    twin = ax_peak.twinx()
    twin.plot(n_pairs, gold[rows, peak], color=s1["color"], marker=s1["marker"],
              linestyle=s1["linestyle"], label="gold reward at the peak")
    twin.set_ylabel("gold reward at the peak (reward units)")
    twin.grid(False)
    twin.spines["right"].set_visible(True)
    lines = ax_peak.get_lines() + twin.get_lines()
    ax_peak.legend(lines, [ln.get_label() for ln in lines], loc="lower right", fontsize=8.5)
    ax_peak.set_title("the peak against N")
    if title:
        ax.figure.suptitle(title)
    return np.array([ax, ax_peak], dtype=object)


def plot_toy_controllers(
    runs: Mapping[str, Any],
    target_kl: float,
    *,
    beta0: float | None = None,
    axes: Any = None,
    title: str | None = None,
) -> np.ndarray:
    """Fixed vs adaptive β in real training (§11): KL, β, gold reward and proxy penalised at β₀.

    The layout of section 10's fixed-vs-adaptive figure (:func:`~.controllers.plot_control_panels`),
    one marked line per run instead of a band over seeds, with the gold reward (what we wanted) in
    place of the learned one.

    Parameters
    ----------
    runs : dict name -> TrainResult
        Each with ``kl``, ``proxy``, ``gold`` of shape (n,) (exact, per step) and ``beta`` (n + 1,).
    target_kl : float
        The controllers' target (nats), drawn dashed on the KL panel.
    beta0 : float, optional
        The one price per nat of the fourth panel, ``proxy − beta0 · kl`` for every run. By default
        the β₀ all runs start from (``beta[0]``); give it when a run starts elsewhere, such as a fixed
        β drawn beside controllers started from β₀.
    axes : 2 x 2 Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (2, 2)
        ``[[kl, beta], [gold, penalised proxy]]``.
    """
    if not isinstance(runs, Mapping) or len(runs) == 0:
        raise TypeError("runs: expected a non-empty dict name -> TrainResult")
    if beta0 is not None:
        beta0 = check_positive(beta0, "beta0")
    traces = {name: ControlTrace(kl=run.kl, beta=run.beta, reward=run.gold,
                                 penalized_reward=(run.penalized_proxy if beta0 is None
                                                   else run.proxy - beta0 * run.kl))
              for name, run in runs.items()}
    # At the house width each of the 2 x 2 panels is about 3 in wide: a taller figure, y labels on
    # two lines, and the legend under the panels instead of on the KL curves.
    flat = new_axes_grid(axes, 2, 2, figsize=fig_size(6.6), sharex=True)
    panels = plot_control_panels(
        traces, target_kl=target_kl, kl_label="exact KL(π_θ ‖ π_ref)\n(nats)",
        reward_label="expected gold reward\n(reward units)", reward_title="gold reward (what we wanted)",
        penalized_of="proxy", beta0=beta0, axes=flat.reshape(2, 2), title=title,
    )
    if beta0 is None:  # plot_control_panels has checked that the runs share it
        beta0 = float(next(iter(runs.values())).beta[0])
    panels[0, 1].set_ylabel("β, log scale\n(reward units per nat)")
    panels[1, 1].set_ylabel(f"proxy − {beta0:g}·KL\n(reward units)")
    panels[1, 1].set_title(f"proxy penalised at β₀ = {beta0:g}")
    figure_legend_below(panels[0, 0], ncol=3)
    return panels


def plot_toy_token_kl(
    exact: Mapping[str, np.ndarray],
    sampled: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
    *,
    betas: Sequence[float] | None = None,
    illustrative: Mapping[str, np.ndarray] | None = None,
    axes: Any = None,
    title: str | None = None,
) -> np.ndarray:
    """Per-token KL of trained policies (§11), next to the handbook's hand-made patterns (shown in §10).

    Parameters
    ----------
    exact : dict name -> ndarray, shape (T,)
        Exact per-position KL of each policy (nats).
    sampled : dict name -> (mean, standard error), each shape (T,), optional
        The per-token k1 estimate averaged over samples of the same policy (same keys as
        ``exact``), drawn as error bars (± 2 standard errors).
    betas : sequence of float, optional
        One β per entry of ``exact``, for colours.
    illustrative : dict name -> ndarray, shape (T',), optional
        The handbook's invented patterns (§10), drawn on a second panel against the relative position.
    axes : 1 or 2 Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (1,) or (2,)
    """
    n_panels = 2 if illustrative is not None else 1
    flat = new_axes_grid(axes, 1, n_panels, figsize=fig_size(3.4))
    ax = flat[0]
    names = list(exact)
    styles = (beta_styles(betas) if betas is not None
              else [series_style(i) for i in range(len(names))])
    for i, name in enumerate(names):
        values = np.asarray(exact[name], dtype=float)
        pos = np.arange(1, values.shape[0] + 1)
        st = styles[i]
        ax.plot(pos, values, color=st["color"], linestyle=st["linestyle"], marker=st["marker"],
                label=f"{name}: exact")
        if sampled is not None and name in sampled:
            mean, sem = (np.asarray(a, dtype=float) for a in sampled[name])
            ax.errorbar(pos + 0.08, mean, yerr=2 * sem, color=st["color"], fmt="none",
                        capsize=3, linewidth=1.2)
    if sampled is not None:
        ax.errorbar([], [], yerr=[], color=REFERENCE_COLOR, fmt="none", capsize=3,
                    label="k1 on samples (±2 s.e.)")
    ax.set_xticks(np.arange(1, np.asarray(exact[names[0]]).shape[0] + 1))
    ax.set_xlabel("token position")
    ax.set_ylabel("KL at the position (nats)")
    ax.set_ylim(bottom=0.0)
    ax.set_title("measured: trained policies")
    ax.legend(loc="best", fontsize=8.5)
    if illustrative is not None:
        ax2 = flat[1]
        for i, (name, values) in enumerate(illustrative.items()):
            values = np.asarray(values, dtype=float)
            st = series_style(i + 3)
            ax2.plot(np.linspace(0, 1, values.shape[0]), values, color=st["color"],
                     linestyle=st["linestyle"], linewidth=1.3, label=name)
        ax2.set_xlabel("relative position in the response")
        ax2.set_ylabel("KL at the token (nats)")
        ax2.set_ylim(bottom=0.0)
        ax2.set_title("the handbook's patterns: not measured")
        ax2.legend(loc="upper center", fontsize=8.5)
    if title:
        ax.figure.suptitle(title)
    return flat


def plot_training_paths(
    runs: Mapping[float, Any],
    frontier: Any,
    *,
    axes: Any = None,
    title: str | None = None,
) -> np.ndarray:
    """Proxy (left) and gold (right) reward against KL at every training step, one path per β (§11).

    Each run is drawn as the line of its exact (KL, reward) from step to step, its last step marked;
    the exact frontier of :math:`\\pi^*_\\beta` is the grey line. The paths show whether runs at
    different β climb one curve (the penalty then acts like a stopping point on it) and where each one
    settles.

    Parameters
    ----------
    runs : dict β -> TrainResult
        Each with ``kl``, ``proxy``, ``gold`` of shape (n,): exact values at every step (fixed-β runs).
    frontier : ToyFrontier
        ``kl``, ``proxy``, ``gold`` of shape (K,), from :func:`kltutorial.toyrlhf.exact_frontier`.
    axes : 2 Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (2,)
    """
    if not isinstance(runs, Mapping) or len(runs) == 0:
        raise TypeError("runs: expected a non-empty dict beta -> TrainResult")
    betas = np.array([float(b) for b in runs], dtype=float)
    styles = beta_styles(betas)
    order = np.argsort(frontier.kl)
    flat = new_axes_grid(axes, 1, 2, figsize=fig_size(4.3), sharex=True)
    for ax, key in zip(flat, ("proxy", "gold"), strict=True):
        ax.plot(frontier.kl[order], getattr(frontier, key)[order], color=REFERENCE_COLOR, linewidth=3.0,
                alpha=0.45, label="exact optimum π*_β (frontier)")
        for (beta, run), st in zip(runs.items(), styles, strict=True):
            kl, values = np.asarray(run.kl, dtype=float), np.asarray(getattr(run, key), dtype=float)
            ax.plot(kl, values, color=st["color"], linestyle=st["linestyle"], linewidth=1.2,
                    label=f"β = {float(beta):g}: path")
            ax.plot(kl[-1], values[-1], color=st["color"], marker=st["marker"], markersize=8,
                    markeredgecolor="black", markeredgewidth=0.6, linestyle="none")
        ax.set_xlabel("KL(π_θ ‖ π_ref) (nats)")
        ax.set_ylabel(f"expected {key} reward (reward units)")
        ax.set_title(f"{key} reward at every step (markers: last step)")
    flat[0].set_title("proxy reward at every step")
    figure_legend_below(flat[0], ncol=4)
    if title:
        flat[0].figure.suptitle(title)
    return flat


_FORM_NAMES = {"bon": "d(α − β d)", "rl": "d(α − β log d)"}


def plot_gao_fits(
    panels: Mapping[str, Sequence[Any]],
    *,
    axes: Any = None,
    title: str | None = None,
) -> np.ndarray:
    """Gao et al.'s functional forms fitted to exact curves (§11): gain against :math:`d = \\sqrt{KL}`.

    One panel per curve: its points (the gold reward gained over the initial policy) as dots, and each
    fit's :math:`R(d)` as a line (the first fit solid, the others dashed), labelled with its coefficients
    and :math:`R^2`. A dotted vertical line marks d = 1, where :math:`\\log d` changes sign.

    Parameters
    ----------
    panels : dict title -> sequence of GaoFit
        The fits of one panel share their points (:attr:`GaoFit.d`, :attr:`GaoFit.gain`), e.g. the
        best-of-n curve fitted with both forms.
    axes : Axes, one per panel, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (len(panels),)
    """
    if not isinstance(panels, Mapping) or len(panels) == 0:
        raise TypeError("panels: expected a non-empty dict title -> sequence of GaoFit")
    flat = new_axes_grid(axes, 1, len(panels), figsize=fig_size(4.4), sharey=True)
    for ax, (name, fits) in zip(flat, panels.items(), strict=True):
        fits = list(fits)
        if not fits:
            raise ValueError(f"panels[{name!r}]: expected at least one GaoFit")
        first = fits[0]
        grid = np.linspace(0.0, float(first.d.max()), 200)
        ax.plot(first.d, first.gain, color="black", marker=".", markersize=5, linestyle="none",
                label="exact", zorder=3)
        for i, fit in enumerate(fits):
            ax.plot(grid, fit.predict(grid**2), color=PALETTE[i % len(PALETTE)],
                    linestyle="-" if i == 0 else "--",
                    label=f"{_FORM_NAMES[fit.form]}\nα = {fit.alpha:.2f}, β = {fit.beta:.2f}, "
                          f"R² = {fit.r2:.2f}")
        ax.axvline(1.0, color=ZONE_COLOR, linestyle=":", linewidth=1.0)
        ax.axhline(0.0, color=ZONE_COLOR, linewidth=0.8)
        ax.set_xlabel("d = √KL (√nats)")
        ax.set_title(name)
        ax.legend(loc="lower left", fontsize=8.5)
    flat[0].set_ylabel("gold reward gained over π_ref\n(reward units)")
    if title:
        flat[0].figure.suptitle(title)
    return flat


def plot_recipe_fixed_points(
    curves: Mapping[str, Any],
    *,
    runs: Mapping[str, tuple[float, float]] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
) -> Axes:
    """Gold reward against KL(π ‖ π_ref) of each placement's exact fixed points as β varies (§9), with the
    trained runs as markers on their placement's curve.

    Parameters
    ----------
    curves : dict label -> FixedPointCurve
        From :func:`kltutorial.toyrlhf.recipes.fixed_point_curve` (``kl``, ``gold``, ``betas``); the first
        is drawn as the reference line (π*_β).
    runs : dict label -> list of (kl, gold), optional
        Trained policies, keyed by the label of the curve they belong to; drawn with that curve's colour
        and marker, edged in black.
    ax : Axes, optional
    title : str, optional

    Returns
    -------
    Axes
    """
    ax = new_axes(ax, figsize=fig_size(4.6))
    for i, (label, curve) in enumerate(curves.items()):
        style = {"color": REFERENCE_COLOR, "linestyle": "-", "marker": "*"} if i == 0 else series_style(i - 1)
        order = np.argsort(curve.kl)
        ax.plot(np.asarray(curve.kl)[order], np.asarray(curve.gold)[order], color=style["color"],
                linestyle=style["linestyle"], linewidth=1.6 if i else 2.4, marker=".", markersize=4,
                label=label)  # a dot at each computed fixed point
        for kl, gold in (runs or {}).get(label, []):
            ax.plot(kl, gold, color=style["color"], marker=style["marker"], markersize=11 if i == 0 else 8,
                    linestyle="none",
                    markeredgecolor="black", markeredgewidth=0.7)
    if runs:
        ax.plot([], [], color="white", marker="o", markeredgecolor="black", linestyle="none",
                label="trained runs (marker: their placement)")
    ax.set_xlabel("KL(π ‖ π_ref) (nats)")
    ax.set_ylabel("expected gold reward (reward units)")
    if title:
        ax.set_title(title)
    figure_legend_below(ax, ncol=2)
    return ax


def plot_trl_kl(
    log: Sequence[Mapping[str, float]],
    monitor: Sequence[Mapping[str, float]],
    *,
    ax: Axes | None = None,
    title: str | None = None,
) -> Axes:
    """TRL's logged ``kl`` against the monitoring callback's exact KL over a run, per token (§9).

    Parameters
    ----------
    log : sequence of dict
        TRL's log records, each with ``step`` and ``kl`` (GRPO's: the batch's mean per-token k3, weighted
        by the importance ratio).
    monitor : sequence of dict
        :class:`~kltutorial.integrations.trl.KLMonitorCallback`'s history, each with ``step``,
        ``exact_kl_per_token``, ``k3_per_token``, ``exact_kl``, ``exact_kl_se`` and ``k3_se``.
    ax : Axes, optional
    title : str, optional

    Returns
    -------
    Axes
    """
    if not log or not monitor:
        raise ValueError("log and monitor must be non-empty sequences of records")
    ax = new_axes(ax, figsize=fig_size(3.6))
    steps = np.array([r["step"] for r in log], dtype=float)
    ax.plot(steps, [r["kl"] for r in log], color=PALETTE[0], marker="o", markersize=4, linewidth=1.2,
            label="TRL's logged kl (training batch, mean k3 per token)")
    m_steps = np.array([r["step"] for r in monitor], dtype=float)
    per_token = np.array([r["exact_kl_per_token"] for r in monitor], dtype=float)
    tokens = np.array([r["exact_kl"] / r["exact_kl_per_token"] if r["exact_kl_per_token"] else 1.0
                       for r in monitor], dtype=float)  # tokens per completion
    se = np.array([r["exact_kl_se"] or 0.0 for r in monitor], dtype=float) / tokens
    ax.fill_between(m_steps, per_token - 2 * se, per_token + 2 * se, color=PALETTE[1], alpha=0.25,
                    linewidth=0)
    ax.plot(m_steps, per_token, color=PALETTE[1], linestyle="--", linewidth=1.6,
            label="callback: exact per-token KL at the sampled prefixes (±2 se)")
    ax.plot(m_steps, [r["k3_per_token"] for r in monitor], color=PALETTE[2], linestyle=":", linewidth=1.6,
            marker="s", markersize=3, label="callback: mean k3 per token (its own samples)")
    ax.set_xlabel("training step")
    ax.set_ylabel("KL per token (nats)")
    ax.set_title(title or "TRL's kl beside the exact KL")
    figure_legend_below(ax, ncol=1)
    return ax
