"""Tests of kltutorial.studies.beta_scale and kltutorial.studies.reference_cost (book section 6)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kltutorial import exact as ex
from kltutorial.studies.beta_scale import (
    max_kl,
    normalise_reward,
    reward_scale_gap,
    sum_to_token_mean,
    summarize_sweep,
    token_mean_to_sum,
)
from kltutorial.studies.reference_cost import LoRABigram, reference_reuse_check

F64 = torch.float64


@pytest.fixture
def problem():
    g = torch.Generator().manual_seed(0)
    ref = torch.log_softmax(torch.randn(50, generator=g, dtype=F64), 0)
    reward = torch.randn(50, generator=g, dtype=F64)
    return ref, reward


@pytest.mark.parametrize("scale", [1e-3, 0.5, 3.0, 1e3])
@pytest.mark.parametrize("beta", [0.05, 1.0, 20.0])
def test_scaling_reward_and_beta_together_changes_nothing(problem, scale, beta):
    ref, reward = problem
    assert reward_scale_gap(ref, reward, beta, scale) < 1e-12


def test_scaling_only_the_reward_is_dividing_beta(problem):
    ref, reward = problem
    a = ex.optimal_policy(ref, 4.0 * reward, 1.0)
    b = ex.optimal_policy(ref, reward, 0.25)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_normalise_reward_mean_zero_var_one_and_beta_times_sigma(problem):
    ref, reward = problem
    r, mu, sigma = normalise_reward(ref, reward)
    p = ref.exp()
    assert abs(float((p * r).sum())) < 1e-12
    assert abs(float((p * r**2).sum()) - 1) < 1e-12
    assert abs(mu - float((p * reward).sum())) < 1e-12
    torch.testing.assert_close(ex.optimal_policy(ref, r, 0.3), ex.optimal_policy(ref, reward, 0.3 * sigma),
                               rtol=0, atol=1e-12)


def test_sum_and_token_mean_are_inverse():
    assert sum_to_token_mean(6.0, 5) == pytest.approx(1.2)
    assert token_mean_to_sum(0.1, 5) == pytest.approx(0.5)
    lengths = np.array([1, 3, 7])
    kl = np.array([0.2, 4.0, 9.1])
    np.testing.assert_allclose(token_mean_to_sum(sum_to_token_mean(kl, lengths), lengths), kl)


def test_token_mean_matches_a_masked_mean():
    # verl: masked_mean over the response, then the batch mean.
    g = torch.Generator().manual_seed(1)
    kl_t = torch.randn(4, 6, generator=g, dtype=F64)
    mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3, [1] * 5 + [0], [1] + [0] * 5])
    sums = (kl_t * mask).sum(-1).numpy()
    lengths = mask.sum(-1).numpy()
    masked_mean = ((kl_t * mask).sum(-1) / mask.sum(-1)).numpy()
    np.testing.assert_allclose(sum_to_token_mean(sums, lengths), masked_mean)


def test_max_kl_is_the_small_beta_limit(problem):
    ref, reward = problem
    limit = max_kl(ref, reward)
    kl_small = ex.sequence_kl(ex.optimal_policy(ref, reward, 1e-4), ref)
    assert abs(kl_small - limit) < 1e-9
    for beta in [0.01, 0.1, 1.0]:
        assert ex.sequence_kl(ex.optimal_policy(ref, reward, beta), ref) < limit
    assert limit == pytest.approx(-float(ref[reward.argmax()]))


def test_summarize_sweep_sorts_and_finds_peak():
    s = summarize_sweep([0.1, 1.0, 0.3], [5.0, 0.2, 1.5], [3.0, 1.0, 2.0], [0.5, 1.2, 2.0], ref_gold=1.0)
    np.testing.assert_array_equal(s.betas, [1.0, 0.3, 0.1])
    assert s.peak_beta == 0.3 and s.peak_kl == 1.5 and s.peak_gold == 2.0
    assert s.beta_window() == (0.3, 1.0)
    none = summarize_sweep([1.0, 2.0], [1, 0.5], [1, 0.5], [0.0, 0.0], ref_gold=1.0)
    assert all(math.isnan(v) for v in none.beta_window())


def test_reference_reuse_check_counts_and_cache():
    g = torch.Generator().manual_seed(0)
    model = LoRABigram(6, 2, generator=g)
    tokens = torch.randint(0, 6, (32, 5), generator=g)
    scores = (tokens == 5).sum(-1).to(F64)
    with torch.no_grad():
        before = model(tokens)
        with model.disable_adapter():
            torch.testing.assert_close(model(tokens), before)  # B = 0: adapted == base at the start
    out = reference_reuse_check(model, tokens, scores, beta=0.1, ppo_epochs=3, n_minibatches=4, generator=g)
    assert out.reference_passes_cached == 1 and out.reference_passes_recomputed == 12
    assert out.max_cache_error == 0.0
    assert out.kl_start == 0.0 and out.kl_end > 0
    with torch.no_grad():
        assert not torch.allclose(model(tokens), before)  # the adapter moved the policy ...
        with model.disable_adapter():
            torch.testing.assert_close(model(tokens), before)  # ... but not the reference


BAD = [
    (lambda p: reward_scale_gap(*p, beta=0.0, scale=1.0), ValueError),
    (lambda p: reward_scale_gap(*p, beta=1.0, scale=-2.0), ValueError),
    (lambda p: reward_scale_gap(p[0], p[1][:3], beta=1.0, scale=1.0), ValueError),
    (lambda p: normalise_reward(p[0], torch.zeros(50, dtype=F64)), ValueError),
    (lambda p: sum_to_token_mean(1.0, 0), ValueError),
    (lambda p: sum_to_token_mean(1.0, 2.5), TypeError),
    (lambda p: sum_to_token_mean("6", 5), TypeError),
    (lambda p: token_mean_to_sum(float("nan"), 5), ValueError),
    (lambda p: token_mean_to_sum([1.0, 2.0], [1, 2, 3]), ValueError),
    (lambda p: summarize_sweep([1.0, 1.0], [1, 1], [1, 1], [1, 1], 0.0), ValueError),
    (lambda p: summarize_sweep([1.0, 0.5], [1], [1, 1], [1, 1], 0.0), ValueError),
    (lambda p: summarize_sweep([1.0, -0.5], [1, 1], [1, 1], [1, 1], 0.0), ValueError),
    (lambda p: LoRABigram(1, 2, generator=torch.Generator()), ValueError),
    (lambda p: LoRABigram(4, 0, generator=torch.Generator()), ValueError),
    (lambda p: LoRABigram(4, 2, generator=0), TypeError),
    (lambda p: LoRABigram(4, 2, generator=torch.Generator())(torch.tensor([[0, 4]])), ValueError),
    (lambda p: reference_reuse_check(LoRABigram(4, 1, generator=torch.Generator()), torch.zeros(2, 3,
     dtype=torch.long), torch.zeros(3, dtype=F64), beta=0.1, ppo_epochs=1, n_minibatches=1,
     generator=torch.Generator()), ValueError),
    (lambda p: reference_reuse_check(LoRABigram(4, 1, generator=torch.Generator()), torch.zeros(2, 3,
     dtype=torch.long), torch.zeros(2, dtype=F64), beta=0.1, ppo_epochs=1, n_minibatches=3,
     generator=torch.Generator()), ValueError),
    (lambda p: reference_reuse_check("model", torch.zeros(2, 3, dtype=torch.long), torch.zeros(2),
     beta=0.1, ppo_epochs=1, n_minibatches=1, generator=torch.Generator()), TypeError),
]


@pytest.mark.parametrize("call, error", BAD)
def test_bad_inputs(problem, call, error):
    with pytest.raises(error):
        call(problem)
