"""KL controllers: hand-computed sequences, clamps, closed-loop behaviour against a simple plant, one
vocabulary (the peers' spellings are in kltutorial.compat, tests/compat/), a settable value, checkpoints, a
positive beta, and a table of bad inputs."""

from __future__ import annotations

import json
import math
import sys
import warnings

import numpy as np
import pytest
import torch

from kltutorial import (
    AdaptiveKLController,
    DoublingKLController,
    ExponentialKLController,
    FixedKLController,
)
from kltutorial.controllers import MIN_FACTOR, KLController


def test_fixed_never_moves():
    c = FixedKLController(0.05)
    assert [c.update(kl) for kl in (0.0, 3.0, 100.0)] == [0.05, 0.05, 0.05]
    assert c.value == 0.05
    np.testing.assert_array_equal(c.history.beta, [0.05] * 4)
    np.testing.assert_array_equal(c.next_beta(np.full(3, 0.05), np.arange(3.0)), [0.05] * 3)


def test_proportional_rule_by_hand():
    c = AdaptiveKLController(beta=0.2, target_kl=6.0, horizon=10000)
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
    c = DoublingKLController(beta=0.1, target_kl=6.0)
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
    c = ExponentialKLController(beta=0.1, target_kl=6.0, gain=0.12)
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
    c = AdaptiveKLController(beta=1.0, target_kl=6.0, horizon=100.0)
    kls = _run_closed_loop(c, 3000)
    assert kls[0] < 3.0
    tail = kls[-200:]
    assert np.all(np.abs(tail / 6.0 - 1.0) < 0.10)
    assert c.value == pytest.approx(0.25, rel=0.1)


def test_doubling_controller_only_reaches_its_band_in_closed_loop():
    c = DoublingKLController(beta=1.0, target_kl=6.0)
    kls = _run_closed_loop(c, 400)
    # Once inside [4, 9] it stops acting: KL settles wherever the last doubling/halving left it.
    assert np.all((kls[-100:] >= 4.0) & (kls[-100:] <= 9.0))
    assert set(np.round(c.history.beta, 12)) <= {1.0, 0.5, 0.25, 0.125}


# --- defaults, arrays where scalars are usual, the clamps' edges --------------------------------------


def test_the_defaults_are_the_documented_ones():
    assert repr(AdaptiveKLController()) == "AdaptiveKLController(beta=0.2, target_kl=6.0, horizon=10000.0)"
    assert repr(FixedKLController()) == "FixedKLController(beta=0.1)"
    assert repr(DoublingKLController()) == (
        "DoublingKLController(beta=0.1, target_kl=6.0, factor=2.0, band=1.5, min_coef=0.001, max_coef=10.0)"
    )
    assert repr(ExponentialKLController()) == (
        "ExponentialKLController(beta=0.1, target_kl=6.0, gain=0.12, min_coef=0.02, max_coef=0.5)"
    )
    # next_beta counts one step unless told: the proportional rule's step is 0.2 * 1 / 100
    assert AdaptiveKLController(1.0, 6.0, 100.0).next_beta(1.0, 12.0) == pytest.approx(1.002, rel=1e-15)


@pytest.mark.parametrize("name", ["fixed", "adaptive", "doubling", "exponential"])
def test_next_beta_broadcasts_a_scalar_beta_over_an_array_of_kls(name):
    c = MAKERS[name]()  # beta 0.3, target 6
    kls = np.array([[0.5, 6.0, 20.0], [3.0, 8.0, 12.0]])
    got = c.next_beta(0.3, kls)
    assert isinstance(got, np.ndarray) and got.shape == (2, 3) and got.dtype == np.float64
    want = [[c.next_beta(0.3, float(kl)) for kl in row] for row in kls]
    np.testing.assert_array_equal(got, want)
    # and an integer beta is a float coefficient, elementwise over the KLs
    np.testing.assert_array_equal(c.next_beta(1, np.zeros(2)), c.next_beta(1.0, np.zeros(2)))
    assert c.next_beta(1, np.zeros(2)).dtype == np.float64
    if name == "fixed":
        np.testing.assert_array_equal(got, np.full((2, 3), 0.3))
        out = c.next_beta(np.array([0.1, 0.2]), np.array([[1.0], [2.0], [3.0]]))  # (2,) with (3, 1)
        np.testing.assert_array_equal(out, np.tile([0.1, 0.2], (3, 1)))


def test_the_base_class_has_no_rule():
    with pytest.raises(NotImplementedError):
        KLController().next_beta(0.1, 1.0)


