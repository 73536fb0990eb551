r"""Log-probabilities of chosen tokens and the exact per-position KL, without a (B, T, V) copy.

Book section 12, "Diagnostics and practice: log-probs at scale".

Every KL penalty starts from log-probabilities. For a position whose logits are
:math:`z \in \mathbb{R}^V`, the log-probability of token :math:`y` is

.. math:: \log \pi(y) = z_y - \operatorname{LSE}(z), \qquad
          \operatorname{LSE}(z) = m + \log \sum_v e^{z_v - m}, \quad m = \max_v z_v .

The textbook recipe ``log_softmax(logits).gather(-1, tokens)`` is correct but writes a second tensor as
large as the logits, shape (B, T, V), only to read one entry per position back out of it; autograd then
keeps that tensor for the backward pass. At an LLM's vocabulary that copy is gigabytes
(4 x 1024 x 128,256 float32 logits are 2.1 GB). The functions here compute the same numbers one
cache-sized chunk of positions at a time (``CHUNK_BYTES``, about 2 MiB of float32 work):

1. copy the chunk to float32 if it is half precision (one chunk, never the whole tensor);
2. normalise it, :math:`z - \operatorname{LSE}(z)`, into a small buffer that is reused by every chunk
   and stays in the CPU's cache;
3. keep the chosen token's entry (one number per position) and move on.

``exact_kl`` sums :math:`\mathrm{KL}(\pi \| \pi_{\mathrm{ref}}) = \sum_v p_v (\log p_v - \log q_v)`
in the same way. Both are ``torch.autograd.Function``\ s whose backward recomputes the softmax chunk by
chunk instead of storing it, so the only (B, T, V) tensor they allocate is the gradient itself.

``naive_logprobs_for_tokens`` and ``naive_exact_kl`` are the baselines (the textbook recipes); the tests
check that the lean versions agree with them and ``python -m kltutorial.studies.bench`` measures both.

Shapes: B batch, T tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx, once_differentiable

from kltutorial._validation import (
    check_logits,
    check_mask,
    check_positive_int,
    check_same_shape,
    check_token_ids,
)

__all__ = [
    "CHUNK_BYTES",
    "chunk_rows",
    "get_logprobs_for_tokens",
    "exact_kl",
    "naive_logprobs_for_tokens",
    "naive_exact_kl",
]

#: Float32 bytes of one chunk of rows (positions), 2 MiB (16 rows at V = 32,000, 4 at V = 128,256).
#: About 2 MiB of float32 work per chunk: large enough that each chunk is many rows of one big
#: kernel call (a single row per call is slower), small enough that the three or four chunk-sized
#: buffers exact KL keeps busy stay near a core's L2 cache. The value is not critical, and the best one
#: depends on the machine: ``python -m kltutorial.studies.bench --sweep`` times chunk sizes from 128 KiB to
#: 16 MiB on yours. Peak extra memory is a few chunks, whatever (B, T).
CHUNK_BYTES = 2 << 20


def chunk_rows(vocab_size: int, chunk_size: int | None = None) -> int:
    """Number of rows (positions) per chunk: ``chunk_size`` if given, else ``CHUNK_BYTES / (4 V)``.

    Parameters
    ----------
    vocab_size : int
        V, the length of one row of logits.
    chunk_size : int, optional
        Explicit number of rows per chunk (>= 1).

    Returns
    -------
    int
        Rows per chunk, at least 1.

    Examples
    --------
    >>> chunk_rows(32_000), chunk_rows(128_256), chunk_rows(10, chunk_size=3)
    (16, 4, 3)
    """
    if chunk_size is not None:
        return check_positive_int(chunk_size, "chunk_size")
    return max(1, CHUNK_BYTES // (4 * check_positive_int(vocab_size, "vocab_size")))


# ----------------------------------------------------------------------------------------------------
# Input checks. Each public function checks its arguments once, with _validation's checks, and the
# kernels below trust them. _validation.check_float_tensor would scan the whole tensor for NaN/inf, which
# reads the logits once more and allocates a (B, T, V) boolean mask (a quarter of float32 logits), so the
# public functions only run check_logits (dtype, rank, non-empty) and the kernels find NaN/+inf in the
# rows they normalise anyway: a row holding a NaN or +inf logit, or only -inf logits, has an all-NaN
# log-softmax, while a valid row never has a NaN one. So one NaN test on one number per row (B*T numbers,
# not B*T*V) catches every bad row; the rare bad row is then read again to say what is wrong with it.


def _raise_if_bad_rows(probe: torch.Tensor, x: torch.Tensor, name: str) -> None:
    """``probe`` (B*T,) holds one log-softmax entry per row of ``x``; NaN marks a row that is not valid."""
    bad = torch.isnan(probe)
    if not bool(bad.any()):
        return
    i = int(torch.nonzero(bad)[0])
    b, t = divmod(i, x.shape[1])
    row = x[b, t]
    if bool(torch.isnan(row).any()):
        raise ValueError(f"{name} contains NaN (at position b={b}, t={t})")
    if bool(torch.isposinf(row).any()):
        raise ValueError(
            f"{name} contains +inf (at position b={b}, t={t}); only -inf (an impossible token) is allowed"
        )
    raise ValueError(
        f"{name} is -inf for every token at position (b={b}, t={t}); at least one token must be possible"
    )


def _compute_dtype(*xs: torch.Tensor) -> torch.dtype:
    """float64 stays float64; everything else (float32, float16, bfloat16) is computed in float32."""
    return torch.float64 if any(x.dtype == torch.float64 for x in xs) else torch.float32


def _row_chunks(
    tensors: list[torch.Tensor], rows: int
) -> Iterator[tuple[int, int, list[torch.Tensor]]]:
    """Yield ``(start, stop, views)``: rows ``start:stop`` of the flattened (B*T, V) tensors, as views.

    When a tensor cannot be flattened without a copy (e.g. ``logits[:, :-1]``), chunks stay within
    one batch row instead, so nothing is ever copied.
    """
    B, T, V = tensors[0].shape
    try:
        flats = [x.view(B * T, V) for x in tensors]
    except RuntimeError:
        flats = None
    if flats is not None:
        for start in range(0, B * T, rows):
            stop = min(start + rows, B * T)
            yield start, stop, [f[start:stop] for f in flats]
    else:
        for b in range(B):
            for t in range(0, T, rows):
                stop = min(t + rows, T)
                yield b * T + t, b * T + stop, [x[b, t:stop] for x in tensors]


class _Buffers:
    """A few (rows, V) work buffers, allocated once per call and reused by every chunk.

    Reusing them (``out=`` arguments) keeps each chunk's work in cache and avoids a fresh allocation,
    and its page faults, per chunk.
    """

    def __init__(self, n: int, rows: int, vocab: int, dtype: torch.dtype, device: torch.device):
        self._all = torch.empty(n, rows, vocab, dtype=dtype, device=device)

    def __getitem__(self, key: tuple[int, int]) -> torch.Tensor:
        slot, n_rows = key
        return self._all[slot, :n_rows]  # (n_rows, V), contiguous


def _upcast(z: torch.Tensor, dtype: torch.dtype, buf: torch.Tensor) -> torch.Tensor:
    """``z`` in ``dtype``: itself if it already is, else a copy into ``buf`` (half -> float32).

    The (log-)softmax of a copy may then be written over it (``out=buf``): each entry is read before it
    is overwritten, so this is exact and saves a second buffer.
    """
    if z.dtype == dtype:
        return z
    buf.copy_(z)
    return buf


# ----------------------------------------------------------------------------------------------------
# Log-probabilities of chosen tokens


class _TokenLogprobs(torch.autograd.Function):
    """log pi(y) = log_softmax(z)_y per chunk; backward d log pi(y) / dz = onehot(y) - softmax(z)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, logits: torch.Tensor, tokens: torch.Tensor, rows: int
    ) -> torch.Tensor:
        B, T, V = logits.shape
        dtype = _compute_dtype(logits)
        ids = tokens.reshape(-1, 1)  # (B*T, 1)
        out = torch.empty(B * T, dtype=dtype, device=logits.device)  # (B*T,)
        buf = _Buffers(1, min(rows, B * T), V, dtype, logits.device)
        for start, stop, (z,) in _row_chunks([logits], rows):
            n = stop - start
            # 1. normalise one cache-sized chunk, z - LSE(z), into the reused buffer (a half-precision
            #    chunk is first copied there as float32, then normalised in place)
            logp = torch.log_softmax(_upcast(z, dtype, buf[0, n]), dim=-1, out=buf[0, n])
            # 2. keep only the chosen token's entry
            torch.gather(logp, 1, ids[start:stop], out=out[start:stop, None])
        # a bad row (NaN, +inf, all -inf) has an all-NaN log-softmax; a valid one never has a NaN entry
        _raise_if_bad_rows(out, logits, "logits")
        ctx.save_for_backward(logits, tokens)
        ctx.rows = rows
        return out.view(B, T)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, tokens = ctx.saved_tensors
        B, T, V = logits.shape
        dtype = _compute_dtype(logits)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # (B, T, V)
        go = grad_out.reshape(-1, 1).to(dtype)  # (B*T, 1)
        ids = tokens.reshape(-1, 1)
        buf = _Buffers(1, min(ctx.rows, B * T), V, dtype, logits.device)
        for start, stop, (z, g) in _row_chunks([logits, grad], ctx.rows):
            n = stop - start
            # float32/64 gradients are written straight into the output chunk; half precision goes
            # through the float32 buffer
            s = g if g.dtype == dtype else buf[0, n]
            # -softmax(z) * grad_out ...
            torch.softmax(_upcast(z, dtype, buf[0, n]), dim=-1, out=s)
            s.mul_(-go[start:stop])
            # ... + onehot(y) * grad_out
            s.scatter_add_(1, ids[start:stop], go[start:stop])
            if s is not g:
                g.copy_(s)
        return grad, None, None


