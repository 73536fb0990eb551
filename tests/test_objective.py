"""Reward shaping and the penalised objective, and a table of bad inputs."""

from __future__ import annotations

import itertools
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
from kltutorial.objective import last_valid_positions


def test_shape_rewards_places_score_at_last_valid_token():
    kl = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 1, 0]])  # full, right-padded, both sides
    scores = torch.tensor([1.0, 2.0, 3.0])
    r = shape_rewards(scores, kl, mask, beta=0.5)
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
    r = shape_rewards(torch.tensor([1.0, -1.0]), kl, torch.ones(2, 3), beta=0.0)
    assert torch.equal(r.sum(-1), torch.tensor([1.0, -1.0]))
    r2 = shape_rewards(torch.zeros(2), kl, torch.ones(2, 3), beta=2.0)
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
    _, out = compute_rlhf_objective(pol, ref, tokens, rewards, mask, beta=0.5, estimator=estimator)
    seq = out["per_token_kl"].sum(-1)
    se = float(seq.std()) / math.sqrt(seq.numel())
    assert abs(out["mean_kl"] - out["mean_exact_kl"]) < 4 * se
    assert out["mean_exact_kl"] > 0
    assert out["kl_penalty"] == pytest.approx(0.5 * out["mean_kl"])
    assert out["objective"] == pytest.approx(out["mean_reward"] - out["kl_penalty"])
    assert all(isinstance(out[k], float) for k in ("objective", "mean_reward", "mean_kl", "mean_exact_kl"))


def test_uniform_tokens_give_a_negative_k1_mean_which_is_no_kl():
    """The handbook's pitfall: tokens not drawn from the policy make the k1 average meaningless."""
    pol, ref, _ = _policy_and_reference(1, b=256)
    gen = torch.Generator().manual_seed(2)
    uniform = torch.randint(0, pol.shape[-1], pol.shape[:2], generator=gen)
    _, out = compute_rlhf_objective(pol, ref, uniform, torch.zeros(256, dtype=torch.float64),
                                    torch.ones(uniform.shape), beta=0.5)
    assert out["mean_kl"] < 0 < out["mean_exact_kl"]
    assert out["objective"] > out["mean_reward"]  # the "penalty" raises the reward


def test_loss_is_differentiable_respects_the_mask_and_info_is_detached():
    pol, ref, tokens = _policy_and_reference(3, b=4)
    pol = pol.clone().requires_grad_(True)
    mask = torch.ones(tokens.shape)
    mask[:, 8:] = 0
    rewards = torch.tensor([1.0, -1.0, 0.5, 2.0], dtype=torch.float64)
    loss, out = compute_rlhf_objective(pol, ref, tokens, rewards, mask, beta=1.0)
    loss.backward()
    assert loss.dim() == 0 and not out["per_token_kl"].requires_grad
    assert torch.all(pol.grad[:, 8:] == 0) and pol.grad[:, :8].abs().sum() > 0
    lp = get_logprobs_for_tokens(pol.detach(), tokens)
    lq = get_logprobs_for_tokens(ref, tokens)
    _, seq = compute_token_kl(lp, lq, mask)
    assert out["mean_kl"] == pytest.approx(float(seq.mean()))
    assert out["mean_exact_kl"] == pytest.approx(float(exact_kl(pol.detach(), ref, mask).sum(-1).mean()))


