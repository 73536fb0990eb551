"""Tests of kltutorial.exact.estimates (book sections 3 and 4): exact moments by enumeration against hand
computations, the unbiasedness of the sampled-token and per-prefix estimators on random models, the
per-position Rao–Blackwell inequality and the case where the sum does not obey it, the running means, and a
table of bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kltutorial import exact as ex
from kltutorial.exact import estimates as est

F64 = torch.float64


def _random_table(space: ex.SequenceSpace, seed: int, scale: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(space.n_prefixes, space.vocab_size, generator=g, dtype=F64)
    return torch.log_softmax(logits, dim=-1)


def _pair(V: int, T: int, seed: int) -> tuple[ex.SequenceSpace, torch.Tensor, torch.Tensor]:
    space = ex.SequenceSpace(V, T)
    ref = _random_table(space, seed)
    pi = torch.log_softmax(ref + _random_table(space, seed + 100, scale=0.8), dim=-1)
    return space, pi, ref


# --- exact moments of a finite pair ------------------------------------------------------------


def test_estimator_moments_by_hand() -> None:
    p = torch.tensor([0.5, 0.5], dtype=F64).log()
    q = torch.tensor([0.25, 0.75], dtype=F64).log()
    d = torch.tensor([math.log(2), math.log(2 / 3)], dtype=F64)  # Δ of each outcome
    kl = float(d.mean())
    k1 = est.estimator_moments(p, q, "kl")
    assert k1.estimator == "k1" and k1.kl == pytest.approx(kl) and k1.mean == pytest.approx(kl)
    assert k1.std == pytest.approx(float(d[0] - d[1]) / 2) and k1.share_negative == 0.5
    k2 = est.estimator_moments(p, q, "k2")
    assert k2.mean == pytest.approx(float((d**2).mean() / 2)) and k2.share_negative == 0.0
    k3 = est.estimator_moments(p, q, "k3")  # r = q/p = 1/2, 3/2: (r - 1) - log r
    vals = torch.tensor([-0.5 + math.log(2), 0.5 - math.log(1.5)], dtype=F64)
    assert k3.mean == pytest.approx(kl) and k3.std == pytest.approx(float(vals.std(unbiased=False)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k1_and_k3_are_unbiased_and_k2_has_its_closed_form_bias(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    p = torch.log_softmax(torch.randn(20, generator=g, dtype=F64), 0)
    q = torch.log_softmax(torch.randn(20, generator=g, dtype=F64), 0)
    kl = ex.sequence_kl(p, q)
    d = p - q
    for name in ("k1", "k3"):
        m = est.estimator_moments(p, q, name)
        assert m.kl == pytest.approx(kl, rel=1e-12) and m.bias == pytest.approx(0.0, abs=1e-12)
    k2 = est.estimator_moments(p, q, "k2")
    assert k2.bias == pytest.approx(float((p.exp() * d**2).sum() / 2) - kl, rel=1e-12)
    k1 = est.estimator_moments(p, q, "k1")
    assert k1.share_negative == pytest.approx(float(p.exp()[d < 0].sum()))
    assert k1.std == pytest.approx(math.sqrt(float((p.exp() * (d - kl) ** 2).sum())))


def test_outcomes_impossible_under_the_policy_count_for_nothing() -> None:
    p = torch.tensor([0.5, 0.5, 0.0], dtype=F64).log()
    q = torch.tensor([0.25, 0.5, 0.25], dtype=F64).log()
    m = est.estimator_moments(p, q, "k3")
    assert math.isfinite(m.mean) and m.kl == pytest.approx(0.5 * math.log(2))
    both = est.estimator_moments(p, torch.tensor([0.5, 0.5, 0.0], dtype=F64).log(), "k1")
    assert both.kl == 0.0 and both.std == 0.0
    assert est.exact_mean_and_std(p, torch.tensor([1.0, 3.0, 1e6], dtype=F64)) == (2.0, 1.0)


# --- estimators on sampled sequences -------------------------------------------------------------


@pytest.mark.parametrize(("V", "T", "seed"), [(2, 4, 0), (3, 3, 1), (4, 2, 2), (3, 4, 3)])
def test_sampled_token_and_per_prefix_estimators_are_unbiased(V: int, T: int, seed: int) -> None:
    space, pi, ref = _pair(V, T, seed)
    lp, lq = ex.sequence_logprobs(space, pi), ex.sequence_logprobs(space, ref)
    kl = ex.sequence_kl(lp, lq)
    every = torch.arange(space.n_sequences)
    k1 = est.sampled_token_kl(space, pi, ref, every)
    assert torch.allclose(k1, lp - lq, rtol=0, atol=1e-13)  # the per-token log-ratios telescope
    k3 = est.sampled_token_kl(space, pi, ref, every, "k3")
    for values in (k1, k3, est.rao_blackwell_kl(space, pi, ref, every)):
        mean, _ = est.exact_mean_and_std(lp, values)
        assert mean == pytest.approx(kl, rel=1e-12)
    # The per-prefix estimator's mean is the chain rule's sum, but it is not the sequence KL pointwise.
    rb = est.rao_blackwell_kl(space, pi, ref, every)
    assert float(rb.max() - rb.min()) > 1e-3


def test_per_prefix_estimator_by_hand() -> None:
    space, pi, ref = _pair(2, 3, 7)
    row_kl = (pi.exp() * (pi - ref)).sum(-1)  # (P,)
    y = 5  # the sequence 1, 0, 1: prefixes "", "1", "10" are rows 0, 2, 3 + 2 = 5
    assert space.sequences[y].tolist() == [1, 0, 1]
    want = row_kl[0] + row_kl[2] + row_kl[5]
    assert float(est.rao_blackwell_kl(space, pi, ref, torch.tensor([y]))[0]) == pytest.approx(float(want))
    tokens = est.sampled_token_kl(space, pi, ref, torch.tensor([y]), "k2")
    d = [pi[r, v] - ref[r, v] for r, v in ((0, 1), (2, 0), (5, 1))]
    assert float(tokens[0]) == pytest.approx(float(sum(x**2 for x in d) / 2))


@pytest.mark.parametrize(("V", "T", "seed"), [(2, 4, 0), (3, 3, 1), (4, 2, 2), (3, 4, 3)])
def test_each_position_is_rao_blackwellised(V: int, T: int, seed: int) -> None:
    """Position by position, the prefix's exact KL varies no more than the sampled token's log-ratio."""
    space, pi, ref = _pair(V, T, seed)
    lp = ex.sequence_logprobs(space, pi)
    rows, toks = space.prefix_ids, space.sequences
    delta = pi[rows, toks] - ref[rows, toks]  # (V**T, T)
    cond = (pi.exp() * (pi - ref)).sum(-1)[rows]  # (V**T, T): E[Δ_t | y_<t]
    for t in range(T):
        _, sd_token = est.exact_mean_and_std(lp, delta[:, t])
        _, sd_prefix = est.exact_mean_and_std(lp, cond[:, t])
        assert sd_prefix <= sd_token + 1e-12
    # ... and on these random models the sum is less variable too.
    every = torch.arange(space.n_sequences)
    _, sd_k1 = est.exact_mean_and_std(lp, est.sampled_token_kl(space, pi, ref, every))
    _, sd_rb = est.exact_mean_and_std(lp, est.rao_blackwell_kl(space, pi, ref, every))
    assert sd_rb < sd_k1


def test_the_sum_of_conditional_means_can_vary_more() -> None:
    """Two tokens: the first token's log-ratio cancels the KL it leads to, so log pi(y) - log ref(y) is the
    same for every sequence, while the exact KL along the prefix is not."""
    space = ex.SequenceSpace(2, 2)
    pi = torch.tensor([[0.5, 0.5], [0.5, 0.5], [1.0, 0.0]], dtype=F64).log()
    ref = torch.tensor([[0.25, 0.75], [0.5, 0.5], [1 / 3, 2 / 3]], dtype=F64).log()
    lp = ex.sequence_logprobs(space, pi)
    drawn = torch.tensor([0, 1, 2])  # sequence 3 (1, 1) has probability 0
    k1 = est.sampled_token_kl(space, pi, ref, drawn)
    rb = est.rao_blackwell_kl(space, pi, ref, drawn)
    assert torch.allclose(k1, torch.full((3,), math.log(2), dtype=F64))
    values = torch.cat([k1, k1[:1]]), torch.cat([rb, rb[:1]])  # any finite value for the impossible one
    (m1, sd1), (m2, sd2) = (est.exact_mean_and_std(lp, v) for v in values)
    assert m1 == pytest.approx(m2) == pytest.approx(math.log(2))
    assert sd1 < 1e-15 < 0.5 < sd2


def test_sampled_estimates_converge_to_the_exact_kl() -> None:
    space, pi, ref = _pair(3, 3, 4)
    kl = ex.sequence_kl(ex.sequence_logprobs(space, pi), ex.sequence_logprobs(space, ref))
    idx = ex.sample_autoregressive(space, pi, 100_000, torch.Generator().manual_seed(0))
    for values in (est.sampled_token_kl(space, pi, ref, idx), est.rao_blackwell_kl(space, pi, ref, idx)):
        se = float(values.std()) / math.sqrt(values.numel())
        assert abs(float(values.mean()) - kl) < 4 * se


# --- running means ---------------------------------------------------------------------------


def test_running_means_match_a_direct_computation() -> None:
    rng = np.random.default_rng(0)
    draws = rng.normal(3.0, 2.0, size=(5, 50))
    run = est.monte_carlo_convergence(torch.from_numpy(draws), [2, 7, 50], 3.0, 2.0)
    for k, n in enumerate([2, 7, 50]):
        np.testing.assert_allclose(run.estimates[:, k], draws[:, :n].mean(axis=1), rtol=1e-12)
        se = draws[:, :n].std(axis=1, ddof=1) / math.sqrt(n)
        np.testing.assert_allclose(run.standard_errors[:, k], se, rtol=1e-10)
    np.testing.assert_allclose(run.clt_standard_error, 2.0 / np.sqrt([2, 7, 50]))
    assert run.sample_counts.tolist() == [2, 7, 50] and (run.exact_mean, run.exact_std) == (3.0, 2.0)


def test_coverage_of_normal_draws_is_near_its_level() -> None:
    draws = np.random.default_rng(1).normal(0.0, 1.0, size=(4000, 200))
    run = est.monte_carlo_convergence(draws, [200], 0.0, 1.0)
    assert abs(float(run.coverage(1.96)[0]) - 0.95) < 0.015
    assert float(run.coverage(0.0)[0]) == 0.0


# --- bad input ------------------------------------------------------------------------------

_S, _PI, _REF = _pair(2, 2, 0)
_I = torch.tensor([0, 3])
_P = torch.tensor([0.5, 0.5], dtype=F64).log()
_D = np.zeros((2, 10))


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: est.estimator_moments(_P, _P[:1] - _P[:1].logsumexp(0)), ValueError, "logq must have shape"),
        (lambda: est.estimator_moments(_P.exp(), _P), ValueError, "logp - torch.logsumexp"),
        (lambda: est.estimator_moments(_P, _P, "full"), ValueError, "sampled estimator"),
        (lambda: est.estimator_moments(_P, _P.clamp(max=0.0) * torch.tensor([0.0, math.inf], dtype=F64)),
         ValueError, "infinite"),
        (lambda: est.exact_mean_and_std(_P, torch.ones(3)), ValueError, "values must have shape"),
        (lambda: est.sampled_token_kl("space", _PI, _REF, _I), TypeError, "SequenceSpace"),
        (lambda: est.sampled_token_kl(_S, _PI[:2], _REF, _I), ValueError, r"table must have shape \(3, 2\)"),
        (lambda: est.sampled_token_kl(_S, _PI, _REF, _I.double()), TypeError, "indices must hold integer"),
        (lambda: est.sampled_token_kl(_S, _PI, _REF, [0, 1]), TypeError, "indices must be a torch.Tensor"),
        (lambda: est.sampled_token_kl(_S, _PI, _REF, _I[None]), ValueError, r"must have shape \(N,\)"),
        (lambda: est.sampled_token_kl(_S, _PI, _REF, torch.tensor([4])), ValueError, r"\[0, 4\)"),
        (lambda: est.sampled_token_kl(_S, _PI, _REF, _I, "full"), ValueError, "rao_blackwell_kl"),
        (lambda: est.sampled_token_kl(
            _S, _PI, torch.tensor([[0.0, -math.inf]] * 3, dtype=F64), _I), ValueError, "impossible"),
        (lambda: est.rao_blackwell_kl(_S, _PI, _REF.exp(), _I), ValueError, "log_softmax"),
        (lambda: est.monte_carlo_convergence(np.zeros(10), [2], 0.0, 1.0), ValueError, r"shape \(S, N\)"),
        (lambda: est.monte_carlo_convergence(_D[:, :1], [2], 0.0, 1.0), ValueError, "N >= 2"),
        (lambda: est.monte_carlo_convergence(_D + np.nan, [2], 0.0, 1.0), ValueError, "finite"),
        (lambda: est.monte_carlo_convergence(_D, [2.0, 4.0], 0.0, 1.0), TypeError, "ints"),
        (lambda: est.monte_carlo_convergence(_D, [], 0.0, 1.0), TypeError, "ints"),
        (lambda: est.monte_carlo_convergence(_D, [4, 2], 0.0, 1.0), ValueError, "increase"),
        (lambda: est.monte_carlo_convergence(_D, [1, 2], 0.0, 1.0), ValueError, r"\[2, 10\]"),
        (lambda: est.monte_carlo_convergence(_D, [2, 11], 0.0, 1.0), ValueError, r"\[2, 10\]"),
        (lambda: est.monte_carlo_convergence(_D, [2], 0.0, -1.0), ValueError, "exact_std"),
    ],
)
def test_bad_input_is_named(call, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        call()
