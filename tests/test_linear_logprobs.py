"""Tests of kltutorial.logprobs.hidden: log-probs, entropy and exact KL from hidden states, tile by tile,
in one process and with the vocabulary split over two gloo processes."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kltutorial.logprobs import exact_kl, get_logprobs_for_tokens
from kltutorial.logprobs.hidden import (
    linear_exact_kl,
    linear_logprobs,
    naive_linear_exact_kl,
    naive_linear_logprobs,
    tile_shape,
)
from kltutorial.studies.diagnostics import spawn_ranks, split_vocabulary, write_rank_result

TILES = [None, 1, (1, 1), (5, 7), (8, 64), (64, 1000)]


def inputs(lead=(3, 11), H=16, V=97, dtype=torch.float64, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    hidden = (scale * torch.randn(*lead, H, generator=g, dtype=torch.float64)).to(dtype)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype)
    tokens = torch.randint(0, V, lead, generator=g)
    return hidden, weight, tokens


def ref_inputs(lead=(3, 11), H=9, V=97, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*lead, H, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype))


def grads(outputs, params, seed=7):
    """Gradients of sum_i <out_i, g_i> with fixed random g_i: every output's backward, weighted."""
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outputs)
    return torch.autograd.grad(loss, params)


def leaf(*xs):
    return [x.detach().clone().requires_grad_() for x in xs]


def max_err(a, b) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


# ----------------------------------------------------------------------------------------------------
# float64: the unfused recipe to 1e-10, values and gradients


@pytest.mark.parametrize("chunk_size", TILES)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("entropy", [False, True])
def test_logprobs_and_entropy_match_the_unfused_recipe_in_float64(chunk_size, temperature, entropy):
    hidden, weight, tokens = inputs()
    h1, w1 = leaf(hidden, weight)
    h2, w2 = leaf(hidden, weight)
    ours = linear_logprobs(h1, w1, tokens, temperature=temperature, return_entropy=entropy,
                           chunk_size=chunk_size)
    naive = naive_linear_logprobs(h2, w2, tokens, temperature=temperature, return_entropy=entropy)
    ours, naive = (ours, naive) if entropy else ((ours,), (naive,))
    for a, b in zip(ours, naive, strict=True):
        assert a.dtype == torch.float64 and a.shape == tokens.shape
        assert max_err(a, b) < 1e-10
    for a, b in zip(grads(ours, [h1, w1]), grads(naive, [h2, w2]), strict=True):
        assert max_err(a, b) < 1e-10


@pytest.mark.parametrize("chunk_size", TILES)
@pytest.mark.parametrize("temperature", [1.0, 1.7])
def test_exact_kl_matches_the_unfused_recipe_in_float64(chunk_size, temperature):
    hidden, weight, _ = inputs()
    ref_h, ref_w = ref_inputs()
    h1, w1 = leaf(hidden, weight)
    h2, w2 = leaf(hidden, weight)
    rh, rw = leaf(ref_h, ref_w)
    ours = linear_exact_kl(h1, w1, rh, rw, temperature=temperature, chunk_size=chunk_size)
    naive = naive_linear_exact_kl(h2, w2, ref_h, ref_w, temperature=temperature)
    assert ours.shape == hidden.shape[:-1] and bool((ours >= 0).all())
    assert max_err(ours, naive) < 1e-10
    # and the logits-based exact KL of the package
    logits_kl = exact_kl(hidden @ weight.T, ref_h @ ref_w.T, temperature=temperature)
    assert max_err(ours, logits_kl) < 1e-10
    for a, b in zip(grads([ours], [h1, w1]), grads([naive], [h2, w2]), strict=True):
        assert max_err(a, b) < 1e-10
    # the reference is held fixed: no gradient reaches it, even when it asks for one
    linear_exact_kl(h1, w1, rh, rw, temperature=temperature, chunk_size=chunk_size).sum().backward()
    assert h1.grad is not None and rh.grad is None and rw.grad is None


def test_identical_models_have_zero_kl_and_zero_gradient():
    hidden, weight, _ = inputs()
    h, w = leaf(hidden, weight)
    kl = linear_exact_kl(h, w, hidden, weight, chunk_size=(4, 10))
    assert float(kl.detach().abs().max()) < 1e-13
    gh, gw = torch.autograd.grad(kl.sum(), [h, w])
    assert float(gh.abs().max()) < 1e-12 and float(gw.abs().max()) < 1e-12


def test_gradcheck_small_float64():
    hidden, weight, tokens = inputs(lead=(2, 3), H=4, V=9)
    ref_h, ref_w = ref_inputs(lead=(2, 3), H=3, V=9)
    h, w = leaf(hidden, weight)

    def f(h, w):
        logp, ent = linear_logprobs(h, w, tokens, temperature=0.8, return_entropy=True, chunk_size=(2, 4))
        return logp, ent, linear_exact_kl(h, w, ref_h, ref_w, temperature=0.8, chunk_size=(4, 2))

    assert torch.autograd.gradcheck(f, (h, w))


