"""kltutorial.compat's log-prob and masked-mean functions against the peers' own code, written out below as
their sources have it: TRL's ``selective_log_softmax`` (``trl/trainer/utils.py``, main) and
``logprobs_from_logits`` (``trl/core.py``, v0.11.4), verl's ``logprobs_from_logits_v2``, ``_naive`` and
``masked_mean`` (``verl/utils/torch_functional.py``, v0.9), and OpenRLHF's ``log_probs_from_logits`` (its path
without flash-attn), ``masked_mean`` and ``compute_approx_kl`` (``openrlhf/models/utils.py``, with PR #1309).
Values agree to rounding (bit for bit where the arithmetic is the same), dtypes and gradients are theirs;
what differs on purpose (half precision rounded once, NaN and empty masks raise, logits left undivided) is
asserted as such."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kltutorial.compat import openrlhf, trl, verl

# --- the peers' code ----------------------------------------------------------------------------------------


def _trl_selective_log_softmax(logits, index):
    squeeze = index.ndim == logits.ndim - 1
    if squeeze:
        index = index.unsqueeze(-1)
    if logits.dtype in [torch.float32, torch.float64]:
        selected_logits = torch.gather(logits, dim=-1, index=index)
        logsumexp_values = torch.stack([torch.logsumexp(lg, dim=-1) for lg in logits])
        per_token_logps = selected_logits - logsumexp_values.unsqueeze(-1)
    else:
        per_token_logps = []
        for row_logits, row_labels in zip(logits, index, strict=True):
            row_logps = F.log_softmax(row_logits, dim=-1)
            per_token_logps.append(row_logps.gather(dim=-1, index=row_labels))
        per_token_logps = torch.stack(per_token_logps)
    if squeeze:
        per_token_logps = per_token_logps.squeeze(-1)
    return per_token_logps


def _trl_logprobs_from_logits(logits, labels, gather=True):
    logp = F.log_softmax(logits, dim=2)
    if not gather:
        return logp
    return torch.gather(logp, 2, labels.unsqueeze(2)).squeeze(-1)


def _verl_naive(logits, labels):
    logp = F.log_softmax(logits, dim=-1)
    return torch.gather(logp, -1, labels.unsqueeze(-1)).squeeze(-1)


def _row_loop(logits, labels):
    """verl's and OpenRLHF's half-precision branch, the same loop in both: log_softmax one row at a time."""
    rows = []
    for row_logits, row_labels in zip(logits, labels, strict=True):
        row_logprobs = F.log_softmax(row_logits, dim=-1)
        rows.append(row_logprobs.gather(dim=-1, index=row_labels.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


def _verl_v2(logits, labels):
    if logits.dtype in [torch.float32, torch.float64]:
        logits_labels = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
        logsumexp_values = torch.stack([torch.logsumexp(logit, dim=-1) for logit in logits])
        return logits_labels - logsumexp_values
    return _row_loop(logits, labels)


def _verl_masked_mean(values, mask, axis=None):
    valid_values = torch.where(mask.bool(), values, 0.0)
    s = (valid_values * mask).sum(axis=axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def _openrlhf_log_probs_from_logits(logits, labels, temperature=1.0):  # without flash-attn installed
    if temperature != 1.0:
        logits.div_(temperature)
    if logits.dtype in [torch.float32, torch.float64]:
        batch_dim, last_dim = logits.shape[:-1], logits.shape[-1]
        logits_labels = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
        flat = logits.reshape(-1, last_dim)
        lse = torch.zeros((flat.shape[0]), device=logits.device, dtype=logits.dtype)
        for s_idx in range(0, flat.shape[0], 1024):
            lse[s_idx:s_idx + 1024] = torch.logsumexp(flat[s_idx:s_idx + 1024], dim=-1)
        return logits_labels - lse.view(*batch_dim)
    return _row_loop(logits, labels)


def _openrlhf_masked_mean(tensor, mask, dim=None):
    if mask is None:
        return tensor.mean(dim=dim)
    return (tensor * mask).sum(dim=dim) / mask.sum(dim=dim)


def _logits(shape, dtype=torch.float32, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)


def _ids(shape, vocab, seed=0):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed + 100))


# --- log-probs ----------------------------------------------------------------------------------------------

PEERS = [
    ("trl.selective_log_softmax", trl.selective_log_softmax, _trl_selective_log_softmax, (3, 7), True),
    ("verl.logprobs_from_logits", verl.logprobs_from_logits, _verl_v2, (3, 7), False),
    ("verl.logprobs_from_logits_v2", verl.logprobs_from_logits_v2, _verl_v2, (21,), False),
    ("openrlhf.log_probs_from_logits", openrlhf.log_probs_from_logits, _openrlhf_log_probs_from_logits,
     (3, 7), False),
]


@pytest.mark.parametrize(("name", "ours_fn", "theirs_fn", "lead", "k_ids"), PEERS, ids=[p[0] for p in PEERS])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_log_probs_values_gradients_and_dtypes_are_the_peers(name, ours_fn, theirs_fn, lead, k_ids, dtype,
                                                             rounded_once_and_closer):
    logits = _logits((*lead, 500), dtype)
    ids = _ids((*lead, 4) if k_ids else lead, 500)
    ours_in, theirs_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours, theirs = ours_fn(ours_in, ids), theirs_fn(theirs_in, ids)
    assert ours.dtype == theirs.dtype == dtype and ours.shape == theirs.shape == ids.shape
    weight = _logits(ids.shape, torch.float64, seed=1).to(dtype)
    (ours * weight).sum().backward()
    (theirs * weight).sum().backward()
    if dtype in (torch.float32, torch.float64):
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol)
        torch.testing.assert_close(ours_in.grad, theirs_in.grad, rtol=tol, atol=tol * 1e-1)
    else:  # theirs rounds in half precision as it goes, ours once
        exact = torch.log_softmax(logits.double(), -1).gather(-1, ids if k_ids else ids[..., None])
        assert rounded_once_and_closer(ours, theirs, exact if k_ids else exact[..., 0])
        torch.testing.assert_close(ours_in.grad.double(), theirs_in.grad.double(), rtol=2e-2, atol=4e-3)


def test_verl_naive_is_verls_bit_for_bit():
    for dtype in (torch.float32, torch.bfloat16):
        logits, ids = _logits((4, 9, 300), dtype), _ids((4, 9), 300)
        assert torch.equal(verl.logprobs_from_logits_naive(logits, ids), _verl_naive(logits, ids))


def test_verl_flat_layout_of_n_positions():
    logits, ids = _logits((50, 300)), _ids((50,), 300)  # verl's (N, V) with (N,)
    torch.testing.assert_close(verl.logprobs_from_logits(logits, ids, inplace_backward=False),
                               _verl_naive(logits, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_trl_logprobs_from_logits_gathered_and_not(dtype, rounded_once_and_closer):
    logits, ids = _logits((3, 8, 200), dtype), _ids((3, 8), 200)
    ours, theirs = trl.logprobs_from_logits(logits, ids), _trl_logprobs_from_logits(logits, ids)
    full, theirs_full = trl.logprobs_from_logits(logits, ids, gather=False), _trl_logprobs_from_logits(
        logits, ids, gather=False)
    assert ours.dtype == theirs.dtype == full.dtype == theirs_full.dtype == dtype
    assert full.shape == theirs_full.shape == (3, 8, 200)
    if dtype == torch.float32:
        torch.testing.assert_close(ours, theirs)
        torch.testing.assert_close(full, theirs_full)
    else:
        exact = F.log_softmax(logits.double(), -1)
        assert rounded_once_and_closer(full, theirs_full, exact)
        assert rounded_once_and_closer(ours, theirs, exact.gather(-1, ids[..., None])[..., 0])


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
def test_openrlhf_temperature_is_openrlhfs_division_but_leaves_the_logits_alone(temperature):
    logits, ids = _logits((4, 6, 300), seed=3), _ids((4, 6), 300, seed=3)
    before = logits.clone()
    ours = openrlhf.log_probs_from_logits(logits, ids, temperature=temperature)
    assert torch.equal(logits, before)  # ours does not divide the caller's tensor
    theirs_logits = logits.clone()
    theirs = _openrlhf_log_probs_from_logits(theirs_logits, ids, temperature=temperature)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    if temperature != 1.0:
        assert not torch.equal(theirs_logits, before)  # theirs did


# --- masked means -------------------------------------------------------------------------------------------

MASKS = [
    ("bool", lambda v: torch.rand(v.shape, generator=torch.Generator().manual_seed(4)) > 0.3),
    ("long", lambda v: (torch.rand(v.shape, generator=torch.Generator().manual_seed(5)) > 0.3).long()),
    ("weights", lambda v: torch.rand(v.shape, generator=torch.Generator().manual_seed(6))),
    ("broadcast", lambda v: torch.rand((*v.shape[:-1], 1), generator=torch.Generator().manual_seed(7)) > 0.2),
]


@pytest.mark.parametrize(("name", "make_mask"), MASKS, ids=[m[0] for m in MASKS])
@pytest.mark.parametrize("axis", [None, -1, 0, (0, 1)])
def test_verl_masked_mean_is_verls_bit_for_bit_in_float32(name, make_mask, axis):
    values = _logits((5, 6, 7))
    mask = make_mask(values)
    ours, theirs = verl.masked_mean(values, mask, axis), _verl_masked_mean(values, mask, axis)
    assert ours.dtype == theirs.dtype
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize(("name", "make_mask"), MASKS, ids=[m[0] for m in MASKS])
@pytest.mark.parametrize("dim", [None, -1, 1])
def test_openrlhf_masked_mean_is_openrlhfs(name, make_mask, dim):
    values = _logits((5, 6, 7))
    mask = make_mask(values)
    theirs = _openrlhf_masked_mean(values, mask, dim)
    if torch.isnan(theirs).any():  # a mask of 0s along dim (broadcast, dim=-1): theirs 0/0, ours raises
        with pytest.raises(ValueError, match="mask is 0 everywhere along dim"):
            openrlhf.masked_mean(values, mask, dim)
        return
    ours = openrlhf.masked_mean(values, mask, dim)
    assert ours.dtype == theirs.dtype
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    no_mask = openrlhf.masked_mean(values, None, dim)
    torch.testing.assert_close(no_mask, _openrlhf_masked_mean(values, None, dim))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_masked_means_have_the_peers_dtypes_and_half_precision_is_summed_in_float32(dtype):
    values = _logits((4, 300), dtype, scale=1.0) + 10  # a sum of 300 such numbers loses digits in bfloat16
    mask = torch.ones(4, 300, dtype=torch.long)
    mask[:, 250:] = 0
    exact = values.double()[:, :250].mean(-1)
    for ours, theirs in [(verl.masked_mean(values, mask, -1), _verl_masked_mean(values, mask, -1)),
                         (openrlhf.masked_mean(values, mask, -1), _openrlhf_masked_mean(values, mask, -1))]:
        assert ours.dtype == theirs.dtype
        assert (ours.double() - exact).abs().max() <= (theirs.double() - exact).abs().max()


def test_masked_means_differ_on_purpose_where_theirs_give_nan_or_zero():
    values = torch.tensor([[1.0, float("nan"), 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 0, 1], [0, 0, 0]])
    # verl: NaN under a 0 mask is ignored, an all-zero row gives 0, as verl's
    torch.testing.assert_close(verl.masked_mean(values, mask, -1), torch.tensor([2.0, 0.0]))
    # OpenRLHF: NaN under a 0 mask is ignored (theirs gives NaN); an all-zero row raises (theirs: NaN)
    assert torch.isnan(_openrlhf_masked_mean(values, mask, -1)).all()
    with pytest.raises(ValueError, match=r"mask is 0 everywhere along dim=-1"):
        openrlhf.masked_mean(values, mask, -1)
    torch.testing.assert_close(openrlhf.masked_mean(values[:1], mask[:1], -1), torch.tensor([2.0]))
    for mean in (verl.masked_mean, openrlhf.masked_mean):
        with pytest.raises(ValueError, match="contains NaN where mask is not 0"):
            mean(values, torch.ones_like(mask))


# --- errors name the peers' arguments -----------------------------------------------------------------------

L, IDS = _logits((2, 3, 5)), _ids((2, 3), 5)
NAN = float("nan")
_sls, _trl_lfl = trl.selective_log_softmax, trl.logprobs_from_logits
_verl_lfl, _verl_naive_lfl = verl.logprobs_from_logits, verl.logprobs_from_logits_naive
_verl_mm = verl.masked_mean
_orl_lfl, _orl_mm, _orl_kl = openrlhf.log_probs_from_logits, openrlhf.masked_mean, openrlhf.compute_approx_kl

BAD_INPUTS = [
    ("trl-index-shape", _sls, (L, IDS[:, :2]), {}, ValueError, "index must have shape"),
    ("trl-index-range", _sls, (L, IDS + 5), {}, ValueError, r"index must lie in \[0, 5\)"),
    ("trl-index-float", _sls, (L, IDS.float()), {}, TypeError, "index must hold integer"),
    ("trl-nan", _sls, (torch.full((2, 5), NAN), IDS[0, :2]), {}, ValueError,
     r"logits contains NaN \(at position \[0\]\)"),
    ("trl-lfl-rank", _trl_lfl, (L[0], IDS[0]), {}, ValueError, r"logits must have 3 dimensions"),
    ("trl-lfl-k", _trl_lfl, (L, IDS[..., None]), {}, ValueError, "labels must have shape"),
    ("trl-lfl-gather", _trl_lfl, (L, IDS), {"gather": 1}, TypeError, "gather must be a bool"),
    ("trl-full-neginf", _trl_lfl, (torch.full((1, 2, 3), -torch.inf), None), {"gather": False}, ValueError,
     r"logits is -inf for every token at position \(b=0, t=0\)"),
    ("trl-full-nan", _trl_lfl, (L.clone().fill_(NAN), None), {"gather": False}, ValueError,
     "logits contains NaN"),
    ("verl-labels-k", _verl_lfl, (L, IDS[..., None]), {}, ValueError, "labels must have shape"),
    ("verl-inplace", _verl_lfl, (L, IDS), {"inplace_backward": "yes"}, TypeError,
     "inplace_backward must be a bool"),
    ("verl-naive-labels", _verl_naive_lfl, (L, IDS - 1), {}, ValueError, "labels must lie in"),
    ("verl-mask-shape", _verl_mm, (L, IDS[:1, :2]), {}, ValueError, "mask must broadcast to values"),
    ("verl-mask-negative", _verl_mm, (L, -torch.ones(2, 3, 5)), {}, ValueError, "mask must be finite"),
    ("verl-values-int", _verl_mm, (IDS, IDS), {}, TypeError, "values must be a floating-point"),
    ("verl-axis", _verl_mm, (L, torch.ones(2, 3, 5)), {"axis": 1.0}, TypeError, "axis must be an int"),
    ("orl-temperature", _orl_lfl, (L, IDS), {"temperature": 0.0}, ValueError,
     "temperature must be a finite number > 0"),
    ("orl-labels", _orl_lfl, (L, IDS.float()), {}, TypeError, "labels must hold integer"),
    ("orl-mask-list", _orl_mm, (L, [1, 0]), {}, TypeError, "mask must be a boolean, integer"),
    ("orl-dim-bool", _orl_mm, (L, None), {"dim": True}, TypeError, "dim must be an int"),
    ("orl-unbiased", _orl_kl, (L[0], L[0]), {"unbiased_gradient": 1}, TypeError,
     "unbiased_gradient must be a bool"),
    ("orl-old-nan", _orl_kl, (L[0], L[0], L[0].clone().fill_(NAN)), {"unbiased_gradient": True}, ValueError,
     "log_probs_old contains NaN"),
    ("orl-old-shape", _orl_kl, (L[0], L[0], L[0, :1]), {"unbiased_gradient": True}, ValueError,
     "old_logprobs"),
]


@pytest.mark.parametrize(("call", "args", "kwargs", "exc", "match"), [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises_naming_the_peers_argument(call, args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(*args, **kwargs)


# --- dtypes: the peers', for every input dtype -------------------------------------------------------------
# Read in the peers' source: TRL main f2cd57710 (v1.9.0 + 26 commits) trl/trainer/utils.py
# selective_log_softmax, and v0.11.4 trl/core.py logprobs_from_logits; verl main 1dda039b9 (the same code as
# v0.9.0) verl/utils/torch_functional.py logprobs_from_logits (its path without flash-attn, which is
# logprobs_from_logits_v2; with flash-attn it returns float32), logprobs_from_logits_v2,
# logprobs_from_logits_naive and masked_mean; OpenRLHF v0.11.0 openrlhf/models/utils.py log_probs_from_logits
# (its path without flash-attn; with flash-attn float32 for float32 and float64 logits) and masked_mean.

F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16
SAME = {F64: F64, F32: F32, F16: F16, BF16: BF16}

#: function -> {the logits' dtype: the dtype the peer returns}
LOGPROB_DTYPES = {
    "trl.selective_log_softmax": SAME,  # gather - logsumexp for float32/64, log_softmax per row for half
    "trl.logprobs_from_logits": SAME,  # F.log_softmax(logits, dim=2), gathered
    "trl.logprobs_from_logits(gather=False)": SAME,  # F.log_softmax(logits, dim=2)
    "verl.logprobs_from_logits": SAME,  # logprobs_from_logits_v2 without flash-attn
    "verl.logprobs_from_logits_v2": SAME,
    "verl.logprobs_from_logits_naive": SAME,  # F.log_softmax(logits, dim=-1), gathered
    "openrlhf.log_probs_from_logits": SAME,  # gather - chunked logsumexp (logits' dtype), or per-row
}

#: (function, mask) -> {the values' dtype: the dtype the peer returns}; the masks have the values' shape
MASKED_MEAN_DTYPES = {
    # verl: (values * mask).sum(axis) / (mask.sum(axis) + 1e-8); an integer sum + 1e-8 is float32
    ("verl.masked_mean", "bool"): {F64: F64, F32: F32, F16: F32, BF16: F32},
    ("verl.masked_mean", "long"): {F64: F64, F32: F32, F16: F32, BF16: F32},
    ("verl.masked_mean", "values' dtype"): SAME,
    # OpenRLHF: (tensor * mask).sum(dim) / mask.sum(dim), or tensor.mean(dim) for mask=None
    ("openrlhf.masked_mean", "bool"): SAME,
    ("openrlhf.masked_mean", "long"): SAME,
    ("openrlhf.masked_mean", "values' dtype"): SAME,
    ("openrlhf.masked_mean", "None"): SAME,
}

DTYPES = [F64, F32, F16, BF16]

_LOGPROB_CALLS = {  # name -> (ours, theirs (the peer's code above), ids with K per position)
    "trl.selective_log_softmax": (trl.selective_log_softmax, _trl_selective_log_softmax, True),
    "trl.logprobs_from_logits": (trl.logprobs_from_logits, _trl_logprobs_from_logits, False),
    "trl.logprobs_from_logits(gather=False)": (
        lambda z, y: trl.logprobs_from_logits(z, y, gather=False),
        lambda z, y: _trl_logprobs_from_logits(z, y, gather=False), False),
    "verl.logprobs_from_logits": (verl.logprobs_from_logits, _verl_v2, False),
    "verl.logprobs_from_logits_v2": (verl.logprobs_from_logits_v2, _verl_v2, False),
    "verl.logprobs_from_logits_naive": (verl.logprobs_from_logits_naive, _verl_naive, False),
    "openrlhf.log_probs_from_logits": (openrlhf.log_probs_from_logits, _openrlhf_log_probs_from_logits,
                                       False),
}

_MASKED_MEAN_CALLS = {
    "verl.masked_mean": (verl.masked_mean, _verl_masked_mean),
    "openrlhf.masked_mean": (openrlhf.masked_mean, _openrlhf_masked_mean),
}


def _mask(kind, values):
    keep = torch.rand(values.shape, generator=torch.Generator().manual_seed(9)) > 0.3
    keep[..., 0] = True  # no row without a kept entry
    return {"bool": keep, "long": keep.long(), "values' dtype": keep.to(values.dtype), "None": None}[kind]


@pytest.mark.parametrize("name", list(LOGPROB_DTYPES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_log_prob_functions_return_the_peers_dtype(name, dtype):
    ours_fn, theirs_fn, k_ids = _LOGPROB_CALLS[name]
    logits = _logits((3, 7, 50), dtype)
    ids = _ids((3, 7, 2) if k_ids else (3, 7), 50)
    ours, theirs = ours_fn(logits, ids), theirs_fn(logits.clone(), ids)
    assert ours.dtype == theirs.dtype == LOGPROB_DTYPES[name][dtype]
    assert ours.shape == theirs.shape


@pytest.mark.parametrize(("name", "mask_kind"), list(MASKED_MEAN_DTYPES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [None, -1, (0, 1)])
def test_masked_means_return_the_peers_dtype(name, mask_kind, dtype, dim):
    ours_fn, theirs_fn = _MASKED_MEAN_CALLS[name]
    values = _logits((3, 7), dtype, scale=1.0)
    mask = _mask(mask_kind, values)
    ours, theirs = ours_fn(values, mask, dim), theirs_fn(values, mask, dim)
    assert ours.dtype == theirs.dtype == MASKED_MEAN_DTYPES[name, mask_kind][dtype]
    assert ours.shape == theirs.shape


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_verl_masked_mean_keeps_torchs_promotion_where_the_masks_sum_is_0_dim(dtype):
    # a (T,) mask over (B, T) values, reduced along T: verl's denominator mask.sum(-1) + 1e-8 is a 0-dim
    # float32, which does not widen the (B,) half-precision numerator, so verl's result stays in dtype
    values = _logits((3, 7), dtype, scale=1.0)
    mask = torch.tensor([1, 1, 0, 1, 0, 1, 1])
    ours, theirs = verl.masked_mean(values, mask, -1), _verl_masked_mean(values, mask, -1)
    assert ours.dtype == theirs.dtype == dtype
    exact = (values.double() * mask).sum(-1) / mask.sum()
    assert torch.all((ours.double() - exact).abs() <= exact.abs() * torch.finfo(dtype).eps / 2 + 1e-30)


def _rounded_through_float32_is_caught(exact):
    """The 1e-12 bound below tells float64 arithmetic from float32's: ``exact`` through float32 misses it."""
    return bool((exact.float().double() - exact).abs().max() > 1e-10)


