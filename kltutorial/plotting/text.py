"""Figures of the real-text chapter (:mod:`kltutorial.textrlhf`).

* :func:`plot_text_runs`: the gold reward, the exact KL and the word distinct-2 at every step of runs at
  several β;
* :func:`plot_text_overoptimisation`: the learned proxy and the gold at every step of runs trained on
  the proxy, a step of each (where its gold peaks) marked;
* :func:`plot_token_kl_text`: texts written out word by word, each word shaded by the KL at its position;
* :func:`plot_position_kl`: where along a policy's own responses its KL goes, position by position;
* :func:`plot_trl_text_run`: a run through TRL's ``RLOOTrainer``: TRL's logged ``kl`` beside the
  callback's exact KL per token, and its gold reward beside the library's own run's;
* :func:`plot_logged_kl_estimates`: the three KLs a run logs at every step (the exact per-position KL,
  k1 and k3), one panel per run.

They take objects with array attributes (``TextTrainResult``, ``TokenKL``, ``TRLTextResult``), never a
model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib import colors as mcolors
from matplotlib import pyplot as plt

from .diagnostics import HEATMAP_CMAP
from .style import (
    REFERENCE_COLOR,
    beta_styles,
    fig_size,
    figure_legend_below,
    new_axes,
    new_axes_grid,
    series_style,
)

__all__ = ["plot_text_runs", "plot_text_overoptimisation", "plot_token_kl_text", "word_label",
           "plot_position_kl", "plot_trl_text_run", "plot_logged_kl_estimates"]


def _check_runs(runs: object, what: str) -> None:
    if not isinstance(runs, Mapping) or len(runs) == 0:
        raise TypeError(f"runs: expected a non-empty dict label -> TextTrainResult ({what})")
    for label, run in runs.items():
        for field in ("gold", "kl", "distinct_2", "proxy"):
            if not hasattr(run, field):
                raise TypeError(f"runs[{label!r}]: expected a TextTrainResult (with .{field}), "
                                f"got {type(run).__name__}")


def plot_text_runs(runs: Mapping[str, Any], *, axes: Any = None, title: str | None = None) -> np.ndarray:
    """The gold reward, the exact KL and the word distinct-2 of each batch, against the step (one line
    per run, coloured by its β; step 0 is the base model's batch).

    Parameters
    ----------
    runs : dict label -> TextTrainResult
        Runs on the gold reward, e.g. ``{"β = 0": run, ...}``; each run's ``config.beta`` sets its colour.
    axes : 3 Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (3,)
    """
    _check_runs(runs, "runs on the gold reward")
    styles = beta_styles([run.config.beta for run in runs.values()])
    flat = new_axes_grid(axes, 1, 3, figsize=fig_size(4.0), sharex=True)
    panels = (("gold", "gold reward (VADER)", "reward"),
              ("kl", "KL(π_θ ‖ π_ref) of a response (nats)", "KL from the base model"),
              ("distinct_2", "distinct-2 of a batch of 64", "variety"))
    for ax, (field, ylabel, panel_title) in zip(flat, panels, strict=True):
        for (label, run), st in zip(runs.items(), styles, strict=True):
            values = np.asarray(getattr(run, field), dtype=float)
            ax.plot(np.arange(len(values)), values, color=st["color"], linestyle=st["linestyle"],
                    linewidth=1.3, label=label)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.set_title(panel_title)
    flat[1].set_yscale("symlog", linthresh=1.0)
    figure_legend_below(flat[0], ncol=len(runs))
    if title:
        flat[0].figure.suptitle(title)
    return flat


def plot_text_overoptimisation(runs: Mapping[str, Any], peaks: Mapping[str, int] | None = None, *,
                               axes: Any = None, title: str | None = None) -> np.ndarray:
    """Runs trained on the learned proxy: the proxy's score (left) and the gold's (right) of each batch
    against the step, with each run's ``peaks`` step marked on both.

    Parameters
    ----------
    runs : dict label -> TextTrainResult
    peaks : dict label -> int, optional
        A step of each run to mark, e.g. where its gold peaks
        (:func:`~kltutorial.textrlhf.metrics.gold_peak`).
    axes : 2 Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (2,)
    """
    _check_runs(runs, "runs on the proxy reward")
    peaks = dict(peaks or {})
    unknown = sorted(set(peaks) - set(runs))
    if unknown:
        raise ValueError(f"peaks: labels that are not runs: {unknown}")
    styles = beta_styles([run.config.beta for run in runs.values()])
    flat = new_axes_grid(axes, 1, 2, figsize=fig_size(4.0), sharex=True)
    for ax, field in zip(flat, ("proxy", "gold"), strict=True):
        for (label, run), st in zip(runs.items(), styles, strict=True):
            values = np.asarray(getattr(run, field), dtype=float)
            steps = np.arange(len(values))
            ax.plot(steps, values, color=st["color"], linestyle=st["linestyle"], linewidth=1.0, label=label)
            if label in peaks:
                step = int(peaks[label])
                ax.plot(steps[step], values[step], color=st["color"], marker=st["marker"], markersize=9,
                        markeredgecolor="black", markeredgewidth=0.8, linestyle="none")
        ax.set_xlabel("training step")
    flat[0].set_ylabel("learned proxy reward")
    flat[0].set_title("what the policy is trained on")
    flat[1].set_ylabel("gold reward (VADER)")
    flat[1].set_title("what was wanted")
    figure_legend_below(flat[0], ncol=len(runs))
    if title:
        flat[0].figure.suptitle(title)
    return flat


def word_label(token: str) -> str:
    """A token as the text shows it: ``##,`` (a mark joined to the word before) as ``,``."""
    return token[2:] if token.startswith("##") else token


_TEXT_VALUES = {
    "kl": "KL(π(·|words before) ‖ π_ref(·|words before)) at the word (nats)",
    "k1": "k1 = log π(word) − log π_ref(word), given the words before (nats)",
}


def plot_token_kl_text(rows: Sequence[Any], *, labels: Sequence[str] | None = None, ax: Any = None,
                       vmax: float | None = None, title: str | None = None, values: str = "kl") -> Any:
    """Texts written word by word, each word on a background shaded by the exact KL at its position
    (the colour map of section 12's heat maps, :data:`~kltutorial.plotting.diagnostics.HEATMAP_CMAP`,
    from 0 to ``vmax``, by default the largest KL shown), with a colour bar in nats; with
    ``values="k1"``, by the sampled log-ratio at the word instead (from the smallest to the largest shown,
    as section 12's toy heat map of k1).

    Parameters
    ----------
    rows : sequence of TokenKL
        From :func:`~kltutorial.textrlhf.token_kl`: each text's tokens and the KL (and k1) at each.
    labels : sequence of str, optional
        A label printed before each text.
    ax : Axes, optional
    vmax : float, optional
    title : str, optional
    values : {"kl", "k1"}

    Returns
    -------
    Axes
    """
    if not isinstance(rows, Sequence) or len(rows) == 0:
        raise TypeError("rows: expected a non-empty sequence of TokenKL (from token_kl)")
    if values not in _TEXT_VALUES:
        raise ValueError(f"values must be one of {sorted(_TEXT_VALUES)}, got {values!r}")
    if labels is not None and len(labels) != len(rows):
        raise ValueError(f"labels: expected {len(rows)} labels, got {len(labels)}")
    shown = [np.asarray(getattr(r, values), dtype=float) for r in rows]
    top = float(max(float(np.max(v)) for v in shown)) if vmax is None else float(vmax)
    bottom = 0.0 if values == "kl" else float(min(float(np.min(v)) for v in shown))
    if not top > bottom:
        raise ValueError(f"vmax must be > {bottom:g} (the largest value shown), got {top}")
    cmap = plt.get_cmap(HEATMAP_CMAP)
    norm = mcolors.Normalize(vmin=bottom, vmax=top)
    ax = new_axes(ax, figsize=fig_size(0.55 * len(rows) + 1.0))
    fig = ax.figure
    ax.set_xlim(0, 1)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.axis("off")
    # Each word is anchored to the right edge of the one before, a few points on: the layout may change
    # the axes' width afterwards (constrained layout, a second panel) and the words keep their spacing.
    for i, row in enumerate(rows):
        before = None
        if labels is not None:
            before = ax.text(0.0, i, labels[i], va="center", ha="left", fontsize=9, color=REFERENCE_COLOR,
                             transform=ax.get_yaxis_transform())
        for token, value in zip(row.tokens, shown[i], strict=True):
            shade = cmap(norm(float(value)))
            dark = mcolors.rgb_to_hsv(shade[:3])[2] < 0.6
            style = {"va": "center", "ha": "left", "fontsize": 10, "color": "white" if dark else "black",
                     "bbox": {"boxstyle": "square,pad=0.15", "facecolor": shade, "edgecolor": "none"}}
            if before is None:
                before = ax.text(0.0, i, word_label(token), transform=ax.get_yaxis_transform(), **style)
                continue
            # a punctuation mark (``##,``) against the word before; a word after a space
            gap = 3.0 if token.startswith("##") else 6.0 if before.get_bbox_patch() else 8.0
            before = ax.annotate(word_label(token), xy=(1.0, 0.5), xycoords=before, xytext=(gap, 0.0),
                                 textcoords="offset points", **style)
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, orientation="horizontal",
                       fraction=0.08, pad=0.02, aspect=40)
    bar.set_label(_TEXT_VALUES[values])
    if title:
        ax.set_title(title)
    return ax