def get_logprobs_for_tokens(
    logits: torch.Tensor, tokens: torch.Tensor, *, chunk_size: int | None = None
) -> torch.Tensor:
    """Log-probability of each chosen token: ``log_softmax(logits)[b, t, tokens[b, t]]``.

    .. math:: \\log \\pi(y_{b,t}) = z_{b,t,y_{b,t}} - \\log \\sum_v \\exp z_{b,t,v}

    Equivalent to ``naive_logprobs_for_tokens`` but never allocates a (B, T, V) tensor: the log-softmax
    is computed for one cache-sized chunk of positions at a time, into a reused buffer, and only the
    chosen token's entry is kept.

    Parameters
    ----------
    logits : Tensor, shape (B, T, V)
        Unnormalised scores. ``-inf`` marks a token that is impossible (masked out of the vocabulary);
        NaN, ``+inf`` and a position whose logits are all ``-inf`` raise ``ValueError``.
    tokens : Tensor, shape (B, T), integer
        Token ids in ``[0, V)``.
    chunk_size : int, optional
        Positions per chunk; by default ``chunk_rows(V)`` (about ``CHUNK_BYTES`` of float32 work).

    Returns
    -------
    Tensor, shape (B, T)
        Log-probabilities (<= 0; ``-inf`` for an impossible token). float64 for float64 logits, float32
        otherwise (float16/bfloat16 logits are upcast one chunk at a time). Differentiable w.r.t.
        ``logits``; the backward recomputes the softmax chunk by chunk
        (:math:`\\partial \\log \\pi(y) / \\partial z = \\mathrm{onehot}(y) - \\mathrm{softmax}(z)`).

    Notes
    -----
    Numerically stable: the log-sum-exp subtracts each row's maximum, so logits of any finite size work
    (the log of a softmax would underflow to ``-inf``). Bad rows (NaN, ``+inf``, all ``-inf``) are found
    from the normalised rows themselves, at no extra pass over the logits. The loop makes one library call
    per chunk; with several OpenMP threads on a busy machine each call may wait for a thread to be
    scheduled (see :mod:`kltutorial.studies.bench`), which one thread avoids.

    The libraries return log-probs in the logits' own dtype: TRL's ``selective_log_softmax``
    (``trl/trainer/utils.py``) and OpenRLHF's ``log_probs_from_logits`` (``openrlhf/models/utils.py``)
    gather the chosen logit and subtract a row-wise log-sum-exp for float32 logits (OpenRLHF uses
    flash-attn's cross entropy instead when it is installed), and run
    ``log_softmax`` one sequence at a time for half precision, so bfloat16 logits give bfloat16 log-probs
    (8 bits of mantissa, about 0.4 % relative error) that then go into the KL. Here every chunk is
    computed in float32 (float64 stays float64).

    Examples
    --------
    >>> logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0]]])
    >>> get_logprobs_for_tokens(logits, torch.tensor([[2]]))  # log(1/4)
    tensor([[-1.3863]])
    """
    logits = check_logits(logits, "logits")
    tokens = check_token_ids(tokens, "tokens", logits.shape[:-1], logits.shape[-1])
    return logprobs_for_tokens_unchecked(logits, tokens, chunk_size)