def _grad(value: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(value, theta, retain_graph=True)
    return grad


def _value(theta, ref, y, reward, beta, estimator):
    """r - beta * (the estimate) for the one-token response ``y``: the value ``info["objective"]`` logs."""
    lp = get_logprobs_for_tokens(theta, torch.tensor([[y]]))
    lq = get_logprobs_for_tokens(ref, torch.tensor([[y]]))
    kwargs = {"policy_logits": theta, "reference_logits": ref} if estimator == "full" else {}
    _, seq = compute_token_kl(lp, lq, torch.ones(1, 1), estimator, **kwargs)
    return reward - beta * seq.sum()


def _expected_value_gradient(theta, ref, rewards, beta, estimator):
    """E_{y ~ pi}[grad of the logged value], exactly: a sum over the V one-token responses."""
    probs = torch.softmax(theta, dim=-1).flatten().detach()
    total = torch.zeros_like(theta)
    for y in range(theta.shape[-1]):
        total += probs[y] * _grad(_value(theta, ref, y, rewards[y], beta, estimator), theta)
    return total


def _categorical(seed, v=6):
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(1, 1, v, generator=gen, dtype=torch.float64)  # (B, T, V) = (1, 1, V)
    theta = (ref + torch.randn(1, 1, v, generator=gen, dtype=torch.float64)).requires_grad_(True)
    rewards = torch.randn(v, generator=gen, dtype=torch.float64)
    return theta, ref, rewards


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_logged_value_is_not_a_loss(seed):
    """The Notes' gradient facts, on a categorical policy over V one-token responses, with every
    expectation an exact sum (no sampling noise): autograd through r - beta * estimate gives no
    gradient for the reward, an expected gradient of 0 with k1, and that of the forward KL(ref || pi)
    with k3; k2 and k3+ give the penalised KL's."""
    theta, ref, rewards = _categorical(seed)
    grad_kl = _grad(exact_kl(theta, ref).sum(), theta)  # grad KL(pi || ref), the penalised one
    grad_forward = _grad(exact_kl(ref, theta).sum(), theta)  # grad KL(ref || pi)
    assert (grad_kl - grad_forward).abs().max() > 1e-2
    zero = torch.zeros_like(theta)
    assert torch.equal(_expected_value_gradient(theta, ref, rewards, 0.0, "k1"), zero)
    torch.testing.assert_close(_expected_value_gradient(theta, ref, rewards, 1.0, "k1"), zero,
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(_expected_value_gradient(theta, ref, rewards, 1.0, "k3"), -grad_forward,
                               rtol=0, atol=1e-12)
    for estimator in ("k2", "k3+"):
        torch.testing.assert_close(_expected_value_gradient(theta, ref, rewards, 1.0, estimator), -grad_kl,
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_the_loss_has_minus_the_objectives_gradient_in_expectation(seed, batch):
    """E over every batch of ``batch`` one-token responses drawn from pi of grad(loss) equals
    -grad J, J = E[r] - beta KL(pi || ref), exactly (a sum over V**batch batches), with the leave-one-out
    baseline for batch > 1 and none for batch = 1; the logged estimator does not change the loss."""
    theta, ref, rewards = _categorical(seed, v=5)
    beta = 0.7
    probs = torch.softmax(theta, dim=-1).flatten()
    grad_j = _grad((probs * rewards).sum() - beta * exact_kl(theta, ref).sum(), theta)
    assert grad_j.abs().max() > 1e-2
    p = probs.detach()
    total = torch.zeros_like(theta)
    v = theta.shape[-1]
    for ys in itertools.product(range(v), repeat=batch):
        tokens = torch.tensor(ys).reshape(batch, 1)
        logits = theta.expand(batch, 1, v)
        loss, _ = compute_rlhf_objective(logits, ref.expand(batch, 1, v), tokens, rewards[list(ys)],
                                         torch.ones(batch, 1), beta=beta)
        total += math.prod(float(p[y]) for y in ys) * _grad(loss, theta)
    torch.testing.assert_close(total, -grad_j, rtol=0, atol=1e-12)
    tokens = torch.arange(batch).reshape(batch, 1)
    args = (theta.expand(batch, 1, v), ref.expand(batch, 1, v), tokens, rewards[:batch], torch.ones(batch, 1))
    losses = [compute_rlhf_objective(*args, beta=beta, estimator=e)[0] for e in ("k1", "k3", "full")]
    assert losses[0] == losses[1] == losses[2]


def test_beta_is_the_one_name_of_the_coefficient():
    kl = torch.tensor([[0.5, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 0]])
    want = shape_rewards(torch.tensor([1.0]), kl, mask, 0.1)  # positional, as before
    assert torch.equal(shape_rewards(torch.tensor([1.0]), kl, mask, beta=0.1), want)
    with pytest.raises(TypeError, match="kl_coef"):  # the peers' spelling is in kltutorial.compat
        shape_rewards(torch.tensor([1.0]), kl, mask, kl_coef=0.1)
    pol, ref, tokens = _policy_and_reference(4, b=4)
    args = (pol, ref, tokens, torch.ones(4, dtype=torch.float64), torch.ones(tokens.shape))
    with pytest.raises(TypeError, match="kl_coef"):
        compute_rlhf_objective(*args, kl_coef=0.3)


def test_padding_gets_exactly_zero_even_where_the_estimate_is_infinite():
    # TRL (<= 0.11) and OpenRLHF leave -beta * kl at padded positions; verl multiplies by the mask, which
    # turns an infinite estimate into NaN. torch.where gives 0.
    kl = torch.tensor([[0.5, math.inf, 0.25]])
    with pytest.raises(ValueError, match="per_token_kl contains inf"):
        shape_rewards(torch.tensor([1.0]), kl, torch.tensor([[1, 0, 1]]), beta=0.1)
    per_token, _ = compute_token_kl(torch.tensor([[-1.0, -1000.0]]), torch.tensor([[-1.0, 0.0]]),
                                    torch.tensor([[1, 0]]), "k3")
    r = shape_rewards(torch.tensor([2.0]), per_token, torch.tensor([[1, 0]]), beta=0.1)
    assert torch.equal(r, torch.tensor([[2.0, 0.0]]))


def test_objective_checks_its_inputs_once_and_names_response_tokens():
    pol, ref, tokens = _policy_and_reference(5, b=2)
    with pytest.raises(ValueError, match="response_tokens must have shape"):
        compute_rlhf_objective(pol, ref, tokens[:, :3], torch.zeros(2), torch.ones(tokens.shape), 0.1)


# --- one fixed batch, by hand ----------------------------------------------------------------------------
# Three sequences of two tokens over a vocabulary of two; the response is token 0 everywhere, and each row of
# logits is the log of a distribution, so log pi(y) is the row's first entry. Sequence 1 is padded at t = 1.
#
#                 log pi(y)      log pi_ref(y)   mask    r    k1 summed over the mask
#   sequence 0    -1.0, -2.0     -1.5, -1.0      1, 1    1    0.5 - 1.0 = -0.5
#   sequence 1    -0.5, -1.5     -1.0, -9.0      1, 0    0    0.5
#   sequence 2    -3.0, -1.0     -2.0, -3.5      1, 1    2    -1.0 + 2.5 = 1.5
#
# With beta = 0.5 the penalised scores r - beta k1 are 1.25, -0.25, 1.25; the leave-one-out baselines
# 0.5, 1.25, 0.5; the advantages A = 0.75, -1.5, 0.75; log pi of each sequence -3, -0.5, -4; the loss
# -(0.75 * -3 + -1.5 * -0.5 + 0.75 * -4) / 3 = 1.5.

BATCH_LP = torch.tensor([[-1.0, -2.0], [-0.5, -1.5], [-3.0, -1.0]], dtype=torch.float64)
BATCH_LQ = torch.tensor([[-1.5, -1.0], [-1.0, -9.0], [-2.0, -3.5]], dtype=torch.float64)
BATCH_MASK = torch.tensor([[1, 1], [1, 0], [1, 1]])
BATCH_REWARDS = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)


def _two_token_logits(logprobs: torch.Tensor) -> torch.Tensor:
    """(B, T, 2) logits whose token 0 has log-prob ``logprobs`` (B, T): log p and log(1 - p)."""
    return torch.stack([logprobs, torch.log1p(-logprobs.exp())], dim=-1)


def _batch(n: int = 3, **kwargs):
    pol = _two_token_logits(BATCH_LP[:n]).requires_grad_(True)
    ref = _two_token_logits(BATCH_LQ[:n]).requires_grad_(True)
    tokens = torch.zeros(n, 2, dtype=torch.long)
    loss, info = compute_rlhf_objective(pol, ref, tokens, BATCH_REWARDS[:n], BATCH_MASK[:n], 0.5, **kwargs)
    return pol, ref, loss, info


def _bernoulli_kl(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    p, q = lp.exp(), lq.exp()
    return p * (lp - lq) + (1 - p) * (torch.log1p(-p) - torch.log1p(-q))


def test_the_loss_its_gradient_and_the_logged_numbers_on_one_batch_by_hand():
    pol, ref, loss, info = _batch()
    assert loss.item() == pytest.approx(1.5, abs=1e-12)
    assert info["mean_reward"] == 1.0
    assert info["mean_kl"] == pytest.approx(0.5, abs=1e-12)  # k1 sums -0.5, 0.5, 1.5
    assert info["kl_penalty"] == pytest.approx(0.25, abs=1e-12)
    assert info["objective"] == pytest.approx(0.75, abs=1e-12)  # mean of 1.25, -0.25, 1.25
    torch.testing.assert_close(info["per_token_kl"], torch.tensor([[0.5, -1.0], [0.5, 0.0], [-1.0, 2.5]],
                                                                  dtype=torch.float64), rtol=0, atol=1e-12)
    exact = torch.where(BATCH_MASK.bool(), _bernoulli_kl(BATCH_LP, BATCH_LQ), 0.0).sum(-1).mean()
    assert info["mean_exact_kl"] == pytest.approx(float(exact), abs=1e-12)
    # d loss / d z_{b,t,v} = -A_b m_{b,t} (1[v = y] - p_v) / B, with y = 0 and p_0 = exp(log pi(y))
    (grad,) = torch.autograd.grad(loss, pol)
    advantage = torch.tensor([0.75, -1.5, 0.75], dtype=torch.float64)
    g0 = -advantage[:, None] * BATCH_MASK * (1 - BATCH_LP.exp()) / 3
    torch.testing.assert_close(grad, torch.stack([g0, -g0], dim=-1), rtol=0, atol=1e-12)
    assert torch.autograd.grad(loss, ref, allow_unused=True) == (None,)  # the reference gets no gradient


@pytest.mark.parametrize(("n", "want"), [(1, 3.75), (2, 1.875)])
def test_the_baseline_of_one_and_of_two_sequences_by_hand(n, want):
    # n = 1: no baseline, loss = -(1.25 * -3) = 3.75; n = 2: baselines -0.25 and 1.25, advantages 1.5 and
    # -1.5, loss = -(1.5 * -3 + -1.5 * -0.5) / 2 = 1.875
    pol, _, loss, _ = _batch(n)
    assert loss.item() == pytest.approx(want, abs=1e-12)
    (grad,) = torch.autograd.grad(loss, pol)
    advantage = torch.tensor([1.25] if n == 1 else [1.5, -1.5], dtype=torch.float64)
    g0 = -advantage[:, None] * BATCH_MASK[:n] * (1 - BATCH_LP[:n].exp()) / n
    torch.testing.assert_close(grad, torch.stack([g0, -g0], dim=-1), rtol=0, atol=1e-12)


def test_the_logged_estimate_follows_the_estimator_and_the_loss_does_not():
    _, _, loss_k1, _ = _batch()
    for name in ("k3", "low_var_kl", "full"):
        _, _, loss, info = _batch(estimator=name)
        assert loss.item() == loss_k1.item()
        want = (compute_token_kl(BATCH_LP, BATCH_LQ, BATCH_MASK, name)[0] if name != "full" else
                exact_kl(_two_token_logits(BATCH_LP), _two_token_logits(BATCH_LQ), BATCH_MASK))
        torch.testing.assert_close(info["per_token_kl"], want, rtol=0, atol=1e-12)
        assert info["mean_kl"] == pytest.approx(float(want.sum(-1).mean()), abs=1e-12)
        assert info["objective"] == pytest.approx(1.0 - 0.5 * info["mean_kl"], abs=1e-12)


def test_the_loss_and_the_logged_objective_are_in_the_log_probs_dtype():
    # float64 rewards with float32 logits: the loss stays float32, and the logged objective is the float32
    # mean of r - beta KL, as the loss's score is
    pol = _two_token_logits(BATCH_LP).float()
    ref = _two_token_logits(BATCH_LQ).float()
    rewards = torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64)
    loss, info = compute_rlhf_objective(pol, ref, torch.zeros(3, 2, dtype=torch.long), rewards, BATCH_MASK,
                                        beta=0.3)
    assert loss.dtype == torch.float32
    kl = info["per_token_kl"].sum(-1)
    assert kl.dtype == torch.float32
    assert info["objective"] == (rewards.float() - 0.3 * kl).mean().item()


def test_last_valid_positions_for_right_left_and_no_padding():
    mask = torch.tensor([[True, True, False], [False, True, True], [True, True, True], [False, True, False]])
    assert last_valid_positions(mask).tolist() == [1, 2, 2, 1]
    with pytest.raises(ValueError, match=r"^response_mask has no valid token in sequence\(s\) \[0, 2\]; "):
        last_valid_positions(torch.tensor([[False], [True], [False]]), "response_mask")


# --- bad input: one table for the module --------------------------------------------------------------

B, T, V = 2, 3, 5
LOGITS = torch.zeros(B, T, V)
NAN_LOGITS = LOGITS.clone()
NAN_LOGITS[1, 0, 3] = math.nan
TOKENS = torch.zeros(B, T, dtype=torch.long)
KL = torch.full((B, T), 0.5)
MASK = torch.ones(B, T)
SCORES = torch.zeros(B)
SHAPE = dict(scores=SCORES, per_token_kl=KL, attention_mask=MASK, beta=0.1)
OBJ = dict(policy_logits=LOGITS, reference_logits=LOGITS, response_tokens=TOKENS, rewards=SCORES,
           attention_mask=MASK, beta=0.1)

BAD_INPUTS = [
    # (id, callable, kwargs, exception, message regex)
    ("sr-scores-shape", shape_rewards, {**SHAPE, "scores": SCORES[:1]}, ValueError,
     r"scores must have shape \(2,\), one score per sequence"),
    ("sr-scores-nan", shape_rewards, {**SHAPE, "scores": torch.tensor([0.0, math.nan])}, ValueError,
     "scores contains NaN"),
    ("sr-scores-int", shape_rewards, {**SHAPE, "scores": SCORES.long()}, TypeError, "scores must be a float"),
    ("sr-kl-rank", shape_rewards, {**SHAPE, "per_token_kl": KL[0]}, ValueError,
     "per_token_kl must have 2 dimensions"),
    ("sr-beta-negative", shape_rewards, {**SHAPE, "beta": -0.1}, ValueError,
     "beta must be a finite number >= 0"),
    ("sr-beta-inf", shape_rewards, {**SHAPE, "beta": math.inf}, ValueError, "beta must be a finite"),
    ("sr-beta-nan", shape_rewards, {**SHAPE, "beta": math.nan}, ValueError, "beta must be a finite"),
    ("sr-beta-str", shape_rewards, {**SHAPE, "beta": "0.1"}, TypeError, "beta must be a real number"),
    ("sr-beta-none", shape_rewards, {**SHAPE, "beta": None}, TypeError, "beta must be a real number"),
    ("sr-mask-shape", shape_rewards, {**SHAPE, "attention_mask": MASK[:, :1]}, ValueError,
     r"^attention_mask must have shape \(2, 3\), got \(2, 1\)$"),
    ("sr-empty-row", shape_rewards, {**SHAPE, "attention_mask": MASK * torch.tensor([[1.0], [0.0]])},
     ValueError, r"attention_mask has no valid token in sequence\(s\) \[1\]"),
    ("obj-logit-shapes", compute_rlhf_objective, {**OBJ, "reference_logits": torch.zeros(B, T, V + 1)},
     ValueError, "policy_logits and reference_logits must have the same shape"),
    ("obj-logits-rank", compute_rlhf_objective, {**OBJ, "policy_logits": LOGITS[0]}, ValueError,
     "^policy_logits must have 3 dimensions"),
    ("obj-ref-logits-rank", compute_rlhf_objective, {**OBJ, "reference_logits": LOGITS[0]}, ValueError,
     r"^reference_logits must have 3 dimensions \(B, T, V\), got shape \(3, 5\)$"),
    ("obj-logits-nan", compute_rlhf_objective, {**OBJ, "reference_logits": NAN_LOGITS}, ValueError,
     r"logits contains NaN \(at position b=1, t=0\)"),
    ("obj-tokens", compute_rlhf_objective, {**OBJ, "response_tokens": TOKENS[:, :1]}, ValueError,
     "response_tokens must have shape"),
    ("obj-tokens-range", compute_rlhf_objective, {**OBJ, "response_tokens": TOKENS + V}, ValueError,
     r"response_tokens must lie in \[0, 5\)"),
    ("obj-rewards-shape", compute_rlhf_objective, {**OBJ, "rewards": torch.zeros(B + 1)}, ValueError,
     "rewards must have shape"),
    ("obj-rewards-nan", compute_rlhf_objective, {**OBJ, "rewards": torch.tensor([0.0, math.nan])},
     ValueError, "rewards contains NaN"),
    ("obj-mask", compute_rlhf_objective, {**OBJ, "attention_mask": MASK * 3}, ValueError,
     r"^attention_mask must contain only 0 and 1 \(1 = valid token, 0 = padding\)$"),
    ("obj-beta", compute_rlhf_objective, {**OBJ, "beta": -1.0}, ValueError, "beta must be"),
    ("obj-beta-none", compute_rlhf_objective, {**OBJ, "beta": None}, TypeError, "beta must be a real"),
    ("obj-estimator", compute_rlhf_objective, {**OBJ, "estimator": "k4"}, ValueError,
     "estimator must be one of"),
]


@pytest.mark.parametrize(("call", "kwargs", "exc", "match"), [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_rejected_with_a_clear_message(call, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(**kwargs)
