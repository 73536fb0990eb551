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
    k1: np.ndarray | None = None


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
    ax.figure.canvas.draw()
    boxes = [t.get_window_extent() for t in texts[:4]]
    # left to right on one line, none on top of another, whatever the layout did to the axes
    assert all(b.x0 > a.x1 for a, b in zip(boxes, boxes[1:], strict=False))
    assert len({round(b.y0) for b in boxes}) == 1
    label = next(t for t in ax.texts if t.get_text() == "a").get_window_extent()
    assert boxes[0].x0 > label.x1
    assert plotting.word_label("##,") == "," and plotting.word_label("love") == "love"
    with pytest.raises(ValueError, match="labels: expected 2"):
        plotting.plot_token_kl_text(rows, labels=["a"])
    with pytest.raises(ValueError, match="vmax must be > 0"):
        plotting.plot_token_kl_text([Row(("a",), np.array([0.0]))])
    with pytest.raises(TypeError, match="non-empty sequence of TokenKL"):
        plotting.plot_token_kl_text([])
    with pytest.raises(ValueError, match="values must be one of"):
        plotting.plot_token_kl_text(rows, values="k3")


def test_token_kl_text_shades_k1_from_its_smallest_to_its_largest_value():
    rows = [Row(("many", "hands"), np.array([0.0, 1.0]), np.array([-1.0, 3.0])),
            Row(("i",), np.array([0.5]), np.array([1.0]))]
    ax = plotting.plot_token_kl_text(rows, values="k1")
    shades = np.array([t.get_bbox_patch().get_facecolor() for t in ax.texts])
    assert np.allclose(shades, plt.get_cmap(HEATMAP_CMAP)(np.array([0.0, 1.0, 0.5])))
    colorbar = ax.figure.axes[-1]
    assert colorbar.get_xlabel().startswith("k1 = log")


def test_position_kl_draws_each_positions_share_and_the_mean_of_the_running_responses():
    from kltutorial.textrlhf import PositionKL

    profile = PositionKL(kl=np.array([2.0, 0.5, 0.25, 0.0]), running=np.array([1.0, 1.0, 0.5, 0.0]))
    axes = plotting.plot_position_kl({"β = 0.05": profile, "β = 0": profile})
    assert len(axes) == 2
    bars = [p.get_height() for p in axes[0].patches]
    assert bars == [2.0, 0.5, 0.25, 0.0]
    [line] = axes[0].get_lines()
    assert np.array_equal(line.get_xdata(), [1, 2, 3, 4])
    assert np.allclose(line.get_ydata()[:3], [2.0, 0.5, 0.5]) and np.isnan(line.get_ydata()[3])
    assert axes[0].get_title() == "β = 0.05: 2.8 nats a response"
    with pytest.raises(TypeError, match="PositionKL"):
        plotting.plot_position_kl({"a": np.zeros(3)})
    with pytest.raises(TypeError, match="non-empty dict"):
        plotting.plot_position_kl({})


@dataclass(frozen=True)
class TRLRun:  # textrlhf.trl_run.TRLTextResult
    trl_step: np.ndarray
    trl_kl: np.ndarray
    trl_reward: np.ndarray
    monitor_step: np.ndarray
    monitor: dict


def test_trl_text_run_sets_each_of_trls_numbers_at_the_policy_it_measured():
    run = TRLRun(trl_step=np.array([1, 2, 3]), trl_kl=np.array([0.0, 0.1, 0.2]),
                 trl_reward=np.array([0.1, 0.2, 0.3]), monitor_step=np.array([0, 1, 2, 3]),
                 monitor={"exact_kl_per_token": np.array([0.0, 0.12, 0.18, 0.25])})
    own = _run(0.05, steps=3)
    left, right = plotting.plot_trl_text_run(run, own=own)
    trl_line, exact_line = left.get_lines()
    assert np.array_equal(trl_line.get_xdata(), [0, 1, 2])  # the policy before each step's update
    assert np.array_equal(exact_line.get_xdata(), [0, 1, 2, 3])
    assert np.array_equal(exact_line.get_ydata(), run.monitor["exact_kl_per_token"])
    trl_gold, own_gold = right.get_lines()
    assert np.array_equal(trl_gold.get_ydata(), run.trl_reward)
    assert np.array_equal(own_gold.get_ydata(), own.gold)
    assert len(plotting.plot_trl_text_run(run)[1].get_lines()) == 1
    with pytest.raises(TypeError, match="TRLTextResult"):
        plotting.plot_trl_text_run(own)
    with pytest.raises(TypeError, match="TextTrainResult"):
        plotting.plot_trl_text_run(run, own=run)


@dataclass(frozen=True)
class LoggedRun:  # the attributes of textrlhf.TextTrainResult that plot_logged_kl_estimates reads
    kl: np.ndarray
    k1: np.ndarray
    k3: np.ndarray


def test_logged_kl_estimates_draw_each_runs_three_kls_in_its_own_panel():
    near = LoggedRun(kl=np.array([0.0, 1.0, 2.0]), k1=np.array([0.0, 1.2, 1.9]), k3=np.array([0.0, 0.9, 2.1]))
    far = LoggedRun(kl=np.array([0.0, 5.0]), k1=np.array([0.0, 5.5]), k3=np.array([0.0, 30.0]))
    left, right = plotting.plot_logged_kl_estimates({"β = 0.2": near, "β = 0.01": far})
    assert (left.get_title(), right.get_title()) == ("β = 0.2", "β = 0.01")
    for ax, run in ((left, near), (right, far)):
        exact, k1, k3 = ax.get_lines()
        assert [np.asarray(line.get_ydata()).tolist() for line in (exact, k1, k3)] == [
            run.kl.tolist(), run.k1.tolist(), run.k3.tolist()]
        assert exact.get_linewidth() > k1.get_linewidth()  # the exact KL is the thick line
        assert len({exact.get_color(), k1.get_color(), k3.get_color()}) == 3
    with pytest.raises(TypeError, match="non-empty dict"):
        plotting.plot_logged_kl_estimates({})
    with pytest.raises(TypeError, match=r"\.k1 and \.k3"):
        plotting.plot_logged_kl_estimates({"a": _run(0.1)})
