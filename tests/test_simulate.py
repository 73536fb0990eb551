"""Tests of kltutorial.studies.dynamics: the §10 models against hand-computed steps, closed forms and
per-seed runs of the same functions (the model is written once, in kltutorial.studies.dynamics)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from kltutorial.controllers import (
    AdaptiveKLController,
    DoublingKLController,
    ExponentialKLController,
    FixedKLController,
)
from kltutorial.studies.dynamics import (
    TrainingNoise,
    controlled_reward,
    controlled_step,
    draw_training_noise,
    equilibrium_kl,
    learned_reward,
    simulate_training_trajectory,
    simulate_training_with_controller,
    trajectory_step,
)

BETAS = [0.01, 0.05, 0.1, 0.3, 1.0]


def one_seed(noise, n):
    """Seed ``n`` of ``noise`` on its own, to run the same function one seed at a time."""
    return TrainingNoise(kl=noise.kl[n : n + 1], reward=noise.reward[n : n + 1])


# ------------------------------------------------------------------------------------------
# Model 1
# ------------------------------------------------------------------------------------------


def test_trajectory_shapes_and_start():
    res = simulate_training_trajectory(BETAS, n_steps=30, n_seeds=7, rng=np.random.default_rng(0))
    assert res.kl.shape == res.reward.shape == (5, 7, 31)
    assert res.n_steps == 30 and res.n_seeds == 7
    np.testing.assert_array_equal(res.betas, BETAS)
    assert np.all(res.kl[..., 0] == 0.0) and np.all(res.reward[..., 0] == 0.0)
    assert np.all(res.kl >= 0.0)
    assert not res.kl.flags.writeable


def test_trajectory_step_by_hand():
    # KL* = 18 / (1 + 8 * 0.25) = 6: one step closes 8 % of the gap, plus the kick σ ε.
    assert trajectory_step(0.0, 0.25, 0.0, 0.08) == pytest.approx(0.48)
    assert trajectory_step(0.98, 0.25, 2.0, 0.5) == pytest.approx(0.98 + 0.08 * (6 - 0.98) + 1.0)
    assert trajectory_step(0.98, 0.25, -4.0, 0.5) == 0.0  # 0.98 + 0.4016 - 2 < 0: floored
    assert trajectory_step(6.0, 0.25, 0.0, 0.08) == 6.0  # the equilibrium is a fixed point
    np.testing.assert_allclose(trajectory_step(np.zeros(2), np.array([0.0, 0.25]), 0.0, 0.08),
                               [0.08 * 18.0, 0.08 * 6.0])


def test_trajectory_first_steps_by_hand():
    noise = TrainingNoise(kl=np.array([[1.0, -4.0]]), reward=np.array([[0.0, 1.0]]))
    res = simulate_training_trajectory([0.25], noise_scale=0.5, reward_scale=2.0, noise=noise)
    # KL_1 = 0.08 * 6 + 0.5 * 1 = 0.98; KL_2 = max(0, 0.98 + 0.08 * 5.02 - 2) = 0.
    np.testing.assert_allclose(res.kl[0, 0], [0.0, 0.98, 0.0], atol=1e-15)
    # r_1 = 2 * 2 (1 - exp(-0.98 / 5)) + 0; r_2 = 2 * 2 (1 - exp(0)) + 0.5 * 1 = 0.5.
    np.testing.assert_allclose(res.reward[0, 0], [0.0, 4 * (1 - math.exp(-0.196)), 0.5], atol=1e-15)


@pytest.mark.parametrize("reward_scale, noise_scale", [(1.0, 0.08), (2.5, 0.3)])
def test_trajectory_vectorised_equals_one_seed_and_one_beta_at_a_time(reward_scale, noise_scale):
    noise = draw_training_noise(n_seeds=4, n_steps=60, rng=np.random.default_rng(1))
    res = simulate_training_trajectory(
        BETAS, reward_scale=reward_scale, noise_scale=noise_scale, noise=noise
    )
    for k, beta in enumerate(BETAS):
        for n in range(4):
            alone = simulate_training_trajectory(
                [beta], reward_scale=reward_scale, noise_scale=noise_scale, noise=one_seed(noise, n)
            )
            # KL uses only +, -, *, max in the same order: identical to the last bit.
            np.testing.assert_array_equal(res.kl[k, n], alone.kl[0, 0])
            np.testing.assert_allclose(res.reward[k, n], alone.reward[0, 0], rtol=1e-13, atol=1e-14)
    # Each recorded step is the model's own step from the previous one, with that step's kick.
    for t in range(60):
        expected = trajectory_step(res.kl[:, :, t], np.array(BETAS)[:, None], noise.kl[:, t], noise_scale)
        np.testing.assert_array_equal(res.kl[:, :, t + 1], expected)
    np.testing.assert_allclose(res.reward[..., 1:],
                               learned_reward(res.kl[..., 1:], reward_scale) + noise_scale * noise.reward,
                               rtol=1e-13, atol=1e-14)


def test_trajectory_floor_is_hit_with_large_noise():
    res = simulate_training_trajectory([5.0], n_steps=50, n_seeds=50, noise_scale=1.0,
                                       rng=np.random.default_rng(2))
    assert np.any(res.kl == 0.0) and np.all(res.kl >= 0.0)


def test_trajectory_approaches_equilibrium_within_noise():
    res = simulate_training_trajectory(BETAS, n_steps=300, n_seeds=2000, rng=np.random.default_rng(3))
    final = res.kl[:, :, -1]
    # Stationary AR(1) spread: sigma / sqrt(1 - (1 - 0.08)^2) ~= 0.205 nats; the mean over
    # 2000 seeds has a standard error of ~0.005, so 0.03 nats is > 5 standard errors.
    np.testing.assert_allclose(final.mean(axis=1), res.equilibrium_kl, atol=0.03)
    np.testing.assert_allclose(final.std(axis=1), 0.08 / math.sqrt(1 - 0.92**2), rtol=0.06)
    # The reward follows the noise-free curve at the final KL up to its measurement noise.
    resid = res.reward[:, :, -1] - learned_reward(final)
    assert abs(resid.mean()) < 0.01 and abs(resid.std() - 0.08) < 0.005


def test_trajectory_without_noise_is_the_closed_form():
    # With sigma = 0: KL_t = KL* (1 - 0.92^t), exactly the geometric relaxation.
    res = simulate_training_trajectory(BETAS, n_steps=40, n_seeds=1, noise_scale=0.0,
                                       rng=np.random.default_rng(0))
    t = np.arange(41)
    expected = np.asarray(equilibrium_kl(np.array(BETAS)))[:, None] * (1 - 0.92**t)
    np.testing.assert_allclose(res.kl[:, 0], expected, rtol=1e-12)
    np.testing.assert_allclose(res.reward[:, 0, 1:], learned_reward(expected[:, 1:]), rtol=1e-12)


def test_same_seed_same_noise_for_every_beta():
    a = simulate_training_trajectory([0.1, 0.3], n_steps=20, n_seeds=5, rng=np.random.default_rng(4))
    b = simulate_training_trajectory([0.3], n_steps=20, n_seeds=5, rng=np.random.default_rng(4))
    np.testing.assert_array_equal(a.kl[1], b.kl[0])


def test_closed_forms():
    assert equilibrium_kl(0.0) == 18.0 and equilibrium_kl(0.25) == 6.0
    assert learned_reward(0.0) == 0.0
    # Above 10 nats the learned reward grows linearly with slope 0.08 (plus the saturating part).
    assert learned_reward(30.0) - learned_reward(20.0) == pytest.approx(
        0.8 + 2 * (math.exp(-4) - math.exp(-6))
    )
    assert controlled_reward(5.0) == pytest.approx(1.5 * (1 - math.exp(-1)))


# ------------------------------------------------------------------------------------------
# Model 2
# ------------------------------------------------------------------------------------------

CONTROLLERS = [
    FixedKLController(0.1),
    ExponentialKLController(beta=0.1, target_kl=6.0, gain=0.12, min_coef=0.02, max_coef=0.5),
    AdaptiveKLController(beta=0.1, target_kl=6.0, horizon=1000.0),
    DoublingKLController(beta=0.1, target_kl=6.0),
]


def test_controlled_step_by_hand():
    # 0.5 + 0.14 - 0.08 * 0.1 * 0.5 + 0.08 * 1 = 0.716
    assert controlled_step(0.5, 0.1, 1.0, 0.08) == pytest.approx(0.716)
    for beta in (0.1, 0.5, 1.0):  # with β fixed and no noise, KL = 1.75 / β is a fixed point
        assert controlled_step(1.75 / beta, beta, 0.0, 0.08) == pytest.approx(1.75 / beta)
    assert controlled_step(0.2, 0.1, -5.0, 0.08) == 0.1  # floored at 0.1


def _fresh(template):
    """A controller of its own with the template's settings and (empty) history."""
    assert len(template.history.kl) == 0
    return copy.deepcopy(template)