def logprobs_for_tokens_unchecked(
    logits: torch.Tensor, tokens: torch.Tensor, chunk_size: int | None = None
) -> torch.Tensor:
    """:func:`get_logprobs_for_tokens` for a caller that has already checked ``logits`` and ``tokens``."""
    return _TokenLogprobs.apply(logits, tokens.long(), chunk_rows(logits.shape[-1], chunk_size))


def naive_logprobs_for_tokens(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Baseline (the textbook recipe): ``log_softmax(logits, -1).gather(-1, tokens)``.

    Computed in the logits' own dtype, as the handbook's and most tutorials' code does; it materialises
    the full (B, T, V) log-softmax (and autograd keeps it for the backward). Used by the tests and the
    benchmark as the reference that ``get_logprobs_for_tokens`` must match. Shapes and token ids are
    checked, but the logits are not scanned for NaN (that would change what the benchmark measures).

    Parameters
    ----------
    logits : Tensor, shape (B, T, V)
    tokens : Tensor, shape (B, T), integer

    Returns
    -------
    Tensor, shape (B, T), the logits' dtype
    """
    logits = check_logits(logits, "logits")
    tokens = check_token_ids(tokens, "tokens", logits.shape[:-1], logits.shape[-1])
    logp = F.log_softmax(logits, dim=-1)  # (B, T, V): the copy the lean version avoids
    return logp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


# ----------------------------------------------------------------------------------------------------
# Exact KL over the vocabulary


def _fix_nan_rows(kl: torch.Tensor, logp: torch.Tensor, diff: torch.Tensor) -> None:
    """Redo, in place, the rows of ``kl`` that the fast product ``sum(p * diff)`` left NaN.

    ``diff = log p - log q``. The product is NaN only where p_v is zero: a token impossible under pi
    (log p_v = -inf: contributes 0, the convention 0 log 0 = 0), or a token possible under pi whose
    probability underflowed to 0.0 while log q_v = -inf (pi puts mass where pi_ref puts none: KL = +inf).
    """
    bad = torch.isnan(kl)
    if not bool(bad.any()):
        return
    lp, d = logp[bad], diff[bad]
    possible = lp > -torch.inf
    terms = torch.where(possible, lp.exp() * d, torch.zeros_like(d)).sum(-1)
    infinite = (possible & (d == torch.inf)).any(-1)
    kl[bad] = torch.where(infinite, torch.full_like(terms, torch.inf), terms)


class _ExactKL(torch.autograd.Function):
    """KL(pi || pi_ref) per position, chunked; backward p * (log p - log q - KL) and q - p."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        policy_logits: torch.Tensor,
        reference_logits: torch.Tensor,
        mask: torch.Tensor | None,
        rows: int,
    ) -> torch.Tensor:
        B, T, V = policy_logits.shape
        dtype = _compute_dtype(policy_logits, reference_logits)
        device = policy_logits.device
        kl = torch.empty(B * T, dtype=dtype, device=device)  # (B*T,)
        probe = torch.empty(2, B * T, dtype=dtype, device=device)  # one log-prob per row, to find NaN
        buf = _Buffers(4, min(rows, B * T), V, dtype, device)
        for start, stop, (z, w) in _row_chunks([policy_logits, reference_logits], rows):
            n = stop - start
            # 1. log p and log q of one cache-sized chunk, into reused buffers
            logp = torch.log_softmax(_upcast(z, dtype, buf[0, n]), dim=-1, out=buf[1, n])
            p = torch.softmax(_upcast(z, dtype, buf[0, n]), dim=-1, out=buf[3, n])
            logq = torch.log_softmax(_upcast(w, dtype, buf[0, n]), dim=-1, out=buf[2, n])
            probe[0, start:stop], probe[1, start:stop] = logp[:, 0], logq[:, 0]
            # 2. KL = sum_v p_v (log p_v - log q_v); diff overwrites log q
            diff = logq.neg_().add_(logp)
            kl_chunk = kl[start:stop]
            torch.sum(p.mul_(diff), dim=-1, out=kl_chunk)  # in place: no chunk-sized temporary
            # 3. rows with an impossible token (p_v = 0) need 0 log 0 = 0 spelled out
            _fix_nan_rows(kl_chunk, logp, diff)
        _raise_if_bad_rows(probe[0], policy_logits, "policy_logits")
        _raise_if_bad_rows(probe[1], reference_logits, "reference_logits")
        kl.clamp_(min=0.0)  # KL >= 0; rounding can leave a sum of mixed-sign terms a hair below 0
        if mask is not None:
            kl.masked_fill_(~mask.reshape(-1), 0.0)
        ctx.save_for_backward(policy_logits, reference_logits, mask, kl)
        ctx.rows = rows
        return kl.view(B, T)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, y, mask, kl = ctx.saved_tensors
        need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        B, T, V = x.shape
        dtype = kl.dtype
        go = grad_out.reshape(-1, 1).to(dtype)  # (B*T, 1)
        padding = None if mask is None else ~mask.reshape(-1, 1)
        gx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if need_x else None  # (B, T, V)
        gy = torch.empty(y.shape, dtype=y.dtype, device=y.device) if need_y else None
        outs = [g for g in (gx, gy) if g is not None]
        buf = _Buffers(5, min(ctx.rows, B * T), V, dtype, x.device)
        for start, stop, views in _row_chunks([x, y, *outs], ctx.rows):
            n = stop - start
            z, w, grads = views[0], views[1], views[2:]
            g_row = go[start:stop]
            p = torch.softmax(_upcast(z, dtype, buf[0, n]), dim=-1, out=buf[1, n])
            if need_y:
                # dKL/dw_v = q_v - p_v
                q = torch.softmax(_upcast(w, dtype, buf[0, n]), dim=-1, out=buf[2, n])
                t = q.sub_(p).mul_(g_row)
                if padding is not None:
                    t.masked_fill_(padding[start:stop], 0.0)
                grads[-1].copy_(t)
            if need_x:
                # dKL/dz_v = p_v (log p_v - log q_v - KL), and 0 where p_v = 0
                logp = torch.log_softmax(_upcast(z, dtype, buf[0, n]), dim=-1, out=buf[3, n])
                logq = torch.log_softmax(_upcast(w, dtype, buf[0, n]), dim=-1, out=buf[4, n])
                t = logq.neg_().add_(logp).sub_(kl[start:stop, None]).mul_(p).mul_(g_row)
                t.masked_fill_(p == 0, 0.0)
                if padding is not None:
                    t.masked_fill_(padding[start:stop], 0.0)
                grads[0].copy_(t)
        return gx, gy, None, None


