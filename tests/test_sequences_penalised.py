"""Tests of kltutorial.exact.penalised (book section 5): the KL-penalised objective on a listed space
against closed forms (the Gibbs identity, beta log Z, the frontier's slope beta) and properties (the optimum
beats every perturbation, quadratically; the baseline leaves the expected gradient unchanged)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kltutorial import exact as ex
from kltutorial.exact import penalised as pen

F64 = torch.float64


def _problem(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ref = torch.log_softmax(torch.randn(n, generator=g, dtype=F64), 0)
    return ref, torch.randn(n, generator=g, dtype=F64)


def _space_problem(seed: int) -> tuple[ex.SequenceSpace, torch.Tensor, torch.Tensor, torch.Tensor]:
    space = ex.SequenceSpace(vocab_size=3, length=3)
    g = torch.Generator().manual_seed(seed)
    ref = torch.log_softmax(torch.randn(space.n_prefixes, 3, generator=g, dtype=F64), -1)
    logits = torch.randn(space.n_prefixes, 3, generator=g, dtype=F64)
    reward = torch.randn(space.n_sequences, generator=g, dtype=F64)
    return space, logits, ex.sequence_logprobs(space, ref), reward


@pytest.mark.parametrize("beta", [0.05, 0.3, 1.0, 7.0])
def test_gibbs_identity_and_maximum(beta: float) -> None:
    ref, r = _problem(40, 0)
    best = ex.optimal_policy(ref, r, beta)
    assert pen.penalised_objective(best, ref, r, beta) == pytest.approx(pen.optimal_value(ref, r, beta),
                                                                        abs=1e-12)
    for seed in range(5):  # J(pi) = beta log Z - beta KL(pi || pi*)
        logp = _problem(40, 100 + seed)[0]
        j = pen.penalised_objective(logp, ref, r, beta)
        expected = pen.optimal_value(ref, r, beta) - beta * ex.sequence_kl(logp, best)
        assert j == pytest.approx(expected, abs=1e-12)


def test_optimal_value_bounds_and_limits() -> None:
    ref, r = _problem(30, 1)
    mean = ex.expected_reward(ref, r)
    values = [pen.optimal_value(ref, r, b) for b in (100.0, 1.0, 0.01)]
    assert mean <= values[0] <= values[1] <= values[2] <= float(r.max())  # decreasing in beta
    assert values[0] == pytest.approx(mean, abs=0.02)  # beta -> inf: E_ref r
    assert pen.optimal_value(ref, r, 1e-4) == pytest.approx(float(r.max()), abs=1e-2)
    assert math.isfinite(pen.optimal_value(ref, 1e4 * r, 1e-3))  # no overflow of e^(r / beta)


@pytest.mark.parametrize("beta", [0.1, 0.5, 2.0])
def test_frontier_slope_is_beta_and_matches_variance_formula(beta: float) -> None:
    ref, r = _problem(50, 2)
    assert pen.frontier_slope(ref, r, beta) == pytest.approx(beta, rel=1e-5)
    p = ex.optimal_policy(ref, r, beta).exp()
    var = float((p * r**2).sum() - (p * r).sum() ** 2)
    h = 1e-4
    f = ex.optimal_frontier(ref, r, [beta * (1 + h), beta * (1 - h)])
    assert (f.reward[0] - f.reward[1]) / (2 * h * beta) == pytest.approx(-var / beta**2, rel=1e-6)
    assert (f.kl[0] - f.kl[1]) / (2 * h * beta) == pytest.approx(-var / beta**3, rel=1e-6)


@pytest.mark.parametrize("budget", [0.05, 0.5, 2.0])
def test_beta_for_budget_spends_the_budget_and_wins_under_it(budget: float) -> None:
    ref, r = _problem(50, 3)
    beta = pen.beta_for_budget(ref, r, budget)
    best = ex.optimal_policy(ref, r, beta)
    assert ex.sequence_kl(best, ref) == pytest.approx(budget, rel=1e-6)
    top = ex.expected_reward(best, r)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):  # random policies inside the budget never do better
        logits = best + 0.3 * torch.randn(50, generator=g, dtype=F64)
        logp = logits - torch.logsumexp(logits, 0)
        if ex.sequence_kl(logp, ref) <= budget:
            assert ex.expected_reward(logp, r) <= top + 1e-12


def test_beta_for_budget_two_point_closed_form() -> None:
    ref = torch.tensor([0.5, 0.5], dtype=F64).log()
    r = torch.tensor([0.0, 1.0], dtype=F64)
    kl = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)  # pi* = (1/4, 3/4)
    assert pen.beta_for_budget(ref, r, kl) == pytest.approx(1 / math.log(3), rel=1e-7)


@pytest.mark.parametrize("beta", [0.2, 1.0])
def test_perturbations_all_lose_quadratically(beta: float) -> None:
    ref, r = _problem(200, 4)
    check = pen.perturbation_check(ref, r, beta, [0.001, 0.01, 1.0], 50, torch.Generator().manual_seed(1))
    assert check.gaps.shape == (3, 50)
    assert check.min_gap() > 0
    assert check.order() == pytest.approx(2.0, abs=0.1)
    curv = check.curvature()
    np.testing.assert_allclose(curv[0], curv[1], rtol=0.05)  # gap / delta^2 constant for small delta
    assert check.optimum == pytest.approx(pen.optimal_value(ref, r, beta), abs=1e-12)
    # the gap is beta KL(perturbed || pi*): redo one direction by hand
    g = torch.Generator().manual_seed(1)
    xi = torch.randn(50, 200, generator=g, dtype=F64)[0]  # the first of the 50 directions
    best = ex.optimal_policy(ref, r, beta)
    logits = best + 0.01 * xi
    logp = logits - torch.logsumexp(logits, 0)
    assert check.gaps[1, 0] == pytest.approx(beta * ex.sequence_kl(logp, best), rel=1e-8)


def test_perturbation_check_is_reproducible() -> None:
    ref, r = _problem(20, 5)
    a = pen.perturbation_check(ref, r, 0.5, [0.1], 5, torch.Generator().manual_seed(3))
    b = pen.perturbation_check(ref, r, 0.5, [0.1], 5, torch.Generator().manual_seed(3))
    np.testing.assert_array_equal(a.gaps, b.gaps)


@pytest.mark.parametrize("baseline", [-5.0, 0.7, 100.0])
def test_policy_gradient_ignores_baseline_and_equals_autograd(baseline: float) -> None:
    space, logits, ref, r = _space_problem(6)
    beta = 0.4
    g0 = pen.policy_gradient(space, logits, ref, r, beta)
    gb = pen.policy_gradient(space, logits, ref, r, beta, baseline=baseline)
    torch.testing.assert_close(gb, g0, rtol=0, atol=1e-12)
    z = logits.clone().requires_grad_(True)
    logp = ex.sequence_logprobs(space, torch.log_softmax(z, -1))
    p = logp.exp()
    j = (p * r).sum() - beta * (p * (logp - ref)).sum()  # J(pi_z), differentiated directly
    (direct,) = torch.autograd.grad(j, z)
    torch.testing.assert_close(g0, direct, rtol=0, atol=1e-12)


def test_policy_gradient_vanishes_at_the_optimum() -> None:
    space, _, ref, r = _space_problem(7)
    best = ex.optimal_policy(ref, r, 0.5)
    table = ex.next_token_logprobs(space, best)  # pi* is autoregressive: its table is its logits
    g = pen.policy_gradient(space, table, ref, r, 0.5, baseline=3.0)
    assert float(g.abs().max()) < 1e-10


REF, R = _problem(4, 9)
GOOD_SPACE, GOOD_LOGITS, GOOD_REF, GOOD_R = _space_problem(8)
BAD = [
    (pen.penalised_objective, (REF, REF, R, 0.0), ValueError, "beta"),
    (pen.penalised_objective, (REF[:3], REF, R, 1.0), ValueError, "logp"),
    (pen.penalised_objective, (REF + 1.0, REF, R, 1.0), ValueError, "logsumexp"),
    (pen.optimal_value, (REF, R[:3], 1.0), ValueError, "reward"),
    (pen.optimal_value, (REF, R, -1.0), ValueError, "beta"),
    (pen.frontier_slope, (REF, R, 1.0, 0.7), ValueError, "rel_step"),
    (pen.frontier_slope, (REF, torch.ones(4, dtype=F64), 1.0), ValueError, "constant"),
    (pen.beta_for_budget, (REF, R, 0.0), ValueError, "budget"),
    (pen.beta_for_budget, (REF, R, 50.0), ValueError, "does not bind"),
    (pen.perturbation_check, (REF, R, 1.0, [], 3, torch.Generator()), ValueError, "scales"),
    (pen.perturbation_check, (REF, R, 1.0, [0.1, -1.0], 3, torch.Generator()), ValueError, "scales"),
    (pen.perturbation_check, (REF, R, 1.0, "x", 3, torch.Generator()), TypeError, "scales"),
    (pen.perturbation_check, (REF, R, 1.0, [0.1], 0, torch.Generator()), ValueError, "n"),
    (pen.perturbation_check, (REF, R, 1.0, [0.1], 3, 7), TypeError, "generator"),
    (pen.policy_gradient, ("space", GOOD_LOGITS, GOOD_REF, GOOD_R, 1.0), TypeError, "SequenceSpace"),
    (pen.policy_gradient, (GOOD_SPACE, GOOD_LOGITS[:3], GOOD_REF, GOOD_R, 1.0), ValueError, "logits"),
    (pen.policy_gradient, (GOOD_SPACE, GOOD_LOGITS, GOOD_REF, GOOD_R, 1.0, math.inf), ValueError, "baseline"),
    (pen.policy_gradient, (GOOD_SPACE, GOOD_LOGITS, GOOD_REF[:5], GOOD_R, 1.0), ValueError, "ref_logprobs"),
]


@pytest.mark.parametrize(("fn", "args", "error", "match"), BAD)
def test_bad_inputs(fn, args, error, match) -> None:
    with pytest.raises(error, match=match):
        fn(*args)
