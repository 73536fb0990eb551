"""Figures of book section 12, diagnostics (:mod:`kltutorial.monitoring`,
:mod:`kltutorial.studies.diagnostics`).

* :func:`plot_token_kl_heatmap`: per-token KL of sampled sequences, sequences by positions, each cell
  labelled with its token: the sampled k1 beside the exact KL of the next-token distributions;
* :func:`plot_spike_log`: a logged KL series with the rolling median, the band a spike must leave and the
  steps flagged by :func:`kltutorial.monitoring.detect_spikes`, above the k1 - k3 gap of every step;
* :func:`plot_memory_by_vocab`: the extra peak memory of computing log-probs (and their gradients)
  against the vocabulary size, one line per method, beside the size of the logits themselves.

They take result objects (``TokenKLTable``, ``SpikeReport``) and plain arrays, never a model or a sampler.
Heat maps use ``cividis``, whose lightness rises monotonically, so they read in grayscale and for
colour-blind readers; every colour bar names its quantity and unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.ticker import FuncFormatter

from .style import (
    PALETTE,
    REFERENCE_COLOR,
    ZONE_COLOR,
    fig_size,
    legend_below,
    new_axes,
    new_axes_grid,
    series_style,
)

__all__ = ["HEATMAP_CMAP", "plot_token_kl_heatmap", "plot_spike_log", "plot_memory_by_vocab"]

#: Perceptually uniform, monotonic in lightness, designed for colour-vision deficiencies.
HEATMAP_CMAP = "cividis"


def _heatmap(ax: Any, values: np.ndarray, tokens: np.ndarray, vocab: Sequence[str], label: str) -> None:
    """One panel: ``values`` (B, T) as cells coloured by value, each labelled with its token."""
    norm = Normalize(vmin=float(values.min()), vmax=float(values.max()))
    image = ax.imshow(values, cmap=HEATMAP_CMAP, norm=norm, aspect="auto", interpolation="nearest")
    for (i, t), v in np.ndenumerate(values):
        # dark text on the light half of the map, white on the dark half
        ax.text(t, i, vocab[int(tokens[i, t])], ha="center", va="center", fontsize=8.5,
                color="black" if norm(v) > 0.55 else "white")
    colorbar = ax.figure.colorbar(image, ax=ax, location="bottom", fraction=0.05, pad=0.02, aspect=30)
    colorbar.set_label(label)
    ax.set_xticks(range(values.shape[1]), [str(t + 1) for t in range(values.shape[1])])
    ax.xaxis.set_ticks_position("top")
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("position t")
    ax.grid(False)




def plot_token_kl_heatmap(
    table: Any,
    *,
    vocab: Sequence[str],
    axes: Any = None,
    title: str | None = None,
) -> np.ndarray:
    """Per-token KL of sampled sequences (§12): sampled k1 (left) and exact next-token KL (right).

    Rows are the sequences in the order of the table (``table.sorted()`` puts the largest k1 sum on top),
    columns the positions; each cell shows its token. The y axis is labelled with each sequence's sum
    (its k1 sum on the left, its summed next-token KL on the right).

    Parameters
    ----------
    table : TokenKLTable
        From :func:`kltutorial.studies.diagnostics.token_kl_table`: ``tokens``, ``k1``, ``kl`` of shape
        (B, T) and their per-sequence sums ``sequence_k1``, ``sequence_kl``.
    vocab : sequence of str
        The text of each token id.
    axes : 2 Axes, optional
    title : str, optional

    Returns
    -------
    ndarray of Axes, shape (2,)
    """
    tokens = np.asarray(table.tokens)
    k1, kl = np.asarray(table.k1, dtype=float), np.asarray(table.kl, dtype=float)
    if tokens.ndim != 2 or k1.shape != tokens.shape or kl.shape != tokens.shape:
        raise ValueError(f"table: tokens, k1 and kl must share one (B, T) shape, got {tokens.shape}, "
                         f"{k1.shape} and {kl.shape}")
    if tokens.min() < 0 or tokens.max() >= len(vocab):
        raise ValueError(f"vocab: {len(vocab)} entries cannot label token ids up to {int(tokens.max())}")
    B = tokens.shape[0]
    flat = new_axes_grid(axes, 1, 2, figsize=fig_size(max(3.0, 1.8 + 0.2 * B)))
    panels = [
        (k1, np.asarray(table.sequence_k1, dtype=float), "sampled k1 = log π − log π_ref (nats)",
         "sampled k1 of each token", "sequence, sum of k1 (nats)"),
        (kl, np.asarray(table.sequence_kl, dtype=float), "exact next-token KL (nats)",
         "KL of the next-token distributions", "sequence, sum of exact KL (nats)"),
    ]
    for ax, (values, sums, cbar_label, panel_title, ylabel) in zip(flat, panels, strict=True):
        _heatmap(ax, values, tokens, vocab, cbar_label)
        ax.set_yticks(range(B), [f"{s:.2f}" for s in sums])
        ax.tick_params(axis="y", labelsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(panel_title, pad=8)
    if title:
        flat[0].figure.suptitle(title)
    return flat


def plot_spike_log(
    report: Any,
    *,
    exact: np.ndarray | None = None,
    gap: np.ndarray | None = None,
    gap_se: np.ndarray | None = None,
    compare: Any = None,
    gap_band: float = 4.0,
    axes: Any = None,
    ylabel: str = "batch mean of sequence k1 (nats)",
) -> np.ndarray:
    """A logged KL series and its spikes (§12), with the k1 - k3 gap of every step below it.

    Top: the series, its rolling median, the band ``median ± threshold * scale`` that a step must leave
    to be flagged, the flagged steps, and optionally the exact KL and the steps another detector flags;
    its legend sits above the panel, clear of the band (which leaves the panel at a change of level).
    Bottom (when ``gap`` is given): k1 - k3 per step with a band of ``± gap_band * gap_se``; on tokens
    sampled from the policy the gap is 0 in expectation; its legend sits under the panel.

    Parameters
    ----------
    report : SpikeReport
        From :func:`kltutorial.monitoring.detect_spikes`: ``values``, ``median``, ``scale``, ``flags``,
        ``threshold`` (arrays of shape (N,)).
    exact : ndarray, shape (N,), optional
        The exact KL at every step, drawn dashed.
    gap, gap_se : ndarray, shape (N,), optional
        k1 - k3 and its standard error at every step.
    compare : SpikeReport, optional
        Another detector's result on the same series; its flags are drawn as open squares.
    gap_band : float
        Width of the gap's band in standard errors.
    axes : 1 or 2 Axes, optional
    ylabel : str

    Returns
    -------
    ndarray of Axes, shape (1,) or (2,)
    """
    values = np.asarray(report.values, dtype=float)
    steps = np.arange(values.size)
    rows = 1 if gap is None else 2
    flat = new_axes_grid(axes, rows, 1, figsize=fig_size(3.9 if rows == 1 else 5.6), sharex=True,
                         **({} if rows == 1 else {"gridspec_kw": {"height_ratios": [2.2, 1]}}))
    ax = flat[0]
    lo = report.median - report.threshold * report.scale
    hi = report.median + report.threshold * report.scale
    ax.fill_between(steps, lo, hi, color=ZONE_COLOR, alpha=0.25, linewidth=0,
                    label=f"median ± {report.threshold:g} × robust scale")
    ax.plot(steps, values, color=PALETTE[0], linestyle="-", linewidth=1.0, label="logged value")
    ax.plot(steps, report.median, color=REFERENCE_COLOR, linestyle="--", linewidth=1.2,
            label="rolling median of the steps before")
    if exact is not None:
        ax.plot(steps, np.asarray(exact, dtype=float), color=PALETTE[2], linestyle=":", linewidth=2.0,
                label="exact KL")
    flags = np.asarray(report.flags, dtype=bool)
    ax.plot(steps[flags], values[flags], linestyle="none", marker="v", markersize=8, color=PALETTE[1],
            markeredgecolor="black", markeredgewidth=0.5, label="flagged (median and MAD)")
    if compare is not None:
        other = np.asarray(compare.flags, dtype=bool)
        ax.plot(steps[other], values[other], linestyle="none", marker="s", markersize=12,
                markerfacecolor="none", markeredgecolor=PALETTE[3], markeredgewidth=1.5,
                label="flagged (mean and standard deviation)")
    ax.set_ylabel(ylabel)
    # the band is as wide as the window's spread, which is huge while the window straddles a change of
    # level (it leaves the panel there): scale the axis to the data
    shown = values if exact is None else np.concatenate([values, np.asarray(exact, dtype=float)])
    lo_y, hi_y = float(shown.min()), float(shown.max())
    span = max(hi_y - lo_y, 1e-9)
    ax.set_ylim(lo_y - 0.1 * span, hi_y + 0.3 * span)
    # no corner of the panel is sure to be free (the band reaches the top at a change of level): the
    # legend goes above the panel, in two columns; constrained layout makes room for it
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2)
    if gap is not None:
        gx = flat[1]
        g = np.asarray(gap, dtype=float)
        if gap_se is not None:
            band = gap_band * np.asarray(gap_se, dtype=float)
            gx.fill_between(steps, -band, band, color=ZONE_COLOR, alpha=0.25, linewidth=0,
                            label=f"± {gap_band:g} standard errors")
        gx.axhline(0.0, color=REFERENCE_COLOR, linewidth=0.8)
        gx.plot(steps, g, color=PALETTE[0], linewidth=1.0, label="k1 − k3")
        gx.set_ylabel("k1 − k3 (nats)")
    flat[-1].set_xlabel("step")
    if gap is not None:  # under the panel (after its x label, which it clears): the band may fill it
        gx.legend(ncol=2, **legend_below(gx))
    return flat


def plot_memory_by_vocab(
    vocab: Sequence[int] | np.ndarray,
    extra_mib: dict[str, Sequence[float] | np.ndarray],
    logits_mib: Sequence[float] | np.ndarray,
    *,
    ax: Any = None,
) -> Any:
    """Extra peak memory against the vocabulary size V, log-log, one line per method (§12).

    Parameters
    ----------
    vocab : sequence of int, shape (K,)
        The vocabulary sizes measured.
    extra_mib : dict of str to sequence, each of shape (K,)
        Label of each method -> its peak memory above the inputs and the gradients it returns, in MiB.
    logits_mib : sequence, shape (K,)
        The size of one float32 logits tensor at each V, drawn as a grey reference line.
    ax : Axes, optional

    Returns
    -------
    Axes
    """
    v = np.asarray(vocab, dtype=float)
    if v.ndim != 1 or v.size < 2 or np.any(v <= 0):
        raise ValueError(f"vocab must be at least two positive sizes, got {vocab!r}")
    ax = new_axes(ax, figsize=fig_size(3.9))
    ax.plot(v / 1000, np.asarray(logits_mib, dtype=float), color=REFERENCE_COLOR, linestyle="--",
            linewidth=1.2, label="one float32 logits tensor (N × V)")
    for i, (label, y) in enumerate(extra_mib.items()):
        y = np.asarray(y, dtype=float)
        if y.shape != v.shape:
            raise ValueError(f"extra_mib[{label!r}] must have {v.size} values, one per V, got {y.shape}")
        ax.plot(v / 1000, y, linewidth=1.6, markersize=6, label=label, **series_style(i))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,.0f}" if y >= 1 else f"{y:g}"))
    ax.set_xticks(v / 1000, [f"{x / 1000:g}k" for x in v])
    ax.minorticks_off()
    ax.set_xlabel("vocabulary size V")
    ax.set_ylabel("extra peak memory (MiB)")
    ax.legend(**legend_below(ax))
    return ax
