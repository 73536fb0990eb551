"""Tests of kltutorial.plotting.control_study: what each §7 figure draws, and bad inputs."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from kltutorial.control_study import StepMetrics, measure_step, simulate_step_response
from kltutorial.controllers import AdaptiveKLController, DoublingKLController
from kltutorial.plotting.control_study import plot_gain_sweep, plot_rules_on_plant, plot_step_response
from kltutorial.simulate import simulate_training_with_controller


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


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
