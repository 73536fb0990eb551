"""Tests of kltutorial.plotting.control_study: what each §7 figure draws, and bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

from kltutorial.controllers import AdaptiveKLController, DoublingKLController
from kltutorial.plotting.control_study import plot_gain_sweep, plot_rules_on_plant, plot_step_response
from kltutorial.studies.control import StepMetrics, measure_step, simulate_step_response
from kltutorial.studies.dynamics import simulate_training_with_controller


def _response():
    before = [AdaptiveKLController(0.2, 6.0, h) for h in (100.0, 10.0)]
    after = [AdaptiveKLController(0.2, 4.0, h) for h in (100.0, 10.0)]
    return simulate_step_response(before, after, 5, 40, 4, np.random.default_rng(0))


def test_step_response_draws_target_and_one_median_per_row():
    res = _response()
    ax_kl, ax_beta = plot_step_response(res, ["slow", "fast"])
    labels = [line.get_label() for line in ax_kl.get_lines()]
    assert "target" in labels and "slow" in labels and "fast" in labels
    target = next(line for line in ax_kl.get_lines() if line.get_label() == "target")
    np.testing.assert_array_equal(target.get_ydata(), res.target)
    assert ax_beta.get_yscale() == "log"
    for ax in (ax_kl, ax_beta):
        assert ax.get_xlabel() and ax.get_ylabel()
    assert tuple(ax_kl.figure.get_size_inches())[0] == pytest.approx(7.0)


def test_gain_sweep_marks_critical_gain_and_unsettled_runs():
    gains = np.array([0.01, 0.1, 1.0])
    metrics = StepMetrics(rise_time=np.array([50.0, 10.0, 3.0]), overshoot=np.array([0.0, 0.2, 1.9]),
                          settling_time=np.array([80.0, 60.0, np.nan]))
    axes = plot_gain_sweep(gains, metrics, np.array([0.8, 0.8, 0.1]), critical=0.02,
                           marks={"batch 512": 0.05})
    assert len(axes) == 3 and all(ax.get_xscale() == "log" for ax in axes)
    np.testing.assert_allclose(axes[0].get_lines()[0].get_ydata(), [0.0, 20.0, 190.0])
    labels = [line.get_label() for line in axes[1].get_lines()]
    assert "never settles" in labels
    legend_texts = [t.get_text() for t in axes[0].figure.legends[0].get_texts()]
    assert any("critical" in t for t in legend_texts)
    assert any(t.get_text().strip() == "batch 512" for t in axes[0].texts)


def test_rules_on_plant_shades_window_and_checks_targets():
    runs = {
        "p": simulate_training_with_controller(AdaptiveKLController(0.1, 6.0, 100.0), n_steps=30,
                                               n_seeds=5, rng=np.random.default_rng(0)),
        "d": simulate_training_with_controller(DoublingKLController(0.1, 6.0), n_steps=30, n_seeds=5,
                                               rng=np.random.default_rng(0)),
    }
    ax_kl, ax_beta = plot_rules_on_plant(runs, window=(20, 30))
    assert ax_beta.get_yscale() == "log"
    assert {"p", "d"} <= {line.get_label() for line in ax_kl.get_lines()}
    runs["x"] = simulate_training_with_controller(DoublingKLController(0.1, 5.0), n_steps=30, n_seeds=5,
                                                  rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="target"):
        plot_rules_on_plant(runs, window=(20, 30))


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: plot_step_response("x", ["a"]), TypeError),
        (lambda: plot_step_response(_response(), ["one name"]), ValueError),
        (lambda: plot_step_response(_response(), ["a", "b"], band=(0.9, 0.1)), ValueError),
        (lambda: plot_gain_sweep(np.array([0.1]), measure_step(np.ones(3), 1.0, 2.0, 1), np.ones(1),
                                 critical=0.1), ValueError),
        (lambda: plot_gain_sweep(np.array([0.1, 1.0]), "m", np.ones(2), critical=0.1), ValueError),
        (lambda: plot_rules_on_plant({}, window=(0, 1)), TypeError),
    ],
)
def test_bad_inputs(call, error):
    with pytest.raises(error):
        call()


def _notebook_like_sweep():
    # the gains, marks and critical gain of §7's figure: the smallest batch's line is near the critical one
    gains = np.array([0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 4.0, 5.0, 6.0, 8.0, 20.0])
    metrics = StepMetrics(rise_time=np.geomspace(1500.0, 2.0, gains.size),
                          overshoot=np.array([0, 0, 0.05, 0.2, 0.3, 0.45, 0.47, 0.4, 0.48, 1.9, 1.95, 1.95]),
                          settling_time=np.array([1500, 700, 300, 150, 140, 140, 150, 150, 240, np.nan,
                                                  np.nan, np.nan]))
    on_target = np.array([0.81] * 8 + [0.7, 0.3, 0.09, 0.07])
    marks = {"batch 64": 0.0064, "batch 512": 0.0512, "batch 2,048": 0.2048, "g = 5": 5.0}
    return plot_gain_sweep(gains, metrics, on_target, critical=0.0089, marks=marks), marks


def test_gain_sweep_labels_are_readable_and_clear_of_the_lines(house_style):
    axes, marks = _notebook_like_sweep()
    ax_o = axes[0]
    fig = ax_o.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = {t.get_text(): t for t in ax_o.texts}
    assert set(labels) == set(marks)
    tick_size = min(t.get_fontsize() for t in ax_o.get_xticklabels() + ax_o.get_yticklabels())
    assert tick_size >= 10
    # every vertical line of the panel (the critical gain and the marks), in pixels
    line_x = [ax_o.transData.transform((float(np.asarray(ln.get_xdata())[0]), 0))[0]
              for ln in ax_o.lines if ln.get_linestyle() in ("--", ":")]
    assert len(line_x) == 1 + len(marks)
    boxes = {}
    for name, g in marks.items():
        text = labels[name]
        assert text.get_fontsize() >= tick_size
        box = text.get_window_extent(renderer)
        boxes[name] = box
        x = ax_o.transData.transform((g, 0))[0]
        assert box.x1 <= x - 2  # left of its own line, with a gap
        assert not any(box.x0 - 1 <= lx <= box.x1 + 1 for lx in line_x)  # on no line at all
        assert ax_o.bbox.y0 <= box.y0 and box.y1 <= ax_o.bbox.y1  # inside the panel
        # above the overshoot curve everywhere under the label
        (curve,) = [ln for ln in ax_o.lines if ln.get_linestyle() == "-"]
        pts = ax_o.transData.transform(np.column_stack([curve.get_xdata(), curve.get_ydata()]))
        under = (pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1)
        assert np.all(pts[under, 1] < box.y0)
    names = list(boxes)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not boxes[a].overlaps(boxes[b])


def test_gain_sweep_legends_and_axis_labels(house_style):
    axes, _ = _notebook_like_sweep()
    ax_o, ax_t, ax_s = axes
    fig = ax_o.figure
    # the on-target axis names its unit once
    assert ax_s.get_ylabel().count("%") == 1 and "(%)" in ax_s.get_ylabel()
    assert "10 %" in ax_s.get_title()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    times = ax_t.get_legend().get_window_extent(renderer)
    assert times.y1 <= ax_t.xaxis.get_tightbbox(renderer).y0 + 1e-6  # under the panel: on no curve
    (shared,) = fig.legends
    shared_box = shared.get_window_extent(renderer)
    assert not shared_box.overlaps(times) and shared_box.y1 <= times.y0 + 1e-6
    for ax in axes:
        assert not shared_box.overlaps(ax.get_tightbbox(renderer))
    for legend in (ax_t.get_legend(), shared):
        assert min(t.get_fontsize() for t in legend.get_texts()) >= 9
    assert fig.bbox.y0 <= shared_box.y0