def test_an_overflow_of_the_proportional_rule_is_clipped_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning: the clip is the documented behaviour
        c = AdaptiveKLController(1.0, 1.0, 1.0)
        assert c.next_beta(1e308, 100.0, n_steps=10**6) == sys.float_info.max
        assert c.next_beta(1e-300, 0.0, n_steps=10**6) == pytest.approx(1e-302)


@pytest.mark.parametrize("cls", [DoublingKLController, ExponentialKLController])
def test_a_clamp_may_be_one_point_and_beta_may_start_at_either_end(cls):
    pinned = cls(beta=0.5, min_coef=0.5, max_coef=0.5)
    assert [pinned.update(kl) for kl in (0.0, 6.0, 100.0)] == [0.5, 0.5, 0.5]
    low, high = cls(beta=0.05, min_coef=0.05, max_coef=2.0), cls(beta=2.0, min_coef=0.05, max_coef=2.0)
    assert low.value == 0.05 and high.value == 2.0
    assert low.update(0.0) == 0.05 and high.update(100.0) == 2.0  # pushed past the clamp: held there
    assert low.update(100.0) > 0.05 and high.update(0.0) < 2.0


# --- one vocabulary; a settable value ---------------------------------------------------------------------

MAKERS = {
    "fixed": lambda: FixedKLController(0.3),
    "adaptive": lambda: AdaptiveKLController(0.3, 6.0, 50.0),
    "doubling": lambda: DoublingKLController(0.3, 6.0),
    "exponential": lambda: ExponentialKLController(0.3, 6.0, 0.12, 0.01, 5.0),
}


def _drive(controller, kls=(9.0, 2.0, 6.5, 30.0, 0.1), n_steps=7):
    return [controller.update(kl, n_steps) for kl in kls]


@pytest.mark.parametrize(
    ("cls", "peer_keyword"),
    [
        (AdaptiveKLController, "init_kl_coef"),
        (AdaptiveKLController, "target"),
        (FixedKLController, "kl_coef"),
        (DoublingKLController, "init_kl_coef"),
        (ExponentialKLController, "target"),
    ],
)
def test_the_core_speaks_one_vocabulary(cls, peer_keyword):
    with pytest.raises(TypeError, match=peer_keyword):
        cls(**{peer_keyword: 0.5})


@pytest.mark.parametrize("name", list(MAKERS))
def test_update_takes_the_kl_as_kl_and_no_peer_keyword(name):
    positional, keyword = MAKERS[name](), MAKERS[name]()
    for kl in (9.0, 2.0, 30.0):
        assert keyword.update(kl=kl, n_steps=64) == positional.update(kl, 64)
    for peer in ("current", "current_kl"):
        with pytest.raises(TypeError, match=peer):
            positional.update(**{peer: 1.0})
    assert not hasattr(positional, "target")  # the peers' name lives in kltutorial.compat


@pytest.mark.parametrize("name", list(MAKERS))
def test_value_is_settable_and_the_next_update_starts_from_it(name):
    c, fresh = MAKERS[name](), MAKERS[name]()
    c.update(9.0, 7)
    c.value = 0.4
    assert c.value == 0.4 and c.history.beta[-1] == 0.4 and c.history.beta.size == 2
    fresh.value = 0.4
    assert c.update(2.0, 7) == fresh.update(2.0, 7)
    with pytest.raises(ValueError, match="value must be a finite number"):
        c.value = -1.0
    assert c.value == fresh.value  # a rejected value changes nothing


def test_only_a_fixed_coefficient_may_be_set_to_zero_and_a_clamp_bounds_the_value():
    fixed = FixedKLController(0.1)
    fixed.value = 0.0
    assert fixed.update(3.0) == 0.0
    with pytest.raises(ValueError, match="value"):
        AdaptiveKLController().value = 0.0
    with pytest.raises(ValueError, match=r"value must lie in \[min_coef, max_coef\]"):
        DoublingKLController().value = 20.0


def test_repr_shows_the_books_names():
    assert repr(AdaptiveKLController(beta=0.2, target_kl=6, horizon=100)) == (
        "AdaptiveKLController(beta=0.2, target_kl=6.0, horizon=100.0)"
    )
    assert repr(FixedKLController(beta=0.05)) == "FixedKLController(beta=0.05)"
    assert "target_kl=6.0" in repr(DoublingKLController()) and "gain=0.12" in repr(ExponentialKLController())


# --- n_steps = 0 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MAKERS))
def test_zero_steps_is_a_no_op_that_records_nothing(name):
    c = MAKERS[name]()
    c.update(20.0, n_steps=3)
    before, history = c.value, c.history
    assert c.update(100.0, n_steps=0) == before == c.value
    assert c.update(kl=0.0, n_steps=0) == before
    np.testing.assert_array_equal(c.history.kl, history.kl)
    np.testing.assert_array_equal(c.history.beta, history.beta)
    with pytest.raises(ValueError, match="kl must be a finite number"):
        c.update(math.nan, n_steps=0)  # still checked


