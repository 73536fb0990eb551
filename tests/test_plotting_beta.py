"""Tests of kltutorial.plotting.beta."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from kltutorial.plotting.beta import plot_beta_sweep  # noqa: E402
from kltutorial.plotting.style import FIG_WIDTH  # noqa: E402
from kltutorial.studies.beta_scale import summarize_sweep  # noqa: E402


def _sweep():
    betas = np.geomspace(5, 0.05, 20)
    kl = 1 / betas
    return summarize_sweep(betas, kl, np.log1p(kl), np.log1p(kl) - 0.1 * kl, ref_gold=0.0)


def test_plot_beta_sweep_draws_curves_targets_and_points():
    s = _sweep()
    axes = plot_beta_sweep(s, kl_targets={"sum 6": 6.0}, kl_limit=20.0,
                           trained={"beta": [1.0], "kl": [1.0], "proxy": [0.7], "gold": [0.6]})
    fig = axes[0].figure
    assert fig.get_size_inches()[0] == pytest.approx(FIG_WIDTH)
    assert axes[0].get_xscale() == "log" and axes[1].get_xscale() == "log"
    assert "nats" in axes[0].get_ylabel() and "reward units" in axes[1].get_ylabel()
    labels = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert any("gold peak" in t for t in labels) and "trained, gold" in labels
    assert len(axes[0].get_lines()) == 3
    plt.close(fig)


def test_plot_beta_sweep_rejects_bad_sweep():
    class Bad:
        betas = np.array([1.0])
        kl = proxy = gold = np.array([1.0])

    with pytest.raises(ValueError):
        plot_beta_sweep(Bad())
