"""Tests of kltutorial.plotting.controllers: what each controller figure draws, and the 2 x 2 layout
that §10 and §11 share."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.patches import Rectangle

from kltutorial import plotting
from kltutorial.controllers import (
    ControllerHistory,
    DoublingKLController,
    ExponentialKLController,
    FixedKLController,
)
from kltutorial.plotting import ControlTrace
from kltutorial.studies.dynamics import simulate_training_with_controller


def _labelled(ax):
    return bool(ax.get_xlabel()) and bool(ax.get_ylabel())


def _history(controller, kls):
    for kl in kls:
        controller.update(kl)
    return controller.history


def test_controller_dynamics_single_and_several():
    kls = [2.0, 3.0, 9.5, 12.0, 6.0, 5.0]
    hist = _history(DoublingKLController(), kls)
    axes = plotting.plot_controller_dynamics(hist, target_kl=6.0)
    ax_kl, ax_beta = axes
    assert ax_kl.figure is ax_beta.figure
    assert _labelled(ax_kl) and _labelled(ax_beta)
    assert "nats" in ax_kl.get_ylabel() and "step" in ax_kl.get_xlabel()
    assert ax_beta.get_yscale() == "log"
    # One history line on each panel, plus the target line on the KL panel.
    assert len(ax_kl.lines) == 2 and len(ax_beta.lines) == 1
    np.testing.assert_array_equal(ax_beta.lines[0].get_ydata(), hist.beta)
    # The stable zone spans [target / 1.5, 1.5 target] in data coordinates.
    zones = [p for p in ax_kl.patches if isinstance(p, Rectangle)]
    assert len(zones) == 1
    y0, height = zones[0].get_y(), zones[0].get_height()
    assert y0 == pytest.approx(4.0) and y0 + height == pytest.approx(9.0)
    target = [ln for ln in ax_kl.lines if np.all(np.asarray(ln.get_ydata()) == 6.0)]
    assert len(target) == 1

    several = {
        "doubling": _history(DoublingKLController(), kls),
        "smooth": _history(ExponentialKLController(), kls),
        "fixed": _history(FixedKLController(0.1), kls),
    }
    ax_kl, ax_beta = plotting.plot_controller_dynamics(several, target_kl=6.0, band=2.0)
    assert len(ax_beta.lines) == 3 and len(ax_kl.lines) == 4
    assert [t.get_text() for t in ax_beta.get_legend().get_texts()] == list(several)
    zone = next(p for p in ax_kl.patches if isinstance(p, Rectangle))
    assert zone.get_y() == pytest.approx(3.0) and zone.get_y() + zone.get_height() == pytest.approx(12.0)
    colors = {ln.get_color() for ln in ax_beta.lines}
    assert len(colors) == 3


def test_controller_dynamics_draws_on_given_axes_and_validates():
    fig, axes = plt.subplots(1, 2)
    hist = ControllerHistory(kl=np.array([1.0, 2.0]), beta=np.array([0.1, 0.1, 0.1]))
    out = plotting.plot_controller_dynamics(hist, target_kl=6.0, axes=axes)
    assert out[0] is axes[0] and out[1] is axes[1]
    with pytest.raises(ValueError, match="target_kl"):
        plotting.plot_controller_dynamics(hist, target_kl=0.0)
    with pytest.raises(ValueError, match="histories"):
        plotting.plot_controller_dynamics(
            ControllerHistory(kl=np.ones(3), beta=np.ones(3)), target_kl=6.0
        )
    with pytest.raises(TypeError, match="histories"):
        plotting.plot_controller_dynamics(3.0, target_kl=6.0)


def test_fixed_vs_adaptive():
    rng_seed = 3
    fixed = simulate_training_with_controller(FixedKLController(0.1), n_steps=30, n_seeds=40,
                                              rng=np.random.default_rng(rng_seed))
    adaptive = simulate_training_with_controller(ExponentialKLController(), n_steps=30, n_seeds=40,
                                                 rng=np.random.default_rng(rng_seed))
    axes = plotting.plot_fixed_vs_adaptive({"fixed": fixed, "adaptive": adaptive})
    assert axes.shape == (2, 2)
    ax_kl, ax_beta, ax_r, ax_pr = axes.ravel()
    for ax in axes.ravel():
        assert _labelled(ax) and "step" in ax.get_xlabel()
        assert len([ln for ln in ax.lines if ln.get_label() in ("fixed", "adaptive")]) == 2
    assert ax_beta.get_yscale() == "log"
    assert "nats" in ax_kl.get_ylabel()
    target = [ln for ln in ax_kl.lines if "target" in ln.get_label()]
    assert len(target) == 1 and np.all(np.asarray(target[0].get_ydata()) == 6.0)
    assert "0.1" in ax_pr.get_title()
    adaptive_line = next(ln for ln in ax_pr.lines if ln.get_label() == "adaptive")
    np.testing.assert_allclose(adaptive_line.get_ydata(),
                               np.median(adaptive.penalized_reward[0], axis=0))


def test_fixed_vs_adaptive_needs_shared_initial_beta():
    a = simulate_training_with_controller(FixedKLController(0.1), n_steps=5, n_seeds=3,
                                          rng=np.random.default_rng(0))
    b = simulate_training_with_controller(FixedKLController(0.2), n_steps=5, n_seeds=3,
                                          rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="shared initial"):
        plotting.plot_fixed_vs_adaptive({"a": a, "b": b})


def test_fixed_vs_adaptive_draws_the_results_own_penalised_reward():
    # Rows 0 and 1 start from β₀ = 0.05 and 0.2: beta_index picks the row, and the panel shows that
    # row's penalized_reward (priced at its own β₀), not something recomputed.
    res = simulate_training_with_controller(ExponentialKLController(), init_betas=[0.05, 0.2], n_steps=20,
                                            n_seeds=15, rng=np.random.default_rng(4))
    axes = plotting.plot_fixed_vs_adaptive({"expo": res}, beta_index=1)
    ax_pr = axes[1, 1]
    assert "0.2" in ax_pr.get_title() and "0.2" in ax_pr.get_ylabel()
    np.testing.assert_allclose(ax_pr.lines[0].get_ydata(), np.median(res.penalized_reward[1], axis=0))
    # One figure legend below the panels, saying what the band is.
    (legend,) = axes[0, 0].figure.legends
    assert "median over seeds" in legend.get_title().get_text()


# ------------------------------------------------------------------------------------------
# The shared 2 x 2 layout
# ------------------------------------------------------------------------------------------


def test_control_panels_single_runs():
    steps = 10
    kl = np.linspace(0.0, 3.0, steps)
    runs = {
        "fixed": ControlTrace(kl=kl, beta=np.full(steps + 1, 0.1), reward=kl / 3,
                              penalized_reward=kl / 3 - 0.1 * kl),
        "adaptive": ControlTrace(kl=kl / 2, beta=np.geomspace(0.1, 0.4, steps + 1), reward=kl / 6,
                                 penalized_reward=kl / 6 - 0.05 * kl),
    }
    axes = plotting.plot_control_panels(runs, target_kl=2.0, penalized_of="proxy",
                                        reward_label="gold (reward units)", reward_title="gold")
    ax_kl, ax_beta, ax_r, ax_pr = axes.ravel()
    assert [ax.get_title() for ax in axes.ravel()] == [
        "KL against its target", "KL coefficient β", "gold", "proxy penalised at the shared β₀ = 0.1"]
    assert ax_beta.get_yscale() == "log" and ax_r.get_ylabel() == "gold (reward units)"
    # β (n + 1 values) is a step function: β[t] in force over step t.
    assert ax_beta.lines[1].get_drawstyle() == "steps-post"
    np.testing.assert_array_equal(ax_beta.lines[1].get_ydata(), runs["adaptive"].beta)
    np.testing.assert_array_equal(ax_pr.lines[0].get_ydata(), runs["fixed"].penalized_reward)
    # Single runs: a legend on the KL panel (target + runs), no figure legend, no bands.
    assert [t.get_text() for t in ax_kl.get_legend().get_texts()] == ["target = 2 nats", "fixed", "adaptive"]
    assert not ax_kl.figure.legends and not ax_kl.collections


def test_control_panels_validate():
    ok = ControlTrace(kl=np.ones(3), beta=np.full(4, 0.1), reward=np.ones(3), penalized_reward=np.ones(3))
    other = ControlTrace(kl=np.ones(3), beta=np.full(4, 0.2), reward=np.ones(3), penalized_reward=np.ones(3))
    with pytest.raises(ValueError, match="shared initial"):
        plotting.plot_control_panels({"a": ok, "b": other})
    with pytest.raises(ValueError, match="penalized_reward"):
        plotting.plot_control_panels({"a": ControlTrace(kl=np.ones(3), beta=np.ones(4))})
    with pytest.raises(TypeError, match="traces"):
        plotting.plot_control_panels({"a": (np.ones(3), np.ones(4))})
    with pytest.raises(TypeError, match="traces"):
        plotting.plot_control_panels({})
    with pytest.raises(ValueError, match="band"):
        plotting.plot_control_panels({"a": ok}, band=(0.5, 0.5))
    with pytest.raises(ValueError, match="beta"):
        ControlTrace(kl=np.ones(3), beta=np.ones(5))
    with pytest.raises(ValueError, match="reward"):
        ControlTrace(kl=np.ones(3), beta=np.ones(3), reward=np.ones(4))
    with pytest.raises(ValueError, match="kl"):
        ControlTrace(kl=np.ones((2, 2, 2)), beta=np.ones((2, 2, 2)))
    fig, axes = plt.subplots(2, 2)
    assert plotting.plot_control_panels({"a": ok}, axes=axes)[1, 0] is axes[1, 0]
