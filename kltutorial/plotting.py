"""House style and figures for the whole book (every section's plots live here).

Plot functions take results (arrays, result dataclasses, controller histories), draw on an
optional ``ax``/``axes`` and return what they drew on. They never train, sample or call
``plt.show()``: computing lives in the other modules, drawing lives here.

Readability rules, for colour-blind readers and grayscale prints:

* categorical colours are the Okabe–Ito palette (:data:`PALETTE`), and every series also
  gets its own line style (:data:`LINESTYLES`) and marker (:data:`MARKERS`);
* β is drawn with :func:`beta_colors`: warm (orange) for small β, cool (dark blue) for large β,
  taken from the perceptually uniform ``plasma`` map, whose lightness falls monotonically, so
  the order of β survives in grayscale;
* every axis names its quantity and its unit (nats, steps).

Figures of the handbook's sections:

* §8  :func:`plot_controller_dynamics`  (adaptive KL dynamics, closed loop)
* §10 :func:`plot_reward_vs_kl`, :func:`plot_kl_over_steps`  (reward vs KL per β)
* §10 :func:`plot_token_kl_patterns`  (per-token KL patterns)
* §10 :func:`plot_fixed_vs_adaptive`  (fixed vs adaptive control, four panels)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from cycler import cycler
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

__all__ = [
    "PALETTE",
    "LINESTYLES",
    "MARKERS",
    "use_style",
    "series_style",
    "beta_colors",
    "beta_styles",
    "plot_median_band",
    "plot_controller_dynamics",
    "plot_reward_vs_kl",
    "plot_kl_over_steps",
    "plot_token_kl_patterns",
    "plot_fixed_vs_adaptive",
]

# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision
# deficiencies. Yellow (#F0E442) is left out: it vanishes on white paper.
PALETTE: tuple[str, ...] = (
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#E69F00",  # orange
    "#56B4E9",  # sky blue
    "#000000",  # black
)
# Line styles and markers separate series when colour is lost (grayscale print).
LINESTYLES: tuple[Any, ...] = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 1)), "-")
MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X")

# Neutral colours for reference elements (targets, shaded zones, marked regions).
REFERENCE_COLOR = "0.25"
ZONE_COLOR = "0.55"

# Part of plasma used for β: 0.8 is orange (warm, small β), 0.0 dark blue (cool, large β).
# The top of plasma (bright yellow) is cut off because it is unreadable on white.
_BETA_CMAP_RANGE = (0.8, 0.0)


def use_style() -> None:
    """Set the book's matplotlib style (rcParams) for the current process.

    Readable font sizes, a light grid, no top/right spines, constrained layout, a colour cycle
    that also cycles line styles (so default series stay apart in grayscale), screen dpi 110
    and saved-figure dpi 150.
    """
    n = min(len(PALETTE), len(LINESTYLES))
    mpl.rcParams.update(
        {
            "figure.dpi": 110,
            "savefig.dpi": 150,
            "savefig.bbox": "tight",
            "figure.figsize": (6.4, 4.0),
            "figure.constrained_layout.use": True,
            "font.size": 11,
            "axes.titlesize": 11.5,
            "axes.labelsize": 11,
            "xtick.labelsize": 10,
            "ytick.labelsize": 10,
            "legend.fontsize": 9.5,
            "legend.frameon": False,
            "figure.titlesize": 12.5,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "grid.linewidth": 0.6,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "lines.linewidth": 1.8,
            "lines.markersize": 5,
            "axes.prop_cycle": cycler(color=list(PALETTE[:n])) + cycler(linestyle=list(LINESTYLES[:n])),
        }
    )


def series_style(i: int) -> dict[str, Any]:
    """Colour, line style and marker of the ``i``-th categorical series (cycles after 7)."""
    return {
        "color": PALETTE[i % len(PALETTE)],
        "linestyle": LINESTYLES[i % len(LINESTYLES)],
        "marker": MARKERS[i % len(MARKERS)],
    }


def beta_colors(betas: Sequence[float] | np.ndarray) -> list[str]:
    """Colours for a set of β values: warm (orange) for small β, cool (dark blue) for large β.

    Colours are assigned by the rank of β (so log-spaced sweeps are spread evenly over the
    map), in the order the β values were given. Equal β values get equal colours.

    Parameters
    ----------
    betas : sequence of float, shape (K,)

    Returns
    -------
    list of str, length K
        Hex colours from the ``plasma`` map, lightness decreasing with β.

    Examples
    --------
    >>> beta_colors([0.01, 1.0])  # small β orange, large β dark blue
    ['#fca636', '#0d0887']
    """
    values = np.asarray(betas, dtype=float).reshape(-1)
    if values.size == 0:
        return []
    unique = np.unique(values)
    rank = np.searchsorted(unique, values)
    frac = rank / (len(unique) - 1) if len(unique) > 1 else np.zeros_like(rank, dtype=float)
    lo, hi = _BETA_CMAP_RANGE
    cmap = mpl.colormaps["plasma"]
    return [to_hex(cmap(lo + (hi - lo) * f)) for f in frac]


def beta_styles(betas: Sequence[float] | np.ndarray) -> list[dict[str, Any]]:
    """Colour (:func:`beta_colors`), line style and marker for each β, in the order given."""
    colors = beta_colors(betas)
    values = np.asarray(betas, dtype=float).reshape(-1)
    rank = np.searchsorted(np.unique(values), values)
    return [
        {"color": c, "linestyle": LINESTYLES[r % len(LINESTYLES)], "marker": MARKERS[r % len(MARKERS)]}
        for c, r in zip(colors, rank, strict=True)
    ]


def _new_axes(ax: Axes | None, **subplots_kw: Any) -> Axes:
    if ax is not None:
        return ax
    _, ax = plt.subplots(**subplots_kw)
    return ax


def _new_axes_grid(axes: Any, nrows: int, ncols: int, **subplots_kw: Any) -> np.ndarray:
    """Return ``axes`` as a flat array of ``nrows * ncols`` axes, creating a figure if None."""
    if axes is None:
        _, axes = plt.subplots(nrows, ncols, squeeze=False, **subplots_kw)
    flat = np.asarray(axes, dtype=object).reshape(-1)
    if flat.size != nrows * ncols:
        raise ValueError(f"axes: expected {nrows * ncols} axes, got {flat.size}")
    return flat


def _log_beta_axis(ax: Axes) -> None:
    """Log-scale y axis with plain tick labels at 1, 2 and 5 times each power of ten."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _check_quantiles(band: tuple[float, float]) -> tuple[float, float]:
    lo, hi = (float(q) for q in band)
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"band: expected two quantiles 0 <= lo < hi <= 1, got {band!r}")
    return lo, hi


