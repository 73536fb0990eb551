"""Tests of kltutorial.studies.estimation (book section 4): the Gaussian quadrature against closed forms and
Schulman's table, sampled moments against exact ones, the samples for figures, and a table of bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kltutorial.estimators import kl_estimate
from kltutorial.studies.estimation import (
    QUADRATURE_NODES,
    EstimatorMoments,
    estimator_samples,
    gaussian_moments,
    sample_gaussian_pair,
    sampled_moments,
)

MUS = [0.1, 0.5, 1.0, 2.0, -1.0]


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def _closed_form(mu: float, estimator: str) -> tuple[float, float]:
    """Mean and std of each estimator under x ~ N(0, 1), reference N(mu, 1): Δ ~ N(mu²/2, mu²)."""
    m, s = mu**2 / 2, abs(mu)
    if estimator == "k1":
        return m, s
    if estimator == "k2":
        return (s**2 + m**2) / 2, math.sqrt(2 * s**4 + 4 * m**2 * s**2) / 2
    if estimator == "k3":
        return m, math.sqrt(math.exp(mu**2) - 1 - mu**2)
    if estimator == "abs":  # the folded normal
        mean = s * math.sqrt(2 / math.pi) * math.exp(-(m**2) / (2 * s**2)) + m * (1 - 2 * _phi(-m / s))
        return mean, math.sqrt(s**2 + m**2 - mean**2)
    raise AssertionError(estimator)


@pytest.mark.parametrize("mu", MUS)
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "abs"])
def test_quadrature_matches_the_closed_forms(mu: float, estimator: str) -> None:
    m = gaussian_moments(mu, estimator)
    mean, std = _closed_form(mu, estimator)
    assert m.kl == mu**2 / 2 and m.n_samples is None and m.estimator == estimator
    assert m.mean == pytest.approx(mean, rel=1e-10, abs=1e-15)
    assert m.std == pytest.approx(std, rel=1e-10)


@pytest.mark.parametrize("mu", MUS)
def test_share_of_negative_estimates(mu: float) -> None:
    # k1 = Δ < 0 when x > mu/2 (mu > 0): probability Φ(-|mu|/2); the other three are never negative.
    assert gaussian_moments(mu, "k1").share_negative == pytest.approx(_phi(-abs(mu) / 2), abs=1e-13)
    for name in ("k2", "k3", "abs"):
        assert gaussian_moments(mu, name).share_negative == 0.0


def test_schulman_table() -> None:
    """J. Schulman, "Approximating KL Divergence" (2020): bias/KL and std/KL at KL = 0.005 and 0.5."""
    table = {
        0.1: {"k1": (0.0, 20.0), "k2": (0.0025, 1.42), "k3": (0.0, 1.42)},
        1.0: {"k1": (0.0, 2.0), "k2": (0.25, 1.73), "k3": (0.0, 1.70)},
    }
    for mu, rows in table.items():
        for name, (bias, std) in rows.items():
            m = gaussian_moments(mu, name)
            assert round(m.relative_std, 2) == std, (mu, name, m.relative_std)
            assert m.relative_bias == pytest.approx(bias, abs=1e-10), (mu, name)
    # k2's bias is mu^4/8 exactly: bias/KL = mu²/4.
    assert gaussian_moments(0.3, "k2").relative_bias == pytest.approx(0.3**2 / 4, rel=1e-10)


def test_quadrature_has_converged_and_aliases_resolve() -> None:
    for name in ("k2", "k3"):
        a = gaussian_moments(2.0, name)
        b = gaussian_moments(2.0, name, nodes=QUADRATURE_NODES + 100)
        assert a.std == pytest.approx(b.std, rel=1e-12)
    assert gaussian_moments(1.0, "low_var_kl") == gaussian_moments(1.0, "k3")
    plus = gaussian_moments(1.0, "k3+")  # straight-through: the value of k3
    assert plus.estimator == "k3+" and plus.mean == gaussian_moments(1.0, "k3").mean


def test_moment_properties() -> None:
    m = EstimatorMoments("k1", kl=0.5, mean=0.6, std=2.0, share_negative=0.3, n_samples=100)
    assert m.bias == pytest.approx(0.1) and m.relative_bias == pytest.approx(0.2)
    assert m.relative_std == 4.0 and m.standard_error == 0.2
    zero = EstimatorMoments("k1", kl=0.0, mean=0.0, std=0.0, share_negative=0.0)
    assert math.isnan(zero.relative_bias) and math.isnan(zero.relative_std)
    assert math.isnan(zero.standard_error)


@pytest.mark.parametrize("mu", [0.1, 1.0])
def test_sampled_moments_agree_with_the_exact_ones(mu: float) -> None:
    lp, lq = sample_gaussian_pair(mu, 400_000, torch.Generator().manual_seed(11))
    for name in ("k1", "k2", "k3"):
        exact = gaussian_moments(mu, name)
        s = sampled_moments(lp, lq, name, exact.kl)
        assert s.n_samples == 400_000 and s.kl == exact.kl
        assert abs(s.mean - exact.mean) < 4 * s.standard_error, name
        assert s.std == pytest.approx(exact.std, rel=0.03), name
        assert s.share_negative == pytest.approx(exact.share_negative, abs=4e-3), name


def test_sampled_moments_by_hand() -> None:
    s = sampled_moments(torch.tensor([0.0, 1.0, -1.0]), torch.zeros(3), "k1", kl=0.0)
    assert s.mean == 0.0 and s.std == pytest.approx(1.0) and s.share_negative == pytest.approx(1 / 3)
    assert math.isnan(s.relative_bias)


def test_gaussian_pair_is_the_two_log_densities_and_uses_only_the_generator() -> None:
    torch.manual_seed(5)
    state = torch.get_rng_state()
    lp, lq = sample_gaussian_pair(0.7, 1000, torch.Generator().manual_seed(3))
    assert torch.equal(torch.get_rng_state(), state)
    x = torch.randn(1000, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    c = 0.5 * math.log(2 * math.pi)
    assert torch.allclose(lp, -0.5 * x**2 - c) and torch.allclose(lq, -0.5 * (x - 0.7) ** 2 - c)
    assert torch.allclose(lp - lq, 0.7**2 / 2 - 0.7 * x)


def test_estimator_samples_keeps_order_and_resolves_aliases() -> None:
    lp, lq = sample_gaussian_pair(1.0, 5000, torch.Generator().manual_seed(0))
    s = estimator_samples(lp, lq, ["low_var_kl", "kl", "mse"], kl=0.5)
    assert list(s.values) == ["k3", "k1", "k2"] and s.kl == 0.5
    np.testing.assert_array_equal(s.values["k3"], kl_estimate(lp, lq, "k3").numpy())
    assert s.share_negative("kl") == float(np.mean(s.values["k1"] < 0)) > 0.25
    assert s.share_negative("k3") == 0.0


_LP = torch.zeros(3)


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: gaussian_moments(0.0), ValueError, "mu must be non-zero"),
        (lambda: gaussian_moments("1"), TypeError, "mu"),
        (lambda: gaussian_moments(math.inf), ValueError, "mu"),
        (lambda: gaussian_moments(1.0, "full"), ValueError, "sampled estimator"),
        (lambda: gaussian_moments(1.0, "k9"), ValueError, "estimator must be one of"),
        (lambda: gaussian_moments(1.0, nodes=0), ValueError, "nodes"),
        (lambda: sample_gaussian_pair(1.0, 0, torch.Generator()), ValueError, "n"),
        (lambda: sample_gaussian_pair(1.0, 3, np.random.default_rng()), TypeError, "generator"),
        (lambda: sampled_moments(_LP[None], _LP[None], "k1", 0.0), ValueError, r"shape \(N,\)"),
        (lambda: sampled_moments(_LP[:1], _LP[:1], "k1", 0.0), ValueError, "N >= 2"),
        (lambda: sampled_moments(_LP, _LP[:2], "k1", 0.0), ValueError, "same shape"),
        (lambda: sampled_moments(_LP, _LP, "k1", -0.1), ValueError, "kl must be >= 0"),
        (lambda: sampled_moments(_LP, _LP, "full", 0.0), ValueError, "policy_logits"),
        (lambda: estimator_samples(_LP, _LP, [], 0.0), TypeError, "non-empty sequence"),
        (lambda: estimator_samples(_LP, _LP, "k1", 0.0), TypeError, "non-empty sequence"),
        (lambda: estimator_samples(_LP, _LP, ["k1", "kl"], 0.0), ValueError, "once"),
        (lambda: estimator_samples(_LP, _LP, ["full"], 0.0), ValueError, "needs logits"),
        (lambda: estimator_samples(_LP[None], _LP[None], ["k1"], 0.0), ValueError, r"shape \(N,\)"),
        (lambda: estimator_samples(_LP, _LP, ["k1"], math.nan), ValueError, "kl"),
    ],
)
def test_bad_input_is_named(call, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        call()
