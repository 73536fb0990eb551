r"""Log-probabilities of chosen tokens and the exact per-position KL, without a (B, T, V) copy.

Book section 12, "Diagnostics and practice: log-probs at scale".

Every KL penalty starts from log-probabilities. For a position whose logits are
:math:`z \in \mathbb{R}^V`, sampled at temperature :math:`\tau` (1 unless said), the log-probability of
token :math:`y` is

.. math:: \log \pi(y) = z_y / \tau - \operatorname{LSE}(z / \tau), \qquad
          \operatorname{LSE}(x) = m + \log \sum_v e^{x_v - m}, \quad m = \max_v x_v .

The textbook recipe ``log_softmax(logits / temperature).gather(-1, tokens)`` is correct but writes a
second tensor as large as the logits, shape (B, T, V), only to read one entry per position back out of it
(and ``logits / temperature`` writes a third); autograd then keeps that tensor for the backward pass. At
an LLM's vocabulary that copy is gigabytes (4 x 1024 x 128,256 float32 logits are 2.1 GB). The functions
here compute the same numbers one cache-sized chunk of positions at a time (``CHUNK_BYTES``, about 2 MiB
of float32 work):

1. copy the chunk to float32 if it is half precision, and divide it by the temperature (one chunk, never
   the whole tensor);
2. normalise it, :math:`x - \operatorname{LSE}(x)`, into a small buffer that is reused by every chunk
   and stays in the CPU's cache;
3. keep the chosen tokens' entries (one number, or K, per position) and move on.

``exact_kl`` sums :math:`\mathrm{KL}(\pi \| \pi_{\mathrm{ref}}) = \sum_v p_v (\log p_v - \log q_v)`
in the same way. Both are ``torch.autograd.Function``\ s whose backward recomputes the softmax chunk by
chunk instead of storing it, so the only (B, T, V) tensor they allocate is the gradient itself.

``naive_logprobs_for_tokens`` and ``naive_exact_kl`` are the baselines (the textbook recipes); the tests
check that the lean versions agree with them and ``python -m kltutorial.studies.bench`` measures both.

Shapes: B batch, T tokens, V vocabulary. Every function takes logits of any leading shape, (..., V):
(B, T, V) in a trainer, (N, V) for a flattened batch (verl's layout).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx, once_differentiable

from kltutorial._validation import (
    check_logits,
    check_mask,
    check_positive,
    check_positive_int,
    check_same_shape,
    check_token_index,
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


def _unravel(i: int, shape: torch.Size) -> tuple[int, ...]:
    """The index into the leading ``shape`` of row ``i`` of its row-major flattening."""
    index = []
    for size in reversed(shape):
        i, rest = divmod(i, size)
        index.append(rest)
    return tuple(reversed(index))


def _raise_if_bad_rows(probe: torch.Tensor, x: torch.Tensor, name: str, temperature: float = 1.0) -> None:
    """``probe`` (N,) holds one log-softmax entry per row of ``x`` (..., V); NaN marks a row not valid."""
    bad = torch.isnan(probe)
    if not bool(bad.any()):
        return
    index = _unravel(int(torch.nonzero(bad)[0]), x.shape[:-1])
    where = f"b={index[0]}, t={index[1]}" if len(index) == 2 else "[" + ", ".join(map(str, index)) + "]"
    row = x[index]  # (V,), a view
    if bool(torch.isnan(row).any()):
        raise ValueError(f"{name} contains NaN (at position {where})")
    if bool(torch.isposinf(row).any()):
        raise ValueError(
            f"{name} contains +inf (at position {where}); only -inf (an impossible token) is allowed"
        )
    if bool((row > -torch.inf).any()):  # a valid row that dividing by the temperature sent to +-inf
        raise ValueError(
            f"{name} / temperature overflows at position {where} (temperature={temperature}); "
            "use a larger temperature or smaller logits"
        )
    raise ValueError(
        f"{name} is -inf for every token at position ({where}); at least one token must be possible"
    )


def _compute_dtype(*xs: torch.Tensor) -> torch.dtype:
    """float64 stays float64; everything else (float32, float16, bfloat16) is computed in float32."""
    return torch.float64 if any(x.dtype == torch.float64 for x in xs) else torch.float32


def _row_blocks(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Tensors of one shape (..., V) as 2-D (rows, V) views, block by block in row-major order.

    One block when the leading dimensions can be merged without a copy; otherwise (e.g.
    ``logits[:, :-1]``) one block per index of the first dimension, recursively, so nothing is copied.
    """
    V = tensors[0].shape[-1]
    try:
        return [[x.view(-1, V) for x in tensors]]
    except RuntimeError:
        return [block for i in range(tensors[0].shape[0]) for block in _row_blocks([x[i] for x in tensors])]