def plot_trl_text_run(run: Any, own: Any = None, *, axes: Any = None, title: str | None = None) -> np.ndarray:
    """A run through TRL's ``RLOOTrainer`` (a :class:`~kltutorial.textrlhf.trl_run.TRLTextResult`), by
    the policy each number measured (step 0: the base model).

    Left, the KL per token: TRL's logged ``kl`` (the mean k1 per token of its training batch) and the
    callback's exact per-position KL per token of its own samples. Right, the gold reward of TRL's
    training batches, and with ``own`` that of a run of the library's trainer
    (:class:`~kltutorial.textrlhf.TextTrainResult`) at the same settings.

    Returns
    -------
    ndarray of Axes, shape (2,)
    """
    for field in ("trl_step", "trl_kl", "trl_reward", "monitor_step", "monitor"):
        if not hasattr(run, field):
            raise TypeError(f"run: expected a TRLTextResult (with .{field}), got {type(run).__name__}")
    if own is not None and not hasattr(own, "gold"):
        raise TypeError(f"own: expected a TextTrainResult (with .gold), got {type(own).__name__}")
    flat = new_axes_grid(axes, 1, 2, figsize=fig_size(3.6), sharex=True)
    trl_style, exact_style, own_style = series_style(0), series_style(1), series_style(2)
    x = np.asarray(run.trl_step) - 1  # the policy TRL's record measured: the one before its step's update
    flat[0].plot(x, run.trl_kl, color=trl_style["color"], linewidth=0.8, alpha=0.8,
                 label="TRL's kl (k1 of its batch)")
    flat[0].plot(run.monitor_step, run.monitor["exact_kl_per_token"], color=exact_style["color"],
                 linewidth=1.6, label="kltutorial/exact_kl_per_token")
    flat[0].set_ylabel("KL per token (nats)")
    flat[0].set_title("what TRL logs, and the exact value")
    flat[1].plot(x, run.trl_reward, color=trl_style["color"], linewidth=0.8, alpha=0.8,
                 label="TRL's RLOOTrainer")
    if own is not None:
        flat[1].plot(np.arange(len(own.gold)), own.gold, color=own_style["color"],
                     linestyle=own_style["linestyle"], linewidth=1.2, label="the library's train_text")
    flat[1].set_ylabel("gold reward of the batch")
    flat[1].set_title("the same run, two trainers")
    for ax in flat:
        ax.set_xlabel("training step")
        ax.legend(loc="lower right", fontsize="small")
    if title:
        flat[0].figure.suptitle(title)
    return flat


