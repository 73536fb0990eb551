"""Tests of kltutorial.plotting.experiment (§11's figures): what each figure draws.

The figures take plain arrays or objects with array attributes; the stand-ins below have the
attributes of ``toyrlhf.ToyFrontier`` and ``toyrlhf.TrainResult`` that the figures read, with numbers
chosen so that what is drawn can be checked by hand. (Moved from tests/test_toyrlhf.py.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from kltutorial import plotting

T = 5  # token positions of the toy task


@dataclass(frozen=True)
class Frontier:  # the attributes of toyrlhf.ToyFrontier the figures read
    betas: np.ndarray
    kl: np.ndarray
    proxy: np.ndarray
    gold: np.ndarray


@dataclass(frozen=True)
class Run:  # the attributes of toyrlhf.TrainResult the figures read
    kl: np.ndarray
    beta: np.ndarray
    proxy: np.ndarray
    gold: np.ndarray

    @property
    def penalized_proxy(self) -> np.ndarray:  # as toyrlhf.TrainResult.penalized_proxy
        return self.proxy - self.beta[0] * self.kl


def _run(beta0: float, steps: int = 12) -> Run:
    kl = np.linspace(0.5, 3.0, steps)
    return Run(kl=kl, beta=np.full(steps + 1, beta0), proxy=1.0 + kl, gold=2.0 - 0.1 * kl)


def test_toy_frontier():
    front = Frontier(betas=np.array([2.0, 1.0, 0.5]), kl=np.array([0.1, 0.4, 1.2]),
                     proxy=np.array([0.2, 0.6, 1.0]), gold=np.array([0.3, 0.5, 0.4]))
    points = {"beta": np.array([1.0]), "kl": front.kl[1:2], "proxy": front.proxy[1:2],
              "gold": front.gold[1:2]}
    best = {"n": np.array([1, 2, 4]), "kl": np.array([0.0, 0.19, 0.6]),
            "proxy": np.array([0.0, 0.3, 0.5]), "gold": np.array([0.2, 0.3, 0.35])}
    axes = plotting.plot_toy_frontier(front, points=points, best_of_n=best)
    assert axes.shape == (2,) and "nats" in axes[0].get_xlabel()
    for ax, key in zip(axes, ("proxy", "gold"), strict=True):
        frontier_line, bon_line, point = ax.lines
        np.testing.assert_allclose(frontier_line.get_xdata(), front.kl)
        np.testing.assert_allclose(frontier_line.get_ydata(), getattr(front, key))
        np.testing.assert_allclose(bon_line.get_ydata(), best[key])
        assert point.get_label() == "trained, β = 1" and point.get_ydata()[0] == getattr(front, key)[1]
        assert key in ax.get_ylabel() and ax.get_legend() is None
    (legend,) = axes[0].figure.legends  # one legend for both panels, under them
    assert len(legend.get_texts()) == 3


def test_bang_histogram():
    ref = np.array([0.6, 0.3, 0.07, 0.02, 0.01, 0.0])
    trained = np.array([0.1, 0.2, 0.3, 0.2, 0.1, 0.1])
    ax = plotting.plot_bang_histogram({"π_ref": ref})
    assert len(ax.containers) == 1 and len(ax.containers[0]) == T + 1
    ax = plotting.plot_bang_histogram({"π_ref": ref, "trained, β = 0.1": trained}, betas=[0.1])
    assert len(ax.containers) == 2
    np.testing.assert_allclose([bar.get_height() for bar in ax.containers[1]], trained)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["π_ref", "trained, β = 0.1"]
    with pytest.raises(TypeError, match="distributions"):
        plotting.plot_bang_histogram({})


def test_data_sweep():
    kl = np.array([[0.0, 1.0, 2.0], [0.0, 1.5, 3.0]])
    gold = np.array([[1.0, 2.0, 1.5], [1.0, 2.0, 2.5]])
    ax_curves, ax_peak = plotting.plot_data_sweep([10, 100], kl, gold)
    (legend,) = ax_curves.figure.legends  # one legend, under the panels
    assert [t.get_text() for t in legend.get_texts()] == ["N = 10 pairs", "N = 100 pairs"]
    # Peaks: at KL 1.0 (gold 2.0) for N = 10, at KL 3.0 (gold 2.5) for N = 100.
    np.testing.assert_allclose(ax_peak.lines[0].get_ydata(), [1.0, 3.0])
    assert ax_peak.get_xscale() == "log"
    with pytest.raises(ValueError, match="kl and gold"):
        plotting.plot_data_sweep([10], kl, gold)


def test_toy_controllers_share_the_control_layout():
    runs = {"fixed": _run(0.05), "adaptive": _run(0.05, steps=8)}
    grid = plotting.plot_toy_controllers(runs, target_kl=1.0)
    assert grid.shape == (2, 2) and grid[0, 1].get_yscale() == "log"
    ax_kl, ax_beta, ax_gold, ax_pen = grid.ravel()
    assert ax_kl.get_title() == "KL against its target" and ax_beta.get_title() == "KL coefficient β"
    # The legend sits under the four panels, not on the KL curves.
    assert ax_kl.get_legend() is None
    (legend,) = ax_kl.figure.legends
    assert [t.get_text() for t in legend.get_texts()][1:] == ["fixed", "adaptive"]
    np.testing.assert_array_equal(ax_gold.lines[0].get_ydata(), runs["fixed"].gold)
    # The fourth panel: proxy − β₀·KL at the shared β₀ = 0.05.
    adaptive = runs["adaptive"]
    np.testing.assert_allclose(ax_pen.lines[1].get_ydata(), adaptive.proxy - 0.05 * adaptive.kl)
    assert "0.05" in ax_pen.get_title() and "proxy" in ax_pen.get_ylabel()
    with pytest.raises(ValueError, match="shared initial"):
        plotting.plot_toy_controllers({"a": _run(0.05), "b": _run(0.1)}, target_kl=1.0)
    with pytest.raises(ValueError, match="beta0"):
        plotting.plot_toy_controllers(runs, target_kl=1.0, beta0=-1.0)
    with pytest.raises(TypeError, match="runs"):
        plotting.plot_toy_controllers({}, target_kl=1.0)


def test_toy_controllers_price_runs_from_other_betas_at_the_given_beta0():
    # A fixed β beside a controller started lower: every run is priced at the one beta0 given.
    runs = {"controller": _run(0.05), "fixed": _run(0.3, steps=8)}
    _, _, _, ax_pen = plotting.plot_toy_controllers(runs, target_kl=1.0, beta0=0.05).ravel()
    for line, run in zip(ax_pen.lines, runs.values(), strict=True):
        np.testing.assert_allclose(line.get_ydata(), run.proxy - 0.05 * run.kl)
    assert "0.05" in ax_pen.get_title() and "0.05" in ax_pen.get_ylabel()


def test_toy_token_kl():
    exact = {"β = 1": np.array([0.1, 0.2, 0.05, 0.3, 0.15])}
    panels = plotting.plot_toy_token_kl(exact, {"β = 1": (exact["β = 1"], np.zeros(T))}, betas=[1.0],
                                        illustrative={"pattern": np.ones(10)})
    assert panels.shape == (2,) and "not measured" in panels[1].get_title()
    np.testing.assert_array_equal(panels[0].lines[0].get_ydata(), exact["β = 1"])
    np.testing.assert_array_equal(panels[0].lines[0].get_xdata(), np.arange(1, T + 1))
    assert "nats" in panels[0].get_ylabel()
    assert plotting.plot_toy_token_kl(exact).shape == (1,)


def test_training_paths():
    front = Frontier(betas=np.array([2.0, 1.0, 0.5]), kl=np.array([1.2, 0.1, 0.4]),
                     proxy=np.array([1.0, 0.2, 0.6]), gold=np.array([0.4, 0.3, 0.5]))
    runs = {0.5: _run(0.5), 0.1: _run(0.1, steps=8)}
    axes = plotting.experiment.plot_training_paths(runs, front)
    assert axes.shape == (2,)
    for ax, key in zip(axes, ("proxy", "gold"), strict=True):
        frontier_line, path, last, path2, last2 = ax.lines
        np.testing.assert_allclose(frontier_line.get_xdata(), [0.1, 0.4, 1.2])  # sorted by KL
        np.testing.assert_allclose(frontier_line.get_ydata(), getattr(front, key)[[1, 2, 0]])
        np.testing.assert_array_equal(path.get_ydata(), getattr(runs[0.5], key))  # every step
        assert last.get_xdata()[0] == runs[0.5].kl[-1] and last2.get_ydata()[0] == getattr(runs[0.1], key)[-1]
        assert "nats" in ax.get_xlabel() and key in ax.get_ylabel()
    (legend,) = axes[0].figure.legends
    assert [t.get_text() for t in legend.get_texts()][1:] == ["β = 0.5: path", "β = 0.1: path"]
    with pytest.raises(TypeError, match="runs"):
        plotting.experiment.plot_training_paths({}, front)


def test_gao_fits():
    from kltutorial.studies.scaling_fit import fit_gao, gao_gain

    kl = np.linspace(0.0, 4.0, 9)
    gain = gao_gain(kl, 3.0, 1.0, "bon")
    fits = [fit_gao(kl, gain, "bon"), fit_gao(kl, gain, "rl")]
    (ax,) = plotting.experiment.plot_gao_fits({"best-of-n": fits})
    points, exact_fit, other_fit = ax.lines[:3]
    np.testing.assert_allclose(points.get_xdata(), np.sqrt(kl))
    np.testing.assert_allclose(points.get_ydata(), gain)
    # The exact form's fit goes through the points; the curve is R(d) on a grid of d.
    d = exact_fit.get_xdata()
    np.testing.assert_allclose(exact_fit.get_ydata(), d * (3.0 - d), atol=1e-9)
    assert other_fit.get_linestyle() == "--" and exact_fit.get_linestyle() == "-"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[1].startswith("d(α − β d)") and "R² = 1.00" in labels[1]
    assert labels[2].startswith("d(α − β log d)")
    assert ax.get_title() == "best-of-n" and "√KL" in ax.get_xlabel()
    with pytest.raises(TypeError, match="panels"):
        plotting.experiment.plot_gao_fits({})
    with pytest.raises(ValueError, match="at least one GaoFit"):
        plotting.experiment.plot_gao_fits({"empty": []})


def test_recipe_fixed_points_draws_each_curve_sorted_by_kl_and_the_runs_on_them() -> None:
    curves = {
        "optimum": Frontier(np.array([1.0, 0.3]), np.array([0.5, 2.0]), np.zeros(2), np.array([2.0, 3.0])),
        "forward": Frontier(np.array([1.0, 0.3]), np.array([3.0, 0.4]), np.zeros(2), np.array([1.0, 2.5])),
    }
    ax = plotting.plot_recipe_fixed_points(curves, runs={"forward": [(0.5, 2.4)]})
    lines = ax.lines
    np.testing.assert_allclose(lines[0].get_xdata(), [0.5, 2.0])
    np.testing.assert_allclose(lines[1].get_xdata(), [0.4, 3.0])  # sorted by KL
    np.testing.assert_allclose(lines[1].get_ydata(), [2.5, 1.0])
    marker = lines[2]
    assert marker.get_xdata()[0] == 0.5 and marker.get_color() == lines[1].get_color()
    labels = [t.get_text() for t in ax.figure.legends[0].get_texts()]
    assert labels[:2] == ["optimum", "forward"] and "trained runs" in labels[2]
    assert ax.get_xlabel() == "KL(π ‖ π_ref) (nats)"


def test_trl_kl_draws_trls_kl_and_the_callbacks_per_token_values() -> None:
    log = [{"step": 20, "kl": 0.5}, {"step": 40, "kl": 0.7}]
    keys = ("step", "exact_kl", "exact_kl_per_token", "exact_kl_se", "k3_per_token")
    monitor = [dict(zip(keys, (0, 0.0, 0.0, 0.0, 0.0), strict=True)),
               dict(zip(keys, (20, 2.5, 0.5, 0.1, 0.6), strict=True))]
    ax = plotting.plot_trl_kl(log, monitor)
    trl_line, exact_line, k3_line = ax.lines
    np.testing.assert_allclose(trl_line.get_xdata(), [20, 40])
    np.testing.assert_allclose(trl_line.get_ydata(), [0.5, 0.7])
    np.testing.assert_allclose(exact_line.get_ydata(), [0.0, 0.5])
    np.testing.assert_allclose(k3_line.get_ydata(), [0.0, 0.6])
    band = ax.collections[0].get_paths()[0].vertices  # ±2 se of the per-token value: 0.1 / 5 tokens
    assert np.isclose(band[:, 1].max(), 0.5 + 2 * 0.02)
    assert ax.get_ylabel() == "KL per token (nats)" and ax.get_xlabel() == "training step"
    with pytest.raises(ValueError, match="non-empty"):
        plotting.plot_trl_kl([], monitor)