def test_a_logits_view_of_the_same_numbers():
    """From hidden states or from their logits: the same log-probs (get_logprobs_for_tokens)."""
    hidden, weight, tokens = inputs(lead=(2, 5, 3))
    assert max_err(linear_logprobs(hidden, weight, tokens),
                   get_logprobs_for_tokens(hidden @ weight.T, tokens)) < 1e-12


def test_one_position_without_leading_dimensions():
    hidden, weight, tokens = inputs(lead=())
    out = linear_logprobs(hidden, weight, tokens)
    assert out.shape == () and max_err(out, naive_linear_logprobs(hidden, weight, tokens)) < 1e-12


# ----------------------------------------------------------------------------------------------------
# Half precision, large logits


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_more_accurate_than_the_unfused_recipe(dtype):
    hidden, weight, tokens = inputs(lead=(4, 64), H=64, V=3000, dtype=dtype, scale=0.4)
    ref_h, ref_w = ref_inputs(lead=(4, 64), H=64, V=3000, dtype=dtype)
    # the truth: float64 on the same (rounded) numbers
    t_logp, t_ent = naive_linear_logprobs(hidden.double(), weight.double(), tokens, return_entropy=True)
    t_kl = naive_linear_exact_kl(hidden.double(), weight.double(), ref_h.double(), ref_w.double())
    logp, ent = linear_logprobs(hidden, weight, tokens, return_entropy=True, chunk_size=(32, 512))
    kl = linear_exact_kl(hidden, weight, ref_h, ref_w, chunk_size=(32, 512))
    n_logp, n_ent = naive_linear_logprobs(hidden, weight, tokens, return_entropy=True)
    n_kl = naive_linear_exact_kl(hidden, weight, ref_h, ref_w)
    assert logp.dtype == ent.dtype == kl.dtype == torch.float32
    for ours, naive, truth in ((logp, n_logp, t_logp), (ent, n_ent, t_ent), (kl, n_kl, t_kl)):
        e_ours, e_naive = max_err(ours, truth), max_err(naive, truth)
        assert e_ours < 1e-4 and e_ours < e_naive / 10, (e_ours, e_naive)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_half_precision_gradients_have_the_input_dtype(dtype):
    hidden, weight, tokens = inputs(lead=(2, 7), H=8, V=50, dtype=dtype)
    h, w = leaf(hidden, weight)
    logp, ent = linear_logprobs(h, w, tokens, return_entropy=True, chunk_size=(3, 16))
    gh, gw = grads([logp, ent], [h, w])
    assert gh.dtype == gw.dtype == dtype
    h64, w64 = leaf(hidden.double(), weight.double())
    logp64, ent64 = naive_linear_logprobs(h64, w64, tokens, return_entropy=True)
    th, tw = grads([logp64, ent64], [h64, w64])
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert max_err(gh, th) < tol * float(th.abs().max()) and max_err(gw, tw) < tol * float(tw.abs().max())


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_logits_of_1e4_stay_finite_and_exact(sign):
    """hidden @ weight.T of +-1e4: no -inf, no NaN, the float64 values in float32 to rounding."""
    V, H = 300, 4
    weight = torch.zeros(V, H)
    weight[:, 0] = torch.linspace(-1.0, 1.0, V)
    weight[:, 1] = 1.0
    hidden = torch.tensor([[sign * 1e4, 0.0, 0.0, 0.0], [0.0, 1e4, 0.0, 0.0], [sign * 5e3, 0.0, 0.0, 0.0]])
    tokens = torch.tensor([0, 17, V - 1])
    # the reference: uniform where the policy is sure, sure where it is uniform, and sure of the other end
    ref_h = torch.tensor([[0.0, 1e4, 0.0, 0.0], [sign * 1e4, 0.0, 0.0, 0.0], [-sign * 5e3, 0.0, 0.0, 0.0]])
    h, w = leaf(hidden, weight)
    logp, ent = linear_logprobs(h, w, tokens, return_entropy=True, chunk_size=(2, 64))
    kl = linear_exact_kl(h, w, ref_h, weight, chunk_size=(2, 64))
    gh, gw = grads([logp, ent, kl], [h, w])
    t_logp, t_ent = naive_linear_logprobs(hidden.double(), weight.double(), tokens, return_entropy=True)
    t_kl = naive_linear_exact_kl(hidden.double(), weight.double(), ref_h.double(), weight.double())
    for x in (logp, ent, kl, gh, gw):
        assert bool(torch.isfinite(x).all())
    assert float(logp.detach().min()) <= -9e3  # a token 1e4 nats down, still finite
    assert max_err(logp, t_logp) <= 1e-7 * float(t_logp.abs().max())
    assert float(t_kl.min()) > 5.0 and float(t_kl.max()) > 9e3  # large KLs, and a moderate one
    assert max_err(ent, t_ent) < 1e-5 and max_err(kl, t_kl) <= 1e-6 * float(t_kl.abs().max())


