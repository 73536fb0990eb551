"""Tests of kltutorial.plotting.estimation: what the §3 convergence figure and the §4 distributions figure
draw, and their bad inputs."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.patches import Polygon, Rectangle

from kltutorial.exact.estimates import monte_carlo_convergence
from kltutorial.plotting.estimation import plot_estimator_distributions, plot_kl_convergence
from kltutorial.studies.estimation import estimator_samples, sample_gaussian_pair


def _runs() -> dict:
    rng = np.random.default_rng(0)
    counts = [2, 5, 10, 50, 100]
    return {
        "wide": monte_carlo_convergence(rng.normal(0.3, 1.0, (20, 100)), counts, 0.3, 1.0),
        "narrow": monte_carlo_convergence(rng.normal(0.3, 0.2, (20, 100)), counts, 0.3, 0.2),
    }


def test_convergence_figure() -> None:
    runs = _runs()
    ax_est, ax_se = plot_kl_convergence(runs)
    assert ax_est.figure is ax_se.figure
    assert ax_est.get_xscale() == "log" and ax_se.get_xscale() == "log" and ax_se.get_yscale() == "log"
    for ax in (ax_est, ax_se):
        assert "n" in ax.get_xlabel() and "nats" in ax.get_ylabel()
    # Left: per run a median line and two CLT lines, then the exact value; one band per run.
    assert len(ax_est.lines) == 2 * 3 + 1
    exact = ax_est.lines[-1]
    np.testing.assert_allclose(exact.get_ydata(), 0.3)
    assert len(ax_est.collections) == 2  # the shaded bands
    median = ax_est.lines[0]
    np.testing.assert_allclose(median.get_ydata(), np.median(runs["wide"].estimates, axis=0))
    clt_hi = ax_est.lines[2]
    np.testing.assert_allclose(clt_hi.get_ydata(), 0.3 + 1.2815515655 * runs["wide"].clt_standard_error,
                               rtol=1e-8)
    texts = [t.get_text() for t in ax_est.get_legend().get_texts()]
    assert texts[:3] == ["wide", "narrow", "exact KL"] and "CLT" in texts[3]
    # Right: per run the median of the runs' own standard errors (markers) and sigma / sqrt(n) (a line).
    assert len(ax_se.lines) == 4
    np.testing.assert_allclose(ax_se.lines[3].get_ydata(), runs["narrow"].clt_standard_error)
    np.testing.assert_allclose(ax_se.lines[0].get_ydata(), np.median(runs["wide"].standard_errors, axis=0))


def test_convergence_figure_on_given_axes_and_bad_input() -> None:
    fig, axes = plt.subplots(1, 2)
    out = plot_kl_convergence(_runs(), axes=axes)
    assert out[0] is axes[0] and out[1] is axes[1]
    with pytest.raises(ValueError, match="at least one"):
        plot_kl_convergence({})
    other = monte_carlo_convergence(np.zeros((2, 5)), [2, 5], 1.0, 1.0)
    with pytest.raises(ValueError, match="same value"):
        plot_kl_convergence({**_runs(), "other": other})
    with pytest.raises(ValueError, match="band"):
        plot_kl_convergence(_runs(), band=(0.9, 0.1))


def _panels() -> dict:
    gen = torch.Generator().manual_seed(0)
    panels = {}
    for mu in (0.1, 1.0):
        lp, lq = sample_gaussian_pair(mu, 5000, gen)
        panels[f"mu = {mu}"] = estimator_samples(lp, lq, ["k1", "k2", "k3"], mu**2 / 2)
    return panels


def test_distributions_figure() -> None:
    panels = _panels()
    axes = plot_estimator_distributions(panels, bins=40)
    assert len(axes) == 2 and axes[0].figure is axes[1].figure
    for ax, (title, draws) in zip(axes, panels.items(), strict=True):
        assert ax.get_title() == title and ax.get_yscale() == "log"
        assert "nats" in ax.get_xlabel() and "1/nat" in ax.get_ylabel()
        # One step histogram per estimator, whose densities integrate to at most 1.
        steps = [p for p in ax.patches if p.__class__.__name__ == "StepPatch"]
        assert len(steps) == 3
        for step in steps:
            values, edges = step.get_data().values, step.get_data().edges
            area = float(np.nansum(values * np.diff(edges)))
            assert 0.99 <= area <= 1.0 + 1e-12
        # The exact KL as a vertical line, the negative half-line shaded.
        assert [float(np.asarray(ln.get_xdata())[0]) for ln in ax.lines] == [draws.kl]
        shaded = [p for p in ax.patches if isinstance(p, Rectangle | Polygon)]
        assert len(shaded) == 1 and ax.get_xlim()[0] < 0
    (legend,) = axes[0].figure.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == ["k1", "k2", "k3", "exact KL", "negative estimates"]


def test_distributions_figure_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        plot_estimator_distributions({})
    with pytest.raises(ValueError, match="bins"):
        plot_estimator_distributions(_panels(), bins=1)
    with pytest.raises(ValueError, match="quantiles"):
        plot_estimator_distributions(_panels(), quantiles=(0.5, 0.5))
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="axes"):
        plot_estimator_distributions(_panels(), axes=ax)


def test_convergence_legends_sit_under_their_panels(house_style) -> None:
    # Each legend lies under its panel's tick labels and x label, so it covers no band, line or marker.
    axes = plot_kl_convergence(_runs())
    fig = axes[0].figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    figure_box = fig.bbox
    for ax in axes:
        legend = ax.get_legend().get_window_extent(renderer)
        assert legend.y1 <= ax.xaxis.get_tightbbox(renderer).y0 + 1e-6
        assert legend.y1 < ax.bbox.y0
        for artist in (*ax.collections, *ax.lines):  # the bands and the markers
            assert not legend.overlaps(artist.get_window_extent(renderer))
        assert legend.y0 >= figure_box.y0 and legend.x0 >= figure_box.x0 and legend.x1 <= figure_box.x1
    # the two legends stay apart
    left, right = (ax.get_legend().get_window_extent(renderer) for ax in axes)
    assert not left.overlaps(right)
