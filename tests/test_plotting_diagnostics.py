"""Tests of kltutorial.plotting.diagnostics (§12's figures): what each figure draws.

The stand-ins have the attributes of ``diagnostics.TokenKLTable`` and ``diagnostics.SpikeReport`` that the
figures read, with numbers chosen so that what is drawn can be checked by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from kltutorial.monitoring import detect_spikes
from kltutorial.plotting import diagnostics as pd
from kltutorial.plotting.style import FIG_WIDTH


@dataclass(frozen=True)
class Table:  # the attributes of diagnostics.TokenKLTable the heat map reads
    tokens: np.ndarray
    k1: np.ndarray
    kl: np.ndarray

    @property
    def sequence_k1(self) -> np.ndarray:
        return self.k1.sum(-1)

    @property
    def sequence_kl(self) -> np.ndarray:
        return self.kl.sum(-1)


TABLE = Table(tokens=np.array([[0, 2, 1], [1, 1, 0]]),
              k1=np.array([[0.5, -0.25, 1.0], [-1.0, 0.0, 0.25]]),
              kl=np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]))


def test_heatmap_draws_both_quantities_with_token_labels():
    axes = pd.plot_token_kl_heatmap(TABLE, vocab=["a", "b", "!"])
    assert axes.shape == (2,)
    assert axes[0].figure.get_size_inches()[0] == pytest.approx(FIG_WIDTH)
    for ax, values in zip(axes, (TABLE.k1, TABLE.kl), strict=True):
        (image,) = ax.images
        np.testing.assert_array_equal(image.get_array(), values)
        assert image.get_cmap().name == pd.HEATMAP_CMAP
        assert [t.get_text() for t in ax.texts] == ["a", "!", "b", "b", "b", "a"]
        assert "position" in ax.get_xlabel()
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["1.25", "-0.75"]  # the k1 sums
    assert [t.get_text() for t in axes[1].get_yticklabels()] == ["0.60", "1.50"]  # the KL sums
    # every colour bar names its quantity and its unit
    labels = [a.get_xlabel() for a in axes[0].figure.axes if a not in axes]
    assert len(labels) == 2 and all("nats" in label for label in labels)


def test_heatmap_text_stays_readable():
    axes = pd.plot_token_kl_heatmap(TABLE, vocab=["a", "b", "!"])
    colours = [t.get_color() for t in axes[0].texts]
    # the largest value (1.0, light end of the map) gets dark text, the smallest (-1.0) white text
    assert colours[2] == "black" and colours[3] == "white"


def test_heatmap_rejects_mismatched_input():
    with pytest.raises(ValueError, match="vocab"):
        pd.plot_token_kl_heatmap(TABLE, vocab=["a", "b"])
    bad = Table(tokens=TABLE.tokens, k1=TABLE.k1[:, :2], kl=TABLE.kl)
    with pytest.raises(ValueError, match="one"):
        pd.plot_token_kl_heatmap(bad, vocab=["a", "b", "!"])


def _report():
    x = 1.0 + 0.01 * np.sin(np.arange(40.0))
    x[[25, 30]] += 1.0
    return detect_spikes(x, window=10, threshold=6.0), detect_spikes(x, window=10, threshold=6.0,
                                                                      centre="mean")


def test_spike_log_draws_the_series_its_median_and_the_flags():
    report, naive = _report()
    exact = np.ones(40)
    axes = pd.plot_spike_log(report, exact=exact, compare=naive)
    assert axes.shape == (1,)
    ax = axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    np.testing.assert_array_equal(lines["logged value"].get_ydata(), report.values)
    np.testing.assert_array_equal(lines["rolling median of the steps before"].get_ydata(), report.median)
    np.testing.assert_array_equal(lines["exact KL"].get_ydata(), exact)
    flagged = lines["flagged (median and MAD)"]
    np.testing.assert_array_equal(flagged.get_xdata(), [25, 30])
    np.testing.assert_array_equal(lines["flagged (mean and standard deviation)"].get_xdata(), naive.indices)
    assert "nats" in ax.get_ylabel() and ax.get_xlabel() == "step"
    lo, hi = ax.get_ylim()
    assert lo < report.values.min() and hi > report.values.max()


def test_spike_log_gap_panel():
    report, _ = _report()
    gap = np.zeros(40)
    gap[25] = 2.0
    axes = pd.plot_spike_log(report, gap=gap, gap_se=np.full(40, 0.1))
    assert axes.shape == (2,)
    (line,) = [ln for ln in axes[1].lines if ln.get_label() == "k1 − k3"]
    np.testing.assert_array_equal(line.get_ydata(), gap)
    assert "nats" in axes[1].get_ylabel() and axes[1].get_xlabel() == "step"
    assert axes[0].figure.get_size_inches()[0] == pytest.approx(FIG_WIDTH)


def test_spike_log_legends_stay_off_the_data(house_style):
    # The series' legend sits above its panel, where the band cannot reach (it leaves the panel at a
    # change of level); the gap's legend under its panel's x label.
    report, naive = _report()
    gap = np.zeros(40)
    gap[25] = 2.0
    axes = pd.plot_spike_log(report, exact=np.ones(40), compare=naive, gap=gap, gap_se=np.full(40, 0.1))
    fig = axes[0].figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    top = axes[0].get_legend().get_window_extent(renderer)
    assert top.y0 >= axes[0].bbox.y1 - 1e-6
    (band,) = axes[0].collections
    assert not top.overlaps(band.get_window_extent(renderer))
    bottom = axes[1].get_legend().get_window_extent(renderer)
    assert bottom.y1 <= axes[1].xaxis.get_tightbbox(renderer).y0 + 1e-6
    for legend in (top, bottom):  # inside the figure
        assert fig.bbox.x0 <= legend.x0 and legend.x1 <= fig.bbox.x1
        assert fig.bbox.y0 <= legend.y0 and legend.y1 <= fig.bbox.y1
    # no room kept inside the panel for a legend: the data fill most of the height
    lo, hi = axes[0].get_ylim()
    span = report.values.max() - report.values.min()
    assert hi - lo < 1.5 * span


def test_spike_log_single_panel_legend_above(house_style):
    report, _ = _report()
    (ax,) = pd.plot_spike_log(report)
    ax.figure.canvas.draw()
    legend = ax.get_legend().get_window_extent(ax.figure.canvas.get_renderer())
    assert legend.y0 >= ax.bbox.y1 - 1e-6 and legend.y1 <= ax.figure.bbox.y1


def test_memory_by_vocab_draws_one_line_per_method_and_the_logits():
    vocab = [32_000, 64_000, 128_000]
    extra = {"unfused": [250.0, 500.0, 1000.0], "tiles": [3.0, 3.0, 3.1]}
    ax = pd.plot_memory_by_vocab(vocab, extra, [125.0, 250.0, 500.0])
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["one float32 logits tensor (N × V)", "unfused", "tiles"]
    np.testing.assert_allclose(lines[2].get_ydata(), [3.0, 3.0, 3.1])
    np.testing.assert_allclose(lines[0].get_xdata(), [32.0, 64.0, 128.0])  # thousands
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["32k", "64k", "128k"]
    assert ax.figure.get_size_inches()[0] == FIG_WIDTH


def test_memory_by_vocab_rejects_mismatched_series():
    with pytest.raises(ValueError, match="extra_mib"):
        pd.plot_memory_by_vocab([1, 2], {"a": [1.0]}, [1.0, 2.0])
    with pytest.raises(ValueError, match="vocab"):
        pd.plot_memory_by_vocab([1], {"a": [1.0]}, [1.0])


def test_memory_by_vocab_labels_the_memory_axis_in_plain_numbers():
    ax = pd.plot_memory_by_vocab([32_000, 64_000], {"a": [3.0, 3000.0]}, [100.0, 200.0])
    ax.figure.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "10" in labels and "1,000" in labels