def exact_kl(
    policy_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Exact KL(pi || pi_ref) over the whole vocabulary at every position (the ``full`` estimator).

    .. math:: \\mathrm{KL}_{b,t} = \\sum_{v=1}^{V} p_v (\\log p_v - \\log q_v), \\qquad
              p = \\mathrm{softmax}(z_{b,t}), \\; q = \\mathrm{softmax}(w_{b,t})

    Equivalent to ``naive_exact_kl`` (away from impossible tokens) but summed over cache-sized chunks of
    positions, so no (B, T, V) tensor is allocated.

    Parameters
    ----------
    policy_logits : Tensor, shape (B, T, V)
        Logits z of the policy pi. ``-inf`` marks an impossible token.
    reference_logits : Tensor, shape (B, T, V)
        Logits w of the reference pi_ref, same shape.
    attention_mask : Tensor, shape (B, T), optional
        1 for a real token, 0 for padding; the result is exactly 0 at padding.
    chunk_size : int, optional
        Positions per chunk; by default ``chunk_rows(V)``.

    Returns
    -------
    Tensor, shape (B, T)
        KL in nats, >= 0 (float64 if either input is float64, else float32).

    Notes
    -----
    Impossible tokens follow the convention 0 log 0 = 0: a token impossible under both models
    contributes 0 (``naive_exact_kl`` returns NaN there). A token possible under pi but impossible under
    pi_ref makes the KL ``+inf``; that is the true value, not an error, since pi puts mass where pi_ref
    puts none. NaN, ``+inf`` logits and a position whose logits are all ``-inf`` raise ``ValueError``.

    The gradient is w.r.t. both logits: :math:`\\partial \\mathrm{KL} / \\partial z_v = p_v
    (\\log p_v - \\log q_v - \\mathrm{KL})` and :math:`\\partial \\mathrm{KL} / \\partial w_v =
    q_v - p_v`, recomputed chunk by chunk in the backward (not finite where the KL is infinite).

    Of the libraries only TRL (up to v0.11, ``kl_penalty="full"``) computes this, as
    ``F.kl_div(ref_logprob, logprob, log_target=True).sum(-1)`` over full log-softmax tensors in the
    logits' dtype: NaN wherever the policy's logit is ``-inf`` (:math:`0 \\cdot (-\\infty)`), where
    this function follows 0 log 0 = 0. verl accepts ``"full"`` and raises ``NotImplementedError``;
    OpenRLHF has no such option.

    Examples
    --------
    >>> z = torch.log(torch.tensor([[[0.5, 0.5]]]))
    >>> w = torch.log(torch.tensor([[[0.25, 0.75]]]))
    >>> exact_kl(z, w)  # 0.5 log 2 + 0.5 log(2/3)
    tensor([[0.1438]])
    """
    policy_logits = check_logits(policy_logits, "policy_logits")
    reference_logits = check_logits(reference_logits, "reference_logits")
    check_same_shape(policy_logits, "policy_logits", reference_logits, "reference_logits")
    mask = None
    if attention_mask is not None:
        mask = check_mask(attention_mask, "attention_mask", policy_logits.shape[:-1])
    return exact_kl_unchecked(policy_logits, reference_logits, mask, chunk_size)


def exact_kl_unchecked(
    policy_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    mask: torch.Tensor | None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """:func:`exact_kl` for a caller that has already checked the logits and made ``mask`` boolean."""
    rows = chunk_rows(policy_logits.shape[-1], chunk_size)
    return _ExactKL.apply(policy_logits, reference_logits, mask, rows)


def naive_exact_kl(
    policy_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Baseline: ``F.kl_div(log_softmax(ref), log_softmax(pol), log_target=True).sum(-1)``.

    The textbook recipe, in the logits' own dtype. It materialises two (B, T, V) log-softmax tensors and
    the (B, T, V) elementwise terms. A token impossible under both models gives NaN (``exp(-inf) *
    (-inf - -inf)``), unlike ``exact_kl``. Used by the tests and the benchmark; like
    ``naive_logprobs_for_tokens``, it does not scan the logits for NaN.

    Parameters
    ----------
    policy_logits, reference_logits : Tensor, shape (B, T, V)
    attention_mask : Tensor, shape (B, T), optional
        The result is set to 0 where it is 0.

    Returns
    -------
    Tensor, shape (B, T)
    """
    policy_logits = check_logits(policy_logits, "policy_logits")
    reference_logits = check_logits(reference_logits, "reference_logits")
    check_same_shape(policy_logits, "policy_logits", reference_logits, "reference_logits")
    logp = F.log_softmax(policy_logits, dim=-1)  # (B, T, V)
    logq = F.log_softmax(reference_logits, dim=-1)  # (B, T, V)
    kl = F.kl_div(logq, logp, log_target=True, reduction="none").sum(-1)  # (B, T)
    if attention_mask is not None:
        mask = check_mask(attention_mask, "attention_mask", policy_logits.shape[:-1])
        kl = kl.masked_fill(~mask, 0.0)
    return kl