def _row_chunks(
    tensors: list[torch.Tensor], rows: int
) -> Iterator[tuple[int, int, list[torch.Tensor]]]:
    """Yield ``(start, stop, views)``: rows ``start:stop`` of the tensors flattened to (N, V), as views."""
    offset = 0
    for block in _row_blocks(tensors):
        n_rows = block[0].shape[0]
        for start in range(0, n_rows, rows):
            stop = min(start + rows, n_rows)
            yield offset + start, offset + stop, [b[start:stop] for b in block]
        offset += n_rows


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


def _scaled(z: torch.Tensor, dtype: torch.dtype, temperature: float, buf: torch.Tensor) -> torch.Tensor:
    """``z / temperature`` in ``dtype``: ``z`` itself if nothing is to be done, else written into ``buf``.

    A half-precision chunk is copied to float32 first and then divided, in float32; a float32 chunk is
    divided as the libraries' ``logits / temperature`` is. The (log-)softmax of the result may then be
    written over it (``out=buf``): each entry is read before it is overwritten, so this is exact and saves
    a second buffer.
    """
    if z.dtype == dtype:
        return z if temperature == 1.0 else torch.div(z, temperature, out=buf)
    buf.copy_(z)
    return buf if temperature == 1.0 else buf.div_(temperature)


# ----------------------------------------------------------------------------------------------------
# Log-probabilities of chosen tokens


