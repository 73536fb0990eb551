"""kltutorial.compat's KL controllers: the peers' signatures and return conventions over the package's rules.

The reference is each library's own class, written out below as its source has it (TRL v0.11.4
``trl/trainer/utils.py``, OpenRLHF v0.11 ``openrlhf/trainer/ppo_utils/kl_controller.py``, verl
``verl/trainer/ppo/core_algos.py``: the same rule under two spellings), and driven by the same calls.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from kltutorial import controllers
from kltutorial.compat import openrlhf, trl, verl
from kltutorial.controllers import MIN_FACTOR


class _TheirAdaptive:
    """The peers' AdaptiveKLController, verbatim in substance (the target's name aside)."""

    def __init__(self, init_kl_coef, target, horizon):
        self.value, self.target, self.horizon = init_kl_coef, target, horizon

    def update(self, current, n_steps):
        proportional_error = np.clip(current / self.target - 1, -0.2, 0.2)
        mult = 1 + proportional_error * n_steps / self.horizon
        self.value *= mult


SIGNATURES = {
    trl: (["init_kl_coef", "target", "horizon"], ["current", "n_steps"]),
    openrlhf: (["init_kl_coef", "target", "horizon"], ["current", "n_steps"]),
    verl: (["init_kl_coef", "target_kl", "horizon"], ["current_kl", "n_steps"]),
}


@pytest.mark.parametrize("lib", list(SIGNATURES), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_signatures_are_the_peers(lib):
    init, update = SIGNATURES[lib]
    assert list(inspect.signature(lib.AdaptiveKLController).parameters) == init
    assert list(inspect.signature(lib.AdaptiveKLController.update).parameters)[1:] == update
    assert list(inspect.signature(lib.FixedKLController).parameters) == ["kl_coef"]
    assert list(inspect.signature(lib.FixedKLController.update).parameters)[1:] == update
    with pytest.raises(TypeError, match="n_steps"):  # required, as theirs
        lib.AdaptiveKLController(0.2, 6.0, 100).update(1.0)


@pytest.mark.parametrize("lib", list(SIGNATURES), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_adaptive_follows_the_peers_bit_for_bit_and_returns_none(lib):
    init, update = SIGNATURES[lib]
    ours = lib.AdaptiveKLController(**dict(zip(init, (0.2, 6.0, 10_000.0), strict=True)))
    theirs = _TheirAdaptive(0.2, 6.0, 10_000.0)
    rng = np.random.default_rng(0)
    for _ in range(500):
        kl, n = float(rng.uniform(0, 15)), int(rng.integers(1, 4096))
        assert ours.update(**dict(zip(update, (kl, n), strict=True))) is None
        theirs.update(kl, n)
        assert ours.value == theirs.value  # exact
    assert ours.target == 6.0 and ours.horizon == 10_000.0
    assert isinstance(ours, controllers.KLController)  # usable wherever the package takes a controller


@pytest.mark.parametrize("lib", list(SIGNATURES), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_where_they_turn_beta_negative_ours_floors_the_factor(lib):
    ours, theirs = lib.AdaptiveKLController(0.2, 6.0, 100.0), _TheirAdaptive(0.2, 6.0, 100.0)
    ours.update(0.0, 1000)
    theirs.update(0.0, 1000)
    assert theirs.value < 0 < ours.value == pytest.approx(0.2 * MIN_FACTOR)


@pytest.mark.parametrize("lib", list(SIGNATURES), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_value_is_settable_as_the_peers_trainers_set_it(lib):
    ctl = lib.AdaptiveKLController(0.2, 6.0, 100.0)
    ctl.value = 0.05  # e.g. restoring a checkpoint by hand
    theirs = _TheirAdaptive(0.05, 6.0, 100.0)
    ctl.update(9.0, 10)
    theirs.update(9.0, 10)
    assert ctl.value == theirs.value
    fixed = lib.FixedKLController(0.1)
    assert fixed.update(5.0, 64) is None and fixed.value == 0.1
    fixed.value = 0.3
    assert fixed.value == 0.3


def test_bad_input_is_a_clear_error_where_theirs_divides_by_zero():
    # each error names the argument as the caller wrote it
    with pytest.raises(ValueError, match="^target must be a finite number > 0"):
        trl.AdaptiveKLController(0.2, 0.0, 100)
    with pytest.raises(ValueError, match="^target_kl must be a finite number > 0"):
        verl.AdaptiveKLController(0.2, 0.0, 100)
    with pytest.raises(ValueError, match="^init_kl_coef must be a finite number > 0"):
        openrlhf.AdaptiveKLController(-1.0, 6.0, 100)
    with pytest.raises(ValueError, match="^current_kl must be a finite number"):
        verl.AdaptiveKLController(0.2, 6.0, 100).update(float("nan"), 10)
    with pytest.raises(ValueError, match="^current must be a finite number"):
        trl.FixedKLController(0.1).update(float("inf"), 10)
    with pytest.raises(ValueError, match="^kl_coef must be a finite number >= 0"):
        openrlhf.FixedKLController(-0.1)


def test_repr_uses_the_peers_names():
    assert repr(trl.AdaptiveKLController(0.2, 6.0, 100)) == (
        "AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=100.0)")
    assert repr(verl.AdaptiveKLController(0.2, 6.0, 100)) == (
        "AdaptiveKLController(init_kl_coef=0.2, target_kl=6.0, horizon=100.0)")
    assert repr(openrlhf.FixedKLController(0.1)) == "FixedKLController(kl_coef=0.1)"


# --- a peer's own test, import swapped ------------------------------------------------------------------
# From MindSpeed-RL (a verl-style trainer; Copyright (c) 2025, HUAWEI CORPORATION), its
# TestAdaptiveKLController: the same calls and assertions, exact equality included, with the import of
# AdaptiveKLController changed to kltutorial.compat.verl (its DistributedTest harness dropped).


class TestAdaptiveKLControllerPorted:
    @pytest.fixture
    def setUp(self):
        from kltutorial.compat.verl import AdaptiveKLController
        self.controller = AdaptiveKLController(init_kl_coef=1.0, target_kl=0.1, horizon=100)

    def test_update_with_positive_error(self, setUp):
        self.controller.update(0.2, 50)
        assert self.controller.value == 1.1

    def test_update_with_negative_error(self, setUp):
        self.controller.update(0.05, 50)
        assert self.controller.value == 0.9
