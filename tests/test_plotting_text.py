"""Tests of kltutorial.plotting.text (the real-text chapter's figures): what each figure draws.

The stand-ins have the attributes of ``textrlhf.TextTrainResult`` and ``textrlhf.TokenKL`` the figures
read, with numbers chosen so that what is drawn can be checked by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pytest

from kltutorial import plotting
from kltutorial.plotting.diagnostics import HEATMAP_CMAP


@dataclass(frozen=True)
class Config:
    beta: float


@dataclass(frozen=True)
class Run:  # the attributes of textrlhf.TextTrainResult the figures read
    config: Config
    gold: np.ndarray
    proxy: np.ndarray
    kl: np.ndarray
    distinct_2: np.ndarray


@dataclass(frozen=True)
class Row:  # textrlhf.TokenKL
    tokens: tuple[str, ...]
    kl: np.ndarray


def _run(beta: float, steps: int = 6) -> Run:
    s = np.arange(steps + 1, dtype=float)
    return Run(Config(beta), gold=0.1 * s, proxy=0.2 * s, kl=s / (1 + 10 * beta), distinct_2=0.9 - 0.1 * s)


def test_text_runs_draws_gold_kl_and_distinct_2_per_run():
    runs = {"β = 0": _run(0.0), "β = 0.05": _run(0.05)}
    axes = plotting.plot_text_runs(runs)
    assert len(axes) == 3
    for ax, field in zip(axes, ("gold", "kl", "distinct_2"), strict=True):
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == list(runs)
        for line, run in zip(lines, runs.values(), strict=True):
            assert np.array_equal(line.get_xdata(), np.arange(7))
            assert np.array_equal(line.get_ydata(), getattr(run, field))
    assert axes[1].get_yscale() == "symlog"
    with pytest.raises(TypeError, match="non-empty dict"):
        plotting.plot_text_runs({})
    with pytest.raises(TypeError, match="TextTrainResult"):
        plotting.plot_text_runs({"x": object()})


def test_overoptimisation_draws_proxy_and_gold_per_step_and_marks_the_peaks():
    runs = {"β = 0": _run(0.0), "β = 0.05": _run(0.05)}
    axes = plotting.plot_text_overoptimisation(runs, {"β = 0": 3})
    for ax, field in zip(axes, ("proxy", "gold"), strict=True):
        lines = ax.get_lines()
        paths = [line for line in lines if line.get_linestyle() != "None"]
        marks = [line for line in lines if line.get_linestyle() == "None"]
        assert len(paths) == 2 and len(marks) == 1
        assert np.array_equal(paths[1].get_xdata(), np.arange(7))
        assert np.array_equal(paths[1].get_ydata(), getattr(runs["β = 0.05"], field))
        assert marks[0].get_xdata()[0] == 3 and marks[0].get_ydata()[0] == getattr(runs["β = 0"], field)[3]
    with pytest.raises(ValueError, match="labels that are not runs"):
        plotting.plot_text_overoptimisation(runs, {"β = 1": 0})


def test_token_kl_text_writes_each_word_on_its_kls_shade():
    rows = [Row(("many", "hands", "##.", "</s>"), np.array([0.0, 1.0, 2.0, 0.5])),
            Row(("i", "love"), np.array([0.25, 2.0]))]
    ax = plotting.plot_token_kl_text(rows, labels=["a", "b"])
    texts = [t for t in ax.texts if t.get_text() not in ("a", "b")]
    assert [t.get_text() for t in texts] == ["many", "hands", ".", "</s>", "i", "love"]
    expected = plt.get_cmap(HEATMAP_CMAP)(np.array([0.0, 0.5, 1.0, 0.25, 0.125, 1.0]))
    shades = np.array([t.get_bbox_patch().get_facecolor() for t in texts])
    assert np.allclose(shades, expected)
    xs = [t.get_position()[0] for t in texts[:4]]
    assert xs == sorted(xs) and len(set(xs)) == 4  # left to right, none on top of another
    assert plotting.word_label("##,") == "," and plotting.word_label("love") == "love"
    with pytest.raises(ValueError, match="labels: expected 2"):
        plotting.plot_token_kl_text(rows, labels=["a"])
    with pytest.raises(ValueError, match="vmax must be > 0"):
        plotting.plot_token_kl_text([Row(("a",), np.array([0.0]))])
    with pytest.raises(TypeError, match="non-empty sequence of TokenKL"):
        plotting.plot_token_kl_text([])