def plot_position_kl(profiles: Mapping[str, Any], *, axes: Any = None,
                     title: str | None = None) -> np.ndarray:
    """One panel per policy (a :class:`~kltutorial.textrlhf.PositionKL` each): bars, each position's share
    of the response's KL (a response that has ended counting 0; the bars sum to the sequence KL); a line,
    the mean KL over the responses still running there. Each panel has its own y axis.

    Returns
    -------
    ndarray of Axes, shape (len(profiles),)
    """
    if not isinstance(profiles, Mapping) or len(profiles) == 0:
        raise TypeError("profiles: expected a non-empty dict label -> PositionKL")
    for label, p in profiles.items():
        if not (hasattr(p, "kl") and hasattr(p, "per_running")):
            raise TypeError(f"profiles[{label!r}]: expected a PositionKL, got {type(p).__name__}")
    flat = new_axes_grid(axes, 1, len(profiles), figsize=fig_size(3.4))
    bar, line = series_style(0), series_style(1)
    for ax, (label, p) in zip(flat, profiles.items(), strict=True):
        kl = np.asarray(p.kl, dtype=float)
        positions = np.arange(1, len(kl) + 1)
        ax.bar(positions, kl, color=bar["color"], alpha=0.75, width=0.8,
               label="share of the response's KL")
        ax.plot(positions, p.per_running, color=line["color"], marker=line["marker"], markersize=3,
                linewidth=1.2, label="mean over responses still running")
        ax.set_xlabel("position in the response (token)")
        ax.set_title(f"{label}: {kl.sum():.1f} nats a response")
        ax.set_ylim(bottom=0)
    flat[0].set_ylabel("KL at the position (nats)")
    figure_legend_below(flat[0], ncol=2)
    if title:
        flat[0].figure.suptitle(title)
    return flat


