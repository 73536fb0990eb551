"""The estimators' importance-weighted straight-through gradient (``old_logprobs``, ``weight_clamp``): its
value, its gradient against the formula and, by enumeration, against the exact gradient of KL(π‖π_ref)
off-policy, half precision, ``compute_token_kl``, and its bad inputs. (OpenRLHF's ``unbiased_gradient``;
its own tests are ported in ``tests/compat/test_openrlhf_ported.py``.)"""

from __future__ import annotations

import math

import pytest
import torch

from kltutorial import compute_token_kl, kl_estimate


def _categorical_triple() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # π, π_ref and the earlier policy π_old that sampled the tokens
    p = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05], dtype=torch.float64)
    q = torch.tensor([0.22, 0.28, 0.18, 0.16, 0.06, 0.10], dtype=torch.float64)
    p_old = torch.tensor([0.10, 0.30, 0.25, 0.15, 0.12, 0.08], dtype=torch.float64)
    return p, q, p_old


@pytest.mark.parametrize("name", ["k1+", "k2+", "k3+", "abs+", "low_var_kl+"])
def test_old_logprobs_weight_the_gradient_and_leave_the_value(name):
    gen = torch.Generator().manual_seed(21)
    lp = (-4 * torch.rand(3, 7, generator=gen, dtype=torch.float64)).requires_grad_(True)
    lq = -4 * torch.rand(3, 7, generator=gen, dtype=torch.float64)
    old = lp.detach() + 0.8 * torch.randn(3, 7, generator=gen, dtype=torch.float64)
    value = kl_estimate(lp, lq, name, old_logprobs=old)
    assert torch.equal(value.detach(), kl_estimate(lp, lq, name).detach())
    (grad,) = torch.autograd.grad(value.sum(), lp)
    w = (lp - old).detach().exp()
    torch.testing.assert_close(grad, w * (lp - lq).detach())  # w Δ
    (clipped,) = torch.autograd.grad(kl_estimate(lp, lq, name, old_logprobs=old, weight_clamp=1.5).sum(), lp)
    torch.testing.assert_close(clipped, w.clamp(max=1.5) * (lp - lq).detach())
    assert (w > 1.5).any()
    # on-policy (old = current) the weight is 1: the plain straight-through gradient, k2's
    (on_policy,) = torch.autograd.grad(kl_estimate(lp, lq, name, old_logprobs=lp.detach()).sum(), lp)
    (plain,) = torch.autograd.grad(kl_estimate(lp, lq, name).sum(), lp)
    assert torch.equal(on_policy, plain)


def test_importance_weighted_gradient_is_the_kl_gradient_off_policy_by_enumeration():
    """E_{y~π_old}[w Δ ∇log π(y)] = ∇KL(π‖π_ref) exactly; without w it is not."""
    p, q, p_old = _categorical_triple()
    theta = p.log().clone().requires_grad_(True)  # logits of the policy being trained
    exact = (torch.softmax(theta, 0) * (torch.log_softmax(theta, 0) - q.log())).sum()
    (want,) = torch.autograd.grad(exact, theta)
    y = torch.arange(6)  # every token, weighted below by its probability under π_old
    got = {}
    for weighted in (True, False):
        lp = torch.log_softmax(theta, 0)[y]
        old = p_old.log()[y] if weighted else None
        kl = kl_estimate(lp, q.log()[y], "k3+", old_logprobs=old)
        (got[weighted],) = torch.autograd.grad((p_old * kl).sum(), theta)
    torch.testing.assert_close(got[True], want, rtol=1e-12, atol=1e-14)
    assert not torch.allclose(got[False], want, atol=1e-3)


def test_importance_weight_of_half_precision_is_computed_in_float32():
    lp = torch.tensor([-1.0, -2.0], dtype=torch.bfloat16, requires_grad=True)
    old = torch.tensor([-1.5, -2.25], dtype=torch.bfloat16)
    lq = torch.tensor([-1.25, -1.0], dtype=torch.bfloat16)
    out = kl_estimate(lp, lq, "k1+", old_logprobs=old)
    assert out.dtype == torch.float32
    (grad,) = torch.autograd.grad(out.sum(), lp)
    want = torch.exp(torch.tensor([0.5, 0.25])) * torch.tensor([0.25, -1.0])  # w Δ in float32
    torch.testing.assert_close(grad.float(), want.to(torch.bfloat16).float())