def plot_median_band(
    ax: Axes,
    x: np.ndarray,
    samples: np.ndarray,
    *,
    band: tuple[float, float] = (0.1, 0.9),
    label: str | None = None,
    color: str | None = None,
    linestyle: Any = "-",
    band_alpha: float = 0.2,
    **line_kw: Any,
) -> Axes:
    """Draw the median over seeds of ``samples`` against ``x`` with a quantile band.

    Parameters
    ----------
    ax : Axes
    x : ndarray, shape (S,)
        Positions along the x axis (e.g. training steps).
    samples : ndarray, shape (N, S)
        One row per seed (N seeds). The line is the median over rows; the shaded band spans
        the ``band`` quantiles (default 10 % to 90 %).
    band : (float, float)
        Lower and upper quantile of the band.
    label, color, linestyle, **line_kw
        Passed to ``ax.plot`` for the median line (the band gets the same colour, no label).

    Returns
    -------
    Axes
    """
    lo, hi = _check_quantiles(band)
    samples = np.asarray(samples, dtype=float)
    if samples.ndim == 1:
        samples = samples[None, :]
    x = np.asarray(x, dtype=float)
    if samples.ndim != 2 or samples.shape[1] != x.shape[0]:
        raise ValueError(f"samples: expected shape (N, {x.shape[0]}), got {samples.shape}")
    q_lo, median, q_hi = np.quantile(samples, [lo, 0.5, hi], axis=0)
    (line,) = ax.plot(x, median, label=label, color=color, linestyle=linestyle, **line_kw)
    if samples.shape[0] > 1:
        ax.fill_between(x, q_lo, q_hi, color=line.get_color(), alpha=band_alpha, linewidth=0)
    return ax


