"""Tests of kltutorial.plotting.foundations (the figures of §1 and §2): what each figure draws.

The stand-ins below have the attributes of ``toyrlhf.TrainResult`` and ``toyrlhf.ToyFrontier`` that the
figures read, with numbers chosen so that what is drawn can be checked by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from kltutorial import exact as ex
from kltutorial.plotting import FIG_WIDTH
from kltutorial.plotting import foundations as figs


@dataclass(frozen=True)
class Run:  # the attributes of toyrlhf.TrainResult the figure reads
    proxy: np.ndarray
    gold: np.ndarray
    beta: np.ndarray


@dataclass(frozen=True)
class Frontier:  # the attributes of toyrlhf.ToyFrontier the figure reads
    betas: np.ndarray
    proxy: np.ndarray
    gold: np.ndarray


def test_reward_hacking() -> None:
    gold = np.r_[np.linspace(1.0, 4.0, 10), np.linspace(4.0, -1.0, 20)]
    run = Run(proxy=np.linspace(0.0, 2.0, 30), gold=gold, beta=np.full(31, 0.01))
    front = Frontier(betas=np.array([0.01, 1.0, 0.1]), proxy=np.array([2.0, 0.1, 1.5]),
                     gold=np.array([-5.0, 2.0, 3.0]))
    axes = figs.plot_reward_hacking(run, front)
    assert axes.shape == (2,) and axes[0].figure.get_size_inches()[0] == pytest.approx(FIG_WIDTH)
    ref_line, proxy_line, gold_line = axes[0].lines
    assert ref_line.get_ydata()[0] == 1.0  # the gold reward of step 0, pi_ref
    np.testing.assert_allclose(proxy_line.get_ydata(), run.proxy)
    np.testing.assert_allclose(gold_line.get_ydata(), run.gold)
    assert "0.01" in axes[0].get_title() and "reward units" in axes[0].get_ylabel()
    _, f_proxy, f_gold = axes[1].lines
    np.testing.assert_allclose(f_proxy.get_xdata(), [1.0, 0.1, 0.01])  # sorted from large beta to small
    np.testing.assert_allclose(f_gold.get_ydata(), [2.0, 3.0, -5.0])
    assert axes[1].get_xscale() == "log" and axes[1].xaxis_inverted()
    with pytest.raises(ValueError, match="run"):
        figs.plot_reward_hacking(Run(np.zeros(3), np.zeros(4), np.zeros(4)), front)


def test_grouped_bars() -> None:
    dists = {"a": np.array([0.5, 0.5, 0.0]), "b": np.array([0.1, 0.2, 0.7])}
    ax = figs.plot_grouped_bars(dists, ["x", "y", "z"], xlabel="kind")
    assert len(ax.containers) == 2
    np.testing.assert_allclose([bar.get_height() for bar in ax.containers[1]], dists["b"])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["x", "y", "z"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]
    hatches = {bar.get_hatch() for bar in ax.containers[1]}
    assert hatches == {"//"}  # the second series is hatched, so it survives grayscale
    with pytest.raises(TypeError, match="distributions"):
        figs.plot_grouped_bars({}, ["x"], xlabel="kind")
    with pytest.raises(ValueError, match="one value per category"):
        figs.plot_grouped_bars({"a": np.ones(2) / 2}, ["x", "y", "z"], xlabel="kind")


def test_forward_reverse_fits() -> None:
    p = ex.GaussianMixture((0.5, 0.5), (-2.0, 2.0), (0.5, 0.5))
    forward = ex.Gaussian(0.0, 2.0)
    reverse = {"left": ex.Gaussian(-2.0, 0.5), "right": ex.Gaussian(2.0, 0.5)}
    x = np.linspace(-5, 5, 101)
    means = np.linspace(-4, 4, 9)
    fwd_kl, rev_kl = 1.0 + 0.1 * means**2, 1.0 + (np.abs(means) - 2) ** 2
    axes = figs.plot_forward_reverse_fits(p, forward, reverse, x, forward_profile=(means, fwd_kl),
                                          reverse_profile=(means, rev_kl))
    ax_d, ax_p = axes
    np.testing.assert_allclose(ax_d.lines[0].get_ydata(), p.pdf(x))
    np.testing.assert_allclose(ax_d.lines[1].get_ydata(), forward.pdf(x))
    assert len(ax_d.lines) == 4 and ax_d.lines[3].get_label() == "reverse, right"
    profile_f, profile_r, *markers = ax_p.lines
    np.testing.assert_allclose(profile_r.get_ydata(), rev_kl)
    # Each fit is marked on the profile of its direction.
    assert [m.get_xdata()[0] for m in markers] == [0.0, -2.0, 2.0]
    assert [m.get_ydata()[0] for m in markers] == [pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0)]
    assert ax_p.get_ylim() == (0.0, pytest.approx(4.0)) and "nats" in ax_p.get_ylabel()
    with pytest.raises(TypeError, match="reverse"):
        figs.plot_forward_reverse_fits(p, forward, {}, x, forward_profile=(means, fwd_kl),
                                       reverse_profile=(means, rev_kl))