def test_compute_token_kl_takes_old_logprobs():
    gen = torch.Generator().manual_seed(22)
    lp = (-3 * torch.rand(2, 5, generator=gen, dtype=torch.float64)).requires_grad_(True)
    lq = -3 * torch.rand(2, 5, generator=gen, dtype=torch.float64)
    old = lp.detach() - 0.5
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    _, per_seq = compute_token_kl(lp, lq, mask, "k3+", "mean", old_logprobs=old, weight_clamp=10)
    torch.testing.assert_close(per_seq, compute_token_kl(lp, lq, mask, "k3+", "mean")[1])
    (grad,) = torch.autograd.grad(per_seq.sum(), lp)
    want = math.exp(0.5) * (lp - lq).detach() * mask / mask.sum(-1, keepdim=True)
    torch.testing.assert_close(grad, want)


def test_compute_token_kl_clamps_the_weight():
    # w = π/π_old = e^2, e^-1, 1, e^0.5 and Δ = 1, -1, 0.5, 2; weight_clamp = 2 clips the first and only it
    lp = torch.tensor([[-1.0, -2.0, -0.5, 0.0]], dtype=torch.float64)
    lq = lp - torch.tensor([[1.0, -1.0, 0.5, 2.0]], dtype=torch.float64)
    old = lp - torch.tensor([[2.0, -1.0, 0.0, 0.5]], dtype=torch.float64)
    w = torch.tensor([[2.0, math.exp(-1), 1.0, math.exp(0.5)]], dtype=torch.float64)
    for name in ("k1+", "k3+"):
        lp_grad = lp.clone().requires_grad_(True)
        per_token, per_seq = compute_token_kl(lp_grad, lq, None, name, old_logprobs=old, weight_clamp=2.0)
        torch.testing.assert_close(per_token, kl_estimate(lp, lq, name[:2]), rtol=0, atol=0)
        (grad,) = torch.autograd.grad(per_seq.sum(), lp_grad)
        torch.testing.assert_close(grad, w * (lp - lq), rtol=1e-14, atol=0)


LP = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, -1.2]])
PAIR = dict(policy_logprobs=LP, reference_logprobs=LP - 0.3)
Z = torch.zeros(2, 3, 5)

BAD_INPUTS = [
    # (id, callable, kwargs, exception, message regex)
    ("not-straight-through", kl_estimate, {**PAIR, "estimator": "k3", "old_logprobs": LP}, ValueError,
     r"^old_logprobs importance-weights the gradient of a straight-through estimator \('k1\+', 'k2\+', "
     r"'k3\+', 'abs\+'\), the only ones whose gradient is k2's whatever their value; got 'k3'$"),
    ("full", kl_estimate, {"policy_logits": Z, "reference_logits": Z, "estimator": "full",
                           "old_logprobs": LP}, ValueError, "straight-through"),
    ("shape", kl_estimate, {**PAIR, "estimator": "k3+", "old_logprobs": LP[:, :2]}, ValueError,
     "policy_logprobs and old_logprobs must have the same shape"),
    ("nan", kl_estimate, {**PAIR, "estimator": "k1+", "old_logprobs": LP.clone().fill_(math.nan)},
     ValueError, "old_logprobs contains NaN"),
    ("list", kl_estimate, {**PAIR, "estimator": "k1+", "old_logprobs": [-1.0]}, TypeError, "old_logprobs"),
    ("clamp-without-old", kl_estimate, {**PAIR, "estimator": "k3+", "weight_clamp": 10}, ValueError,
     "^weight_clamp bounds the importance weight, which needs old_logprobs$"),
    ("clamp-zero", kl_estimate, {**PAIR, "estimator": "k3+", "old_logprobs": LP, "weight_clamp": 0},
     ValueError, "weight_clamp must be a finite number > 0"),
    ("clamp-str", kl_estimate, {**PAIR, "estimator": "k3+", "old_logprobs": LP, "weight_clamp": "10"},
     TypeError, "weight_clamp must be a real number"),
    ("tok-shape", compute_token_kl, {**PAIR, "estimator": "k3+", "old_logprobs": LP[:1]}, ValueError,
     "old_logprobs"),
]


@pytest.mark.parametrize(("call", "kwargs", "exc", "match"), [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_rejected_with_a_clear_message(call, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(**kwargs)
