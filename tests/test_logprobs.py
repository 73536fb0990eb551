"""Tests of kltutorial.logprobs: the lean (chunked) log-probs and exact KL against independent references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kltutorial.logprobs import (
    chunk_rows,
    exact_kl,
    exact_kl_unchecked,
    get_logprobs_for_tokens,
    logprobs_for_tokens_unchecked,
    naive_exact_kl,
    naive_logprobs_for_tokens,
)

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------------------------------
# Independent float64 references (NumPy, explicit max subtraction; no torch.log_softmax)


def ref_log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - (m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True)))


def ref_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> np.ndarray:
    """log_softmax(logits / temperature) at one id per position, (...), or K ids, (..., K)."""
    logp = ref_log_softmax(logits.double().numpy() / temperature)
    ids = tokens.numpy()
    single = ids.ndim == logp.ndim - 1
    out = np.take_along_axis(logp, ids[..., None] if single else ids, axis=-1)
    return out[..., 0] if single else out


def ref_kl(policy: torch.Tensor, reference: torch.Tensor, temperature: float = 1.0) -> np.ndarray:
    """sum_v p_v (log p_v - log q_v) with 0 log 0 = 0 and p_v > 0 = q_v giving +inf."""
    z, w = policy.double().numpy() / temperature, reference.double().numpy() / temperature
    logp, logq = ref_log_softmax(z), ref_log_softmax(w)
    possible = np.isfinite(z)
    with np.errstate(invalid="ignore", over="ignore"):
        terms = np.where(possible, np.exp(logp) * (logp - logq), 0.0)
    out = terms.sum(axis=-1)
    out[(possible & ~np.isfinite(w)).any(axis=-1)] = np.inf
    return out


def random_logits(shape, dtype=torch.float32, scale=3.0, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)


def random_tokens(shape, vocab, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1000)
    return torch.randint(0, vocab, shape, generator=g)


# ----------------------------------------------------------------------------------------------------
# Agreement with the references over shapes, chunk sizes and dtypes

SHAPES = [(1, 1, 1), (1, 1, 7), (2, 3, 5), (3, 17, 100), (2, 9, 4099)]
CHUNKS = [None, 1, 4, 7]
# (dtype, tolerance against the float64 reference of the *same* rounded inputs). Half-precision inputs
# are exact in float32, so the lean path (float32 per chunk) meets float32 tolerances for them too.
DTYPES = [
    (torch.float64, 1e-12),
    (torch.float32, 2e-5),
    (torch.bfloat16, 2e-5),
    (torch.float16, 2e-5),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_logprobs_match_float64_reference(shape, chunk_size, dtype, tol):
    logits = random_logits(shape, dtype, seed=sum(shape))
    tokens = random_tokens(shape[:2], shape[2], seed=sum(shape))
    out = get_logprobs_for_tokens(logits, tokens, chunk_size=chunk_size)
    assert out.shape == shape[:2]
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    np.testing.assert_allclose(out.double().numpy(), ref_logprobs(logits, tokens), rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_exact_kl_matches_float64_reference(shape, chunk_size, dtype, tol):
    z = random_logits(shape, dtype, seed=sum(shape))
    w = random_logits(shape, dtype, seed=sum(shape) + 1)
    out = exact_kl(z, w, chunk_size=chunk_size)
    assert out.shape == shape[:2]
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    np.testing.assert_allclose(out.double().numpy(), ref_kl(z, w), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,rtol,atol", [(torch.float64, 1e-12, 1e-12), (torch.float32, 1e-5, 1e-5),
                                             (torch.bfloat16, 2e-2, 0.1)])
def test_lean_equals_naive(dtype, rtol, atol):
    # the naive baselines compute in the input dtype, so bfloat16 gets a bfloat16-sized tolerance
    z = random_logits((3, 11, 1000), dtype, seed=3)
    w = random_logits((3, 11, 1000), dtype, seed=4)
    tokens = random_tokens((3, 11), 1000)
    np.testing.assert_allclose(
        get_logprobs_for_tokens(z, tokens, chunk_size=5).double().numpy(),
        naive_logprobs_for_tokens(z, tokens).double().numpy(), rtol=rtol, atol=atol,
    )
    np.testing.assert_allclose(
        exact_kl(z, w, chunk_size=5).double().numpy(),
        naive_exact_kl(z, w).double().numpy(), rtol=rtol, atol=atol,
    )


def test_mixed_dtypes_are_computed_in_the_wider_one():
    z = random_logits((2, 5, 30), torch.bfloat16)
    w = random_logits((2, 5, 30), torch.float64, seed=1)
    out = exact_kl(z, w, chunk_size=3)
    assert out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), ref_kl(z, w), rtol=1e-12, atol=1e-12)
    assert exact_kl(z, w.float()).dtype == torch.float32
    other_way = exact_kl(w, z, chunk_size=3)  # float64 policy, bfloat16 reference: float64 too
    assert other_way.dtype == torch.float64
    np.testing.assert_allclose(other_way.numpy(), ref_kl(w, z), rtol=1e-12, atol=1e-12)


def test_non_contiguous_logits_are_handled_without_flattening():
    # logits[:, :-1] (drop the last position, as RLHF code does) cannot be viewed as (B*T, V)
    z = random_logits((3, 8, 50))[:, :-1]
    w = random_logits((3, 8, 50), seed=1)[:, :-1]
    tokens = random_tokens((3, 7), 50)
    assert not z.is_contiguous()
    np.testing.assert_allclose(get_logprobs_for_tokens(z, tokens, chunk_size=3).numpy(),
                               ref_logprobs(z, tokens), atol=1e-5)
    np.testing.assert_allclose(exact_kl(z, w, chunk_size=3).numpy(), ref_kl(z, w), atol=1e-5)


def test_logprobs_are_normalised():
    # summing exp(log-prob) over every token id gives 1 at each position
    z = random_logits((2, 3, 6), torch.float64)
    total = sum(get_logprobs_for_tokens(z, torch.full((2, 3), v)).exp() for v in range(6))
    torch.testing.assert_close(total, torch.ones(2, 3, dtype=torch.float64))


def test_chunk_rows():
    # CHUNK_BYTES = 2 MiB of float32 work: 2**21 / (4 V) rows
    assert (chunk_rows(32_000), chunk_rows(128_256), chunk_rows(2**19), chunk_rows(10**9)) == (16, 4, 1, 1)
    assert chunk_rows(100, chunk_size=7) == 7
    with pytest.raises(ValueError, match="^chunk_size must be >= 1, got 0$"):
        chunk_rows(100, chunk_size=0)
    with pytest.raises(ValueError, match="^vocab_size must be >= 1, got 0$"):
        chunk_rows(0)


# ----------------------------------------------------------------------------------------------------
# Gradients


def test_gradcheck_logprobs_float64():
    z = random_logits((2, 3, 6), torch.float64).requires_grad_()
    tokens = random_tokens((2, 3), 6)
    assert torch.autograd.gradcheck(lambda a: get_logprobs_for_tokens(a, tokens, chunk_size=4), (z,))


def test_gradcheck_exact_kl_float64():
    z = random_logits((2, 3, 6), torch.float64).requires_grad_()
    w = random_logits((2, 3, 6), torch.float64, seed=1).requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert torch.autograd.gradcheck(lambda a, b: exact_kl(a, b, mask, chunk_size=4), (z, w))
    assert torch.autograd.gradcheck(lambda a, b: exact_kl(a, b, chunk_size=5), (z, w))


def _grads(fn, *inputs, weight):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    (fn(*inputs) * weight).sum().backward()
    return [x.grad for x in inputs]


def test_gradients_match_naive_autograd_float32():
    z, w = random_logits((3, 9, 300)), random_logits((3, 9, 300), seed=1)
    tokens = random_tokens((3, 9), 300)
    weight = random_logits((3, 9), seed=2)
    ours = _grads(lambda a: get_logprobs_for_tokens(a, tokens, chunk_size=4), z, weight=weight)
    naive = _grads(lambda a: naive_logprobs_for_tokens(a, tokens), z, weight=weight)
    torch.testing.assert_close(ours[0], naive[0], rtol=1e-5, atol=1e-6)
    ours = _grads(lambda a, b: exact_kl(a, b, chunk_size=4), z, w, weight=weight)
    naive = _grads(naive_exact_kl, z, w, weight=weight)
    for a, b in zip(ours, naive, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_gradients_of_non_contiguous_logits():
    base_z = random_logits((2, 6, 40), torch.float64).requires_grad_()
    base_w = random_logits((2, 6, 40), torch.float64, seed=1).requires_grad_()
    tokens = random_tokens((2, 5), 40)
    weight = random_logits((2, 5), torch.float64, seed=2)
    for fn, naive in [
        (lambda z, w: get_logprobs_for_tokens(z, tokens, chunk_size=2),
         lambda z, w: naive_logprobs_for_tokens(z, tokens) + 0 * w.sum()),
        (lambda z, w: exact_kl(z, w, chunk_size=2), naive_exact_kl),
    ]:
        ours = torch.autograd.grad((fn(base_z[:, :-1], base_w[:, :-1]) * weight).sum(), (base_z, base_w),
                                   allow_unused=True)
        ref = torch.autograd.grad((naive(base_z[:, :-1], base_w[:, :-1]) * weight).sum(), (base_z, base_w))
        for a, b in zip(ours, ref, strict=True):
            torch.testing.assert_close(torch.zeros_like(b) if a is None else a, b)


def test_bfloat16_gradients_have_input_dtype_and_match():
    z = random_logits((2, 5, 64), torch.bfloat16)
    tokens = random_tokens((2, 5), 64)
    (g,) = _grads(lambda a: get_logprobs_for_tokens(a, tokens, chunk_size=3), z, weight=1.0)
    (ref,) = _grads(lambda a: naive_logprobs_for_tokens(a, tokens), z.double(), weight=1.0)
    assert g.dtype == torch.bfloat16
    torch.testing.assert_close(g.double(), ref, rtol=2e-2, atol=4e-3)


def test_only_reference_gradient_when_policy_is_frozen():
    z = random_logits((2, 3, 7))
    w = random_logits((2, 3, 7), seed=1).requires_grad_()
    exact_kl(z, w).sum().backward()
    p, q = torch.softmax(z, -1), torch.softmax(w.detach(), -1)
    torch.testing.assert_close(w.grad, q - p)  # dKL/dw = q - p


# ----------------------------------------------------------------------------------------------------
# Impossible tokens (-inf logits), masking, extreme logits


def test_token_impossible_under_both_contributes_zero():
    z = torch.tensor([[[0.0, NEG_INF, 1.0, 2.0]]], requires_grad=True)
    w = torch.tensor([[[0.5, NEG_INF, 1.0, 1.0]]], requires_grad=True)
    kl = exact_kl(z, w)
    np.testing.assert_allclose(kl.detach().numpy(), ref_kl(z.detach(), w.detach()), rtol=1e-6)
    assert torch.isfinite(kl).all()
    assert torch.isnan(naive_exact_kl(z.detach(), w.detach())).all()  # what the textbook recipe gives
    kl.sum().backward()
    assert torch.isfinite(z.grad).all() and torch.isfinite(w.grad).all()
    assert z.grad[0, 0, 1] == 0 and w.grad[0, 0, 1] == 0


def test_token_possible_under_policy_only_gives_infinite_kl():
    z = torch.tensor([[[0.0, 1.0, 2.0], [0.0, 1.0, -50.0]]])
    w = torch.tensor([[[0.0, NEG_INF, 2.0], [0.0, 1.0, NEG_INF]]])
    assert torch.isposinf(exact_kl(z, w)).all()
    # the other way round (pi puts no mass where pi_ref does) the KL is finite
    kl = exact_kl(w, z)
    assert torch.isfinite(kl).all()
    np.testing.assert_allclose(kl.numpy(), ref_kl(w, z), rtol=1e-6)


def test_infinite_kl_even_when_policy_probability_underflows():
    # p = exp(-2e4) is 0.0 in float32 yet positive: pi still puts mass where pi_ref puts none
    z = torch.tensor([[[1e4, -1e4]]])
    w = torch.tensor([[[0.0, NEG_INF]]])
    assert torch.isposinf(exact_kl(z, w)).all()


def test_log_prob_of_impossible_token_is_minus_inf():
    z = torch.tensor([[[0.0, NEG_INF, 0.0]]])
    out = get_logprobs_for_tokens(z, torch.tensor([[1]]))
    assert torch.isneginf(out).all()
    torch.testing.assert_close(get_logprobs_for_tokens(z, torch.tensor([[2]])),
                               torch.tensor([[-np.log(2.0)]], dtype=torch.float32))


def test_masked_positions_are_exactly_zero_with_zero_gradient():
    z = random_logits((2, 4, 9)).requires_grad_()
    w = random_logits((2, 4, 9), seed=1)
    w[0, 1, 3] = NEG_INF  # an infinite KL at a padded position must not leak NaN into the gradient
    mask = torch.tensor([[1, 0, 1, 0], [0, 1, 1, 1]])
    kl = exact_kl(z, w, mask, chunk_size=3)
    assert (kl[mask == 0] == 0).all()
    assert (kl[mask == 1] > 0).all()
    kl.sum().backward()
    assert (z.grad[mask == 0] == 0).all()
    assert torch.isfinite(z.grad).all()
    torch.testing.assert_close(kl, naive_exact_kl(z.detach(), w, mask))


@pytest.mark.parametrize("scale", [1e4, -1e4])
def test_extreme_finite_logits(scale):
    g = torch.Generator().manual_seed(5)
    z = scale * torch.randn(2, 3, 50, generator=g)
    w = scale * torch.randn(2, 3, 50, generator=g)
    tokens = random_tokens((2, 3), 50)
    lp = get_logprobs_for_tokens(z, tokens)
    kl = exact_kl(z, w)
    assert torch.isfinite(kl).all()
    assert torch.isfinite(lp).all() and (lp <= 0).all()
    # float32 logits of size 1e4 carry a rounding error of about 1e-3 per entry
    np.testing.assert_allclose(lp.numpy(), ref_logprobs(z, tokens), rtol=1e-6, atol=1e-2)
    np.testing.assert_allclose(kl.numpy(), ref_kl(z, w), rtol=1e-6, atol=1e-2)


# ----------------------------------------------------------------------------------------------------
# Properties (hypothesis)

_logits = hnp.arrays(
    np.float64,
    st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 12)),
    elements=st.floats(-30, 30, allow_nan=False, allow_infinity=False),
)


@settings(max_examples=40, deadline=None)
@given(z=_logits, seed=st.integers(0, 2**16), chunk=st.integers(1, 6))
def test_kl_is_nonnegative_and_zero_for_identical_logits(z, seed, chunk):
    z = torch.from_numpy(z)
    w = z + torch.randn(z.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    assert (exact_kl(z, w, chunk_size=chunk) >= 0).all()
    assert (exact_kl(z, z, chunk_size=chunk) == 0).all()
    assert (exact_kl(z.float(), z.float(), chunk_size=chunk) == 0).all()


@settings(max_examples=40, deadline=None)
@given(z=_logits, seed=st.integers(0, 2**16))
def test_masked_positions_never_change_a_result(z, seed):
    z = torch.from_numpy(z)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(z.shape, generator=g, dtype=torch.float64)
    mask = torch.randint(0, 2, z.shape[:2], generator=g)
    w2 = torch.where(mask[..., None].bool(), w, 50 * torch.randn(z.shape, generator=g, dtype=torch.float64))
    a, b = exact_kl(z, w, mask, chunk_size=2), exact_kl(z, w2, mask, chunk_size=2)
    assert torch.equal(a, b)
    assert (a[mask == 0] == 0).all()


@settings(max_examples=40, deadline=None)
@given(z=_logits, seed=st.integers(0, 2**16))
def test_results_do_not_depend_on_batch_order(z, seed):
    z = torch.from_numpy(z)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(z.shape, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, z.shape[-1], z.shape[:2], generator=g)
    perm = torch.randperm(z.shape[0], generator=g)
    torch.testing.assert_close(exact_kl(z[perm], w[perm], chunk_size=3), exact_kl(z, w, chunk_size=3)[perm])
    torch.testing.assert_close(get_logprobs_for_tokens(z[perm], tokens[perm], chunk_size=3),
                               get_logprobs_for_tokens(z, tokens, chunk_size=3)[perm])


# ----------------------------------------------------------------------------------------------------
# Any leading shape, K ids per position, temperature

LEADING = [(7,), (3, 4), (2, 3, 4), (2, 2, 3, 2)]  # (N,), (B, T), (A, B, T), (A, B, C, T)


@pytest.mark.parametrize("lead", LEADING)
@pytest.mark.parametrize("k", [None, 1, 3])
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_logprobs_of_any_leading_shape_and_k_ids(lead, k, dtype, tol):
    V = 37
    logits = random_logits((*lead, V), dtype, seed=len(lead))
    tokens = random_tokens(lead if k is None else (*lead, k), V, seed=len(lead))
    out = get_logprobs_for_tokens(logits, tokens, chunk_size=5)
    assert out.shape == tokens.shape
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    np.testing.assert_allclose(out.double().numpy(), ref_logprobs(logits, tokens), rtol=tol, atol=tol)
    naive = naive_logprobs_for_tokens(logits.double(), tokens)
    assert naive.shape == tokens.shape


def test_logits_of_one_position_and_k_ids_from_it():
    z = random_logits((11,), torch.float64)
    np.testing.assert_allclose(get_logprobs_for_tokens(z, torch.tensor(4)).numpy(),
                               ref_log_softmax(z.numpy())[4], rtol=1e-13)
    ids = torch.tensor([4, 0, 4, 10])  # (K,) with a repeated id
    np.testing.assert_allclose(get_logprobs_for_tokens(z, ids).numpy(), ref_log_softmax(z.numpy())[ids],
                               rtol=1e-13)


def test_k_ids_equal_k_single_id_calls():
    z = random_logits((2, 5, 50), torch.float64, seed=8)
    ids = random_tokens((2, 5, 4), 50, seed=8)
    together = get_logprobs_for_tokens(z, ids, chunk_size=3)
    for j in range(4):
        assert torch.equal(together[..., j], get_logprobs_for_tokens(z, ids[..., j], chunk_size=3))


def test_non_contiguous_logits_of_four_dimensions():
    base = random_logits((2, 3, 6, 40), torch.float64).requires_grad_()
    z = base[:, :, :-1]  # (2, 3, 5, 40): its leading dimensions cannot be merged without a copy
    w = random_logits((2, 3, 6, 40), torch.float64, seed=1)[:, :, 1:]
    tokens = random_tokens((2, 3, 5, 2), 40)
    with pytest.raises(RuntimeError):
        z.view(-1, 40)
    np.testing.assert_allclose(get_logprobs_for_tokens(z, tokens, chunk_size=3).detach().numpy(),
                               ref_logprobs(z.detach(), tokens), rtol=1e-12)
    np.testing.assert_allclose(exact_kl(z, w, chunk_size=4).detach().numpy(), ref_kl(z.detach(), w),
                               rtol=1e-12, atol=1e-14)
    weight = random_logits((2, 3, 5, 2), torch.float64, seed=3)
    ours = torch.autograd.grad((get_logprobs_for_tokens(z, tokens, chunk_size=3) * weight).sum(), base)
    z_ref = base.detach().clone().requires_grad_()
    naive = naive_logprobs_for_tokens(z_ref[:, :, :-1], tokens)
    (ref,) = torch.autograd.grad((naive * weight).sum(), z_ref)
    torch.testing.assert_close(ours[0], ref)


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 2.0, 2.5])
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_temperature_divides_the_logits(temperature, dtype, tol):
    # against log_softmax(z / tau) of the same (rounded) logits in float64
    z = random_logits((3, 7, 300), dtype, seed=11)
    w = random_logits((3, 7, 300), dtype, seed=12)
    tokens = random_tokens((3, 7), 300)
    lp = get_logprobs_for_tokens(z, tokens, temperature=temperature, chunk_size=4)
    np.testing.assert_allclose(lp.double().numpy(), ref_logprobs(z, tokens, temperature), rtol=tol, atol=tol)
    kl = exact_kl(z, w, temperature=temperature, chunk_size=4)
    np.testing.assert_allclose(kl.double().numpy(), ref_kl(z, w, temperature), rtol=tol, atol=tol)
    if dtype == torch.float64:  # the baselines, in the logits' own dtype
        np.testing.assert_allclose(naive_logprobs_for_tokens(z, tokens, temperature=temperature).numpy(),
                                   ref_logprobs(z, tokens, temperature), rtol=tol, atol=tol)
        np.testing.assert_allclose(naive_exact_kl(z, w, temperature=temperature).numpy(),
                                   ref_kl(z, w, temperature), rtol=tol, atol=tol)


def test_temperature_is_the_float32_division_of_the_libraries():
    # for float32 logits the chunk is z / tau in float32, as `logits / temperature` is: same bits after it
    z = random_logits((2, 9, 500), seed=13)
    tokens = random_tokens((2, 9), 500)
    ours = get_logprobs_for_tokens(z, tokens, temperature=0.6, chunk_size=4)
    theirs = get_logprobs_for_tokens(z / 0.6, tokens, chunk_size=4)
    assert torch.equal(ours, theirs)
    default = get_logprobs_for_tokens(z, tokens)
    assert torch.equal(get_logprobs_for_tokens(z, tokens, temperature=1.0), default)


def test_temperature_leaves_the_logits_untouched():
    # OpenRLHF's log_probs_from_logits divides the caller's logits in place; here they are only read
    z = random_logits((2, 3, 20))
    before = z.clone()
    get_logprobs_for_tokens(z, random_tokens((2, 3), 20), temperature=0.5)
    exact_kl(z, z.flip(-1), temperature=0.5)
    assert torch.equal(z, before)


def _naive64_grads(fn, *inputs, weight):
    """Gradients of the naive recipe, by autograd in float64, w.r.t. each input."""
    return _grads(fn, *[x.double() for x in inputs], weight=weight.double())


@pytest.mark.parametrize("k", [None, 4])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("dtype,rtol,atol", [(torch.float64, 1e-12, 1e-14), (torch.float32, 1e-5, 1e-7),
                                             (torch.bfloat16, 1e-2, 2e-3)])
def test_gradients_with_k_ids_and_temperature_match_naive_float64_autograd(k, temperature, dtype, rtol, atol):
    z = random_logits((3, 5, 60), dtype, seed=14)
    tokens = random_tokens((3, 5) if k is None else (3, 5, k), 60, seed=14)
    if k is not None:
        tokens[..., 1] = tokens[..., 0]  # a repeated id: its gradient counts twice
    weight = random_logits(tokens.shape, torch.float64, seed=15)
    (ours,) = _grads(lambda a: get_logprobs_for_tokens(a, tokens, temperature=temperature, chunk_size=4),
                     z, weight=weight.to(dtype if dtype == torch.float64 else torch.float32))
    (ref,) = _naive64_grads(lambda a: naive_logprobs_for_tokens(a, tokens, temperature=temperature),
                            z, weight=weight)
    assert ours.dtype == dtype
    torch.testing.assert_close(ours.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
@pytest.mark.parametrize("dtype,rtol,atol", [(torch.float64, 1e-10, 1e-13), (torch.float32, 1e-4, 2e-5)])
def test_exact_kl_gradients_with_temperature_match_naive_float64_autograd(temperature, dtype, rtol, atol):
    # float32: log p - log q - KL cancels terms of size ~20 here, so its absolute error is ~20 * 2**-23
    z, w = random_logits((2, 4, 3, 30), dtype, seed=16), random_logits((2, 4, 3, 30), dtype, seed=17)
    mask = torch.randint(0, 2, (2, 4, 3), generator=torch.Generator().manual_seed(0))
    weight = random_logits((2, 4, 3), torch.float64, seed=18)
    ours = _grads(lambda a, b: exact_kl(a, b, mask, temperature=temperature, chunk_size=5), z, w,
                  weight=weight.to(dtype))
    ref = _naive64_grads(lambda a, b: naive_exact_kl(a, b, mask, temperature=temperature), z, w,
                         weight=weight)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=rtol, atol=atol)


def test_gradcheck_with_k_ids_and_temperature():
    z = random_logits((2, 3, 6), torch.float64).requires_grad_()
    w = random_logits((2, 3, 6), torch.float64, seed=1).requires_grad_()
    ids = torch.tensor([[[0, 5], [2, 2], [1, 3]], [[4, 0], [5, 5], [3, 1]]])
    assert torch.autograd.gradcheck(
        lambda a: get_logprobs_for_tokens(a, ids, temperature=0.7, chunk_size=4), (z,))
    assert torch.autograd.gradcheck(lambda a: get_logprobs_for_tokens(a[0, 0], ids[0, 0], temperature=1.9),
                                    (z,))
    assert torch.autograd.gradcheck(lambda a, b: exact_kl(a, b, temperature=0.7, chunk_size=4), (z, w))


def test_exact_kl_of_any_leading_shape_with_mask():
    z, w = random_logits((6, 25), torch.float64), random_logits((6, 25), torch.float64, seed=1)
    mask = torch.tensor([1, 0, 1, 1, 0, 1])
    kl = exact_kl(z, w, mask, chunk_size=4)
    assert kl.shape == (6,)
    expected = np.where(mask.numpy() == 1, ref_kl(z, w), 0.0)
    np.testing.assert_allclose(kl.numpy(), expected, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(kl, naive_exact_kl(z, w, mask))
    assert exact_kl(z[0], w[0]).shape == ()


def _largest_allocation(fn) -> int:
    """Bytes of the largest single CPU allocation any operator makes while ``fn`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events()), default=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_never_allocates_a_tensor_the_size_of_the_logits(dtype):
    # (the naive recipe allocates at least one; the lean forward, temperature and K ids included, keeps to
    # its chunk buffers and its (N, K) output)
    z = random_logits((8, 128, 4000), dtype)
    w = random_logits((8, 128, 4000), dtype, seed=1)
    ids = random_tokens((8, 128, 3), 4000)
    limit = z.numel() * 4 // 4  # a quarter of the logits in float32 (exact KL's 4 buffers are 1 MiB here)
    assert _largest_allocation(lambda: naive_logprobs_for_tokens(z, ids, temperature=0.7)) >= limit
    assert _largest_allocation(lambda: get_logprobs_for_tokens(z, ids, temperature=0.7)) < limit
    assert _largest_allocation(lambda: exact_kl(z, w, temperature=0.7, chunk_size=16)) < limit


def test_positions_are_named_for_any_leading_shape():
    z = random_logits((2, 3, 4, 5))
    z[1, 0, 2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"logits contains NaN \(at position \[1, 0, 2\]\)"):
        get_logprobs_for_tokens(z, random_tokens((2, 3, 4), 5))
    w = random_logits((6, 5))
    w[4] = NEG_INF
    with pytest.raises(ValueError, match=r"reference_logits is -inf for every token at position \(\[4\]\)"):
        exact_kl(random_logits((6, 5)), w)


def test_temperature_that_overflows_the_logits_raises():
    z = torch.tensor([[3e38, 0.0, 1.0]])
    with pytest.raises(ValueError, match=r"^logits / temperature overflows at position \[0\] "
                                         r"\(temperature=0.5\); use a larger temperature or smaller logits$"):
        get_logprobs_for_tokens(z, torch.tensor([1]), temperature=0.5)
    zeros = torch.zeros(1, 3)
    for args, name in (((z, zeros), "policy_logits"), ((zeros, z), "reference_logits")):
        with pytest.raises(ValueError, match=rf"^{name} / temperature overflows at position \[0\] "
                                             r"\(temperature=0.25\)"):
            exact_kl(*args, temperature=0.25)
    assert torch.isfinite(get_logprobs_for_tokens(z.double(), torch.tensor([1]), temperature=0.5)).all()


# ----------------------------------------------------------------------------------------------------
# One chunk holding every kind of row; the unchecked entry points; one call and no allocation per chunk


def test_nan_and_infinite_rows_in_one_chunk():
    # one chunk: a plain row; two rows with a token impossible under both models, where the fast product
    # p (log p - log q) is 0 * NaN and the KL finite; a row whose token 1 is possible under pi with a
    # probability that underflows to 0 while pi_ref rules it out, where the product is 0 * inf = NaN and
    # the KL +inf; and one where the product is inf itself
    z = torch.tensor([[0.0, 1.0, 2.0], [0.0, NEG_INF, 1.0], [1e4, -1e4, 0.0], [1.0, NEG_INF, 0.0],
                      [0.0, 1.0, 2.0]], dtype=torch.float64)
    w = torch.tensor([[1.0, 0.0, 0.0], [0.5, NEG_INF, 0.0], [0.0, NEG_INF, 0.0], [0.0, NEG_INF, 2.0],
                      [0.0, NEG_INF, 2.0]], dtype=torch.float64)
    kl = exact_kl(z, w)  # (N,) = (5,), one chunk
    assert torch.isposinf(kl[[2, 4]]).all() and torch.isfinite(kl[[0, 1, 3]]).all()
    np.testing.assert_allclose(kl.numpy(), ref_kl(z, w), rtol=1e-14)
    # p = (1/(1+e), e/(1+e)) on the possible tokens, q likewise from 0.5 and 0: KL by hand for row 1
    p, q = torch.softmax(torch.tensor([0.0, 1.0], dtype=torch.float64), 0), torch.softmax(
        torch.tensor([0.5, 0.0], dtype=torch.float64), 0)
    assert kl[1].item() == pytest.approx(float((p * (p.log() - q.log())).sum()), rel=1e-14)
    assert torch.equal(exact_kl(z, w, chunk_size=1), kl)  # the same, one row per chunk


def test_the_unchecked_entry_points_equal_the_checked_ones():
    z = random_logits((3, 5, 40), torch.float64, seed=21).requires_grad_()
    w = random_logits((3, 5, 40), torch.float64, seed=22)
    tokens = random_tokens((3, 5), 40, seed=21)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]]).bool()
    for chunk in (None, 2):
        lp = logprobs_for_tokens_unchecked(z, tokens, chunk)
        want = get_logprobs_for_tokens(z, tokens, chunk_size=chunk)
        assert lp.shape == (3, 5) and torch.equal(lp, want)
        assert torch.equal(torch.autograd.grad(lp.sum(), z)[0], torch.autograd.grad(want.sum(), z)[0])
        assert torch.equal(exact_kl_unchecked(z, w, mask, chunk), exact_kl(z, w, mask, chunk_size=chunk))
    assert torch.equal(exact_kl_unchecked(z, w, None), exact_kl(z, w))  # temperature 1 by default
    assert torch.equal(exact_kl_unchecked(z, w, None, temperature=0.5), exact_kl(z, w, temperature=0.5))


def _calls_and_bytes(fn) -> tuple[dict[str, int], int]:
    """How many times each operator ran while ``fn`` ran, and the bytes all its allocations took."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    calls: dict[str, int] = {}
    for e in prof.events():
        calls[e.name] = calls.get(e.name, 0) + 1
    return calls, sum(e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_library_call_and_no_allocation_per_chunk(temperature, dtype):
    # 60 positions of V = 400 in chunks of 7 rows: 9 chunks, each one log_softmax call (two for exact KL:
    # log p and log q) written into the reused buffers; one row per chunk allocates no more in total than
    # the buffers, the output and a few bytes of bookkeeping per chunk, far less than a row per chunk
    z, w = random_logits((6, 10, 400), dtype, seed=23), random_logits((6, 10, 400), dtype, seed=24)
    tokens = random_tokens((6, 10), 400, seed=23)
    row = 400 * 4  # bytes of one float32 row
    calls, _ = _calls_and_bytes(lambda: get_logprobs_for_tokens(z, tokens, temperature=temperature,
                                                                chunk_size=7))
    assert calls["aten::log_softmax"] == 9 and calls["aten::gather"] == 9
    calls, _ = _calls_and_bytes(lambda: exact_kl(z, w, temperature=temperature, chunk_size=7))
    assert calls["aten::log_softmax"] == 18 and calls["aten::softmax"] == 9 and calls["aten::sum"] == 9
    _, allocated = _calls_and_bytes(lambda: get_logprobs_for_tokens(z, tokens, temperature=temperature,
                                                                    chunk_size=1))
    assert allocated < 8 * row  # one buffer row and the (60,) output, not 60 rows
    _, allocated = _calls_and_bytes(lambda: exact_kl(z, w, temperature=temperature, chunk_size=1))
    assert allocated < 12 * row  # four buffer rows, the output and the probes, not 60 rows
    # a view that cannot be flattened is walked one sequence at a time: 6 sequences of 2 chunks
    calls, _ = _calls_and_bytes(lambda: exact_kl(z[:, :-1], w[:, :-1], chunk_size=7))
    assert calls["aten::log_softmax"] == 2 * 12
    calls, _ = _calls_and_bytes(lambda: logprobs_for_tokens_unchecked(z, tokens, 7))
    assert calls["aten::log_softmax"] == 9


def test_the_default_chunk_is_chunk_bytes_of_float32_rows():
    # V = 2**17: 2 MiB / (4 V) = 4 positions per chunk, so the (2, 4) positions take two chunks
    z = torch.zeros(2, 4, 2**17)
    tokens = torch.zeros(2, 4, dtype=torch.long)
    for fn in (lambda: get_logprobs_for_tokens(z, tokens), lambda: logprobs_for_tokens_unchecked(z, tokens),
               lambda: exact_kl(z, z)):
        calls, _ = _calls_and_bytes(fn)
        assert calls["aten::softmax" if "aten::softmax" in calls else "aten::log_softmax"] == 2


def test_a_float32_chunk_at_temperature_one_is_read_where_it_lies():
    # no division at temperature 1; a half-precision chunk is copied to float32 once per model and chunk,
    # a float32 one not at all (the other copies, the probes of bad rows, are the same for both)
    tokens = random_tokens((6, 10), 400, seed=25)
    copies = {}
    for dtype in (torch.float32, torch.bfloat16):
        z, w = random_logits((6, 10, 400), dtype, seed=25), random_logits((6, 10, 400), dtype, seed=26)
        lp, _ = _calls_and_bytes(lambda z=z: get_logprobs_for_tokens(z, tokens, chunk_size=7))
        kl, _ = _calls_and_bytes(lambda z=z, w=w: exact_kl(z, w, chunk_size=7))
        for calls in (lp, kl):
            assert "aten::div" not in calls and "aten::div_" not in calls
        copies[dtype] = lp.get("aten::copy_", 0), kl.get("aten::copy_", 0)
    assert copies[torch.float32][0] == 0
    assert copies[torch.bfloat16][0] - copies[torch.float32][0] == 9  # 9 chunks
    assert copies[torch.bfloat16][1] - copies[torch.float32][1] == 2 * 9
    # and at another temperature a float32 chunk is divided as `logits / temperature` is: the same bits
    z, w = random_logits((3, 9, 500), seed=27), random_logits((3, 9, 500), seed=28)
    scaled = exact_kl(z / 0.6, w / 0.6, chunk_size=4)
    assert torch.equal(exact_kl(z, w, temperature=0.6, chunk_size=4), scaled)


# ----------------------------------------------------------------------------------------------------
# Bad input: every case raises the right error and names the argument

L = random_logits((2, 3, 5))
TOK = random_tokens((2, 3), 5)
MASK = torch.ones(2, 3, dtype=torch.long)
MASK_PAD_01 = torch.tensor([[1, 0, 1], [1, 1, 1]])  # position (0, 1), where _with writes, is padding
_lp, _kl = get_logprobs_for_tokens, exact_kl  # short names for the table


def _with(value, index=(0, 1, 2)):
    x = L.clone()
    x[index] = value
    return x


BAD_INPUTS = [
    # get_logprobs_for_tokens
    ("lp-logits-not-tensor", lambda: _lp(L.numpy(), TOK), TypeError,
     "^logits must be a torch.Tensor, got ndarray$"),
    ("lp-logits-int", lambda: _lp(L.long(), TOK), TypeError, "logits"),
    ("lp-logits-0d", lambda: _lp(torch.tensor(1.0), TOK), ValueError, "logits must have at least 1"),
    ("lp-tokens-rank-4-logits", lambda: _lp(L[None], TOK), ValueError, r"tokens must have shape \(1, 2, 3\)"),
    ("lp-tokens-k-lead", lambda: _lp(L, TOK[:1, :, None]), ValueError, r"\(2, 3, K\)"),
    ("lp-tokens-k-zero", lambda: _lp(L, TOK[..., None][..., :0]), ValueError, "K >= 1"),
    ("lp-tokens-k-too-high", lambda: _lp(L, torch.stack([TOK, TOK + 5], -1)), ValueError, "tokens must lie"),
    ("lp-temperature-zero", lambda: _lp(L, TOK, temperature=0.0), ValueError, "temperature must be"),
    ("lp-temperature-negative", lambda: _lp(L, TOK, temperature=-1.0), ValueError, "temperature"),
    ("lp-temperature-nan", lambda: _lp(L, TOK, temperature=float("nan")), ValueError, "temperature"),
    ("lp-temperature-inf", lambda: _lp(L, TOK, temperature=float("inf")), ValueError, "temperature"),
    ("lp-temperature-str", lambda: _lp(L, TOK, temperature="1"), TypeError, "temperature"),
    ("lp-temperature-bool", lambda: _lp(L, TOK, temperature=True), TypeError, "temperature"),
    ("lp-temperature-positional", lambda: _lp(L, TOK, 0.5), TypeError, "positional"),
    ("lp-empty-batch", lambda: _lp(L[:0], TOK[:0]), ValueError, "empty"),
    ("lp-empty-vocab", lambda: _lp(L[..., :0], TOK), ValueError, "empty"),
    ("lp-nan", lambda: _lp(_with(float("nan")), TOK), ValueError, "logits contains NaN"),
    ("lp-posinf", lambda: _lp(_with(float("inf")), TOK), ValueError, r"logits contains \+inf"),
    ("lp-all-neginf", lambda: _lp(_with(NEG_INF, (1, 2)), TOK), ValueError, r"b=1, t=2"),
    ("lp-tokens-not-tensor", lambda: _lp(L, TOK.tolist()), TypeError, "tokens"),
    ("lp-tokens-float", lambda: _lp(L, TOK.float()), TypeError, "tokens"),
    ("lp-tokens-bool", lambda: _lp(L, TOK > 0), TypeError, "tokens"),
    ("lp-tokens-shape", lambda: _lp(L, TOK[:, :2]), ValueError, "tokens"),
    ("lp-tokens-too-high", lambda: _lp(L, TOK + 5), ValueError, "tokens"),
    ("lp-tokens-negative", lambda: _lp(L, TOK - 5), ValueError, "tokens"),
    ("lp-chunk-zero", lambda: _lp(L, TOK, chunk_size=0), ValueError, "chunk_size"),
    ("lp-chunk-float", lambda: _lp(L, TOK, chunk_size=2.0), TypeError, "chunk_size"),
    ("naive-lp-tokens", lambda: naive_logprobs_for_tokens(L, TOK + 5), ValueError,
     r"^tokens must lie in \[0, 5\)"),
    ("naive-lp-temperature", lambda: naive_logprobs_for_tokens(L, TOK, temperature=0), ValueError,
     "^temperature must be a finite number > 0, got 0"),
    ("naive-lp-logits", lambda: naive_logprobs_for_tokens(L.long(), TOK), TypeError,
     "^logits must be a floating-point tensor, got dtype torch.int64$"),
    # exact_kl
    ("kl-policy-not-tensor", lambda: _kl(L.numpy(), L), TypeError, "^policy_logits must be a torch.Tensor"),
    ("kl-reference-int", lambda: _kl(L, L.long()), TypeError, "^reference_logits must be a floating-point"),
    ("kl-0d", lambda: _kl(torch.tensor(1.0), torch.tensor(1.0)), ValueError, "policy_logits"),
    ("kl-rank-mismatch", lambda: _kl(L[0], L), ValueError, "reference_logits"),
    ("kl-temperature-zero", lambda: _kl(L, L, temperature=0), ValueError,
     "^temperature must be a finite number > 0, got 0"),
    ("kl-temperature-tensor", lambda: _kl(L, L, temperature=torch.ones(2)), TypeError, "temperature"),
    ("kl-mask-2d-logits", lambda: _kl(L[0], L[0], MASK), ValueError,
     r"attention_mask must have shape \(3,\)"),
    ("kl-shape-mismatch", lambda: _kl(L, L[:, :, :4]), ValueError,
     r"^policy_logits and reference_logits must have the same shape, got \(2, 3, 5\) and \(2, 3, 4\)$"),
    ("kl-shape-mismatch-T", lambda: _kl(L, L[:, :2]), ValueError, "reference_logits"),
    ("kl-empty", lambda: _kl(L[:0], L[:0]), ValueError, "empty"),
    ("kl-policy-nan", lambda: _kl(_with(float("nan")), L), ValueError, "policy_logits contains NaN"),
    ("kl-reference-nan", lambda: _kl(L, _with(float("nan"))), ValueError, "reference_logits contains NaN"),
    ("kl-nan-at-masked-position", lambda: _kl(L, _with(float("nan")), MASK_PAD_01), ValueError, "NaN"),
    ("kl-reference-posinf", lambda: _kl(L, _with(float("inf"))), ValueError, r"reference_logits .* \+inf"),
    ("kl-policy-all-neginf", lambda: _kl(_with(NEG_INF, (0, 0)), L), ValueError, "policy_logits is -inf"),
    ("kl-mask-not-tensor", lambda: _kl(L, L, MASK.tolist()), TypeError, "attention_mask"),
    ("kl-mask-shape", lambda: _kl(L, L, MASK[:, :2]), ValueError, "attention_mask"),
    ("kl-mask-values", lambda: _kl(L, L, MASK * 2), ValueError, "attention_mask"),
    ("kl-mask-fraction", lambda: _kl(L, L, MASK * 0.5), ValueError, "attention_mask"),
    ("kl-chunk-negative", lambda: _kl(L, L, chunk_size=-1), ValueError, "chunk_size"),
    ("naive-kl-shape", lambda: naive_exact_kl(L, L[:, :2]), ValueError,
     "^policy_logits and reference_logits must have the same shape"),
    ("naive-kl-policy", lambda: naive_exact_kl(L.long(), L), TypeError, "^policy_logits must be a floating"),
    ("naive-kl-reference", lambda: naive_exact_kl(L, L.long()), TypeError,
     "^reference_logits must be a floating"),
    ("naive-kl-temperature", lambda: naive_exact_kl(L, L, temperature=-1.0), ValueError,
     "^temperature must be a finite number > 0"),
    ("naive-kl-mask", lambda: naive_exact_kl(L, L, MASK[:, :2]), ValueError,
     r"^attention_mask must have shape \(2, 3\)"),
]


@pytest.mark.parametrize("call,error,match", [case[1:] for case in BAD_INPUTS],
                         ids=[case[0] for case in BAD_INPUTS])
def test_bad_input_raises(call, error, match):
    with pytest.raises(error, match=match):
        call()
