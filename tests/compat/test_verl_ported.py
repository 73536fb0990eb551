# Ported from volcengine/verl, now verl-project/verl (Apache License 2.0; Copyright 2024-2025 Bytedance Ltd.
# and/or its affiliates):
#   * tests/utils/test_torch_functional.py, test_masked_mean, at main commit 1dda039b9 (2026-08-22);
#   * tests/trainer/ppo/test_core_algos_on_cpu.py, test_kl_penalty_straight_through_value_matches_base and
#     test_kl_penalty_k3_plus_uses_k2_gradient (the "+" names' tests, added by verl PR #6058), same commit;
#   * tests/gpu_utility/test_torch_functional.py, test_logprobs_from_logits_v2, at tag v0.4.0 (commit
#     07584894; verl's only test of logprobs_from_logits_v2 against _naive, removed after v0.4.0).
# The test bodies are verl's. Changed: the imports (from kltutorial.compat.verl), and in
# test_logprobs_from_logits_v2 its device="cuda" (twice), now DEVICE: CUDA where there is one, else the CPU.
#
# Marked xfail (strict) in tests/compat/conftest.py:
#   * test_logprobs_from_logits_v2's float16/bfloat16 cases assert bit-equality of logprobs_from_logits_v2 with
#     logprobs_from_logits_naive, PyTorch's own half-precision log_softmax; ours is computed in float32 and
#     rounded once (test_v2_is_at_least_as_close_as_naive below: the closer to the float64 value);
#   * test_masked_mean's third case expects NaN from a NaN where the mask is 1; kltutorial raises ValueError.
#
# Left out, and why:
#   * test_distributed_mean_max_min_std, test_distributed_masked_mean and the rest of test_torch_functional.py:
#     NCCL process groups on several GPUs, and functions kltutorial does not provide;
#   * test_log_probs_from_logits_response_rmpad (v0.4.0): flash-attn's unpad_input and verl's
#     log_probs_from_logits_response*, not provided here;
#   * tests/utils/test_linear_cross_entropy.py (which calls logprobs_from_logits): verl's fused linear
#     cross-entropy kernels on CUDA;
#   * tests/models/* (logprobs_from_logits, masked_mean inside model forward passes): Hugging Face checkpoints;
#   * the rest of test_core_algos_on_cpu.py: advantage estimators, not ported to kltutorial;
#   * test_logprobs_from_logits_naive of pull request #3852 (refs/pull/3852/head, commit 6a6e52ce4, not merged):
#     it asserts float32 log-probs for every dtype, from the PR's naive, -cross_entropy(logits.float()); the
#     naive of released verl (v0.4.0 to v0.9.0, main 1dda039b9), log_softmax then gather, returns the logits'
#     dtype and fails its float64, float16 and bfloat16 cases, as kltutorial's (which is verl's) does.
#
# Added here, after verl's tests: the float64 comparison beside the xfailed bit-equality cases.

# ruff: noqa: E501

from __future__ import annotations

import pytest
import torch

from kltutorial.compat.verl import kl_penalty, masked_mean

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "value,mask,gt",
    [
        ([1.0, 2.0, 3.0, 4.0], [1, 0, 0, 1], 2.5),
        ([1.0, 2.0, float("nan"), 4.0], [1, 0, 0, 1], 2.5),
        ([1.0, 2.0, float("nan"), 4.0], [1, 0, 1, 0], float("nan")),
    ],
)
def test_masked_mean(value, mask, gt):
    res = masked_mean(torch.tensor(value), torch.tensor(mask))
    gt = torch.tensor(gt)
    assert torch.allclose(res, gt) or (torch.isnan(res) and torch.isnan(gt))


@pytest.mark.parametrize(
    "name,base",
    [
        ("k1+", "k1"),
        ("kl+", "kl"),
        ("abs+", "abs"),
        ("k3+", "k3"),
        ("low_var_kl+", "low_var_kl"),
    ],
)
def test_kl_penalty_straight_through_value_matches_base(name, base):
    """The ``+`` suffix is a straight-through trick that swaps in the k2
    gradient while keeping the base estimator's value. Therefore the forward
    value of e.g. ``k3+`` must match the value of plain ``k3``.

    Regression test for the bug where ``kl_penalty(..., "k3+")`` raised
    ``NotImplementedError`` because the wrapper forwarded the ``+`` suffix to
    ``kl_penalty_forward`` without stripping it.
    """
    torch.manual_seed(0)
    logprob = torch.randn(4, 8, requires_grad=True)
    ref_logprob = torch.randn(4, 8)

    plus_value = kl_penalty(logprob, ref_logprob, name)
    base_value = kl_penalty(logprob, ref_logprob, base)
    assert torch.allclose(plus_value, base_value)


def test_kl_penalty_k3_plus_uses_k2_gradient():
    """With ``k3+`` the gradient w.r.t. ``logprob`` should equal the gradient
    obtained from the ``k2`` (``0.5 * log_ratio**2``) estimator, since the
    straight-through trick routes the backward pass through ``k2``.
    """
    torch.manual_seed(0)
    logprob = torch.randn(4, 8, requires_grad=True)
    ref_logprob = torch.randn(4, 8)

    out_plus = kl_penalty(logprob, ref_logprob, "k3+").sum()
    (grad_plus,) = torch.autograd.grad(out_plus, logprob)

    logprob_k2 = logprob.detach().clone().requires_grad_(True)
    out_k2 = kl_penalty(logprob_k2, ref_logprob, "k2").sum()
    (grad_k2,) = torch.autograd.grad(out_k2, logprob_k2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_logprobs_from_logits_v2(dtype):
    from kltutorial.compat.verl import logprobs_from_logits_naive, logprobs_from_logits_v2

    vocab_size = 32000
    batch_size = 2
    seq_len = 512

    labels = torch.randint(low=0, high=vocab_size, size=(batch_size, seq_len), device=DEVICE)
    logits = torch.randn(batch_size, seq_len, vocab_size, device=DEVICE, dtype=dtype)

    expected_output = logprobs_from_logits_naive(labels=labels, logits=logits)
    actual_output = logprobs_from_logits_v2(labels=labels, logits=logits)

    if dtype in [torch.float16, torch.bfloat16]:  # float16 falls back to an exactly equivalent method
        assert torch.equal(actual_output, expected_output)
    else:  # small numerical difference when using gather / logsumexp approach
        torch.testing.assert_close(actual_output, expected_output, rtol=1e-5, atol=1e-5)


# --- added here (not verl's): the float64 comparison beside the xfailed half-precision cases -------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_v2_is_at_least_as_close_as_naive(dtype, rounded_once_and_closer):
    """logprobs_from_logits_v2 is float32's value rounded once to ``dtype``; _naive (PyTorch's
    half-precision log_softmax, which verl's test compares with bit for bit) is further off at its worst."""
    from kltutorial.compat.verl import logprobs_from_logits_naive, logprobs_from_logits_v2

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 64, 32000, generator=g, dtype=torch.float64).to(dtype)
    labels = torch.randint(0, 32000, (2, 64), generator=g)
    exact = logits.double().log_softmax(-1).gather(-1, labels[..., None])[..., 0]
    ours, naive = logprobs_from_logits_v2(logits, labels), logprobs_from_logits_naive(logits, labels)
    assert ours.dtype == naive.dtype == dtype
    assert rounded_once_and_closer(ours, naive, exact)