class _TokenLogprobs(torch.autograd.Function):
    """log pi(y) = log_softmax(z / tau)_y per chunk, for K ids y per position; backward
    d log pi(y) / dz = (onehot(y) - softmax(z / tau)) / tau."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, logits: torch.Tensor, ids: torch.Tensor, temperature: float, rows: int
    ) -> torch.Tensor:
        V, K = logits.shape[-1], ids.shape[-1]  # logits (..., V), ids (..., K)
        dtype = _compute_dtype(logits)
        flat_ids = ids.reshape(-1, K)  # (N, K), N positions
        N = flat_ids.shape[0]
        out = torch.empty(N, K, dtype=dtype, device=logits.device)  # (N, K)
        buf = _Buffers(1, min(rows, N), V, dtype, logits.device)
        for start, stop, (z,) in _row_chunks([logits], rows):
            n = stop - start
            # 1. one cache-sized chunk of z / tau in the reused buffer (a half-precision chunk is copied
            #    there as float32 first; a float32 chunk at tau = 1 is read where it lies)
            x = _scaled(z, dtype, temperature, buf[0, n])
            # 2. normalise it, x - LSE(x), into the buffer (in place if x is already there)
            logp = torch.log_softmax(x, dim=-1, out=buf[0, n])
            # 3. keep only the chosen tokens' entries
            torch.gather(logp, 1, flat_ids[start:stop], out=out[start:stop])
        # a bad row (NaN, +inf, all -inf) has an all-NaN log-softmax; a valid one never has a NaN entry
        _raise_if_bad_rows(out[:, 0], logits, "logits", temperature)
        ctx.save_for_backward(logits, ids)
        ctx.temperature, ctx.rows = temperature, rows
        return out.view(ids.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, ids = ctx.saved_tensors
        V, K = logits.shape[-1], ids.shape[-1]
        dtype, tau = _compute_dtype(logits), ctx.temperature
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # (..., V)
        go = grad_out.reshape(-1, K).to(dtype)  # (N, K)
        go_sum = go.sum(dim=1, keepdim=True)  # (N, 1): the softmax term is shared by the K ids
        flat_ids = ids.reshape(-1, K)
        buf = _Buffers(1, min(ctx.rows, go.shape[0]), V, dtype, logits.device)
        for start, stop, (z, g) in _row_chunks([logits, grad], ctx.rows):
            n = stop - start
            # float32/64 gradients are written straight into the output chunk; half precision goes
            # through the float32 buffer
            s = g if g.dtype == dtype else buf[0, n]
            # -softmax(z / tau) * sum_k grad_out_k ...
            torch.softmax(_scaled(z, dtype, tau, buf[0, n]), dim=-1, out=s)
            s.mul_(-go_sum[start:stop])
            # ... + sum_k onehot(y_k) * grad_out_k ...
            s.scatter_add_(1, flat_ids[start:stop], go[start:stop])
            # ... times d(z / tau) / dz = 1 / tau
            if tau != 1.0:
                s.div_(tau)
            if s is not g:
                g.copy_(s)
        return grad, None, None, None


def get_logprobs_for_tokens(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Log-probability of each chosen token: ``log_softmax(logits / temperature)`` at ``tokens``.

    .. math:: \\log \\pi(y_{b,t}) = z_{b,t,y_{b,t}} / \\tau - \\log \\sum_v \\exp(z_{b,t,v} / \\tau)

    Equivalent to ``naive_logprobs_for_tokens`` but never allocates a tensor the size of the logits: the
    log-softmax is computed for one cache-sized chunk of positions at a time, into a reused buffer, and
    only the chosen tokens' entries are kept. The naive equivalent, for one id per position::

        torch.gather((logits / temperature).log_softmax(-1), -1, tokens.unsqueeze(-1)).squeeze(-1)

    and for K ids per position ``torch.gather((logits / temperature).log_softmax(-1), -1, tokens)``.

    Parameters
    ----------
    logits : Tensor, shape (..., V)
        Unnormalised scores, of any leading shape ((B, T, V), (N, V), ...). ``-inf`` marks a token that is
        impossible (masked out of the vocabulary); NaN, ``+inf`` and a position whose logits are all
        ``-inf`` raise ``ValueError``, naming the position.
    tokens : Tensor, shape (...) or (..., K), integer
        Token ids in ``[0, V)``: one per position (the logits' leading shape), or K >= 1 per position
        (e.g. a top-K). The shape decides: ``tokens.shape == logits.shape[:-1]`` is one id per position,
        ``tokens.shape[:-1] == logits.shape[:-1]`` is K ids; anything else raises ``ValueError``.
    temperature : float
        :math:`\\tau > 0`; the logits are divided by it, as the libraries' ``logits / temperature``
        (computed per chunk, in float32 for half precision, so no divided copy of the logits is made).
    chunk_size : int, optional
        Positions per chunk; by default ``chunk_rows(V)`` (about ``CHUNK_BYTES`` of float32 work).

    Returns
    -------
    Tensor, the shape of ``tokens``
        Log-probabilities (<= 0; ``-inf`` for an impossible token). float64 for float64 logits, float32
        otherwise (float16/bfloat16 logits are upcast one chunk at a time). Differentiable w.r.t.
        ``logits``; the backward recomputes the softmax chunk by chunk
        (:math:`\\partial \\log \\pi(y) / \\partial z = (\\mathrm{onehot}(y) - \\mathrm{softmax}(z/\\tau))
        / \\tau`).

    Notes
    -----
    Numerically stable: the log-sum-exp subtracts each row's maximum, so logits of any finite size work
    (the log of a softmax would underflow to ``-inf``). Bad rows (NaN, ``+inf``, all ``-inf``) are found
    from the normalised rows themselves, at no extra pass over the logits. The loop makes one library call
    per chunk; with several OpenMP threads on a busy machine each call may wait for a thread to be
    scheduled (see :mod:`kltutorial.studies.bench`), which one thread avoids.

    The libraries return log-probs in the logits' own dtype: TRL's ``selective_log_softmax``
    (``trl/trainer/utils.py``), verl's ``logprobs_from_logits_v2`` (``verl/utils/torch_functional.py``)
    and OpenRLHF's ``log_probs_from_logits`` (``openrlhf/models/utils.py``) gather the chosen logit and
    subtract a row-wise log-sum-exp for float32 logits (verl and OpenRLHF use flash-attn's cross entropy
    instead when it is installed), and run ``log_softmax`` one sequence at a time for half precision, so
    bfloat16 logits give bfloat16 log-probs (8 bits of mantissa, about 0.4 % relative error) that then go
    into the KL. OpenRLHF and TRL's GRPO divide the logits by the temperature in the logits' dtype (OpenRLHF
    in place, overwriting the caller's logits). Here every chunk is computed in float32 (float64 stays
    float64); :mod:`kltutorial.compat` rounds the result to the logits' dtype where the libraries return it.

    Examples
    --------
    >>> logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0]]])
    >>> get_logprobs_for_tokens(logits, torch.tensor([[2]]))  # log(1/4)
    tensor([[-1.3863]])
    >>> z = torch.log(torch.tensor([[1.0, 3.0]]))  # (N, V) = (1, 2): p = (1/4, 3/4)
    >>> get_logprobs_for_tokens(z, torch.tensor([[1, 0]]))  # K = 2 ids: log 3/4, log 1/4
    tensor([[-0.2877, -1.3863]])
    >>> get_logprobs_for_tokens(z, torch.tensor([0]), temperature=0.5)  # p ~ (1, 9): log(1/10)
    tensor([-2.3026])
    """
    logits = check_logits(logits, "logits", ndim=None)
    ids, single = check_token_index(tokens, "tokens", logits.shape)
    temperature = check_positive(temperature, "temperature")
    out = _TokenLogprobs.apply(logits, ids.long(), temperature, chunk_rows(logits.shape[-1], chunk_size))
    return out.squeeze(-1) if single else out