# ----------------------------------------------------------------------------------------------------
# The (N, V) logits never exist


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_tensor_of_the_logits_size_exists_forward_or_backward():
    N, H, V = 512, 8, 4000  # logits: 2.0 M numbers; hidden 4 k; weight 32 k
    hidden, weight, tokens = inputs(lead=(N,), H=H, V=V, dtype=torch.float32)
    ref_h, ref_w = ref_inputs(lead=(N,), H=H, V=V, dtype=torch.float32)
    h, w = leaf(hidden, weight)
    with _LargestTensor() as ours:
        logp, ent = linear_logprobs(h, w, tokens, return_entropy=True, chunk_size=(64, 256))
        kl = linear_exact_kl(h, w, ref_h, ref_w, chunk_size=(64, 256))
        grads([logp, ent, kl], [h, w])
    with _LargestTensor() as naive:
        grads(naive_linear_logprobs(h, w, tokens, return_entropy=True), [h, w])
    assert naive.largest >= N * V  # the check sees the logits when they exist
    assert ours.largest <= max(3 * 64 * 256, V * H, N * H)  # three tiles' buffers, or a gradient


# ----------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda h, w, y: (h, w[:, :-1], y), ValueError, r"weight must have shape \(V, 16\)"),
        (lambda h, w, y: (h, w[None], y), ValueError, r"weight must have 2 dimensions"),
        (lambda h, w, y: (h, w.float(), y), TypeError, r"same dtype"),
        (lambda h, w, y: (h.long(), w, y), TypeError, r"hidden must be a floating-point"),
        (lambda h, w, y: (h.numpy(), w, y), TypeError, r"hidden must be a torch.Tensor"),
        (lambda h, w, y: (h, w, y[:, :-1]), ValueError, r"tokens must have shape \(3, 11\)"),
        (lambda h, w, y: (h, w, y.double()), TypeError, r"tokens must hold integer"),
        (lambda h, w, y: (h, w, y.clone().fill_(97)), ValueError,
         r"tokens must lie in \[0, 97\).*\[97, 97\]"),
        (lambda h, w, y: (h, w, y.clone().fill_(-1)), ValueError, r"tokens must lie in \[0, 97\)"),
        (lambda h, w, y: (h.clone().fill_(float("nan")), w, y), ValueError, r"hidden contains NaN"),
        (lambda h, w, y: (h, w.clone().fill_(float("inf")), y), ValueError, r"weight contains NaN or inf"),
    ],
)
def test_bad_input_names_the_argument(change, error, match):
    with pytest.raises(error, match=match):
        linear_logprobs(*change(*inputs()))