@pytest.mark.parametrize("template", CONTROLLERS, ids=lambda c: type(c).__name__)
def test_controlled_loop_wiring(template):
    noise = draw_training_noise(n_seeds=3, n_steps=120, rng=np.random.default_rng(5))
    res = simulate_training_with_controller(template, noise=noise, samples_per_update=8)
    assert res.kl.shape == res.beta.shape == res.reward.shape == (1, 3, 121)
    kl, beta = res.kl[0], res.beta[0]
    # 1. each KL is the model's step from the previous KL under the β then in force;
    for t in range(120):
        step = controlled_step(kl[:, t], beta[:, t], noise.kl[:, t], 0.08)
        np.testing.assert_array_equal(kl[:, t + 1], step)
    # 2. the reward is the noise-free curve plus its measurement noise (the start noise-free);
    np.testing.assert_allclose(res.reward[0, :, 1:], controlled_reward(kl[:, 1:]) + 0.05 * noise.reward,
                               rtol=1e-13, atol=1e-14)
    assert np.all(res.reward[..., 0] == controlled_reward(0.5))
    for n in range(3):
        # 3. β is what the *stateful* controller returns when fed the same KL values one by one
        #    (so the vectorised next_beta path is checked against update);
        fresh = _fresh(template)
        np.testing.assert_array_equal(beta[n], [fresh.value] + [fresh.update(x, 8) for x in kl[n, 1:]])
        # 4. and seed n run alone gives the same run.
        alone = simulate_training_with_controller(template, noise=one_seed(noise, n), samples_per_update=8)
        np.testing.assert_array_equal(alone.kl[0, 0], kl[n])
        np.testing.assert_array_equal(alone.beta[0, 0], beta[n])
    np.testing.assert_allclose(res.penalized_reward, res.reward - 0.1 * res.kl, rtol=1e-12, atol=1e-13)
    # The template controller itself was not touched.
    assert len(template.history.kl) == 0


