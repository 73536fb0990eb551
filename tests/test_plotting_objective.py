"""Tests of kltutorial.plotting.objective (§5's figures): what each figure draws, on stand-ins whose
numbers can be checked by hand."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from kltutorial.plotting import objective as po


@dataclass(frozen=True)
class Frontier:  # the attributes of sequences.Frontier the figure reads
    betas: np.ndarray
    kl: np.ndarray
    reward: np.ndarray


@dataclass(frozen=True)
class Check:  # the attributes of PerturbationCheck the figure reads
    beta: float
    scales: np.ndarray
    gaps: np.ndarray


FRONTIER = Frontier(betas=np.array([2.0, 1.0, 0.5]), kl=np.array([0.1, 0.4, 1.0]),
                    reward=np.array([0.2, 0.6, 0.9]))


def test_frontier_tangents_draw_slope_beta_through_the_point() -> None:
    ax = po.plot_frontier_tangents(FRONTIER, [1.0], reward_label="proxy reward")
    tangent = [ln for ln in ax.lines if ln.get_label().startswith("slope β = 1")][0]
    x, y = tangent.get_data()
    assert (y[1] - y[0]) / (x[1] - x[0]) == pytest.approx(1.0)
    assert y[0] + 1.0 * (0.4 - x[0]) == pytest.approx(0.6)
    assert "nats" in ax.get_xlabel() and "reward units" in ax.get_ylabel()
    assert "proxy reward" in ax.get_ylabel()
    frontier_line = ax.lines[0]
    np.testing.assert_allclose(frontier_line.get_xdata(), [0.1, 0.4, 1.0])


@pytest.mark.parametrize(
    ("frontier", "betas", "match"),
    [
        (FRONTIER, [0.3], "not one of frontier.betas"),
        (Frontier(np.array([1.0]), np.array([0.1]), np.array([0.2])), [1.0], "K >= 2"),
        (Frontier(np.array([1.0, 2.0]), np.array([0.1]), np.array([0.2, 0.3])), [1.0], "one shape"),
    ],
)
def test_frontier_tangents_bad_inputs(frontier, betas, match) -> None:
    with pytest.raises(ValueError, match=match):
        po.plot_frontier_tangents(frontier, betas)


def test_perturbation_gaps_draw_every_gap_median_and_slope_two() -> None:
    scales = np.array([0.1, 1.0])
    gaps = np.array([[1e-3, 2e-3, 3e-3], [0.1, 0.2, 0.3]])
    ax = po.plot_perturbation_gaps(Check(beta=0.3, scales=scales, gaps=gaps))
    dots, median, ref = ax.lines
    assert len(dots.get_xdata()) == 6
    np.testing.assert_allclose(median.get_ydata(), [2e-3, 0.2])
    np.testing.assert_allclose(ref.get_ydata(), [1e-3, 0.1])  # half of 2e-3 * (1.0 / 0.1)^2
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert "β = 0.3" in ax.get_title()
    assert "reward units" in ax.get_ylabel() and "nats" in ax.get_xlabel()


@pytest.mark.parametrize(
    ("check", "match"),
    [
        (Check(0.3, np.array([0.1, 1.0]), np.array([[1e-3, -1e-4], [0.1, 0.2]])), "> 0"),
        (Check(0.3, np.array([0.1]), np.array([[1e-3]])), "S >= 2"),
        (Check(0.3, np.array([0.1, 1.0]), np.array([1e-3, 0.1])), "gaps"),
    ],
)
def test_perturbation_gaps_bad_inputs(check, match) -> None:
    with pytest.raises(ValueError, match=match):
        po.plot_perturbation_gaps(check)