def logprobs_for_tokens_unchecked(
    logits: torch.Tensor, tokens: torch.Tensor, chunk_size: int | None = None
) -> torch.Tensor:
    """:func:`get_logprobs_for_tokens` (one id per position, temperature 1) for a caller that has already
    checked ``logits`` and ``tokens``."""
    ids = tokens.long().unsqueeze(-1)
    return _TokenLogprobs.apply(logits, ids, 1.0, chunk_rows(logits.shape[-1], chunk_size)).squeeze(-1)


def naive_logprobs_for_tokens(
    logits: torch.Tensor, tokens: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """Baseline (the textbook recipe): ``log_softmax(logits / temperature, -1).gather(-1, tokens)``.

    Computed in the logits' own dtype, as the handbook's and most tutorials' code does (and verl's
    ``logprobs_from_logits_naive``); it materialises the full (..., V) log-softmax (and autograd keeps it
    for the backward). Used by the tests and the benchmark as the reference that
    ``get_logprobs_for_tokens`` must match. Shapes, token ids and the temperature are checked as there, but
    the logits are not scanned for NaN (that would change what the benchmark measures).

    Parameters
    ----------
    logits : Tensor, shape (..., V)
    tokens : Tensor, shape (...) or (..., K), integer
    temperature : float

    Returns
    -------
    Tensor, the shape of ``tokens``, the logits' dtype
    """
    logits = check_logits(logits, "logits", ndim=None)
    ids, single = check_token_index(tokens, "tokens", logits.shape)
    temperature = check_positive(temperature, "temperature")
    if temperature != 1.0:
        logits = logits / temperature  # (..., V): a second copy
    logp = F.log_softmax(logits, dim=-1)  # (..., V): the copy the lean version avoids
    out = logp.gather(-1, ids.long())
    return out.squeeze(-1) if single else out


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
    """KL(pi || pi_ref) per position, chunked, of p = softmax(z / tau) and q = softmax(w / tau); backward
    p * (log p - log q - KL) / tau and (q - p) / tau."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        policy_logits: torch.Tensor,
        reference_logits: torch.Tensor,
        mask: torch.Tensor | None,
        temperature: float,
        rows: int,
    ) -> torch.Tensor:
        V = policy_logits.shape[-1]  # logits (..., V), N positions
        N = policy_logits.numel() // V
        dtype = _compute_dtype(policy_logits, reference_logits)
        device = policy_logits.device
        kl = torch.empty(N, dtype=dtype, device=device)  # (N,)
        probe = torch.empty(2, N, dtype=dtype, device=device)  # one log-prob per row, to find NaN
        buf = _Buffers(4, min(rows, N), V, dtype, device)
        for start, stop, (z, w) in _row_chunks([policy_logits, reference_logits], rows):
            n = stop - start
            # 1. log p, p and log q of one cache-sized chunk, into reused buffers
            x = _scaled(z, dtype, temperature, buf[0, n])
            logp = torch.log_softmax(x, dim=-1, out=buf[1, n])
            p = torch.softmax(x, dim=-1, out=buf[3, n])
            logq = torch.log_softmax(_scaled(w, dtype, temperature, buf[0, n]), dim=-1, out=buf[2, n])
            probe[0, start:stop], probe[1, start:stop] = logp[:, 0], logq[:, 0]
            # 2. KL = sum_v p_v (log p_v - log q_v); diff overwrites log q
            diff = logq.neg_().add_(logp)
            kl_chunk = kl[start:stop]
            torch.sum(p.mul_(diff), dim=-1, out=kl_chunk)  # in place: no chunk-sized temporary
            # 3. rows with an impossible token (p_v = 0) need 0 log 0 = 0 spelled out
            _fix_nan_rows(kl_chunk, logp, diff)
        _raise_if_bad_rows(probe[0], policy_logits, "policy_logits", temperature)
        _raise_if_bad_rows(probe[1], reference_logits, "reference_logits", temperature)
        kl.clamp_(min=0.0)  # KL >= 0; rounding can leave a sum of mixed-sign terms a hair below 0
        if mask is not None:
            kl.masked_fill_(~mask.reshape(-1), 0.0)
        ctx.save_for_backward(policy_logits, reference_logits, mask, kl)
        ctx.temperature, ctx.rows = temperature, rows
        return kl.view(policy_logits.shape[:-1])

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, y, mask, kl = ctx.saved_tensors
        need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        V, tau = x.shape[-1], ctx.temperature
        dtype = kl.dtype
        go = grad_out.reshape(-1, 1).to(dtype)  # (N, 1)
        if tau != 1.0:
            go = go / tau  # d(z / tau) / dz = 1 / tau, folded into the incoming gradient
        padding = None if mask is None else ~mask.reshape(-1, 1)
        gx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if need_x else None  # (..., V)
        gy = torch.empty(y.shape, dtype=y.dtype, device=y.device) if need_y else None
        outs = [g for g in (gx, gy) if g is not None]
        buf = _Buffers(5, min(ctx.rows, go.shape[0]), V, dtype, x.device)
        for start, stop, views in _row_chunks([x, y, *outs], ctx.rows):
            n = stop - start
            z, w, grads = views[0], views[1], views[2:]
            g_row = go[start:stop]
            zs = _scaled(z, dtype, tau, buf[0, n])
            p = torch.softmax(zs, dim=-1, out=buf[1, n])
            if need_x:
                logp = torch.log_softmax(zs, dim=-1, out=buf[3, n])
            ws = _scaled(w, dtype, tau, buf[0, n])
            if need_y:
                # dKL/dw_v = (q_v - p_v) / tau
                q = torch.softmax(ws, dim=-1, out=buf[2, n])
                t = q.sub_(p).mul_(g_row)
                if padding is not None:
                    t.masked_fill_(padding[start:stop], 0.0)
                grads[-1].copy_(t)
            if need_x:
                # dKL/dz_v = p_v (log p_v - log q_v - KL) / tau, and 0 where p_v = 0
                logq = torch.log_softmax(ws, dim=-1, out=buf[4, n])
                t = logq.neg_().add_(logp).sub_(kl[start:stop, None]).mul_(p).mul_(g_row)
                t.masked_fill_(p == 0, 0.0)
                if padding is not None:
                    t.masked_fill_(padding[start:stop], 0.0)
                grads[0].copy_(t)
        return gx, gy, None, None, None


def exact_kl(
    policy_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Exact KL(pi || pi_ref) over the whole vocabulary at every position (the ``full`` estimator).

    .. math:: \\mathrm{KL}_{b,t} = \\sum_{v=1}^{V} p_v (\\log p_v - \\log q_v), \\qquad
              p = \\mathrm{softmax}(z_{b,t} / \\tau), \\; q = \\mathrm{softmax}(w_{b,t} / \\tau)

    Equivalent to ``naive_exact_kl`` (away from impossible tokens) but summed over cache-sized chunks of
    positions, so no tensor the size of the logits is allocated.

    Parameters
    ----------
    policy_logits : Tensor, shape (..., V)
        Logits z of the policy pi, of any leading shape ((B, T, V), (N, V), ...). ``-inf`` marks an
        impossible token.
    reference_logits : Tensor, shape (..., V)
        Logits w of the reference pi_ref, same shape.
    attention_mask : Tensor, shape (...), optional
        The logits' leading shape: 1 for a real token, 0 for padding; the result is exactly 0 at padding.
    temperature : float
        :math:`\\tau > 0`, dividing both models' logits, as the libraries divide the policy's and the
        reference's logits by the same sampling temperature (computed per chunk, in float32 for half
        precision).
    chunk_size : int, optional
        Positions per chunk; by default ``chunk_rows(V)``.

    Returns
    -------
    Tensor, shape (...)
        KL in nats, >= 0 (float64 if either input is float64, else float32).

    Notes
    -----
    Impossible tokens follow the convention 0 log 0 = 0: a token impossible under both models
    contributes 0 (``naive_exact_kl`` returns NaN there). A token possible under pi but impossible under
    pi_ref makes the KL ``+inf``; that is the true value, not an error, since pi puts mass where pi_ref
    puts none. NaN, ``+inf`` logits and a position whose logits are all ``-inf`` raise ``ValueError``.

    The gradient is w.r.t. both logits: :math:`\\partial \\mathrm{KL} / \\partial z_v = p_v
    (\\log p_v - \\log q_v - \\mathrm{KL}) / \\tau` and :math:`\\partial \\mathrm{KL} / \\partial w_v =
    (q_v - p_v) / \\tau`, recomputed chunk by chunk in the backward (not finite where the KL is infinite).

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
    >>> exact_kl(z[0, 0], w[0, 0], temperature=0.5)  # (V,): p = (1/2, 1/2), q = (1/10, 9/10)
    tensor(0.5108)
    """
    policy_logits = check_logits(policy_logits, "policy_logits", ndim=None)
    reference_logits = check_logits(reference_logits, "reference_logits", ndim=None)
    check_same_shape(policy_logits, "policy_logits", reference_logits, "reference_logits")
    temperature = check_positive(temperature, "temperature")
    mask = None
    if attention_mask is not None:
        mask = check_mask(attention_mask, "attention_mask", policy_logits.shape[:-1])
    return exact_kl_unchecked(policy_logits, reference_logits, mask, chunk_size, temperature=temperature)


def exact_kl_unchecked(
    policy_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    mask: torch.Tensor | None,
    chunk_size: int | None = None,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """:func:`exact_kl` for a caller that has already checked the logits and made ``mask`` boolean."""
    rows = chunk_rows(policy_logits.shape[-1], chunk_size)
    return _ExactKL.apply(policy_logits, reference_logits, mask, temperature, rows)


def naive_exact_kl(
    policy_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Baseline: ``F.kl_div(log_softmax(ref / tau), log_softmax(pol / tau), log_target=True).sum(-1)``.

    The textbook recipe, in the logits' own dtype. It materialises two (..., V) log-softmax tensors and
    the (..., V) elementwise terms. A token impossible under both models gives NaN (``exp(-inf) *
    (-inf - -inf)``), unlike ``exact_kl``. Used by the tests and the benchmark; like
    ``naive_logprobs_for_tokens``, it does not scan the logits for NaN.

    Parameters
    ----------
    policy_logits, reference_logits : Tensor, shape (..., V)
    attention_mask : Tensor, shape (...), optional
        The result is set to 0 where it is 0.
    temperature : float

    Returns
    -------
    Tensor, shape (...)
    """
    policy_logits = check_logits(policy_logits, "policy_logits", ndim=None)
    reference_logits = check_logits(reference_logits, "reference_logits", ndim=None)
    check_same_shape(policy_logits, "policy_logits", reference_logits, "reference_logits")
    temperature = check_positive(temperature, "temperature")
    if temperature != 1.0:
        policy_logits, reference_logits = policy_logits / temperature, reference_logits / temperature
    logp = F.log_softmax(policy_logits, dim=-1)  # (..., V)
    logq = F.log_softmax(reference_logits, dim=-1)  # (..., V)
    kl = F.kl_div(logq, logp, log_target=True, reduction="none").sum(-1)  # (...)
    if attention_mask is not None:
        mask = check_mask(attention_mask, "attention_mask", policy_logits.shape[:-1])
        kl = kl.masked_fill(~mask, 0.0)
    return kl
