"""KL estimators against closed forms: categorical distributions and Schulman's Gaussian table."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kltutorial import compute_token_kl, kl_estimate

# --- small categorical distributions, exact KL known -------------------------------------------------


def _categorical_pair() -> tuple[torch.Tensor, torch.Tensor]:
    # Close but not identical: so that k1 is negative for a good share of samples.
    p = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05], dtype=torch.float64)
    q = torch.tensor([0.22, 0.28, 0.18, 0.16, 0.06, 0.10], dtype=torch.float64)
    return p, q


def _draw(n: int, seed: int = 0):
    p, q = _categorical_pair()
    gen = torch.Generator().manual_seed(seed)
    y = torch.multinomial(p, n, replacement=True, generator=gen)
    return p, q, p.log()[y], q.log()[y]


N_SAMPLES = 400_000


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_unbiased_estimators_mean_matches_exact_kl(estimator):
    p, q, lp, lq = _draw(N_SAMPLES)
    exact = float((p * (p.log() - q.log())).sum())
    est = kl_estimate(lp, lq, estimator)
    se = float(est.std()) / math.sqrt(N_SAMPLES)
    assert abs(float(est.mean()) - exact) < 4 * se, (float(est.mean()), exact, se)


def test_k2_bias_matches_its_closed_form():
    p, q, lp, lq = _draw(N_SAMPLES, seed=1)
    delta = p.log() - q.log()
    exact_kl = float((p * delta).sum())
    expected_k2 = float((p * 0.5 * delta**2).sum())
    bias = expected_k2 - exact_kl
    assert bias != 0  # k2 really is biased here
    est = kl_estimate(lp, lq, "k2")
    se = float(est.std()) / math.sqrt(N_SAMPLES)
    assert abs(float(est.mean()) - exact_kl - bias) < 4 * se


def test_k3_nonnegative_and_k1_often_negative():
    p, q, lp, lq = _draw(50_000, seed=2)
    assert (kl_estimate(lp, lq, "k3") >= 0).all()
    k1 = kl_estimate(lp, lq, "k1")
    share_negative = float((k1 < 0).double().mean())
    exact_share = float(p[(p.log() - q.log()) < 0].sum())
    assert share_negative > 0.25
    assert abs(share_negative - exact_share) < 0.01


def test_k3_nonnegative_on_extreme_log_ratios():
    d = torch.linspace(-50, 50, 1001, dtype=torch.float64)
    k3 = kl_estimate(d, torch.zeros_like(d), "k3")
    assert torch.isfinite(k3).all() and (k3 >= 0).all()
    # Small ratios: k3 ≈ Δ²/2 to third order, computed without cancellation.
    tiny = torch.tensor([1e-6], dtype=torch.float32)
    assert torch.allclose(kl_estimate(tiny, torch.zeros(1), "k3"), tiny**2 / 2, rtol=1e-3)


def test_abs_and_k2_match_their_formulas():
    lp = torch.tensor([-1.0, -2.0, -0.5])
    lq = torch.tensor([-1.5, -1.0, -0.5])
    assert torch.allclose(kl_estimate(lp, lq, "abs"), torch.tensor([0.5, 1.0, 0.0]))
    assert torch.allclose(kl_estimate(lp, lq, "k2"), torch.tensor([0.125, 0.5, 0.0]))


# --- Schulman's Gaussian table ---------------------------------------------------------------------
# q = N(0, 1) is the sampling distribution (our policy), p = N(mu, 1) the reference. For x ~ q,
# Δ = log q(x) - log p(x) = -mu x + mu²/2 and KL(q || p) = mu²/2.
# Table (J. Schulman, "Approximating KL Divergence", 2020), as (bias/KL, std/KL):
SCHULMAN = {
    0.1: {"k1": (0.0, 20.0), "k2": (0.0025, 1.42), "k3": (0.0, 1.42)},
    1.0: {"k1": (0.0, 2.0), "k2": (0.25, 1.73), "k3": (0.0, 1.70)},
}


def _gaussian_moments(mu: float, estimator: str, deg: int = 120) -> tuple[float, float]:
    """Mean and std of an estimator under x ~ N(0,1), by Gauss–Hermite quadrature (exact to ~1e-12)."""
    x, w = np.polynomial.hermite_e.hermegauss(deg)
    w = w / math.sqrt(2 * math.pi)
    logq = torch.tensor(-0.5 * x**2, dtype=torch.float64)
    logp = torch.tensor(-0.5 * (x - mu) ** 2, dtype=torch.float64)
    vals = kl_estimate(logq, logp, estimator).numpy()
    mean = float((w * vals).sum())
    var = float((w * (vals - mean) ** 2).sum())
    return mean, math.sqrt(var)


@pytest.mark.parametrize("mu", [0.1, 1.0])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_schulman_table_by_quadrature(mu, estimator):
    kl = mu**2 / 2
    mean, std = _gaussian_moments(mu, estimator)
    want_bias, want_std = SCHULMAN[mu][estimator]
    assert std / kl == pytest.approx(want_std, rel=0.05)
    if want_bias == 0:
        assert abs(mean - kl) / kl < 1e-6
    else:
        assert (mean - kl) / kl == pytest.approx(want_bias, rel=0.05)


@pytest.mark.parametrize("mu", [0.1, 1.0])
def test_schulman_table_by_sampling(mu):
    """The same table from 10^6 samples of the policy: std/KL within 5 %, unbiased means within 4 SE."""
    n = 1_000_000
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(n, generator=gen, dtype=torch.float64)
    logq, logp = -0.5 * x**2, -0.5 * (x - mu) ** 2
    kl = mu**2 / 2
    for estimator, (_, want_std) in SCHULMAN[mu].items():
        est = kl_estimate(logq, logp, estimator)
        assert float(est.std()) / kl == pytest.approx(want_std, rel=0.05), estimator
        if estimator != "k2":
            assert abs(float(est.mean()) - kl) < 4 * float(est.std()) / math.sqrt(n), estimator


# --- compute_token_kl: masking and reduction --------------------------------------------------------


def test_token_sum_and_token_mean():
    lp = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -1.0, -3.0]])
    lq = torch.tensor([[-2.0, -1.5, -9.0], [-2.5, -2.0, -3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    per_token, seq_sum = compute_token_kl(lp, lq, mask)
    assert torch.equal(per_token, torch.tensor([[1.0, 0.5, 0.0], [0.5, 1.0, 0.0]]))
    assert torch.allclose(seq_sum, torch.tensor([1.5, 1.5]))
    _, seq_mean = compute_token_kl(lp, lq, mask, reduction="mean")
    assert torch.allclose(seq_mean, torch.tensor([0.75, 0.5]))


def test_all_padding_sequence_gets_zero_mean():
    lp = torch.zeros(2, 3)
    lq = torch.full((2, 3), -1.0)
    mask = torch.tensor([[0, 0, 0], [1, 0, 0]])
    _, seq_mean = compute_token_kl(lp, lq, mask, reduction="mean")
    assert torch.equal(seq_mean, torch.tensor([0.0, 1.0]))


def test_padding_with_extreme_log_ratio_stays_exactly_zero():
    # A pad token the reference deems nearly impossible gives a huge k3 (overflowing to inf in float32);
    # masked, it must contribute exactly 0, never NaN.
    lp = torch.tensor([[-1.0, -1000.0]])
    lq = torch.tensor([[-1.0, 0.0]])
    assert torch.isinf(kl_estimate(lp, lq, "k3")[0, 1])
    per_token, seq = compute_token_kl(lp, lq, torch.tensor([[1, 0]]), estimator="k3")
    assert torch.equal(per_token[0, 1], torch.tensor(0.0)) and torch.isfinite(seq).all()


logprob_arrays = st.integers(1, 5).flatmap(
    lambda b: st.integers(1, 7).flatmap(
        lambda t: st.tuples(
            st.lists(st.floats(-20, 0), min_size=b * t, max_size=b * t),
            st.lists(st.floats(-20, 0), min_size=b * t, max_size=b * t),
            st.lists(st.booleans(), min_size=b * t, max_size=b * t),
            st.just((b, t)),
            st.permutations(list(range(b))),
        )
    )
)


@settings(max_examples=60, deadline=None)
@given(logprob_arrays, st.sampled_from(["k1", "k2", "k3", "abs"]), st.sampled_from(["sum", "mean"]))
def test_masked_positions_never_matter_and_batch_order_is_irrelevant(data, estimator, reduction):
    lp, lq, m, shape, perm = data
    lp = torch.tensor(lp, dtype=torch.float64).reshape(shape)
    lq = torch.tensor(lq, dtype=torch.float64).reshape(shape)
    mask = torch.tensor(m).reshape(shape)
    per_token, seq = compute_token_kl(lp, lq, mask, estimator, reduction)
    # 1. Changing what sits at masked positions changes nothing.
    junk = torch.where(mask, lp, lp - 7.0)
    per_token2, seq2 = compute_token_kl(junk, lq, mask, estimator, reduction)
    assert torch.equal(per_token, per_token2) and torch.equal(seq, seq2)
    assert (per_token[~mask] == 0).all()
    # 2. Permuting the batch permutes the results.
    idx = torch.tensor(perm)
    per_token3, seq3 = compute_token_kl(lp[idx], lq[idx], mask[idx], estimator, reduction)
    assert torch.equal(per_token3, per_token[idx]) and torch.equal(seq3, seq[idx])
