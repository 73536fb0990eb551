"""KL estimators against closed forms (categorical distributions, Schulman's Gaussian table), the libraries'
names, clamps and straight-through variants, the registry, and a table of bad inputs."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kltutorial import (
    ESTIMATOR_ALIASES,
    ESTIMATORS,
    compute_rlhf_objective,
    compute_token_kl,
    exact_kl,
    get_estimator,
    kl_estimate,
    register_estimator,
)
from kltutorial import estimators as est

SAMPLED = [name for name, spec in ESTIMATORS.items() if not spec.needs_logits]

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


# --- one fixed batch, by hand: every estimator's value and gradient ---------------------------------
# Three sequences of three tokens; the log-ratios Δ = log π - log π_ref are written out below them. The
# last two positions of sequence 1 and of sequence 2 are padding (the reference's -9 there would give a
# large estimate).

FIXED_LP = torch.tensor([[-1.0, -2.0, -0.5], [-0.25, -3.0, -1.0], [-2.0, -0.5, -4.0]], dtype=torch.float64)
FIXED_LQ = torch.tensor([[-1.5, -1.0, -0.5], [-1.25, -1.0, -9.0], [-0.5, -9.0, -9.0]], dtype=torch.float64)
#        Δ =            [[ 0.5, -1.0,  0.0], [ 1.0,  -2.0,  8.0], [-1.5,  8.5,  5.0]]
FIXED_MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])


def _k3(d: torch.Tensor) -> torch.Tensor:
    return torch.exp(-d) - 1 + d


# name: (value of Δ, its derivative with respect to log π, which is minus that with respect to log π_ref)
CLOSED_FORMS = {
    "k1": (lambda d: d, lambda d: torch.ones_like(d)),
    "k2": (lambda d: d**2 / 2, lambda d: d),
    "k3": (_k3, lambda d: 1 - torch.exp(-d)),
    "abs": (torch.abs, torch.sign),
    "k1+": (lambda d: d, lambda d: d),
    "k2+": (lambda d: d**2 / 2, lambda d: d),
    "k3+": (_k3, lambda d: d),
    "abs+": (torch.abs, lambda d: d),
}


def _value_and_grads(fn, lp, lq):
    lp, lq = lp.clone().requires_grad_(True), lq.clone().requires_grad_(True)
    out = fn(lp, lq)
    value = out if isinstance(out, torch.Tensor) else out[1]
    return (out.detach() if isinstance(out, torch.Tensor) else tuple(o.detach() for o in out),
            *torch.autograd.grad(value.sum(), (lp, lq)))


@pytest.mark.parametrize("name", list(CLOSED_FORMS))
def test_every_estimator_on_a_fixed_batch_value_and_gradient(name):
    f, df = CLOSED_FORMS[name]
    d = FIXED_LP - FIXED_LQ
    assert d.tolist() == [[0.5, -1.0, 0.0], [1.0, -2.0, 8.0], [-1.5, 8.5, 5.0]]
    value, g_lp, g_lq = _value_and_grads(lambda a, b: kl_estimate(a, b, name), FIXED_LP, FIXED_LQ)
    torch.testing.assert_close(value, f(d), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(g_lp, df(d), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(g_lq, -df(d), rtol=1e-14, atol=1e-14)
    # per sequence: the masked sum, and the mean over the 3, 2 and 1 valid tokens
    m = FIXED_MASK.double()
    for reduction, weight in (("sum", m), ("mean", m / m.sum(-1, keepdim=True))):
        (per_token, per_seq), g_lp, g_lq = _value_and_grads(
            lambda a, b, r=reduction: compute_token_kl(a, b, FIXED_MASK, name, r), FIXED_LP, FIXED_LQ)
        torch.testing.assert_close(per_token, f(d) * m, rtol=1e-14, atol=1e-14)
        torch.testing.assert_close(per_seq, (f(d) * weight).sum(-1), rtol=1e-14, atol=1e-14)
        torch.testing.assert_close(g_lp, df(d) * weight, rtol=1e-14, atol=1e-14)
        torch.testing.assert_close(g_lq, -df(d) * weight, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("batch", [1, 2])
def test_small_batches_and_no_mask(batch):
    # the first sequences of the fixed batch alone, no mask: every position counts
    lp, lq = FIXED_LP[:batch], FIXED_LQ[:batch]
    per_token, per_seq = compute_token_kl(lp, lq)
    torch.testing.assert_close(per_token, lp - lq, rtol=0, atol=0)
    torch.testing.assert_close(per_seq, torch.tensor([-0.5, 7.0][:batch], dtype=torch.float64))
    _, mean = compute_token_kl(lp, lq, reduction="mean")
    torch.testing.assert_close(mean, torch.tensor([-0.5 / 3, 7.0 / 3][:batch], dtype=torch.float64))


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
@given(logprob_arrays, st.sampled_from(SAMPLED), st.sampled_from(["sum", "mean"]))
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


# --- names: the registry's order, the libraries' aliases --------------------------------------------


def test_estimators_iterate_in_the_books_order_and_are_read_only():
    assert list(ESTIMATORS)[:4] == ["k1", "k2", "k3", "abs"]
    assert list(ESTIMATORS) == ["k1", "k2", "k3", "abs", "k1+", "k2+", "k3+", "abs+", "full"]
    with pytest.raises(TypeError):
        ESTIMATORS["k9"] = ESTIMATORS["k1"]  # a read-only view: register_estimator is the way in
    with pytest.raises(TypeError):
        ESTIMATOR_ALIASES["x"] = "k1"


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3"), ("kl+", "k1+"), ("low_var_kl+", "k3+")],
)
def test_each_alias_equals_its_canonical_estimator(alias, canonical):
    assert ESTIMATOR_ALIASES[alias] == canonical and get_estimator(alias) is get_estimator(canonical)
    gen = torch.Generator().manual_seed(3)
    lp, lq = -torch.rand(4, 6, generator=gen) * 5, -torch.rand(4, 6, generator=gen) * 5
    assert torch.equal(kl_estimate(lp, lq, alias), kl_estimate(lp, lq, canonical))
    mask = torch.ones(4, 6)
    mask[:, 4:] = 0
    got, want = compute_token_kl(lp, lq, mask, alias), compute_token_kl(lp, lq, mask, canonical)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_half_precision_is_computed_in_float32_like_openrlhf():
    lp = torch.tensor([-0.01, -3.0, -7.5]).bfloat16()
    lq = torch.tensor([-0.02, -2.0, -9.0]).bfloat16()
    got = kl_estimate(lp, lq, "k3")
    assert got.dtype == torch.float32
    assert torch.equal(got, kl_estimate(lp.float(), lq.float(), "k3"))
    assert kl_estimate(lp.double(), lq, "k1").dtype == torch.float64  # float64 is never cast down


# --- clamps: OpenRLHF's and verl's, explicit here ---------------------------------------------------


def test_clamp_clips_every_estimate_and_stops_its_gradient():
    lp = torch.tensor([-1.0, -30.0, -0.5, 20.0], requires_grad=True)
    lq = torch.tensor([-0.5, -1.0, -1.0, 0.0])
    for name in ("k1", "k2", "k3", "abs"):
        plain = kl_estimate(lp, lq, name)
        clipped = kl_estimate(lp, lq, name, clamp=10.0)
        assert torch.equal(clipped, plain.clamp(-10.0, 10.0)), name
        (grad,) = torch.autograd.grad(clipped.sum(), lp)
        outside = plain.detach().abs() > 10
        assert outside.any() and (grad[outside] == 0).all() and (grad[~outside] != 0).all(), name
    assert torch.equal(kl_estimate(lp, lq, "k1", clamp=1.0), torch.tensor([-0.5, -1.0, 0.5, 1.0]))


def test_clamp_ten_reproduces_openrlhf_compute_approx_kl():
    # OpenRLHF (openrlhf/models/utils.py): log_ratio = lp.float() - lq.float(); k1, k2 = Δ²/2 or
    # k3 = exp(-Δ) - 1 + Δ; then clamp(-10, 10).
    gen = torch.Generator().manual_seed(4)
    lp = (-8 * torch.rand(200, generator=gen)).bfloat16()
    lq = (-30 * torch.rand(200, generator=gen)).bfloat16()
    d = lp.float() - lq.float()
    theirs = {"k1": d, "k2": d**2 / 2.0, "k3": (-d).exp() - 1 + d}
    for name, value in theirs.items():
        torch.testing.assert_close(kl_estimate(lp, lq, name, clamp=10), value.clamp(min=-10, max=10))


def test_verl_low_var_kl_is_k3_with_both_clamps():
    # verl (core_algos.kl_penalty_forward): kl = ref - logprob clamped to ±20, exp(kl) - kl - 1 clamped ±10.
    d = torch.linspace(-60, 60, 241, dtype=torch.float64)
    kl = (-d).clamp(min=-20, max=20)
    theirs = (kl.exp() - kl - 1).clamp(min=-10, max=10)
    ours = kl_estimate(d, torch.zeros_like(d), "low_var_kl", clamp=10, log_ratio_clamp=20)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_log_ratio_clamp_keeps_the_clamped_k3_gradient_finite():
    lp = torch.tensor([-100.0, -1.0], requires_grad=True)  # exp(100) overflows float32
    lq = torch.tensor([0.0, -1.2])
    (grad,) = torch.autograd.grad(kl_estimate(lp, lq, "k3", clamp=10).sum(), lp)
    assert torch.isnan(grad[0])  # 0 * inf: the reason verl clamps the log-ratio before exp
    (grad,) = torch.autograd.grad(kl_estimate(lp, lq, "k3", clamp=10, log_ratio_clamp=20).sum(), lp)
    assert grad[0] == 0 and torch.isfinite(grad).all()
    assert grad[1] == pytest.approx(1 - math.exp(-0.2))  # d k3 / dΔ = 1 - e^{-Δ}, inside both clamps


# Each clamp alone and together, through compute_token_kl (what a trainer calls) as well as kl_estimate,
# on log-ratios that reach every bound: Δ = -30, -1, 0.5, 25.
CLAMP_LP = torch.tensor([[-31.0, -2.0, -0.5, 0.0]], dtype=torch.float64)
CLAMP_LQ = torch.tensor([[-1.0, -1.0, -1.0, -25.0]], dtype=torch.float64)
CLAMP_D = torch.tensor([[-30.0, -1.0, 0.5, 25.0]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("name", "kwargs", "value", "grad"),
    [
        # clamp alone: the estimate clipped to [-10, 10], no gradient where it clips
        ("k1", dict(clamp=10), [-10.0, -1.0, 0.5, 10.0], [0.0, 1.0, 1.0, 0.0]),
        # log_ratio_clamp alone: Δ clipped to [-20, 20] on both sides before the estimator
        ("k1", dict(log_ratio_clamp=20), [-20.0, -1.0, 0.5, 20.0], [0.0, 1.0, 1.0, 0.0]),
        ("k2", dict(log_ratio_clamp=20), [200.0, 0.5, 0.125, 200.0], [0.0, -1.0, 0.5, 0.0]),
        # both: verl's low_var_kl
        ("k3", dict(clamp=10, log_ratio_clamp=20), [10.0, math.e - 2, math.exp(-0.5) - 0.5, 10.0],
         [0.0, 1 - math.e, 1 - math.exp(-0.5), 0.0]),
        # a straight-through value is clipped, its gradient is k2's (Δ) everywhere
        ("k3+", dict(clamp=10, log_ratio_clamp=20), [10.0, math.e - 2, math.exp(-0.5) - 0.5, 10.0],
         [-30.0, -1.0, 0.5, 25.0]),
        ("k1+", dict(clamp=0.75), [-0.75, -0.75, 0.5, 0.75], [-30.0, -1.0, 0.5, 25.0]),
    ],
)
def test_each_clamp_alone_and_together_through_compute_token_kl(name, kwargs, value, grad):
    assert torch.equal(CLAMP_LP - CLAMP_LQ, CLAMP_D)
    want_value = torch.tensor([value], dtype=torch.float64)
    want_grad = torch.tensor([grad], dtype=torch.float64)
    got, g_lp, _ = _value_and_grads(lambda a, b: kl_estimate(a, b, name, **kwargs), CLAMP_LP, CLAMP_LQ)
    torch.testing.assert_close(got, want_value, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(g_lp, want_grad, rtol=1e-14, atol=1e-14)
    (per_token, per_seq), g_lp, _ = _value_and_grads(
        lambda a, b: compute_token_kl(a, b, None, name, **kwargs), CLAMP_LP, CLAMP_LQ)
    torch.testing.assert_close(per_token, want_value, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(per_seq, want_value.sum(-1), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(g_lp, want_grad, rtol=1e-14, atol=1e-14)


def test_the_upper_log_ratio_clamp_alone():
    # without clamp= to hide it: k3 of Δ = 25 is about 24, of Δ = 20 exactly 19 + e^-20
    k3 = kl_estimate(torch.tensor([25.0], dtype=torch.float64), torch.zeros(1, dtype=torch.float64), "k3",
                     log_ratio_clamp=20)
    assert k3.item() == pytest.approx(19 + math.exp(-20), rel=1e-15)


# --- straight-through: the value of k1 or k3, the gradient of k2 ------------------------------------


@pytest.mark.parametrize(("name", "value_of"), [("k1+", "k1"), ("k3+", "k3"), ("low_var_kl+", "k3")])
def test_straight_through_has_the_value_of_its_estimator_and_the_gradient_of_k2(name, value_of):
    gen = torch.Generator().manual_seed(5)
    lp = (-4 * torch.rand(3, 7, generator=gen, dtype=torch.float64)).requires_grad_(True)
    lq = -4 * torch.rand(3, 7, generator=gen, dtype=torch.float64)
    value = kl_estimate(lp, lq, name)
    assert torch.equal(value.detach(), kl_estimate(lp, lq, value_of).detach())
    (grad,) = torch.autograd.grad(value.sum(), lp)
    (grad_k2,) = torch.autograd.grad(kl_estimate(lp, lq, "k2").sum(), lp)
    (grad_own,) = torch.autograd.grad(kl_estimate(lp, lq, value_of).sum(), lp)
    assert torch.equal(grad, grad_k2)
    torch.testing.assert_close(grad, (lp - lq).detach())  # d(½Δ²)/d log π = Δ
    assert not torch.allclose(grad, grad_own)


def test_straight_through_keeps_the_k2_gradient_where_the_value_is_clamped():
    # As in verl: the clamp acts on the (detached) value; the gradient is k2's everywhere.
    lp = torch.tensor([-30.0, -1.0], requires_grad=True)
    lq = torch.tensor([-1.0, -1.5])
    value = kl_estimate(lp, lq, "k3+", clamp=10, log_ratio_clamp=20)
    assert value[0] == 10
    (grad,) = torch.autograd.grad(value.sum(), lp)
    assert torch.equal(grad, (lp - lq).detach())


def test_straight_through_k3_is_an_unbiased_kl_gradient_on_policy_samples():
    """E[∇k2] = ∇KL(π‖π_ref) on samples from π (score function: E[∇log π] = 0); E[∇k3] is not."""
    p, q = _categorical_pair()
    theta = p.log().clone().requires_grad_(True)  # logits of the policy
    exact = (torch.softmax(theta, 0) * (torch.log_softmax(theta, 0) - q.log())).sum()
    (want,) = torch.autograd.grad(exact, theta)
    y = torch.multinomial(p, 400_000, replacement=True, generator=torch.Generator().manual_seed(6))
    got = {}
    for name in ("k3+", "k3"):
        lp = torch.log_softmax(theta, 0)[y]
        (g,) = torch.autograd.grad(kl_estimate(lp, q.log()[y], name).mean(), theta)
        got[name] = g
    assert torch.allclose(got["k3+"], want, atol=4e-3)
    assert not torch.allclose(got["k3"], want, atol=4e-3)


# --- full: the exact KL from both models' logits ----------------------------------------------------


def _logits(seed: int, shape=(3, 4, 9)) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


def test_full_is_exact_kl():
    z, w = _logits(7)
    assert torch.equal(kl_estimate(policy_logits=z, reference_logits=w, estimator="full"), exact_kl(z, w))
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    per_token, per_seq = compute_token_kl(
        attention_mask=mask, estimator="full", policy_logits=z, reference_logits=w
    )
    assert torch.equal(per_token, exact_kl(z, w, mask))
    assert torch.equal(per_seq, exact_kl(z, w, mask).sum(-1))
    assert torch.equal(kl_estimate(policy_logits=z, reference_logits=w, estimator="full", clamp=0.5),
                       exact_kl(z, w).clamp(max=0.5))


def test_full_with_and_without_a_mask_value_and_gradient_where_padding_is_infinite():
    # position (0, 1) is padding where the reference rules out a token the policy can produce: its exact KL
    # is +inf, and it must not reach the gradient (inf * 0 would be NaN)
    z = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75]], [[0.5, 0.5], [0.5, 0.5]]], dtype=torch.float64))
    w = torch.log(torch.tensor([[[0.25, 0.75], [1.0, 0.0]], [[0.5, 0.5], [0.75, 0.25]]], dtype=torch.float64))
    mask = torch.tensor([[1, 0], [1, 1]])
    kl_a = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)  # KL((1/2, 1/2) || (1/4, 3/4))
    kl_b = 0.5 * math.log(2 / 3) + 0.5 * math.log(2)  # KL((1/2, 1/2) || (3/4, 1/4))
    unmasked = kl_estimate(policy_logits=z, reference_logits=w, estimator="full")
    assert unmasked[0, 0].item() == pytest.approx(kl_a) and math.isinf(unmasked[0, 1].item())
    zz = z.clone().requires_grad_(True)
    per_token, per_seq = compute_token_kl(None, None, mask, "full", policy_logits=zz, reference_logits=w)
    torch.testing.assert_close(per_token, torch.tensor([[kl_a, 0.0], [0.0, kl_b]], dtype=torch.float64))
    torch.testing.assert_close(per_seq, torch.tensor([kl_a, kl_b], dtype=torch.float64))
    (grad,) = torch.autograd.grad(per_seq.sum(), zz)
    assert torch.isfinite(grad).all() and (grad[0, 1] == 0).all()
    # dKL/dz_v = p_v (log p_v - log q_v - KL): (1/2)(log 2 - kl_a) and (1/2)(log(2/3) - kl_a) at (0, 0)
    want = torch.tensor([0.5 * (math.log(2) - kl_a), 0.5 * (math.log(2 / 3) - kl_a)], dtype=torch.float64)
    torch.testing.assert_close(grad[0, 0], want)
    # the checked inputs' own estimate takes the mask for the same reason
    inputs = est.KLInputs(get_estimator("full"), policy_logits=zz, reference_logits=w)
    (grad,) = torch.autograd.grad(inputs.estimate(mask.bool()).masked_fill(mask == 0, 0.0).sum(), zz)
    assert torch.isfinite(grad).all()


def test_one_call_serves_every_estimator_when_logits_are_given():
    z, w = _logits(8)
    tokens = torch.distributions.Categorical(logits=z).sample()
    lp = torch.log_softmax(z, -1).gather(-1, tokens[..., None])[..., 0]
    lq = torch.log_softmax(w, -1).gather(-1, tokens[..., None])[..., 0]
    for name in ESTIMATORS:
        got = kl_estimate(lp, lq, name, policy_logits=z, reference_logits=w)
        want = exact_kl(z, w) if name == "full" else kl_estimate(lp, lq, name)
        assert torch.equal(got, want), name


def test_full_gradient_matches_exact_kl_and_ignores_padding():
    z, w = _logits(9)
    z.requires_grad_(True)
    mask = torch.ones(3, 4)
    mask[0, 2:] = 0
    _, seq = compute_token_kl(None, None, mask, "full", policy_logits=z, reference_logits=w)
    (grad,) = torch.autograd.grad(seq.sum(), z)
    (want,) = torch.autograd.grad(exact_kl(z, w, mask).sum(), z)
    assert torch.equal(grad, want) and (grad[0, 2:] == 0).all()


def test_objective_accepts_every_name_including_full():
    z, w = _logits(10, shape=(8, 5, 11))
    tokens = torch.distributions.Categorical(logits=z).sample()
    args = (z, w, tokens, torch.zeros(8), torch.ones(8, 5), 0.1)
    _, full = compute_rlhf_objective(*args, estimator="full")
    assert full["mean_kl"] == pytest.approx(full["mean_exact_kl"])
    for alias, name in ESTIMATOR_ALIASES.items():
        assert compute_rlhf_objective(*args, estimator=alias)[1]["mean_kl"] == pytest.approx(
            compute_rlhf_objective(*args, estimator=name)[1]["mean_kl"]
        )


# --- the registry ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _scratch_registry():
    """Let a test register estimators, and put the registry back as it was afterwards."""
    specs, aliases = dict(est._SPECS), dict(est._ALIASES)
    try:
        yield
    finally:
        est._SPECS.clear()
        est._SPECS.update(specs)
        est._ALIASES.clear()
        est._ALIASES.update(aliases)


def test_a_registered_estimator_is_usable_by_name_and_alias_and_does_not_leak():
    lp = torch.tensor([[-1.0, -2.0, -0.5]])
    lq = torch.tensor([[-1.5, -1.0, -0.5]])
    with _scratch_registry():

        @register_estimator("half_k2", aliases=("half_mse",))
        def half_k2(log_ratio):
            return 0.25 * log_ratio.square()

        assert list(ESTIMATORS)[-1] == "half_k2" and ESTIMATOR_ALIASES["half_mse"] == "half_k2"
        spec = get_estimator("half_mse")
        assert (spec.name, spec.fn, spec.aliases, spec.gradient_from, spec.needs_logits) == (
            "half_k2", half_k2, ("half_mse",), None, False)
        want = torch.tensor([[0.0625, 0.25, 0.0]])
        assert torch.equal(kl_estimate(lp, lq, "half_k2"), want)
        assert torch.equal(compute_token_kl(lp, lq, estimator="half_mse")[1], want.sum(-1))
        # the clamps and straight-through apply to it like to the built-in ones
        assert torch.equal(kl_estimate(lp, lq, "half_k2", clamp=0.1), want.clamp(max=0.1))
        register_estimator("half_k2+", gradient_from="mse")(half_k2)
        assert get_estimator("half_k2+").gradient_from == "k2" and get_estimator("half_k2+").aliases == ()
        lp_grad = lp.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(kl_estimate(lp_grad, lq, "half_k2+").sum(), lp_grad)
        assert torch.equal(grad, lp - lq)
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("half_mse")
    assert "half_k2" not in ESTIMATORS and "half_mse" not in ESTIMATOR_ALIASES
    with pytest.raises(ValueError, match="estimator must be one of"):
        kl_estimate(lp, lq, "half_k2")


def test_a_registered_logits_estimator_gets_the_logits_and_the_mask():
    z, w = _logits(11, shape=(2, 3, 4))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    seen = {}
    with _scratch_registry():

        @register_estimator("tv", needs_logits=True)
        def total_variation(policy_logits, reference_logits, attention_mask):
            seen["mask"] = attention_mask
            return 0.5 * (policy_logits.softmax(-1) - reference_logits.softmax(-1)).abs().sum(-1)

        spec = get_estimator("tv")
        assert spec.needs_logits is True and spec.aliases == () and spec.name == "tv"
        want = 0.5 * (z.softmax(-1) - w.softmax(-1)).abs().sum(-1)
        assert torch.equal(kl_estimate(policy_logits=z, reference_logits=w, estimator="tv"), want)
        per_token, _ = compute_token_kl(None, None, mask, "tv", policy_logits=z, reference_logits=w)
        assert torch.equal(per_token, want * mask) and torch.equal(seen["mask"], mask.bool())
        with pytest.raises(ValueError, match="'tv' needs policy_logits and reference_logits"):
            kl_estimate(torch.zeros(2, 3), torch.zeros(2, 3), "tv")


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        (dict(name="k1"), ValueError, "name 'k1' is already registered"),
        (dict(name="low_var_kl"), ValueError, "already registered"),
        (dict(name=""), TypeError, "name must be a non-empty str"),
        (dict(name=3), TypeError, "name must be a non-empty str"),
        (dict(name="new", aliases="n"), TypeError, "^aliases must be a sequence of str, got str$"),
        (dict(name="new", aliases=("kl",)), ValueError, "alias 'kl' is already registered"),
        (dict(name="new", aliases=("n", "n")), ValueError, "must all differ"),
        (dict(name="new", aliases=("new",)), ValueError, "must all differ"),
        (dict(name="new", gradient_from="k7"), ValueError, "estimator must be one of"),
        (dict(name="new", gradient_from="full"), ValueError,
         "^gradient_from must name a plain sampled estimator, and the new estimator must be sampled too; "
         "got gradient_from='full' with needs_logits=False$"),
        (dict(name="new", gradient_from="k3+"), ValueError, "gradient_from must name a plain sampled"),
        (dict(name="new", gradient_from="k2", needs_logits=True), ValueError, "gradient_from"),
        (dict(name="new", needs_logits=1), TypeError, "^needs_logits must be a bool, got int$"),
    ],
)
def test_register_estimator_rejects_bad_registrations(kwargs, exc, match):
    # the parameters are shared by every run of the test: read them, never pop from them
    name, rest = kwargs["name"], {k: v for k, v in kwargs.items() if k != "name"}
    with _scratch_registry():
        with pytest.raises(exc, match=match):
            register_estimator(name, **rest)
        decorate = r"^register_estimator\('fine'\) must decorate a function, got int$"
        with pytest.raises(TypeError, match=decorate):
            register_estimator("fine")(42)
        assert "fine" not in ESTIMATORS


# --- bad input: one table for the module --------------------------------------------------------------

B, T, V = 2, 3, 5
LP = torch.full((B, T), -1.0)
NAN_LP = LP.clone()
NAN_LP[1, 2] = math.nan
INF_LP = LP.clone()
INF_LP[0, 0] = -math.inf
MASK = torch.ones(B, T)
Z = torch.zeros(B, T, V)
PAIR = dict(policy_logprobs=LP, reference_logprobs=LP)
LOGITS = dict(policy_logits=Z, reference_logits=Z)

BAD_INPUTS = [
    # (id, callable, kwargs, exception, message regex)
    ("unknown", kl_estimate, {**PAIR, "estimator": "k4"}, ValueError,
     r"^estimator must be one of 'k1', 'k2', 'k3', 'abs', 'k1\+', 'k2\+', 'k3\+', 'abs\+', 'full', or an "
     r"alias: 'kl' \(k1\), 'mse' \(k2\), 'low_var_kl' \(k3\), 'kl\+' \(k1\+\), 'mse\+' \(k2\+\), "
     r"'low_var_kl\+' \(k3\+\); got 'k4'$"),
    ("not-a-name", kl_estimate, {**PAIR, "estimator": None}, ValueError, "estimator must be one of"),
    ("shape", kl_estimate, {**PAIR, "reference_logprobs": LP[:, :2]}, ValueError, "reference_logprobs"),
    ("nan", kl_estimate, {**PAIR, "policy_logprobs": NAN_LP}, ValueError, "policy_logprobs contains NaN"),
    ("inf", kl_estimate, {**PAIR, "reference_logprobs": INF_LP}, ValueError,
     "reference_logprobs contains inf; expected finite values"),
    ("int", kl_estimate, {**PAIR, "policy_logprobs": LP.long()}, TypeError, "policy_logprobs"),
    ("list", kl_estimate, {**PAIR, "policy_logprobs": [-1.0]}, TypeError, "policy_logprobs must be a torch"),
    ("empty", kl_estimate, dict(policy_logprobs=LP[:0], reference_logprobs=LP[:0]), ValueError, "empty"),
    ("one-of-pair", kl_estimate, dict(policy_logprobs=LP), ValueError,
     "^pass both policy_logprobs and reference_logprobs, or neither$"),
    ("nothing", kl_estimate, {}, ValueError, "'k1' needs policy_logprobs and reference_logprobs"),
    ("clamp-zero", kl_estimate, {**PAIR, "clamp": 0}, ValueError, "clamp must be a finite number > 0"),
    ("clamp-str", kl_estimate, {**PAIR, "clamp": "10"}, TypeError, "clamp must be a real number"),
    ("lr-clamp-inf", kl_estimate, {**PAIR, "log_ratio_clamp": math.inf}, ValueError,
     "^log_ratio_clamp must be a finite number > 0, got inf$"),
    ("full-no-logits", kl_estimate, {**PAIR, "estimator": "full"}, ValueError,
     r"^estimator 'full' needs policy_logits and reference_logits, shape \(B, T, V\): the exact KL sums over "
     "the whole vocabulary, which the sampled tokens' log-probs do not hold$"),
    ("full-lr-clamp", kl_estimate, {**LOGITS, "estimator": "full", "log_ratio_clamp": 20}, ValueError,
     "log_ratio_clamp applies to sampled estimators"),
    ("one-logits", kl_estimate, {**PAIR, "policy_logits": Z}, ValueError,
     "^pass both policy_logits and reference_logits, or neither$"),
    ("ref-logits-rank", kl_estimate, {**LOGITS, "estimator": "full", "reference_logits": Z[0]}, ValueError,
     r"^reference_logits must have 3 dimensions \(B, T, V\), got shape \(3, 5\)$"),
    ("logits-rank", kl_estimate, {**LOGITS, "estimator": "full", "policy_logits": Z[0]}, ValueError,
     r"policy_logits must have 3 dimensions \(B, T, V\)"),
    ("logits-shape", kl_estimate, {**LOGITS, "estimator": "full", "reference_logits": Z[:, :, :4]},
     ValueError, "policy_logits and reference_logits must have the same shape"),
    ("logits-vs-lp", kl_estimate, {**PAIR, **LOGITS, "policy_logits": Z[:, :2], "reference_logits": Z[:, :2]},
     ValueError, r"policy_logprobs must have shape \(2, 2\)"),
    ("full-nan", kl_estimate, {**LOGITS, "estimator": "full", "policy_logits": Z.clone().fill_(math.nan)},
     ValueError, "policy_logits contains NaN"),
    ("tok-mask-shape", compute_token_kl, {**PAIR, "attention_mask": MASK[:1]}, ValueError,
     r"^attention_mask must have shape \(2, 3\), got \(1, 3\)$"),
    ("tok-mask-values", compute_token_kl, {**PAIR, "attention_mask": MASK * 0.5}, ValueError,
     "attention_mask must contain only 0 and 1"),
    ("tok-mask-type", compute_token_kl, {**PAIR, "attention_mask": [[1, 1, 1]] * 2}, TypeError,
     "attention_mask must be a torch.Tensor"),
    ("tok-reduction", compute_token_kl, {**PAIR, "reduction": "max"}, ValueError, "reduction must be one of"),
    ("tok-rank", compute_token_kl, dict(policy_logprobs=LP[0], reference_logprobs=LP[0]), ValueError,
     r"policy_logprobs must have shape \(B, T\)"),
    ("tok-nan", compute_token_kl, {**PAIR, "reference_logprobs": NAN_LP}, ValueError, "NaN"),
    ("tok-estimator", compute_token_kl, {**PAIR, "estimator": "KL"}, ValueError, "estimator must be one of"),
    ("tok-full-mask", compute_token_kl, {**LOGITS, "estimator": "full", "attention_mask": MASK[:, :2]},
     ValueError, "attention_mask must have shape"),
]


@pytest.mark.parametrize(("call", "kwargs", "exc", "match"), [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_rejected_with_a_clear_message(call, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(**kwargs)
