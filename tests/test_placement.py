"""Tests of kltutorial.exact.placement (book section 9): GAE against hand-computed examples and its closed
forms, the exact gradients of the KL in the reward and in the loss against the KL gradients they follow, the
exact critic, a sampled check of the reward placement, and a table of bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from kltutorial import exact as ex
from kltutorial.exact.gradients import sequence_estimator_gradients
from kltutorial.exact.placement import (
    compare_gradients,
    gae_advantages,
    grpo_style_loss,
    penalty_gradients,
    ppo_style_loss,
    score_gradient,
)

F64 = torch.float64


# ----------------------------------------------------------------------------------------------------
# GAE


def test_gae_hand_computed() -> None:
    # gamma = 1, lam = 0.5: deltas 0.1, 0.1, 0.3; A_2 = 0.3, A_1 = 0.1 + 0.15, A_0 = 0.1 + 0.125
    adv, ret = gae_advantages(
        torch.tensor([[0.0, 0.0, 1.0]], dtype=F64), torch.tensor([[0.5, 0.6, 0.7]], dtype=F64),
        torch.ones(1, 3), gamma=1.0, lam=0.5,
    )
    assert torch.allclose(adv, torch.tensor([[0.225, 0.25, 0.3]], dtype=F64), atol=1e-15)
    assert torch.allclose(ret, torch.tensor([[0.725, 0.85, 1.0]], dtype=F64), atol=1e-15)


def test_gae_hand_computed_discounted_and_padded() -> None:
    # gamma = 0.5, lam = 1, no critic: discounted returns 1 + 0.5 * 4 = 3, 2 + 0.5 * 4 = 4, 4; then padding
    rewards = torch.tensor([[1.0, 2.0, 4.0, 9.0]], dtype=F64)
    no_critic = torch.zeros(1, 4, dtype=F64)
    adv, ret = gae_advantages(rewards, no_critic, torch.tensor([[1, 1, 1, 0]]), gamma=0.5, lam=1.0)
    assert adv.tolist() == [[3.0, 4.0, 4.0, 0.0]]
    assert ret.tolist() == adv.tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_closed_forms(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    r, v = torch.randn(3, 6, generator=g, dtype=F64), torch.randn(3, 6, generator=g, dtype=F64)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 1:] = False
    gamma = 0.9
    rm, vm = r * mask, v * mask
    # lam = 1: discounted return minus the value
    adv, _ = gae_advantages(r, v, mask, gamma, 1.0)
    disc = gamma ** torch.arange(6, dtype=F64)
    want = torch.stack([(rm[:, t:] * disc[: 6 - t]).sum(-1) for t in range(6)], -1) - vm
    assert torch.allclose(adv, want * mask, atol=1e-12)
    # lam = 0: the one-step TD error
    adv0, ret0 = gae_advantages(r, v, mask, gamma, 0.0)
    next_v = torch.cat([vm[:, 1:], torch.zeros(3, 1, dtype=F64)], -1)
    assert torch.allclose(adv0, (rm + gamma * next_v - vm) * mask, atol=1e-12)
    assert torch.allclose(ret0, adv0 + vm, atol=1e-12)
    # padding gets exactly 0, whatever was there
    r2 = r.clone()
    r2[~mask] = 1e6
    assert torch.equal(gae_advantages(r2, v, mask, gamma, 0.7)[0], gae_advantages(r, v, mask, gamma, 0.7)[0])


# ----------------------------------------------------------------------------------------------------
# Exact gradients of the two placements


def _problem(V: int, T: int, seed: int, scale: float = 0.8):
    g = torch.Generator().manual_seed(seed)
    space = ex.SequenceSpace(vocab_size=V, length=T)
    ref_logits = 1.5 * torch.randn(space.n_prefixes, V, generator=g, dtype=F64)
    theta = ref_logits + scale * torch.randn(space.n_prefixes, V, generator=g, dtype=F64)
    scores = torch.randn(space.n_sequences, generator=g, dtype=F64)
    return space, theta, torch.log_softmax(ref_logits, -1), scores


def _grad(loss_fn, theta: torch.Tensor) -> torch.Tensor:
    th = theta.clone().requires_grad_(True)
    return torch.autograd.grad(loss_fn(th), th)[0]


def test_penalty_gradients_closed_form_one_token() -> None:
    space, theta, ref, _ = _problem(5, 1, 0)
    pi = torch.softmax(theta[0], 0)
    d = pi.log() - ref[0]
    t = penalty_gradients(space, theta, ref)
    assert torch.allclose(t.reverse_sequence[0], pi * (d - (pi * d).sum()), atol=1e-15)
    assert torch.allclose(t.forward_sequence[0], pi - ref[0].exp(), atol=1e-15)
    assert torch.allclose(t.reverse_per_token, t.reverse_sequence, atol=1e-15)
    assert torch.allclose(t.forward_per_token, t.forward_sequence, atol=1e-15)


@pytest.mark.parametrize(("V", "T", "seed"), [(2, 3, 0), (3, 3, 1), (3, 2, 2)])
def test_reward_placement_gives_the_objective_gradient(V: int, T: int, seed: int) -> None:
    space, theta, ref, scores = _problem(V, T, seed)
    beta = 0.3
    reverse = penalty_gradients(space, theta, ref).reverse_sequence
    want = -score_gradient(space, theta, scores) + beta * reverse
    for lam, critic in [(1.0, "exact"), (0.9, "exact"), (0.0, "exact"), (1.0, "none")]:
        got = _grad(lambda th, lam=lam, critic=critic: ppo_style_loss(
            space, th, ref, scores, beta, lam=lam, critic=critic), theta)
        assert torch.allclose(got, want, atol=1e-12), (lam, critic)
    # without a critic, lam < 1 cuts the later rewards short: biased
    got = _grad(lambda th: ppo_style_loss(space, th, ref, scores, beta, lam=0.5, critic="none"), theta)
    assert (got - want).abs().max() > 1e-3


@pytest.mark.parametrize(("V", "T", "seed"), [(2, 3, 0), (3, 3, 1)])
def test_k3_in_the_reward_is_reverse_minus_forward(V: int, T: int, seed: int) -> None:
    space, theta, ref, _ = _problem(V, T, seed)
    t = penalty_gradients(space, theta, ref)
    zero = torch.zeros(space.n_sequences, dtype=F64)
    got = _grad(lambda th: ppo_style_loss(space, th, ref, zero, 1.0, estimator="k3"), theta)
    assert torch.allclose(got, t.reverse_sequence - t.forward_per_token, atol=1e-12)


@pytest.mark.parametrize(("V", "T", "seed"), [(2, 3, 0), (3, 3, 1), (3, 2, 2)])
def test_loss_placement_per_token_targets(V: int, T: int, seed: int) -> None:
    space, theta, ref, scores = _problem(V, T, seed)
    beta = 0.3
    t = penalty_gradients(space, theta, ref)
    ds = score_gradient(space, theta, scores)
    rev, fwd = t.reverse_per_token, t.forward_per_token
    expected = {"k1": 0 * ds, "k2": rev, "k3+": rev, "k1+": rev, "k3": fwd, "low_var_kl": fwd}
    for name, target in expected.items():
        got = _grad(
            lambda th, name=name: grpo_style_loss(space, th, ref, scores, beta, estimator=name), theta
        )
        assert torch.allclose(got, -ds + beta * target, atol=1e-12), name
        # the same penalty term as section 4's per-token loss
        if name in ("k2", "k3"):
            sg = sequence_estimator_gradients(space, theta, ref, name)
            assert torch.allclose(target, sg.loss, atol=1e-12)
    k1 = sequence_estimator_gradients(space, theta, ref, "k1")
    assert torch.allclose(t.reverse_sequence, k1.reverse_kl)
    assert (t.reverse_per_token - t.reverse_sequence).abs().max() > 1e-3


def test_exact_critic_is_the_conditional_expectation() -> None:
    # with no penalty the critic at the empty prefix is E[s], so A_0 = s - E[s] with lam = 1 ...
    space, theta, ref, scores = _problem(2, 2, 0)
    from kltutorial.exact.placement import _exact_values

    p = ex.sequence_logprobs(space, torch.log_softmax(theta, -1)).exp()
    values = _exact_values(space, p, scores[:, None].expand(-1, 2))
    assert torch.allclose(values[:, 0], (p * scores).sum().expand(4))
    # ... and after the first token, the mean over the second
    for first in range(2):
        rows = space.sequences[:, 0] == first
        want = (p[rows] * scores[rows]).sum() / p[rows].sum()
        assert torch.allclose(values[rows, 1], want.expand(int(rows.sum())))


def test_reward_placement_on_samples_converges_to_the_exact_gradient() -> None:
    # REINFORCE with the k1-shaped return on sampled sequences, autograd through the sampled log-probs
    space, theta, ref, scores = _problem(2, 3, 4)
    gen = torch.Generator().manual_seed(0)
    table = torch.log_softmax(theta, -1)
    idx = ex.sample_autoregressive(space, table, 200_000, gen)  # (N,) sequence indices
    th = theta.clone().requires_grad_(True)
    per_tok = torch.log_softmax(th, -1)[space.prefix_ids[idx], space.sequences[idx]]  # (N, T)
    ref_tok = ref[space.prefix_ids[idx], space.sequences[idx]]
    ret = scores[idx] - 0.5 * (per_tok - ref_tok).detach().sum(-1)
    (g,) = torch.autograd.grad(-(ret[:, None] * per_tok).sum(-1).mean(), th)
    want = -score_gradient(space, theta, scores) + 0.5 * penalty_gradients(space, theta, ref).reverse_sequence
    assert (g - want).abs().max() < 0.02
    assert compare_gradients(g, want).cosine > 0.99


# ----------------------------------------------------------------------------------------------------
# Bad inputs

_S, _TH, _REF, _SC = _problem(2, 2, 0)
_R = torch.zeros(2, 3)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: gae_advantages(_R, _R, torch.ones(2, 3), 1.5), ValueError, "gamma"),
        (lambda: gae_advantages(_R, _R, torch.ones(2, 3), 1.0, -0.1), ValueError, "lam"),
        (lambda: gae_advantages(_R, _R, torch.ones(2, 3), True), TypeError, "gamma"),
        (lambda: gae_advantages(_R, torch.zeros(2, 4), torch.ones(2, 3)), ValueError, "shape"),
        (lambda: gae_advantages(_R, _R, torch.tensor([[0, 1, 1], [1, 1, 1]])), ValueError, "right-padded"),
        (lambda: gae_advantages(_R.long(), _R, torch.ones(2, 3)), TypeError, "rewards"),
        (lambda: gae_advantages(_R, _R, torch.ones(2, 2)), ValueError, "attention_mask"),
        (lambda: ppo_style_loss(_S, _TH, _REF, _SC, -1.0), ValueError, "beta"),
        (lambda: ppo_style_loss(_S, _TH, _REF, _SC, 1.0, estimator="full"), ValueError, "sampled"),
        (lambda: ppo_style_loss(_S, _TH, _REF, _SC, 1.0, critic="mc"), ValueError, "critic"),
        (lambda: ppo_style_loss(_S, _TH, _REF, _SC[:3], 1.0), ValueError, "scores"),
        (lambda: grpo_style_loss(_S, _TH[:2], _REF, _SC, 1.0), ValueError, "logits"),
        (lambda: grpo_style_loss(_S, _TH, _TH, _SC, 1.0), ValueError, "ref_table"),
        (lambda: grpo_style_loss("space", _TH, _REF, _SC, 1.0), TypeError, "SequenceSpace"),
        (lambda: penalty_gradients(_S, _TH, _REF * math.nan), ValueError, "NaN"),
        (lambda: score_gradient(_S, _TH, _SC.float().int()), TypeError, "scores"),
        (lambda: compare_gradients(torch.zeros(2), torch.zeros(3)), ValueError, "shape"),
    ],
)
def test_bad_inputs(call, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()
