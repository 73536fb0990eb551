"""Tests of kltutorial.studies.control: the step-response loop against a hand-computed run, the
measurements on hand-made responses, the linearised loop against finite differences of the real
one, the critical gain, the speed limit, and bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kltutorial.controllers import AdaptiveKLController, ExponentialKLController, FixedKLController
from kltutorial.studies.control import (
    StepMetrics,
    balance_beta,
    critical_gain,
    linearised_loop,
    measure_step,
    plant_push_pull,
    simulate_step_response,
    updates_to_scale,
)
from kltutorial.studies.dynamics import controlled_step


def _step(target0, target1, horizon, n=1, **kw):
    return simulate_step_response([AdaptiveKLController(0.2, target0, horizon)],
                                  [AdaptiveKLController(0.2, target1, horizon)],
                                  samples_per_update=n, **kw)


def test_balance_beta_is_a_fixed_point_of_the_plant():
    for target in (1.0, 4.0, 6.0, 17.5):
        beta = balance_beta(target)
        assert math.isclose(beta, 1.75 / target)
        assert math.isclose(float(controlled_step(target, beta, 0.0, 0.0)), target)
    assert plant_push_pull() == pytest.approx((0.14, 0.08))


def test_step_response_matches_a_hand_computed_loop():
    res = _step(6.0, 4.0, 100.0, n=3, switch_step=4, n_steps=10, n_seeds=2,
                rng=np.random.default_rng(5), kl_noise=0.08)
    eps = np.random.default_rng(5).standard_normal((2, 10))
    for s in range(2):
        kl, beta = 6.0, 1.75 / 6.0
        assert res.kl[0, s, 0] == kl and math.isclose(res.beta[0, s, 0], beta)
        for t in range(10):
            kl = max(0.1, kl + 0.14 - 0.08 * beta * kl + 0.08 * eps[s, t])
            target = 6.0 if t + 1 < 4 else 4.0
            e = min(max(kl / target - 1.0, -0.2), 0.2)
            beta = beta * (1.0 + e * 3 / 100.0)
            assert math.isclose(res.kl[0, s, t + 1], kl, rel_tol=1e-12)
            assert math.isclose(res.beta[0, s, t + 1], beta, rel_tol=1e-12)
    assert res.target.tolist() == [6.0] * 4 + [4.0] * 7
    assert not res.kl.flags.writeable


def test_noise_free_loop_is_still_until_the_step_and_only_n_over_h_matters():
    a = _step(6.0, 4.0, 10_000.0, n=512, switch_step=50, n_steps=400, n_seeds=1,
              rng=np.random.default_rng(0), kl_noise=0.0)
    b = _step(6.0, 4.0, 1250.0, n=64, switch_step=50, n_steps=400, n_seeds=1,
              rng=np.random.default_rng(1), kl_noise=0.0)
    assert np.all(a.kl[0, 0, :50] == 6.0)
    np.testing.assert_allclose(a.kl, b.kl, rtol=1e-12)
    assert abs(a.kl[0, 0, -1] - 4.0) < 0.01  # it reaches the new target


def test_rows_share_the_disturbances():
    before = [AdaptiveKLController(0.2, 6.0, 100.0), FixedKLController(0.3)]
    with pytest.raises(ValueError, match="target_kl"):
        simulate_step_response(before, before, 2, 5, 3, np.random.default_rng(0))
    c = [ExponentialKLController(0.1, 6.0, gain=0.1, max_coef=1.0)] * 2
    res = simulate_step_response(c, c, 2, 5, 3, np.random.default_rng(0))
    np.testing.assert_array_equal(res.kl[0], res.kl[1])


def test_measure_step_by_hand():
    kl = np.array([[6.0, 6.0, 5.0, 3.5, 3.95, 4.0, 4.0],
                   [6.0, 6.0, 5.9, 5.0, 4.5, 4.2, 4.3]])
    m = measure_step(kl, 6.0, 4.0, 1)
    assert isinstance(m, StepMetrics)
    np.testing.assert_allclose(m.rise_time, [2.0, np.nan])
    np.testing.assert_allclose(m.overshoot, [0.25, 0.0])
    np.testing.assert_allclose(m.settling_time, [3.0, np.nan])
    up = measure_step(np.array([2.0, 2.0, 3.0, 3.0]), 2.0, 3.0, 1)  # a step up, on target after one
    assert up.rise_time == 1.0 and up.settling_time == 1.0 and up.overshoot == 0.0


def test_linearised_loop_is_the_jacobian_of_the_loop():
    target, g = 6.0, 0.05
    beta_star = balance_beta(target)

    def step(x, y):  # noise-free plant, then log beta += log(1 + g e) (e inside the clip)
        kl = float(controlled_step(target + x, beta_star * math.exp(y), 0.0, 0.0))
        return np.array([kl - target, y + math.log1p(g * (kl / target - 1.0))])

    h = 1e-6
    jac = np.column_stack([(step(h, 0.0) - step(-h, 0.0)) / (2 * h),
                           (step(0.0, h) - step(0.0, -h)) / (2 * h)])
    np.testing.assert_allclose(linearised_loop(target, g), jac, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("target", [2.0, 6.0, 20.0])
def test_critical_gain_separates_real_from_complex_eigenvalues(target):
    g_c = critical_gain(target)
    a = 0.14 / target
    assert g_c == pytest.approx(a / 4, rel=0.3)
    assert np.all(np.linalg.eigvals(linearised_loop(target, 0.99 * g_c)).imag == 0)
    eig = np.linalg.eigvals(linearised_loop(target, 1.01 * g_c))
    assert np.all(eig.imag != 0)
    for g in (1.01 * g_c, 10 * g_c, 1.0):  # complex: modulus sqrt(1 - a) whatever the gain
        np.testing.assert_allclose(np.abs(np.linalg.eigvals(linearised_loop(target, g))),
                                   math.sqrt(1 - a))


def test_updates_to_scale_is_the_clipped_speed_limit():
    g = 0.05
    n = updates_to_scale(2.0, g)
    assert math.isclose((1 + 0.2 * g) ** n, 2.0)
    assert math.isclose((1 - 0.2 * g) ** updates_to_scale(0.5, g), 0.5)
    assert updates_to_scale(1.0, g) == 0.0 and updates_to_scale(0.5, 5.0) == 1.0
    # the controller, pushed with the largest error, needs ceil(n) updates
    c = AdaptiveKLController(1.0, 1.0, horizon=1 / g)
    beta, count = 1.0, 0
    while beta < 2.0:
        beta, count = float(c.next_beta(beta, 100.0, 1)), count + 1
    assert count == math.ceil(n)


P = AdaptiveKLController(0.2, 6.0, 100.0)


def _rng():
    return np.random.default_rng(0)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: simulate_step_response(P, [P], 1, 5, 1, _rng()), TypeError, "sequences"),
        (lambda: simulate_step_response([], [], 1, 5, 1, _rng()), ValueError, "non-empty"),
        (lambda: simulate_step_response([P], [P, P], 1, 5, 1, _rng()), ValueError, "length"),
        (lambda: simulate_step_response([1.0], [P], 1, 5, 1, _rng()), TypeError, "KLController"),
        (lambda: simulate_step_response([P], [P], 6, 5, 1, _rng()), ValueError, "switch_step"),
        (lambda: simulate_step_response([P], [P], 0, 5, 1, _rng()), ValueError, "switch_step"),
        (lambda: simulate_step_response([P], [P], 1, 5, 1, 0), TypeError, "rng"),
        (lambda: simulate_step_response([P], [P], 1, 5, 1, np.random.default_rng(0), kl_noise=-1.0),
         ValueError, "kl_noise"),
        (lambda: simulate_step_response([P], [P], 1, 5, 1, np.random.default_rng(0),
                                        samples_per_update=[1, 2]), ValueError, "samples_per_update"),
        (lambda: simulate_step_response([P, AdaptiveKLController(0.2, 5.0)], [P, P], 1, 5, 1,
                                        _rng()), ValueError, "share one target"),
        (lambda: measure_step(np.ones(5), 6.0, 6.0, 1), ValueError, "different"),
        (lambda: measure_step(np.ones(5), 6.0, 4.0, 5), ValueError, "switch_step"),
        (lambda: measure_step(np.ones(5), 6.0, 4.0, 1, tolerance=0.0), ValueError, "tolerance"),
        (lambda: balance_beta(0.0), ValueError, "target_kl"),
        (lambda: linearised_loop(6.0, -1.0), ValueError, "gain"),
        (lambda: critical_gain(0.1), ValueError, "target_kl"),
        (lambda: updates_to_scale(0.0, 0.1), ValueError, "factor"),
        (lambda: updates_to_scale(2.0, "x"), TypeError, "gain"),
    ],
)
def test_bad_inputs(call, error, match):
    with pytest.raises(error, match=match):
        call()