LOGGED_KL_SERIES = (("exact per-position KL", "kl"), ("k1", "k1"), ("k3", "k3"))


def plot_logged_kl_estimates(runs: Mapping[str, Any], *, axes: Any = None) -> np.ndarray:
    """The KL of each batch as a run logged it, three ways: the exact per-position KL summed along each
    response (thick), and the sampled estimates k1 and k3, against the training step; one panel per run.

    Parameters
    ----------
    runs : dict label -> TextTrainResult
        e.g. ``{"β = 0.2": run, "β = 0.01": run}``; each needs ``kl``, ``k1`` and ``k3``, one value per step.
    axes : Axes, one per run, optional

    Returns
    -------
    ndarray of Axes, shape (len(runs),)
    """
    if not isinstance(runs, Mapping) or len(runs) == 0:
        raise TypeError("runs: expected a non-empty dict label -> TextTrainResult")
    for label, run in runs.items():
        missing = [field for _, field in LOGGED_KL_SERIES if not hasattr(run, field)]
        if missing:
            raise TypeError(f"runs[{label!r}]: expected a TextTrainResult (with .kl, .k1 and .k3), "
                            f"got {type(run).__name__}")
    flat = new_axes_grid(axes, 1, len(runs), figsize=fig_size(3.4))
    for ax, (label, run) in zip(flat, runs.items(), strict=True):
        for i, (name, field) in enumerate(LOGGED_KL_SERIES):
            style = series_style(i)
            ax.plot(np.asarray(getattr(run, field), dtype=float), label=name, color=style["color"],
                    linestyle=style["linestyle"], linewidth=2.4 if i == 0 else 1.3)
        ax.set(title=label, xlabel="training step (batches)", ylabel="logged KL (nats per response)")
    figure_legend_below(flat[0], ncol=len(LOGGED_KL_SERIES))
    return flat