# --- checkpoints ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MAKERS))
def test_state_dict_round_trip_restores_value_and_history_and_the_future(name):
    original = MAKERS[name]()
    _drive(original)
    state = json.loads(json.dumps(original.state_dict()))  # plain values: JSON or torch.save
    restored = MAKERS[name]()
    restored.load_state_dict(state)
    assert restored.value == original.value
    np.testing.assert_array_equal(restored.history.kl, original.history.kl)
    np.testing.assert_array_equal(restored.history.beta, original.history.beta)
    assert _drive(restored, (12.0, 0.5)) == _drive(original, (12.0, 0.5))
    assert restored.state_dict() == original.state_dict()
    # the state is a copy: changing the controller afterwards does not change a saved state
    saved = original.state_dict()
    original.update(50.0)
    assert len(saved["kl"]) == len(original.state_dict()["kl"]) - 1


def _state(**override):
    state = AdaptiveKLController(0.2, 6.0, 100).state_dict()
    state.update(override)
    return state


@pytest.mark.parametrize(
    ("state", "exc", "match"),
    [
        ([("value", 0.2)], TypeError, r"^state must be a mapping from state_dict\(\), got list$"),
        ({"value": 0.2}, ValueError, "state must have the keys"),
        (_state(extra=1), ValueError, "state must have the keys"),
        (_state(type="FixedKLController"), ValueError,
         "^state is of a FixedKLController, not of a AdaptiveKLController$"),
        (_state(value=-0.1), ValueError, r"state\['value'\] must be a finite number > 0"),
        (_state(value=0.0, beta=[0.0]), ValueError, r"state\['value'\]"),
        (_state(value=0.3), ValueError, r"end with state\['value'\]"),
        (_state(kl=[1.0]), ValueError,
         r"^state\['beta'\] must hold one more coefficient than state\['kl'\] has KLs and end with "
         r"state\['value'\]; got 1 coefficients, 1 KLs$"),
        (_state(kl=[1.0], beta=[0.2, -0.2]), ValueError,
         r"^state\['beta'\]\[1\] must be a finite number > 0"),
        (_state(kl=[math.nan], beta=[0.2, 0.2]), ValueError, r"state\['kl'\]\[0\] must be a finite number"),
        (_state(kl=["x"], beta=[0.2, 0.2]), TypeError, r"state\['kl'\]\[0\] must be a real number"),
    ],
)
def test_load_state_dict_rejects_a_bad_state(state, exc, match):
    c = AdaptiveKLController(0.2, 6.0, 100)
    with pytest.raises(exc, match=match):
        c.load_state_dict(state)
    assert c.value == 0.2 and c.history.kl.size == 0  # untouched


def test_a_fixed_coefficient_of_zero_round_trips():
    c = FixedKLController(0.0)
    c.update(3.0)
    restored = FixedKLController(1.0)
    restored.load_state_dict(c.state_dict())
    assert restored.value == 0.0 and restored.history.beta.tolist() == [0.0, 0.0]


# --- beta stays positive and finite; bit-for-bit the libraries' rule otherwise ------------------------


def _library_rule(value: float, current: float, n_steps: int, target: float, horizon: float) -> float:
    """The update of lm-human-preferences, TRL (<= 0.11), OpenRLHF and verl, as they write it."""
    proportional_error = np.clip(current / target - 1, -0.2, 0.2)
    mult = 1 + proportional_error * n_steps / horizon
    return value * mult


def test_adaptive_equals_the_libraries_bit_for_bit_where_their_factor_is_at_least_min_factor():
    rng = np.random.default_rng(0)
    target, horizon = 6.0, 10_000.0
    c = AdaptiveKLController(0.2, target, horizon)
    theirs = 0.2
    for _ in range(2000):
        kl = float(rng.uniform(0, 15))
        n = int(rng.integers(1, int(4.95 * horizon) + 1))
        theirs = _library_rule(theirs, kl, n, target, horizon)
        assert c.update(kl, n) == theirs  # exact equality, not approx
    assert c.history.beta.min() > 0


@pytest.mark.parametrize("n_steps", [50_000, 50_001, 10**6, 10**12, 10**300])
def test_huge_n_steps_keeps_beta_positive_and_finite(n_steps):
    low = AdaptiveKLController(0.2, 6.0, 10_000)
    assert _library_rule(0.2, 0.0, n_steps, 6.0, 10_000) <= 0  # theirs: zero or negative
    assert low.update(0.0, n_steps=n_steps) == pytest.approx(0.2 * MIN_FACTOR)
    high = AdaptiveKLController(0.2, 6.0, 10_000)
    assert 0.2 < high.update(100.0, n_steps=n_steps) < math.inf
    for _ in range(400):  # repeated: never underflows to 0, never overflows to inf
        low.update(0.0, n_steps=n_steps)
        high.update(100.0, n_steps=n_steps)
    assert 0 < low.value and math.isfinite(high.value)
    assert np.all(np.isfinite(high.history.beta)) and np.all(low.history.beta > 0)


