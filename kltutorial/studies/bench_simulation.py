"""The vectorised §10 simulation against the handbook's one-run-at-a-time loop (book section 12).

:func:`simulation_benchmark` times :func:`kltutorial.studies.dynamics.simulate_training_trajectory`
(vectorised over β and seeds) against :func:`scalar_training_trajectory`, the handbook's loop that
runs one (β, seed) pair at a time in plain Python (the baseline), and checks that both compute the
same trajectories. Both run the model of :mod:`kltutorial.studies.dynamics` (its per-step function), on the
same pre-drawn disturbances: what differs is only how many runs each step advances at once.
``python -m kltutorial.studies.bench --sim-only`` prints the result.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from .._validation import check_positive_int, check_rng
from .dynamics import (
    TrainingTrajectories,
    draw_training_noise,
    learned_reward,
    simulate_training_trajectory,
    trajectory_step,
)

__all__ = ["scalar_training_trajectory", "simulation_benchmark"]


def scalar_training_trajectory(
    beta: float,
    kl_noise: np.ndarray,
    reward_noise: np.ndarray,
    noise_scale: float = 0.08,
) -> tuple[np.ndarray, np.ndarray]:
    """Baseline: one run of the §10 fixed-β model, one step at a time (the handbook's loop).

    The handbook's ``simulate_training_trajectory`` loop: one β and one seed per call, one step per
    iteration, Python lists, NumPy scalar arithmetic. The model itself is
    :func:`kltutorial.studies.dynamics.trajectory_step` and
    :func:`kltutorial.studies.dynamics.learned_reward`, called on one number at a time; the vectorised
    :func:`kltutorial.studies.dynamics.simulate_training_trajectory` calls the same functions on all
    (β, seed) pairs at once. Kept here only as the benchmark's baseline.

    Parameters
    ----------
    beta : float
    kl_noise, reward_noise : ndarray, shape (n_steps,)
        The run's standard-normal disturbances ε and η (one row of a
        :class:`~kltutorial.studies.dynamics.TrainingNoise`).
    noise_scale : float
        σ, as in the simulation.

    Returns
    -------
    kl, reward : ndarray, shape (n_steps + 1,)
    """
    kl_values, reward_values = [0.0], [0.0]
    for eps, eta in zip(kl_noise, reward_noise, strict=True):
        new_kl = trajectory_step(kl_values[-1], beta, eps, noise_scale)
        kl_values.append(new_kl)
        reward_values.append(learned_reward(new_kl) + noise_scale * eta)
    return np.array(kl_values), np.array(reward_values)


def simulation_benchmark(
    betas: Sequence[float] = (0.0, 0.05, 0.1, 0.3, 1.0),
    n_seeds: int = 1000,
    n_steps: int = 200,
    repeats: int = 3,
    *,
    rng: np.random.Generator,
) -> dict[str, float]:
    """Time the vectorised simulation against the handbook's scalar loop over (β, seed).

    One set of disturbances is drawn from ``rng``; then timed: ``simulate_training_trajectory(betas,
    noise=noise)`` against :func:`scalar_training_trajectory` called for every β and seed on that seed's
    row of the same disturbances. Checked: both give the same trajectories (a mismatch raises
    ``AssertionError``).

    Returns
    -------
    dict
        ``vectorised_s`` and ``loop_s`` (median seconds), ``speedup``, ``max_abs_diff``, and the sizes.
    """
    n_seeds = check_positive_int(n_seeds, "n_seeds")
    n_steps = check_positive_int(n_steps, "n_steps")
    repeats = check_positive_int(repeats, "repeats")
    noise = draw_training_noise(n_seeds, n_steps, check_rng(rng))

    def vectorised() -> TrainingTrajectories:
        return simulate_training_trajectory(betas, noise=noise)

    def loop() -> list[list[tuple[np.ndarray, np.ndarray]]]:
        return [[scalar_training_trajectory(beta, noise.kl[s], noise.reward[s]) for s in range(n_seeds)]
                for beta in betas]

    def timed(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    # same model, same disturbances: the two must agree (to rounding of the reward's exp)
    res, runs = vectorised(), loop()
    diff = max(max(float(np.abs(kl - res.kl[i, s]).max()), float(np.abs(reward - res.reward[i, s]).max()))
               for i, per_seed in enumerate(runs) for s, (kl, reward) in enumerate(per_seed))
    assert diff < 1e-9, f"vectorised and scalar simulations disagree by {diff}"

    vec_s, loop_s = timed(vectorised), timed(loop)
    return {"n_betas": len(betas), "n_seeds": n_seeds, "n_steps": n_steps, "vectorised_s": vec_s,
            "loop_s": loop_s, "speedup": loop_s / vec_s, "max_abs_diff": diff}