def test_bad_settings_name_the_argument():
    hidden, weight, tokens = inputs()
    with pytest.raises(ValueError, match="temperature"):
        linear_logprobs(hidden, weight, tokens, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_logprobs(hidden, weight, tokens, chunk_size=(4, 0))
    with pytest.raises(ValueError, match="chunk_size"):
        tile_shape((1, 2, 3))
    with pytest.raises(ValueError, match="vocab_size is 100, but weight hold V = 97"):
        linear_logprobs(hidden, weight, tokens, vocab_size=100)
    with pytest.raises(ValueError, match="overflows"):
        linear_logprobs(hidden * 1e200, weight * 1e200, tokens)
    ref_h, ref_w = ref_inputs()
    with pytest.raises(ValueError, match="ref_weight must have the V = 97 rows"):
        linear_exact_kl(hidden, weight, ref_h, ref_w[:-1])
    with pytest.raises(ValueError, match="ref_hidden must have the leading shape"):
        linear_exact_kl(hidden, weight, ref_h[:, :-1], ref_w)
    with pytest.raises(ValueError, match="ref_weight must have shape"):
        linear_exact_kl(hidden, weight, ref_h, ref_w[:, :-1])


# ----------------------------------------------------------------------------------------------------
# The vocabulary split over two gloo processes


SPLIT = [40, 57]  # rank 0 holds ids 0-39, rank 1 ids 40-96, in the bad-input cases


def _rank_main(rank: int, world: int, folder: str) -> None:
    """Every bad-input case on two ranks; records each rank's message (None: nothing raised)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(folder, 'init')}", rank=rank,
                            world_size=world)
    errors: dict[str, str | None] = {}
    try:
        hidden, weight, tokens = inputs()
        ref_h, ref_w = ref_inputs()
        lo, hi = sum(SPLIT[:rank]), sum(SPLIT[: rank + 1])
        group = dist.group.WORLD
        cases = {
            "vocab_size": lambda: linear_logprobs(hidden, weight[lo:hi], tokens, group=group, vocab_size=100),
            "token": lambda: linear_logprobs(hidden, weight[lo:hi], tokens.clone().fill_(97), group=group),
            "replicated": lambda: linear_logprobs(hidden + rank, weight[lo:hi], tokens, group=group),
            "rank_error": lambda: linear_logprobs(hidden, weight[lo:hi, :-1] if rank == 1 else weight[lo:hi],
                                                  tokens, group=group),
            "empty": lambda: linear_logprobs(hidden, weight[lo:hi] if rank == 0 else weight[:0], tokens,
                                             group=group),
            "ref_split": lambda: linear_exact_kl(hidden, weight[lo:hi], ref_h,
                                                 ref_w[lo:hi] if rank == 0 else ref_w[lo + 1:hi],
                                                 group=group),
            "works_after": lambda: linear_logprobs(hidden, weight[lo:hi], tokens, group=group),
        }
        for name, call in cases.items():
            try:
                call()
                errors[name] = None
            except ValueError as err:
                errors[name] = str(err)
        # the exchanges of one good forward call, as the module docstring counts them
        calls: list[str] = []
        originals = {f: getattr(dist, f) for f in ("all_gather_object", "all_gather", "all_reduce")}

        def counted(f):
            def call(*args, **kwargs):
                calls.append(f)
                return originals[f](*args, **kwargs)
            return call

        try:
            for f in originals:
                setattr(dist, f, counted(f))
            linear_logprobs(hidden, weight[lo:hi], tokens, group=group, return_entropy=True)
        finally:
            for f, original in originals.items():
                setattr(dist, f, original)
        errors["collectives"] = ",".join(calls)
        write_rank_result(folder, rank, errors)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks_errors() -> list[dict]:
    return spawn_ranks(_rank_main, 2, timeout=120)


def test_two_gloo_ranks_agree_with_one_process():
    """Each rank holds half the vocabulary (ids 0-47 and 48-96, tiles smaller than a slice): log-probs,
    entropy, KL and the hidden states' gradient equal one process's on every rank, and each rank's weight
    gradient is its slice of one process's."""
    hidden, weight, tokens = inputs()
    ref_h, ref_w = ref_inputs()
    ranks = split_vocabulary(hidden, weight, tokens, ref_h, ref_w, world_size=2, temperature=0.6,
                             chunk_size=(4, 16))
    h, w = leaf(hidden, weight)
    logp, ent = linear_logprobs(h, w, tokens, temperature=0.6, return_entropy=True)
    kl = linear_exact_kl(h, w, ref_h, ref_w, temperature=0.6)
    (logp + ent + kl).sum().backward()
    assert [r.vocab_slice for r in ranks] == [(0, 48), (48, 97)]
    for r in ranks:
        lo, hi = r.vocab_slice
        assert max_err(r.logprobs, logp) < 1e-10 and max_err(r.entropy, ent) < 1e-10
        assert max_err(r.kl, kl) < 1e-10
        assert max_err(r.grad_hidden, h.grad) < 1e-10  # the whole hidden-state gradient on every rank
        assert r.grad_weight.shape == (hi - lo, 16) and max_err(r.grad_weight, w.grad[lo:hi]) < 1e-10


def test_two_gloo_ranks_forward_makes_two_exchanges(two_ranks_errors):
    """A forward call makes the agreement check and one gather of the statistics, nothing else."""
    assert [e["collectives"] for e in two_ranks_errors] == ["all_gather_object,all_gather"] * 2


def test_two_gloo_ranks_reject_bad_input_together(two_ranks_errors):
    """Every rank raises, with a message naming the argument (no rank is left waiting)."""
    expected = {
        "vocab_size": r"vocab_size is 100, but the slices of weight on the ranks of group hold V = 97",
        "token": r"tokens must lie in \[0, 97\)",
        "replicated": r"hidden and tokens must be the same on every rank",
        "rank_error": r"weight must have shape \(V, 16\)",
        "empty": r"weight must not be empty",
        "ref_split": r"ref_weight must be split like weight",
    }
    import re

    for rank, errors in enumerate(two_ranks_errors):
        for name, pattern in expected.items():
            message = errors[name]
            assert message is not None and re.search(pattern, message), (rank, name, message)
        assert errors["works_after"] is None  # a rejected call leaves the group usable
    assert "rank 1 of group rejected its input" in two_ranks_errors[0]["rank_error"]
