"""KL controllers: hand-computed sequences, clamps, and closed-loop behaviour against a simple plant."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kltutorial import (
    AdaptiveKLController,
    DoublingKLController,
    ExponentialKLController,
    FixedKLController,
)


def test_fixed_never_moves():
    c = FixedKLController(0.05)
    assert [c.update(kl) for kl in (0.0, 3.0, 100.0)] == [0.05, 0.05, 0.05]
    assert c.value == 0.05
    np.testing.assert_array_equal(c.history.beta, [0.05] * 4)
    np.testing.assert_array_equal(c.next_beta(np.full(3, 0.05), np.arange(3.0)), [0.05] * 3)


def test_proportional_rule_by_hand():
    c = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000)
    # KL = 9: error 0.5 clipped to 0.2; n_steps = 256 -> beta * (1 + 0.2 * 256 / 10000).
    assert c.update(9.0, n_steps=256) == pytest.approx(0.2 * 1.00512)
    # KL = 6.6: error 0.1, inside the clip; n_steps = 100 -> * (1 + 0.1 * 0.01).
    assert c.update(6.6, n_steps=100) == pytest.approx(0.2 * 1.00512 * 1.001)
    # KL = 0: error -1 clipped to -0.2; n_steps = 1000 -> * 0.98.
    assert c.update(0.0, n_steps=1000) == pytest.approx(0.2 * 1.00512 * 1.001 * 0.98)
    # KL on target: no change.
    before = c.value
    assert c.update(6.0, n_steps=5000) == pytest.approx(before)
    h = c.history
    np.testing.assert_allclose(h.kl, [9.0, 6.6, 0.0, 6.0])
    assert h.beta.shape == (5,) and h.beta[0] == 0.2 and h.beta[-1] == c.value


def test_proportional_rule_is_symmetric_in_the_clip():
    up = AdaptiveKLController(1.0, 1.0, 10.0).update(1e9, n_steps=1)
    down = AdaptiveKLController(1.0, 1.0, 10.0).update(0.0, n_steps=1)
    assert up == pytest.approx(1.02) and down == pytest.approx(0.98)


def test_doubling_rule_by_hand_and_saturation():
    c = DoublingKLController(init_kl_coef=0.1, target_kl=6.0)
    # Above 1.5 * target = 9: doubles, until the clamp at 10.
    highs = [c.update(12.0) for _ in range(9)]
    np.testing.assert_allclose(highs, [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0])
    # Inside the band [4, 9] nothing happens: beta stays pinned at the clamp.
    assert [c.update(kl) for kl in (4.5, 6.0, 8.9)] == [10.0, 10.0, 10.0]
    # Below target / 1.5 = 4: halves, until the floor at 0.001.
    lows = [c.update(1.0) for _ in range(15)]
    assert lows[0] == 5.0 and lows[-1] == 0.001 and min(lows) == 0.001
    # The band edges themselves are inside the band.
    edge = DoublingKLController(0.1, 6.0)
    assert edge.update(9.0) == 0.1 and edge.update(4.0) == 0.1


def test_exponential_rule_by_hand_and_clamp():
    c = ExponentialKLController(init_kl_coef=0.1, target_kl=6.0, gain=0.12)
    assert c.update(12.0) == pytest.approx(0.1 * np.exp(0.12))
    assert c.update(3.0) == pytest.approx(0.1 * np.exp(0.12) * np.exp(-0.06))
    for _ in range(100):
        c.update(60.0)
    assert c.value == 0.5
    for _ in range(200):
        c.update(0.0)
    assert c.value == 0.02


@pytest.mark.parametrize(
    "make",
    [
        lambda: AdaptiveKLController(0.3, 6.0, 50.0),
        lambda: DoublingKLController(0.3, 6.0),
        lambda: ExponentialKLController(0.3, 6.0, 0.12, 0.01, 5.0),
        lambda: FixedKLController(0.3),
    ],
)
def test_next_beta_is_pure_and_matches_update(make):
    """The array rule used by simulations gives exactly what update gives, and changes no state."""
    kls = np.array([0.5, 3.0, 6.0, 8.0, 20.0])
    ref = make()
    expected = []
    for kl in kls:
        fresh = make()
        expected.append(fresh.update(float(kl), n_steps=3))
    got = ref.next_beta(np.full(kls.shape, 0.3), kls, 3)
    np.testing.assert_allclose(got, expected)
    assert ref.value == 0.3 and ref.history.kl.size == 0


def test_update_accepts_zero_dim_tensors():
    c = AdaptiveKLController(0.2, 6.0, 100.0)
    assert c.update(torch.tensor(12.0)) == pytest.approx(c.history.beta[0] * 1.002)


def _run_closed_loop(controller, n_updates: int, kl0: float = 1.0, gain: float = 1.5, speed: float = 0.2):
    """A plant whose KL relaxes towards gain / beta (more penalty, less drift)."""
    kl = kl0
    kls = []
    for _ in range(n_updates):
        kl = kl + speed * (gain / controller.value - kl)
        kls.append(kl)
        controller.update(kl, n_steps=1)
    return np.array(kls)


def test_proportional_controller_reaches_target_in_closed_loop():
    # Equilibrium needs beta = 1.5 / 6 = 0.25; start 4x too high.
    c = AdaptiveKLController(init_kl_coef=1.0, target=6.0, horizon=100.0)
    kls = _run_closed_loop(c, 3000)
    assert kls[0] < 3.0
    tail = kls[-200:]
    assert np.all(np.abs(tail / 6.0 - 1.0) < 0.10)
    assert c.value == pytest.approx(0.25, rel=0.1)


def test_doubling_controller_only_reaches_its_band_in_closed_loop():
    c = DoublingKLController(init_kl_coef=1.0, target_kl=6.0)
    kls = _run_closed_loop(c, 400)
    # Once inside [4, 9] it stops acting: KL settles wherever the last doubling/halving left it.
    assert np.all((kls[-100:] >= 4.0) & (kls[-100:] <= 9.0))
    assert set(np.round(c.history.beta, 12)) <= {1.0, 0.5, 0.25, 0.125}
