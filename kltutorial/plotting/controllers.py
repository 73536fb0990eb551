"""Figures of KL controllers at work: KL against its target, β over time, and what each run earned.

* §8  :func:`plot_controller_dynamics`: KL per step with the target and the stable zone, β per step
  (log scale), for one or several controller histories;
* §10 :func:`plot_fixed_vs_adaptive`: fixed against adaptive β on the invented model, over many seeds;
* §11 ``plot_toy_controllers`` (in :mod:`.experiment`): the same comparison in real training.

The last two share one layout, :func:`plot_control_panels`: a 2 x 2 grid of KL against its target, β,
a reward, and the reward penalised at the β all runs started from. Its inputs are
:class:`ControlTrace` objects, one per run; each figure function turns its own results into those.
All three draw their KL and β panels with the same two helpers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.layout_engine import ConstrainedLayoutEngine

from .._validation import check_positive
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

__all__ = [
    "ControlTrace",
    "plot_control_panels",
    "plot_controller_dynamics",
    "plot_fixed_vs_adaptive",
]


@dataclass(frozen=True)
class ControlTrace:
    """One controller run, as the control figures draw it.

    An array of shape (n,) is one run, drawn as a line with markers; shape (N, n) holds N seeds of
    the same run, drawn as the median over seeds with a quantile band.

    Attributes
    ----------
    kl : ndarray, shape (n,) or (N, n)
        KL at each recorded step (nats).
    beta : ndarray, shape (..., n) or (..., n + 1)
        β at each step. With one entry more than ``kl`` it also holds the β after the last update,
        and ``beta[t]`` is drawn as in force over step t (a step function).
    reward, penalized_reward : ndarray, same shape as ``kl``, optional
        A reward of the run, and a reward minus β₀·KL priced at one β₀ shared by every run drawn with
        it (the β₀ they all started from, unless the figure is told another).
    """

    kl: np.ndarray
    beta: np.ndarray
    reward: np.ndarray | None = None
    penalized_reward: np.ndarray | None = None

    def __post_init__(self) -> None:
        kl = np.asarray(self.kl, dtype=float)
        beta = np.asarray(self.beta, dtype=float)
        if kl.ndim not in (1, 2) or kl.shape[-1] == 0:
            raise ValueError(f"kl: expected shape (n,) or (N, n) with n >= 1, got {kl.shape}")
        if beta.shape[:-1] != kl.shape[:-1] or beta.shape[-1] not in (kl.shape[-1], kl.shape[-1] + 1):
            raise ValueError(
                f"beta: expected the shape of kl {kl.shape}, or one more step, got {beta.shape}"
            )
        object.__setattr__(self, "kl", kl)
        object.__setattr__(self, "beta", beta)
        for name in ("reward", "penalized_reward"):
            value = getattr(self, name)
            if value is not None:
                value = np.asarray(value, dtype=float)
                if value.shape != kl.shape:
                    raise ValueError(f"{name}: expected the shape of kl {kl.shape}, got {value.shape}")
                object.__setattr__(self, name, value)

    @property
    def over_seeds(self) -> bool:
        """True when the arrays hold several seeds (drawn as median and band)."""
        return self.kl.ndim == 2

    @property
    def initial_beta(self) -> np.ndarray:
        """β at step 0 (one value, or one per seed)."""
        return self.beta[..., 0]


# --------------------------------------------------------------------------------------------
# Panels shared by every control figure
# --------------------------------------------------------------------------------------------


def _draw(ax: Axes, y: np.ndarray, i: int, name: str, band: tuple[float, float], every: int) -> None:
    """Series ``i`` of a panel: median and band over seeds for (N, n), a marked line for (n,)."""
    style = series_style(i)
    if y.ndim == 2:
        plot_median_band(ax, np.arange(y.shape[-1]), y, band=band, label=name or None,
                         color=style["color"], linestyle=style["linestyle"])
    else:
        ax.plot(np.arange(y.shape[-1]), y, label=name or None, markevery=every, **style)


def _draw_beta(ax: Axes, trace: ControlTrace, i: int, name: str, band: tuple[float, float],
               every: int) -> None:
    if trace.beta.shape[-1] == trace.kl.shape[-1] + 1 and not trace.over_seeds:
        # beta[t] is in force over step t; the last entry is the β after the final update.
        ax.plot(np.arange(trace.beta.shape[-1]), trace.beta, label=name or None,
                drawstyle="steps-post", markevery=every, **series_style(i))
    else:
        _draw(ax, trace.beta, i, name, band, every)


def _markevery(trace: ControlTrace, n_markers: int) -> int:
    return max(1, trace.kl.shape[-1] // n_markers)


def _draw_kl_panel(
    ax: Axes,
    traces: Mapping[str, ControlTrace],
    *,
    target_kl: float | None,
    ylabel: str,
    zone: float | None = None,
    band: tuple[float, float] = (0.1, 0.9),
    n_markers: int = 8,
) -> None:
    """KL of each run against the target (dashed); ``[target/zone, zone·target]`` shaded if ``zone``."""
    if target_kl is not None and zone is not None:
        ax.axhspan(target_kl / zone, target_kl * zone, color=ZONE_COLOR, alpha=0.18, linewidth=0,
                   label=f"stable zone [target/{zone:g}, {zone:g}·target]")
    if target_kl is not None:
        ax.axhline(target_kl, color=REFERENCE_COLOR, linestyle="--", linewidth=1.2,
                   label=f"target = {target_kl:g} nats")
    for i, (name, trace) in enumerate(traces.items()):
        _draw(ax, trace.kl, i, name, band, _markevery(trace, n_markers))
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.set_title("KL against its target")


def _draw_beta_panel(
    ax: Axes,
    traces: Mapping[str, ControlTrace],
    *,
    band: tuple[float, float] = (0.1, 0.9),
    n_markers: int = 8,
) -> None:
    """β of each run on a log scale, so that each ×c or ÷c step of a controller is the same height."""
    for i, (name, trace) in enumerate(traces.items()):
        _draw_beta(ax, trace, i, name, band, _markevery(trace, n_markers))
    log_beta_axis(ax)
    ax.set_xlabel("training step")
    ax.set_ylabel("β (reward units per nat, log scale)")
    ax.set_title("KL coefficient β")


def _check_traces(traces: object, name: str, *, rewards: bool) -> dict[str, ControlTrace]:
    if not isinstance(traces, Mapping) or len(traces) == 0:
        raise TypeError(f"{name}: expected a non-empty dict name -> ControlTrace")
    for key, trace in traces.items():
        if not isinstance(trace, ControlTrace):
            raise TypeError(f"{name}[{key!r}]: expected a ControlTrace, got {type(trace).__name__}")
        if rewards and (trace.reward is None or trace.penalized_reward is None):
            raise ValueError(f"{name}[{key!r}]: the reward panels need reward and penalized_reward")
    return dict(traces)


# --------------------------------------------------------------------------------------------
# The 2 x 2 layout: KL, β, reward, penalised reward
# --------------------------------------------------------------------------------------------


def plot_control_panels(
    traces: Mapping[str, ControlTrace],
    *,
    target_kl: float | None = None,
    kl_label: str = "KL from the reference (nats)",
    reward_label: str = "learned reward (reward units)",
    reward_title: str = "raw reward",
    penalized_of: str = "reward",
    band: tuple[float, float] = (0.1, 0.9),
    beta0: float | None = None,
    axes: Any = None,
    title: str | None = None,
) -> np.ndarray:
    """Four panels: KL against its target, β (log scale), a reward, and the reward penalised at β₀.

    Runs over seeds ((N, n) arrays) are drawn as medians with a ``band`` quantile range and share one
    legend below the panels; single runs ((n,) arrays) are marked lines with the legend on the KL
    panel. The penalised-reward panel prices every nat of KL at one β₀, by default the one all runs
    started from, so it compares what each run's drift cost at a single price.

    Parameters
    ----------
    traces : dict name -> ControlTrace
        Each with ``reward`` and ``penalized_reward``; every run starts from the same β₀.
    target_kl : float, optional
        Drawn dashed on the KL panel (nats).
    kl_label, reward_label, reward_title : str
        Y labels of the KL and reward panels, and the reward panel's title.
    penalized_of : str
        What is penalised, in the fourth panel's label and title ("reward", "proxy").
    band : (float, float)
        Quantiles over seeds for the bands.
    beta0 : float, optional
        The price per nat at which every trace's ``penalized_reward`` was computed, for runs that do
        not all start from one β (a fixed β beside controllers started lower). By default the β₀ all
        runs start from.
    axes : 2 x 2 array of Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (2, 2)
        ``[[kl, beta], [reward, penalized_reward]]``.

    Raises
    ------
    ValueError
        If no ``beta0`` is given and the runs do not start from one shared β₀.
    """
    traces = _check_traces(traces, "traces", rewards=True)
    band = check_quantiles(band)
    if beta0 is None:
        initial = np.unique(np.concatenate([np.ravel(t.initial_beta) for t in traces.values()]))
        if initial.size != 1:
            raise ValueError(
                f"traces: the penalised-reward panel needs one shared initial β, got {initial.tolist()} "
                "(start every run from the same β, or pass the beta0 the rewards were priced at)"
            )
        beta0 = float(initial[0])
    else:
        beta0 = check_positive(beta0, "beta0")
    flat = new_axes_grid(axes, 2, 2, figsize=fig_size(5.6), sharex=True)
    ax_kl, ax_beta, ax_r, ax_pr = flat
    _draw_kl_panel(ax_kl, traces, target_kl=target_kl, ylabel=kl_label, band=band)
    _draw_beta_panel(ax_beta, traces, band=band)
    for i, (name, trace) in enumerate(traces.items()):
        every = _markevery(trace, 8)
        _draw(ax_r, trace.reward, i, name, band, every)
        _draw(ax_pr, trace.penalized_reward, i, name, band, every)
    ax_r.set_ylabel(reward_label)
    ax_r.set_title(reward_title)
    ax_pr.set_ylabel(f"{penalized_of} − {beta0:g}·KL (reward units)")
    ax_pr.set_title(f"{penalized_of} penalised at the shared β₀ = {beta0:g}")
    for ax in flat:
        ax.set_xlabel("training step")
        ax.xaxis.set_tick_params(labelbottom=True)
    fig = ax_kl.figure
    if any(t.over_seeds for t in traces.values()):
        # One legend for the four panels, below them (median line; band = quantiles over seeds).
        handles, labels = ax_kl.get_legend_handles_labels()
        constrained = isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
        # Two columns from four names on: one row of them is wider than the house width.
        fig.legend(handles, labels, loc="outside lower center" if constrained else "lower center",
                   ncol=len(labels) if len(labels) <= 3 else 2,
                   title=f"median over seeds; band: {band[0]:.0%}–{band[1]:.0%} quantiles")
    else:
        ax_kl.legend(loc="best", fontsize=8.5)
    if title:
        fig.suptitle(title)
    return flat.reshape(2, 2)


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
    is an equal-sized step. The legends sit under the panels, clear of the data: the left one
    names the target and the zone, the right one the runs (when they are named).

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
    traces = {name: ControlTrace(kl=h.kl, beta=h.beta) for name, h in _as_named_histories(histories).items()}
    ax_kl, ax_beta = new_axes_grid(axes, 1, 2, figsize=fig_size(3.9))
    _draw_kl_panel(ax_kl, traces, target_kl=target_kl, ylabel="observed KL (nats)", zone=band,
                  n_markers=12)
    _draw_beta_panel(ax_beta, traces, n_markers=12)
    # Each legend under its own panel, where no data can be: the KL panel's names the zone and the
    # target, the β panel's the runs (drawn in the same styles on both panels).
    handles, labels = ax_kl.get_legend_handles_labels()
    reference = [(h, lab) for h, lab in zip(handles, labels, strict=True) if lab not in traces]
    ax_kl.legend(*zip(*reference, strict=True), **legend_below(ax_kl))
    if len(traces) > 1 or next(iter(traces)):
        ax_beta.legend(**legend_below(ax_beta))
    if title:
        ax_kl.figure.suptitle(title)
    return np.array([ax_kl, ax_beta], dtype=object)


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

    Each panel shows, per controller, the median over seeds and the ``band`` quantile range
    (:func:`plot_control_panels`). The penalised reward is the result's own
    ``penalized_reward``, ``reward − β₀·KL`` at the initial β₀ that all controllers share, so the
    panel compares the KL each run pays for at one fixed price.

    Parameters
    ----------
    results : dict name -> ControlledTraining
        From :func:`kltutorial.studies.dynamics.simulate_training_with_controller`; each with
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
    if target_kl is None:
        target_kl = next(
            (r.target_kl for r in results.values() if getattr(r, "target_kl", None) is not None),
            None,
        )
    traces = {
        name: ControlTrace(kl=res.kl[beta_index], beta=res.beta[beta_index],
                           reward=res.reward[beta_index], penalized_reward=res.penalized_reward[beta_index])
        for name, res in results.items()
    }
    # At the house width a 2 x 2 grid has panels about 3 in wide and 2 in high: a taller figure,
    # y labels on two lines (so none runs past its panel).
    flat = new_axes_grid(axes, 2, 2, figsize=fig_size(6.6), sharex=True)
    panels = plot_control_panels(
        traces, target_kl=target_kl, kl_label="KL from the\nreference (nats)",
        reward_label="learned reward\n(reward units)", band=band, axes=flat.reshape(2, 2), title=title,
    )
    beta0 = float(np.ravel(next(iter(traces.values())).initial_beta)[0])
    panels[0, 1].set_ylabel("β, log scale\n(reward units per nat)")
    panels[1, 1].set_ylabel(f"reward − {beta0:g}·KL\n(reward units)")
    panels[1, 1].set_title(f"reward penalised at β₀ = {beta0:g}")  # the long one overran the figure
    return panels
