"""Tests of kltutorial.plotting.dynamics (§10's invented models): what each figure draws."""

from __future__ import annotations

import numpy as np
import pytest

from kltutorial import plotting
from kltutorial.studies.dynamics import illustrative_token_kl_patterns, simulate_training_trajectory


def _labelled(ax):
    return bool(ax.get_xlabel()) and bool(ax.get_ylabel())


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


def test_reward_vs_kl_validates_the_result():
    res = simulate_training_trajectory([0.1, 1.0], n_steps=5, n_seeds=3, rng=np.random.default_rng(0))

    class Flat:
        betas, kl, reward = res.betas, res.kl[0], res.reward[0]

    with pytest.raises(ValueError, match="result"):
        plotting.plot_reward_vs_kl(Flat())


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