def test_floored_factor_is_continuous_and_monotone_in_n_steps():
    c = AdaptiveKLController(1.0, 6.0, 100.0)
    n = np.arange(1, 2001)
    betas = c.next_beta(1.0, 0.0, n)
    assert np.all(np.diff(betas) <= 0) and betas.min() == MIN_FACTOR
    np.testing.assert_array_equal(betas[n <= 495], 1 - 0.2 * n[n <= 495] / 100.0)
    np.testing.assert_array_equal(betas[n > 495], MIN_FACTOR)  # 1 - 0.2 * 495 / 100 is 0.01 + 9e-18


# --- bad input: one table for the module --------------------------------------------------------------

BAD_INPUTS = [
    # (id, callable, kwargs, exception, message regex)
    ("fixed-negative", FixedKLController, dict(beta=-0.1), ValueError, "beta must be a finite number >= 0"),
    ("fixed-nan", FixedKLController, dict(beta=math.nan), ValueError, "beta must be a finite number"),
    ("fixed-str", FixedKLController, dict(beta="0.1"), TypeError, "beta must be a real number"),
    ("adaptive-target", AdaptiveKLController, dict(beta=0.1, target_kl=0.0), ValueError, "target_kl must be"),
    ("adaptive-horizon", AdaptiveKLController, dict(horizon=-5), ValueError, "horizon must be"),
    ("adaptive-init", AdaptiveKLController, dict(beta=0.0), ValueError, "beta must be a finite number > 0"),
    ("adaptive-init-inf", AdaptiveKLController, dict(beta=math.inf), ValueError, "beta must be a finite"),
    ("adaptive-bool", AdaptiveKLController, dict(beta=True), TypeError, "beta must be a real number"),
    ("doubling-target", DoublingKLController, dict(target_kl=-6.0), ValueError, "target_kl must be"),
    ("doubling-factor", DoublingKLController, dict(factor=1.0), ValueError,
     "factor must be a finite number > 1"),
    ("doubling-band", DoublingKLController, dict(band=0.5), ValueError, "band must be a finite number > 1"),
    ("doubling-bounds", DoublingKLController, dict(min_coef=1.0, max_coef=0.5), ValueError,
     "min_coef must be <= max_coef"),
    ("doubling-init", DoublingKLController, dict(beta=20.0), ValueError,
     r"^beta must lie in \[min_coef, max_coef\] = \[0.001, 10.0\], got 20.0$"),
    ("doubling-init-zero", DoublingKLController, dict(beta=0.0), ValueError,
     "^beta must be a finite number > 0, got 0"),
    ("exp-init-below", ExponentialKLController, dict(beta=0.01), ValueError,
     r"^beta must lie in \[min_coef, max_coef\] = \[0.02, 0.5\], got 0.01$"),
    ("doubling-min", DoublingKLController, dict(min_coef=0), ValueError,
     "min_coef must be a finite number > 0"),
    ("exp-gain", ExponentialKLController, dict(gain=0.0), ValueError, "gain must be a finite number > 0"),
    ("exp-target", ExponentialKLController, dict(target_kl=math.nan), ValueError, "target_kl must be"),
    ("exp-max", ExponentialKLController, dict(max_coef=math.inf), ValueError, "max_coef must be"),
    ("update-nan", AdaptiveKLController().update, dict(kl=math.nan), ValueError, "kl must be a finite"),
    ("update-inf", AdaptiveKLController().update, dict(kl=math.inf), ValueError, "kl must be a finite"),
    ("update-str", FixedKLController().update, dict(kl="6"), TypeError, "kl must be a real"),
    ("update-array", FixedKLController().update, dict(kl=np.ones(2)), ValueError,
     r"kl must be a single number, got an array of shape \(2,\)"),
    ("update-tensor", FixedKLController().update, dict(kl=torch.ones(1, 1)), ValueError,
     "kl must be a single number"),
    ("update-steps", AdaptiveKLController().update, dict(kl=1.0, n_steps=-1), ValueError,
     "n_steps must be >= 0"),
    ("update-steps-float", DoublingKLController().update, dict(kl=1.0, n_steps=1.5), TypeError,
     "n_steps must be an int"),
]


@pytest.mark.parametrize(("call", "kwargs", "exc", "match"), [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_rejected_with_a_clear_message(call, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(**kwargs)
