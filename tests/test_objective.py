"""Reward shaping and the penalised objective."""

from __future__ import annotations

import math

import pytest
import torch

from kltutorial import (
    compute_rlhf_objective,
    compute_token_kl,
    exact_kl,
    get_logprobs_for_tokens,
    shape_rewards,
)


def test_shape_rewards_places_score_at_last_valid_token():
    kl = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 1, 0]])  # full, right-padded, both sides
    scores = torch.tensor([1.0, 2.0, 3.0])
    r = shape_rewards(scores, kl, mask, kl_coef=0.5)
    expected = torch.tensor(
        [
            [-0.05, -0.10, -0.15, -0.20 + 1.0],
            [-0.25, -0.30 + 2.0, 0.0, 0.0],
            [0.0, -0.5, -0.5 + 3.0, 0.0],
        ]
    )
    assert torch.allclose(r, expected)
    # Summed over a sequence: score - beta * sum of valid per-token KL.
    assert torch.allclose(r.sum(-1), scores - 0.5 * (kl * mask).sum(-1))


def test_shape_rewards_zero_beta_and_gradient():
    kl = torch.rand(2, 3, requires_grad=True)
    r = shape_rewards(torch.tensor([1.0, -1.0]), kl, torch.ones(2, 3), kl_coef=0.0)
    assert torch.equal(r.sum(-1), torch.tensor([1.0, -1.0]))
    r2 = shape_rewards(torch.zeros(2), kl, torch.ones(2, 3), kl_coef=2.0)
    r2.sum().backward()
    assert torch.equal(kl.grad, torch.full((2, 3), -2.0))


def _policy_and_reference(seed: int, b: int = 64, t: int = 12, v: int = 40, spread: float = 0.5):
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(b, t, v, generator=gen, dtype=torch.float64)
    pol = ref + spread * torch.randn(b, t, v, generator=gen, dtype=torch.float64)
    probs = torch.softmax(pol, dim=-1).reshape(-1, v)
    tokens = torch.multinomial(probs, 1, generator=gen).reshape(b, t)  # sampled from the policy
    return pol, ref, tokens


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_objective_estimate_agrees_with_exact_kl_on_policy_samples(estimator):
    pol, ref, tokens = _policy_and_reference(0, b=512)
    mask = torch.ones(tokens.shape)
    rewards = torch.linspace(-1, 1, tokens.shape[0], dtype=torch.float64)
    out = compute_rlhf_objective(pol, ref, tokens, rewards, mask, kl_coef=0.5, estimator=estimator)
    seq = out["per_token_kl"].sum(-1)
    se = float(seq.std()) / math.sqrt(seq.numel())
    assert abs(out["mean_kl"] - out["mean_exact_kl"]) < 4 * se
    assert out["mean_exact_kl"] > 0
    assert out["kl_penalty"] == pytest.approx(0.5 * out["mean_kl"])
    assert out["mean_penalized_reward"] == pytest.approx(out["mean_reward"] - out["kl_penalty"])
    assert float(out["objective"]) == pytest.approx(out["mean_penalized_reward"])


def test_uniform_tokens_give_a_negative_k1_mean_which_is_no_kl():
    """The handbook's pitfall: tokens not drawn from the policy make the k1 average meaningless."""
    pol, ref, _ = _policy_and_reference(1, b=256)
    gen = torch.Generator().manual_seed(2)
    uniform = torch.randint(0, pol.shape[-1], pol.shape[:2], generator=gen)
    out = compute_rlhf_objective(pol, ref, uniform, torch.zeros(256, dtype=torch.float64),
                                 torch.ones(uniform.shape), kl_coef=0.5)
    assert out["mean_kl"] < 0 < out["mean_exact_kl"]
    assert out["mean_penalized_reward"] > out["mean_reward"]  # the "penalty" raises the reward


def test_objective_is_differentiable_and_respects_the_mask():
    pol, ref, tokens = _policy_and_reference(3, b=4)
    pol = pol.clone().requires_grad_(True)
    mask = torch.ones(tokens.shape)
    mask[:, 8:] = 0
    out = compute_rlhf_objective(pol, ref, tokens, torch.ones(4, dtype=torch.float64), mask, kl_coef=1.0)
    out["objective"].backward()
    assert torch.all(pol.grad[:, 8:] == 0) and pol.grad[:, :8].abs().sum() > 0
    lp = get_logprobs_for_tokens(pol.detach(), tokens)
    lq = get_logprobs_for_tokens(ref, tokens)
    _, seq = compute_token_kl(lp, lq, mask)
    assert out["mean_kl"] == pytest.approx(float(seq.mean()))
    assert out["mean_exact_kl"] == pytest.approx(float(exact_kl(pol.detach(), ref, mask).sum(-1).mean()))
