"""Figures of the real-text chapter (:mod:`kltutorial.textrlhf`).

* :func:`plot_text_runs`: the gold reward, the exact KL and the word distinct-2 at every step of runs at
  several β;
* :func:`plot_text_overoptimisation`: the learned proxy and the gold at every step of runs trained on
  the proxy, a step of each (where its gold peaks) marked;
* :func:`plot_token_kl_text`: texts written out word by word, each word shaded by the KL at its position.

They take objects with array attributes (``TextTrainResult``, ``TokenKL``), never a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib import colors as mcolors
from matplotlib import pyplot as plt

from .diagnostics import HEATMAP_CMAP
from .style import REFERENCE_COLOR, beta_styles, fig_size, figure_legend_below, new_axes, new_axes_grid

__all__ = ["plot_text_runs", "plot_text_overoptimisation", "plot_token_kl_text", "word_label"]


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


def plot_token_kl_text(rows: Sequence[Any], *, labels: Sequence[str] | None = None, ax: Any = None,
                       vmax: float | None = None, title: str | None = None) -> Any:
    """Texts written word by word, each word on a background shaded by the exact KL at its position
    (the colour map of section 12's heat maps, :data:`~kltutorial.plotting.diagnostics.HEATMAP_CMAP`,
    from 0 to ``vmax``, by default the largest KL shown), with a colour bar in nats.

    Parameters
    ----------
    rows : sequence of TokenKL
        From :func:`~kltutorial.textrlhf.token_kl`: each text's tokens and the KL at each.
    labels : sequence of str, optional
        A label printed before each text.
    ax : Axes, optional
    vmax : float, optional
    title : str, optional

    Returns
    -------
    Axes
    """
    if not isinstance(rows, Sequence) or len(rows) == 0:
        raise TypeError("rows: expected a non-empty sequence of TokenKL (from token_kl)")
    if labels is not None and len(labels) != len(rows):
        raise ValueError(f"labels: expected {len(rows)} labels, got {len(labels)}")
    top = float(max(float(np.max(r.kl)) for r in rows)) if vmax is None else float(vmax)
    if not top > 0:
        raise ValueError(f"vmax must be > 0 (the largest KL shown), got {top}")
    cmap = plt.get_cmap(HEATMAP_CMAP)
    norm = mcolors.Normalize(vmin=0.0, vmax=top)
    ax = new_axes(ax, figsize=fig_size(0.55 * len(rows) + 1.0))
    fig = ax.figure
    ax.set_xlim(0, 1)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.axis("off")
    fig.canvas.draw()  # text extents need a renderer
    renderer = fig.canvas.get_renderer()
    to_axes = ax.transAxes.inverted()
    for i, row in enumerate(rows):
        x = 0.0
        if labels is not None:
            label = ax.text(x, i, labels[i], va="center", ha="left", fontsize=9, color=REFERENCE_COLOR,
                            transform=ax.get_yaxis_transform())
            x += _width(label, renderer, to_axes) + 0.01
        for token, kl in zip(row.tokens, row.kl, strict=True):
            word = word_label(token)
            if token.startswith("##"):  # a punctuation mark: against the word before
                x -= 0.004
            shade = cmap(norm(float(kl)))
            dark = mcolors.rgb_to_hsv(shade[:3])[2] < 0.6
            t = ax.text(x, i, word, va="center", ha="left", fontsize=10, transform=ax.get_yaxis_transform(),
                        color="white" if dark else "black",
                        bbox={"boxstyle": "square,pad=0.15", "facecolor": shade, "edgecolor": "none"})
            x += _width(t, renderer, to_axes) + 0.006
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, orientation="horizontal",
                       fraction=0.08, pad=0.02, aspect=40)
    bar.set_label("KL(π(·|words before) ‖ π_ref(·|words before)) at the word (nats)")
    if title:
        ax.set_title(title)
    return ax


def _width(text: Any, renderer: Any, to_axes: Any) -> float:
    """The width of a drawn text in axes coordinates."""
    box = text.get_window_extent(renderer=renderer)
    (x0, _), (x1, _) = to_axes.transform([(box.x0, box.y0), (box.x1, box.y1)])
    return float(x1 - x0)