def test_handbook_exponential_rule_written_out():
    """The handbook's inline rule (β *= exp(0.12 (KL − 6)/6), clipped to [0.02, 0.5])."""
    noise = draw_training_noise(n_seeds=1, n_steps=200, rng=np.random.default_rng(6))
    res = simulate_training_with_controller(ExponentialKLController(), noise=noise)
    beta = 0.1
    for step in range(200):
        assert res.beta[0, 0, step] == pytest.approx(beta, rel=1e-12)
        beta = float(np.clip(beta * np.exp(0.12 * (res.kl[0, 0, step + 1] - 6.0) / 6.0), 0.02, 0.5))


def test_fixed_controller_keeps_beta_and_settles_at_closed_form():
    res = simulate_training_with_controller(
        FixedKLController(0.1), init_betas=[0.1, 0.5, 1.0], n_steps=1500, n_seeds=400,
        rng=np.random.default_rng(7),
    )
    np.testing.assert_array_equal(res.beta, np.broadcast_to([[[0.1]], [[0.5]], [[1.0]]], res.beta.shape))
    # KL* = 0.14 / (0.08 β) = 1.75 / β; stationary spread sigma / sqrt(1 - (1 - 0.08 β)^2).
    late = res.kl[:, :, -1]
    np.testing.assert_allclose(late.mean(axis=1), [17.5, 3.5, 1.75], rtol=0.01)
    assert res.target_kl is None


def test_exponential_controller_holds_kl_near_target():
    res = simulate_training_with_controller(ExponentialKLController(), n_steps=600, n_seeds=300,
                                            rng=np.random.default_rng(8))
    late_kl = res.kl[0, :, -200:].mean(axis=1)
    assert abs(np.median(late_kl) - 6.0) < 0.2
    # β settles where the push balances the pull at the target: 0.14 = 0.08 β 6.
    assert abs(np.median(res.beta[0, :, -200:]) - 0.14 / (0.08 * 6.0)) < 0.02
    assert np.all((res.beta >= 0.02) & (res.beta <= 0.5))
    assert res.target_kl == 6.0 and res.controller == "ExponentialKLController"