# --------------------------------------------------------------------------------------------
# §8 Adaptive KL dynamics
# --------------------------------------------------------------------------------------------


def _as_named_histories(histories: Any) -> dict[str, Any]:
    """Normalise one history, a sequence of histories or a mapping name -> history."""
    if isinstance(histories, Mapping):
        named = dict(histories)
    elif hasattr(histories, "kl") and hasattr(histories, "beta"):
        named = {"": histories}
    elif isinstance(histories, Sequence) and not isinstance(histories, str):
        named = {f"run {i + 1}": h for i, h in enumerate(histories)}
    else:
        raise TypeError(
            "histories: expected a ControllerHistory (with .kl and .beta), a sequence of them "
            f"or a dict name -> history, got {type(histories).__name__}"
        )
    for name, h in named.items():
        if not (hasattr(h, "kl") and hasattr(h, "beta")):
            raise TypeError(f"histories[{name!r}]: expected an object with .kl and .beta")
        kl, beta = np.asarray(h.kl), np.asarray(h.beta)
        if kl.ndim != 1 or beta.shape != (kl.shape[0] + 1,):
            raise ValueError(
                f"histories[{name!r}]: expected kl shape (n,) and beta shape (n+1,), "
                f"got {kl.shape} and {beta.shape}"
            )
    return named


