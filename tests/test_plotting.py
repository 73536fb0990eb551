"""Tests of kltutorial.plotting: what each figure draws, not how it looks."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.patches import Rectangle

from kltutorial import plotting
from kltutorial.controllers import (
    ControllerHistory,
    DoublingKLController,
    ExponentialKLController,
    FixedKLController,
)
from kltutorial.simulate import (
    illustrative_token_kl_patterns,
    simulate_training_trajectory,
    simulate_training_with_controller,
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _labelled(ax):
    return bool(ax.get_xlabel()) and bool(ax.get_ylabel())


def _lightness(color):
    r, g, b = to_rgb(color)
    return 0.299 * r + 0.587 * g + 0.114 * b


def test_use_style_sets_rcparams():
    plotting.use_style()
    rc = matplotlib.rcParams
    assert rc["axes.spines.top"] is False and rc["axes.spines.right"] is False
    assert rc["axes.grid"] is True and rc["figure.dpi"] == 110
    cycle = rc["axes.prop_cycle"].by_key()
    assert len(set(cycle["linestyle"])) > 1  # series differ in grayscale too


def test_beta_colors_warm_to_cool_and_grayscale_ordered():
    betas = [1.0, 0.01, 0.1, 0.05, 0.3]
    colors = plotting.beta_colors(betas)
    assert len(colors) == 5
    order = np.argsort(betas)
    light = [_lightness(colors[i]) for i in order]
    assert all(a > b for a, b in zip(light, light[1:], strict=False))  # darker as β grows
    lo, hi = to_rgb(colors[order[0]]), to_rgb(colors[order[-1]])
    assert lo[0] > lo[2] and hi[2] > hi[0]  # small β warm (red > blue), large β cool
    assert plotting.beta_colors([0.2, 0.2]) == plotting.beta_colors([0.2]) * 2
    styles = plotting.beta_styles(betas)
    assert len({s["linestyle"] if isinstance(s["linestyle"], str) else str(s["linestyle"])
                for s in styles}) == 5


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


def test_reward_vs_kl():
    res = simulate_training_trajectory([0.01, 0.1, 1.0], n_steps=40, n_seeds=50,
                                       rng=np.random.default_rng(0))
    ax = plotting.plot_reward_vs_kl(res, reward_curve=lambda kl: kl * 0.0)
    assert _labelled(ax) and "nats" in ax.get_xlabel()
    assert "invented" in ax.get_title()
    beta_lines = [ln for ln in ax.lines if ln.get_label().startswith("β")]
    assert [ln.get_label() for ln in beta_lines] == ["β = 0.01", "β = 0.1", "β = 1"]
    # Each line is the per-step median trajectory.
    np.testing.assert_allclose(beta_lines[1].get_xdata(), np.median(res.kl[1], axis=0))
    np.testing.assert_allclose(beta_lines[1].get_ydata(), np.median(res.reward[1], axis=0))
    # Unreliable region: hatched span starting at 10 nats, labelled as illustrative.
    spans = [p for p in ax.patches if "unreliable" in p.get_label()]
    assert len(spans) == 1 and "illustrative" in spans[0].get_label()
    assert spans[0].get_x() == pytest.approx(10.0)
    # Bands: one filled region per β.
    assert len(ax.collections) >= 3
    ax2 = plotting.plot_reward_vs_kl(res, unreliable_kl=None)
    assert not [p for p in ax2.patches if "unreliable" in p.get_label()]


def test_kl_over_steps():
    res = simulate_training_trajectory([0.05, 0.3], n_steps=20, n_seeds=30,
                                       rng=np.random.default_rng(1))
    ax = plotting.plot_kl_over_steps(res, equilibrium_kl=res.equilibrium_kl)
    assert _labelled(ax) and "step" in ax.get_xlabel() and "nats" in ax.get_ylabel()
    medians = [ln for ln in ax.lines if ln.get_label().startswith("β")]
    assert len(medians) == 2 and len(ax.lines) == 4  # two medians, two equilibrium lines
    np.testing.assert_allclose(medians[0].get_ydata(), np.median(res.kl[0], axis=0))


def test_token_kl_patterns():
    pats = illustrative_token_kl_patterns(rng=np.random.default_rng(2))
    axes = plotting.plot_token_kl_patterns(pats)
    assert len(axes) == 3
    assert [ax.get_title() for ax in axes] == list(pats)
    for ax, values in zip(axes, pats.values(), strict=True):
        assert len(ax.lines) == 1 and ax.get_xlabel() == "token position"
        np.testing.assert_array_equal(ax.lines[0].get_ydata(), values)
    assert "nats" in axes[0].get_ylabel()
    assert "not measured" in axes[0].figure._suptitle.get_text()
    with pytest.raises(TypeError, match="patterns"):
        plotting.plot_token_kl_patterns({})


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


def test_median_band_validates():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="band"):
        plotting.plot_median_band(ax, np.arange(3), np.ones((2, 3)), band=(0.9, 0.1))
    with pytest.raises(ValueError, match="samples"):
        plotting.plot_median_band(ax, np.arange(3), np.ones((2, 4)))
    plotting.plot_median_band(ax, np.arange(3), np.arange(6.0).reshape(2, 3), label="x")
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [1.5, 2.5, 3.5])


def test_fixed_vs_adaptive_needs_shared_initial_beta():
    a = simulate_training_with_controller(FixedKLController(0.1), n_steps=5, n_seeds=3,
                                          rng=np.random.default_rng(0))
    b = simulate_training_with_controller(FixedKLController(0.2), n_steps=5, n_seeds=3,
                                          rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="shared initial"):
        plotting.plot_fixed_vs_adaptive({"a": a, "b": b})