def test_penalized_reward_uses_initial_beta():
    res = simulate_training_with_controller(ExponentialKLController(), init_betas=[0.05, 0.2],
                                            n_steps=50, n_seeds=10, rng=np.random.default_rng(9))
    for k, b0 in enumerate([0.05, 0.2]):
        np.testing.assert_allclose(res.penalized_reward[k], res.reward[k] - b0 * res.kl[k])
    assert np.all(res.kl >= 0.1) and np.all(res.kl[..., 0] == 0.5)
    assert not res.penalized_reward.flags.writeable
    # At another price, every row pays the same β.
    np.testing.assert_allclose(res.penalized_reward_at(0.3), res.reward - 0.3 * res.kl)
    np.testing.assert_array_equal(res.penalized_reward_at(0.05)[0], res.penalized_reward[0])
    with pytest.raises(ValueError, match="beta"):
        res.penalized_reward_at(-0.1)
    with pytest.raises(TypeError, match="beta"):
        res.penalized_reward_at("0.1")


def test_same_seed_same_disturbances_across_controllers():
    a = simulate_training_with_controller(FixedKLController(0.1), n_steps=50, n_seeds=20,
                                          rng=np.random.default_rng(10))
    b = simulate_training_with_controller(ExponentialKLController(), n_steps=50, n_seeds=20,
                                          rng=np.random.default_rng(10))
    # Step 1 uses β0 = 0.1 in both, so the first KL (and reward) must coincide exactly.
    np.testing.assert_array_equal(a.kl[..., :2], b.kl[..., :2])
    np.testing.assert_array_equal(a.reward[..., :2], b.reward[..., :2])
    assert not np.array_equal(a.kl, b.kl)


def test_vectorised_over_initial_betas_matches_separate_runs():
    noise = draw_training_noise(6, 80, np.random.default_rng(11))
    both = simulate_training_with_controller(ExponentialKLController(), init_betas=[0.05, 0.3],
                                             noise=noise)
    one = simulate_training_with_controller(ExponentialKLController(beta=0.3), noise=noise)
    np.testing.assert_array_equal(both.kl[1], one.kl[0])
    np.testing.assert_array_equal(both.beta[1], one.beta[0])


# ------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        ({"betas": [-0.1]}, ValueError, "betas"),
        ({"betas": []}, ValueError, "betas"),
        ({"betas": ["a"]}, TypeError, "betas"),
        ({"betas": [0.1], "n_steps": 0}, ValueError, "n_steps"),
        ({"betas": [0.1], "n_seeds": 0}, ValueError, "n_seeds"),
        ({"betas": [0.1], "n_steps": 2.5}, TypeError, "n_steps"),
        ({"betas": [0.1], "noise_scale": -1.0}, ValueError, "noise_scale"),
        ({"betas": [0.1], "reward_scale": float("nan")}, ValueError, "reward_scale"),
    ],
)
def test_trajectory_validation(kwargs, exc, name):
    kwargs = {"rng": np.random.default_rng(0), **kwargs}  # a copy: the parameters are shared by every run
    with pytest.raises(exc, match=name):
        simulate_training_trajectory(**kwargs)


def test_rng_validation():
    with pytest.raises(TypeError, match="rng"):
        simulate_training_trajectory([0.1], rng=0)
    with pytest.raises(TypeError, match="rng"):
        simulate_training_trajectory([0.1])
    noise = draw_training_noise(2, 5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="rng"):
        simulate_training_trajectory([0.1], rng=np.random.default_rng(0), noise=noise)
    with pytest.raises(ValueError, match="n_steps"):
        simulate_training_trajectory([0.1], n_steps=6, noise=noise)


def test_controller_validation():
    rng = np.random.default_rng(0)
    with pytest.raises(TypeError, match="controller"):
        simulate_training_with_controller("adaptive", rng=rng)
    with pytest.raises(ValueError, match="init_betas"):
        simulate_training_with_controller(FixedKLController(0.1), init_betas=[-1.0], rng=rng)
    with pytest.raises(ValueError, match="target_kl"):
        simulate_training_with_controller(ExponentialKLController(), target_kl=3.0, rng=rng)
    with pytest.raises(ValueError, match="kl_noise"):
        simulate_training_with_controller(FixedKLController(0.1), kl_noise=-0.1, rng=rng)
    with pytest.raises(ValueError, match="samples_per_update"):
        simulate_training_with_controller(FixedKLController(0.1), samples_per_update=0, rng=rng)
    with pytest.raises(ValueError, match="noise"):
        TrainingNoise(kl=np.zeros((2, 3)), reward=np.zeros((2, 4)))
    res = simulate_training_with_controller(FixedKLController(0.1), target_kl=6.0, n_steps=3,
                                            n_seeds=2, rng=rng)
    assert res.target_kl == 6.0