def plot_controller_dynamics(
    histories: Any,
    target_kl: float,
    *,
    band: float = 1.5,
    axes: Any = None,
    title: str | None = None,
) -> np.ndarray:
    """Adaptive KL dynamics (§8): KL per step against its target, and β per step (log scale).

    Left panel: the KL each controller observed at each step, the target as a dashed line and
    the stable zone ``[target_kl / band, band * target_kl]`` shaded. Right panel: the β in
    force at each step on a log scale, so that multiplying or dividing β by a constant factor
    is an equal-sized step.

    Parameters
    ----------
    histories : ControllerHistory, sequence of them, or dict name -> ControllerHistory
        Each with ``kl`` shape (n,) and ``beta`` shape (n+1,), where ``beta[0]`` is the
        initial β and ``beta[t]`` the β in force when ``kl[t]`` was observed. Several
        histories are overlaid (one colour, line style and marker each).
    target_kl : float
        Target KL (nats).
    band : float
        Half-width factor of the stable zone (the handbook's doubling rule uses 1.5).
    axes : array of 2 Axes, optional
        Drawn on if given; otherwise a new 1 x 2 figure is created.
    title : str, optional
        Figure title.

    Returns
    -------
    ndarray of Axes, shape (2,)
        ``[kl_axes, beta_axes]``.
    """
    if target_kl <= 0:
        raise ValueError(f"target_kl: expected a positive KL target (nats), got {target_kl}")
    if band <= 1:
        raise ValueError(f"band: expected a factor > 1, got {band}")
    named = _as_named_histories(histories)
    ax_kl, ax_beta = _new_axes_grid(axes, 1, 2, figsize=(10.0, 3.8))

    ax_kl.axhspan(
        target_kl / band,
        target_kl * band,
        color=ZONE_COLOR,
        alpha=0.18,
        linewidth=0,
        label=f"stable zone [target/{band:g}, {band:g}·target]",
    )
    ax_kl.axhline(target_kl, color=REFERENCE_COLOR, linestyle="--", linewidth=1.2,
                  label=f"target = {target_kl:g} nats")
    for i, (name, h) in enumerate(named.items()):
        style = series_style(i)
        kl, beta = np.asarray(h.kl, dtype=float), np.asarray(h.beta, dtype=float)
        n = kl.shape[0]
        every = max(1, n // 12)
        ax_kl.plot(np.arange(n), kl, label=name or None, markevery=every, **style)
        # beta[t] is in force over step t; the last entry is the β after the final update.
        ax_beta.plot(np.arange(n + 1), beta, label=name or None, drawstyle="steps-post",
                     markevery=every, **style)
    ax_kl.set_xlabel("training step")
    ax_kl.set_ylabel("observed KL (nats)")
    ax_kl.set_title("KL against its target")
    ax_kl.legend(loc="best")
    _log_beta_axis(ax_beta)
    ax_beta.set_xlabel("training step")
    ax_beta.set_ylabel("β (reward units per nat, log scale)")
    ax_beta.set_title("KL coefficient β")
    if len(named) > 1 or next(iter(named)):
        ax_beta.legend(loc="best")
    if title:
        ax_kl.figure.suptitle(title)
    return np.array([ax_kl, ax_beta], dtype=object)


# --------------------------------------------------------------------------------------------
# §10 Reward vs KL per β (invented model)
# --------------------------------------------------------------------------------------------


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
        From :func:`kltutorial.simulate.simulate_training_trajectory`: ``betas`` (K,),
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
    lo, hi = _check_quantiles(band)
    betas = np.asarray(result.betas, dtype=float)
    kl = np.asarray(result.kl, dtype=float)
    reward = np.asarray(result.reward, dtype=float)
    if kl.ndim != 3 or reward.shape != kl.shape or kl.shape[0] != betas.shape[0]:
        raise ValueError(
            "result: expected kl and reward of shape (K, N, n_steps + 1) with K = len(betas), "
            f"got {kl.shape}, {reward.shape}, K = {betas.shape[0]}"
        )
    ax = _new_axes(ax, figsize=(7.0, 4.4))
    kl_med = np.median(kl, axis=1)  # (K, S)
    r_lo, r_med, r_hi = np.quantile(reward, [lo, 0.5, hi], axis=1)  # each (K, S)
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
    ax = _new_axes(ax, figsize=(6.4, 4.0))
    steps = np.arange(kl.shape[-1])
    for k, style in enumerate(beta_styles(betas)):
        plot_median_band(ax, steps, kl[k], band=band, color=style["color"],
                         linestyle=style["linestyle"], label=f"β = {betas[k]:g}")
        if equilibrium_kl is not None:
            ax.axhline(float(np.asarray(equilibrium_kl)[k]), color=style["color"],
                       linestyle=(0, (2, 3)), linewidth=0.9)
    ax.set_xlabel("training step")
    ax.set_ylabel("KL from the reference (nats)")
    if title:
        ax.set_title(title)
    ax.legend(loc="best", fontsize=9)
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
    flat = _new_axes_grid(axes, 1, n, figsize=(3.4 * n, 3.3), sharey=True)
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


# --------------------------------------------------------------------------------------------
# §10 Fixed vs adaptive KL control (invented model)
# --------------------------------------------------------------------------------------------


def plot_fixed_vs_adaptive(
    results: Mapping[str, Any],
    *,
    target_kl: float | None = None,
    beta_index: int = 0,
    band: tuple[float, float] = (0.1, 0.9),
    axes: Any = None,
    title: str | None = "Fixed vs adaptive KL control (invented model)",
) -> np.ndarray:
    """Four panels (§10): KL against its target, β, raw reward, reward penalised at β₀.

    Each panel shows, per controller, the median over seeds and the ``band`` quantile range.
    The penalised reward is ``reward − β₀·KL`` at the initial β₀ that all controllers share,
    so the panel compares the KL each run pays for at one fixed price.

    Parameters
    ----------
    results : dict name -> ControlledTraining
        From :func:`kltutorial.simulate.simulate_training_with_controller`; each with
        ``kl``, ``beta``, ``reward``, ``penalized_reward`` of shape (K, N, n_steps + 1).
    target_kl : float, optional
        Drawn as a dashed line on the KL panel. If None, taken from the first result that
        has a ``target_kl``.
    beta_index : int
        Which initial β (row K) of each result to draw.
    band : (float, float)
        Quantiles over seeds for the bands.
    axes : 2 x 2 array of Axes, optional
    title : str or None

    Returns
    -------
    ndarray of Axes, shape (2, 2)
        ``[[kl, beta], [reward, penalized_reward]]``.
    """
    if not isinstance(results, Mapping) or len(results) == 0:
        raise TypeError("results: expected a non-empty dict name -> ControlledTraining")
    flat = _new_axes_grid(axes, 2, 2, figsize=(10.0, 6.6), sharex=True)
    ax_kl, ax_beta, ax_r, ax_pr = flat
    if target_kl is None:
        target_kl = next(
            (r.target_kl for r in results.values() if getattr(r, "target_kl", None) is not None),
            None,
        )
    if target_kl is not None:
        ax_kl.axhline(target_kl, color=REFERENCE_COLOR, linestyle="--", linewidth=1.2,
                      label=f"target = {target_kl:g} nats")
    initial = {float(np.asarray(r.beta)[beta_index, 0, 0]) for r in results.values()}
    if len(initial) != 1:
        raise ValueError(
            f"results: the penalised-reward panel needs one shared initial β, got {sorted(initial)}"
        )
    init_beta = None
    for i, (name, res) in enumerate(results.items()):
        style = series_style(i)
        steps = np.arange(np.asarray(res.kl).shape[-1])
        common = {"band": band, "color": style["color"], "linestyle": style["linestyle"]}
        plot_median_band(ax_kl, steps, res.kl[beta_index], label=name, **common)
        plot_median_band(ax_beta, steps, res.beta[beta_index], label=name, **common)
        plot_median_band(ax_r, steps, res.reward[beta_index], label=name, **common)
        plot_median_band(ax_pr, steps, res.penalized_reward[beta_index], label=name, **common)
        init_beta = float(np.asarray(res.beta)[beta_index, 0, 0])
    ax_kl.set_ylabel("KL from the reference (nats)")
    ax_kl.set_title("KL against its target")
    _log_beta_axis(ax_beta)
    ax_beta.set_ylabel("β (reward units per nat, log scale)")
    ax_beta.set_title("KL coefficient β")
    ax_r.set_ylabel("learned reward (reward units)")
    ax_r.set_title("raw reward")
    ax_pr.set_ylabel(f"reward − {init_beta:g}·KL (reward units)")
    ax_pr.set_title(f"reward penalised at the shared β₀ = {init_beta:g}")
    for ax in flat:
        ax.set_xlabel("training step")
        ax.xaxis.set_tick_params(labelbottom=True)
    # One legend for the four panels, below them (median line; band = quantiles over seeds).
    handles, labels = ax_kl.get_legend_handles_labels()
    fig = ax_kl.figure
    constrained = isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    loc = "outside lower center" if constrained else "lower center"
    fig.legend(handles, labels, loc=loc, ncol=len(labels),
               title=f"median over seeds; band: {band[0]:.0%}–{band[1]:.0%} quantiles")
    if title:
        fig.suptitle(title)
    return flat.reshape(2, 2)


# --------------------------------------------------------------------------------------------
# §11 A real experiment (figures appended below by the §11 author)
# --------------------------------------------------------------------------------------------

# --- §11 experiment figures ---
# Plot functions of book section 11 (the toy RLHF experiment of kltutorial.toyrlhf). They take
# plain arrays or objects with array attributes (Frontier, TrainResult), never a task or a model.

__all__ += [
    "plot_toy_frontier",
    "plot_bang_histogram",
    "plot_data_sweep",
    "plot_toy_controllers",
    "plot_toy_token_kl",
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
    flat = _new_axes_grid(axes, 1, 2, figsize=(10.0, 4.0), sharex=True)
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
    flat[0].legend(loc="lower right", fontsize=8.5)
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
    ax = _new_axes(ax, figsize=(6.4, 3.8))
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
    ax.legend(loc="center right", fontsize=8.5)
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
    ax, ax_peak = _new_axes_grid(axes, 1, 2, figsize=(10.0, 3.9))
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
    ax.set_title("gold reward of the proxy's optimum (markers: peaks)")
    ax.legend(loc="lower left", fontsize=8.5)
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
    ax_peak.set_title("the peak against the amount of data")
    if title:
        ax.figure.suptitle(title)
    return np.array([ax, ax_peak], dtype=object)


def plot_toy_controllers(
    runs: Mapping[str, Any],
    target_kl: float,
    *,
    axes: Any = None,
    title: str | None = None,
) -> np.ndarray:
    """Fixed vs adaptive β in real training (§11): KL, β, gold reward and proxy penalised at β₀.

    Parameters
    ----------
    runs : dict name -> TrainResult
        Each with ``kl``, ``proxy``, ``gold`` of shape (n,) (exact, per step) and ``beta`` (n + 1,).
        All runs are assumed to start from the same β₀ (``beta[0]``).
    target_kl : float
        The controllers' target (nats), drawn dashed on the KL panel.
    axes : 2 x 2 Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (2, 2)
        ``[[kl, beta], [gold, penalised proxy]]``.
    """
    if not isinstance(runs, Mapping) or len(runs) == 0:
        raise TypeError("runs: expected a non-empty dict name -> TrainResult")
    flat = _new_axes_grid(axes, 2, 2, figsize=(10.0, 6.6), sharex=True)
    ax_kl, ax_beta, ax_gold, ax_pen = flat
    ax_kl.axhline(target_kl, color=REFERENCE_COLOR, linestyle="--", linewidth=1.2,
                  label=f"target = {target_kl:g} nats")
    beta0 = float(np.asarray(next(iter(runs.values())).beta)[0])
    for i, (name, run) in enumerate(runs.items()):
        style = series_style(i)
        kl = np.asarray(run.kl, dtype=float)
        steps = np.arange(kl.shape[0])
        every = max(1, kl.shape[0] // 8)
        common = {"color": style["color"], "linestyle": style["linestyle"],
                  "marker": style["marker"], "markevery": every, "label": name}
        ax_kl.plot(steps, kl, **common)
        ax_beta.plot(np.arange(kl.shape[0] + 1), run.beta, drawstyle="steps-post", **common)
        ax_gold.plot(steps, run.gold, **common)
        ax_pen.plot(steps, np.asarray(run.proxy) - beta0 * kl, **common)
    ax_kl.set_ylabel("exact KL(π_θ ‖ π_ref) (nats)")
    ax_kl.set_title("KL against its target")
    ax_kl.legend(loc="best", fontsize=8.5)
    ax_beta.set_yscale("log")
    ax_beta.set_ylabel("β (log scale)")
    ax_beta.set_title("KL coefficient β")
    ax_gold.set_ylabel("expected gold reward (reward units)")
    ax_gold.set_title("gold reward (what we wanted)")
    ax_pen.set_ylabel(f"proxy − {beta0:g}·KL (reward units)")
    ax_pen.set_title(f"proxy reward penalised at the shared β₀ = {beta0:g}")
    for ax in flat:
        ax.set_xlabel("training step")
        ax.xaxis.set_tick_params(labelbottom=True)
    if title:
        ax_kl.figure.suptitle(title)
    return flat.reshape(2, 2)


def plot_toy_token_kl(
    exact: Mapping[str, np.ndarray],
    sampled: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
    *,
    betas: Sequence[float] | None = None,
    illustrative: Mapping[str, np.ndarray] | None = None,
    axes: Any = None,
    title: str | None = None,
) -> np.ndarray:
    """Per-token KL of trained policies (§11), next to §10's hand-made patterns.

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
        §10's invented patterns, drawn on a second panel against the relative position.
    axes : 1 or 2 Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (1,) or (2,)
    """
    n_panels = 2 if illustrative is not None else 1
    flat = _new_axes_grid(axes, 1, n_panels, figsize=(5.2 * n_panels, 3.9))
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
        ax2.set_title("§10's patterns: hand-made, not measured")
        ax2.legend(loc="upper center", fontsize=8.5)
    if title:
        ax.figure.suptitle(title)
    return flat