@pytest.mark.parametrize("name", list(LOGPROB_DTYPES))
def test_float64_log_probs_keep_float64_precision(name):
    ours_fn, _, k_ids = _LOGPROB_CALLS[name]
    logits = _logits((3, 7, 500), F64, seed=11)
    ids = _ids((3, 7, 2) if k_ids else (3, 7), 500, seed=11)
    exact = torch.log_softmax(logits, -1)  # (3, 7, 500), float64
    if "gather=False" not in name:
        exact = exact.gather(-1, ids if k_ids else ids[..., None])
        exact = exact if k_ids else exact[..., 0]
    ours = ours_fn(logits, ids)
    assert ours.dtype == F64 and _rounded_through_float32_is_caught(exact)
    torch.testing.assert_close(ours, exact, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(_MASKED_MEAN_CALLS))
@pytest.mark.parametrize("mask_kind", ["bool", "long", "values' dtype"])
@pytest.mark.parametrize("dim", [None, -1])
def test_float64_masked_means_keep_float64_precision(name, mask_kind, dim):
    ours_fn, theirs_fn = _MASKED_MEAN_CALLS[name]
    values = _logits((4, 300), F64, seed=12, scale=1.0) + 1 / 3
    mask = _mask(mask_kind, values)
    exact = theirs_fn(values, mask, dim)  # float64; verl's integer count + 1e-8 is float32, the count exact
    ours = ours_fn(values, mask, dim)
    assert ours.dtype == F64 and _rounded_through_float32_is_caught(exact)
    torch.testing.assert_close(ours, exact, rtol=1e-12, atol=1e-12)
