r"""Log-probs, entropy and exact KL straight from the last hidden states, and across a split vocabulary.

Book section 12, "Log-probabilities at scale: from the hidden states".

A language model's next-token logits are :math:`z = h W^\top` for the last hidden state
:math:`h \in \mathbb{R}^H` of a position and the output embedding (the unembedding, ``lm_head``)
:math:`W \in \mathbb{R}^{V \times H}`. The functions of :mod:`kltutorial.logprobs` start from the logits
and avoid their log-softmax copy, but at an LLM's vocabulary the logits themselves are the problem:
4 x 1024 x 128,256 float32 logits are 2.1 GB, for the policy and again for the reference, and once more
for their gradient. The functions here never build them. They walk the (positions x vocabulary) grid one
tile at a time:

1. the tile's logits ``hidden[rows] @ weight[cols].T / temperature`` (``rows`` x ``cols`` numbers, a
   few MiB, reused by every tile);
2. per position, a running maximum :math:`m`, a running sum :math:`s = \sum_v e^{x_v - m}` and, for the
   entropy, :math:`u = \sum_v e^{x_v - m} (x_v - m)`, each rescaled when a later tile raises the maximum
   (the online log-sum-exp of flash attention): when :math:`m` grows to :math:`m'`,
   :math:`s \leftarrow e^{m - m'} s` and :math:`u \leftarrow e^{m - m'} (u + s (m - m'))`;
3. the chosen token's logit, read from the tile that holds it.

Then :math:`\log \pi(y) = x_y - m - \log s` and the entropy is :math:`\log s - u / s`. The exact
:math:`\mathrm{KL}(\pi \| \pi_{\mathrm{ref}})` keeps the same statistics for both models' tiles (the
reference has its own hidden states and output embedding) plus
:math:`a = \sum_v e^{x_v - m} \big((x_v - m) - (y_v - m_{\mathrm{ref}})\big)`, so that
:math:`\mathrm{KL} = a / s - \log s + \log s_{\mathrm{ref}}`. Every term is measured from the running
maxima, so large logits do not cancel (logits of :math:`\pm 10^4` give finite, accurate results).

The backward pass recomputes each tile from the saved per-position log-sum-exp (and entropy or KL): for
the log-probs and entropy,

.. math:: \frac{\partial \ell}{\partial x_v} = g_{\log\pi} (\mathbf{1}[v = y] - p_v)
          - g_H \, p_v (\log p_v + H),

for the KL, :math:`g \, p_v (\log p_v - \log q_v - \mathrm{KL})`; each tile's gradient ``G`` (divided by the
temperature) becomes ``G @ weight[cols]`` for the hidden states and ``G.T @ hidden[rows]`` for the
weight, and is dropped. It loops over the vocabulary outside and the positions inside, so each weight
tile's gradient is complete (and written once) before the next. The extra memory is a few tiles,
whatever V: no (B, T, V) tensor exists, forward or backward. The price is one more matrix product
than the unfused forward + backward (the backward recomputes the logits): four instead of three.

**Vocabulary split over processes** (``group``, a ``torch.distributed`` process group, as Megatron's
tensor parallelism splits the output embedding). Each rank holds a contiguous slice of the vocabulary,
in rank order (rank 0 the first ids); the hidden states and the token ids (global ids) are the same on
every rank. Each rank runs the tiles of its own slice, then one ``all_gather`` exchanges the
per-position statistics, and every rank combines them in the same order into the full result.

What each position costs in communication. Forward: every rank sends 4 numbers per position for the
log-probs and entropy (its running maximum, sum and entropy sum, and the chosen logit where it owns the
token, else 0), 5 for the KL (both models' maxima and sums, and :math:`a`), and receives those of the
R - 1 others. Megatron's vocab-parallel cross-entropy makes three all-reduces of one number per position
instead (MAX of the maxima, SUM of the chosen logits, SUM of the sums; its fused variant concatenates the
last two), and so does Cut Cross-Entropy's vocab-parallel mode; verl's ``linear_cross_entropy`` (v0.9.0)
also makes three: first the maxima of every 1,024-token split of the rank's own slice, about V / (1024 R)
numbers per position (63 at V = 128,000 and R = 2, more than the gather's 4; fewer as R grows), then the
chosen log-probs, then two sums. The gather's volume grows with R (4 (R - 1) numbers received per
position, against about 6 (R - 1) / R for Megatron's three ring all-reduces, which carry the log-probs
only, no entropy), so the all-reduces move less at every R >= 2. Either way it is small beside the
backward: each rank computes its own slice's weight gradient locally, and one ``all_reduce`` sums the
hidden states' gradient, H numbers per position (Megatron and verl do the same sum, outside the loss, in
the backward of the column-parallel output layer; Cut Cross-Entropy does it inside). Every rank must then
receive the same upstream gradient (as when each rank computes the same loss from the replicated result).
Before any of this, one small ``all_gather_object`` checks that the ranks agree (shapes, temperature, the
same hidden states and tokens, slices that cover the vocabulary), so that a bad input fails on every rank
at once with the same message, never as a hang. It is counted here, and it is not free: a float64 copy of
the hidden states for their fingerprint, a pickled dictionary per rank and a host synchronisation on every
call, so a forward call makes two exchanges (this check, then the gather of the statistics), not one.

**What the libraries do** (on GPUs, in Triton, except where said). verl's ``linear_cross_entropy``
(``verl/utils/kernel/linear_cross_entropy.py``, kernels in ``kernels.py``) takes the hidden states,
the ``lm_head`` weight, the labels, a temperature and an optional tensor-parallel group, tiles positions
x vocabulary with a running maximum, sum and :math:`\sum_v z_v e^{z_v}`, returns per-token log-probs
and entropy, and recomputes the logits in the backward; verl's default fused path for FSDP is plain
PyTorch that chunks positions only (``FusedLinearForPPO``). Liger Kernel's fused linear cross-entropy
chunks positions only, builds each chunk's full-vocabulary logits, and computes the gradients of the
hidden states and the weight during the forward pass (it returns the loss, per token with
``reduction="none"``: the negative log-probs, no entropy, no temperature); its GRPO loss computes
per-token log-probs from the hidden states in positions x vocabulary chunks with an online log-sum-exp,
in PyTorch, and penalises the k3 estimate of the KL. Apple's Cut Cross-Entropy computes the chosen
logit with an indexed dot product and the log-sum-exp block by block in on-chip memory, and its
backward recomputes the blocks and skips those whose softmax entries are all below a threshold
(``filter_eps``, by default the dtype's eps / 32). prime-rl's ``FusedOutputLinear`` chunks positions and
vocabulary in PyTorch and returns log-probs and entropy, with a backward for the log-probs only. verl's
``vocab_parallel_log_probs_from_logits`` and ``vocab_parallel_entropy`` and Megatron's vocab-parallel
cross-entropy start from each rank's slice of the logits, and Megatron keeps the slice's softmax for the
backward. The functions here are plain PyTorch on the CPU, written for reading and for exact tests; the
entropy's backward is implemented, and nothing is skipped.

Shapes: ``hidden`` (..., H), ``weight`` (V, H) (each rank's (V_r, H) slice with a ``group``), ``tokens``
(...) with the leading shape of ``hidden``. float64 is computed in float64; float32, float16 and bfloat16
in float32, one tile at a time (the results are float32).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx, once_differentiable

from kltutorial._validation import check_positive, check_positive_int, check_token_ids

__all__ = [
    "TILE_ROWS",
    "TILE_COLS",
    "tile_shape",
    "linear_logprobs",
    "linear_exact_kl",
    "naive_linear_logprobs",
    "naive_linear_exact_kl",
]

#: Positions per tile by default.
TILE_ROWS = 256
#: Vocabulary entries per tile by default: with :data:`TILE_ROWS`, a 1 MiB float32 tile of logits, small
#: enough to stay in a core's L2 cache while it is normalised, large enough that each matrix product runs
#: near the machine's peak. ``python -m kltutorial.studies.bench --linear --sweep`` times other sizes.
TILE_COLS = 1024


def tile_shape(chunk_size: int | tuple[int, int] | None = None) -> tuple[int, int]:
    """(positions, vocabulary entries) per tile: ``chunk_size`` if a pair, ``(chunk_size, TILE_COLS)`` if
    an int, ``(TILE_ROWS, TILE_COLS)`` if None.

    Examples
    --------
    >>> tile_shape(), tile_shape(64), tile_shape((32, 4096))
    ((256, 1024), (64, 1024), (32, 4096))
    """
    if chunk_size is None:
        return TILE_ROWS, TILE_COLS
    if isinstance(chunk_size, tuple | list):
        if len(chunk_size) != 2:
            raise ValueError(
                f"chunk_size must be an int or a pair (positions, vocabulary), got {chunk_size!r}"
            )
        return (check_positive_int(chunk_size[0], "chunk_size[0]"),
                check_positive_int(chunk_size[1], "chunk_size[1]"))
    return check_positive_int(chunk_size, "chunk_size"), TILE_COLS


# ----------------------------------------------------------------------------------------------------
# Input checks


def _shape(x: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in x.shape) + ")"


def _check_matrix_pair(hidden: object, h_name: str, weight: object, w_name: str) -> None:
    """hidden (..., H) and weight (V, H): float tensors of one dtype and device, finite, non-empty."""
    for x, name, want in ((hidden, h_name, "(..., H)"), (weight, w_name, "(V, H)")):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor {want}, got {type(x).__name__}")
        if not torch.is_floating_point(x):
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    assert isinstance(hidden, torch.Tensor) and isinstance(weight, torch.Tensor)
    if hidden.dim() < 1:
        raise ValueError(f"{h_name} must have shape (..., H), got a 0-d tensor")
    if weight.dim() != 2:
        raise ValueError(f"{w_name} must have 2 dimensions (V, H), got shape {_shape(weight)}")
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"{w_name} must have shape (V, {hidden.shape[-1]}) to match the last dimension H of {h_name}, "
            f"got {_shape(weight)}"
        )
    if weight.dtype != hidden.dtype:
        raise TypeError(
            f"{h_name} and {w_name} must have the same dtype, got {hidden.dtype} and {weight.dtype}"
        )
    if weight.device != hidden.device:
        raise ValueError(
            f"{h_name} and {w_name} must be on one device, got {hidden.device} and {weight.device}"
        )
    for x, name in ((hidden, h_name), (weight, w_name)):
        if x.numel() == 0:
            raise ValueError(f"{name} must not be empty, got shape {_shape(x)}")
        # one reduction, no temporary (isfinite would make several the size of the weight); NaN
        # propagates to both ends, +-inf shows as one
        lo, hi = torch.aminmax(x.detach())
        if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
            raise ValueError(f"{name} contains NaN or inf; expected finite values")


def _check_tokens(tokens: object, lead: torch.Size, device: torch.device) -> torch.Tensor:
    tokens = check_token_ids(tokens, "tokens", lead, None, "the leading dimensions of hidden")
    if tokens.device != device:
        raise ValueError(f"tokens must be on the device of hidden ({device}), got {tokens.device}")
    return tokens.reshape(-1).long()


def _check_vocab(tokens: torch.Tensor, vocab: int, vocab_size: int | None, where: str) -> None:
    """Token ids in [0, V); ``vocab_size``, if given, equal to the V the weight (or the shards) hold."""
    if vocab_size is not None and check_positive_int(vocab_size, "vocab_size") != vocab:
        raise ValueError(f"vocab_size is {vocab_size}, but {where} hold V = {vocab} rows")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(
            f"tokens must lie in [0, {vocab}) (the vocabulary {where} hold), got values in [{lo}, {hi}]"
        )


# ----------------------------------------------------------------------------------------------------
# Distributed bookkeeping


@dataclass(frozen=True)
class _Shard:
    """This rank's slice ``[start, stop)`` of the vocabulary, and the group (None: one process)."""

    start: int
    stop: int
    vocab: int
    group: object | None

    @property
    def parallel(self) -> bool:
        return self.group is not None


def _agree(group: object | None, local: dict[str, object], error: Exception | None) -> tuple[list[dict], int]:
    """Exchange every rank's description of its input; raise on every rank if any rank's input is bad.

    Returns the descriptions in rank order and this rank's position in the group.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group is a process group, but torch.distributed is not initialised")
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    local = dict(local, error=None if error is None else f"{type(error).__name__}: {error}")
    gathered: list[dict] = [{} for _ in range(world)]
    dist.all_gather_object(gathered, local, group=group)
    if error is not None:
        raise error
    bad = [r for r, d in enumerate(gathered) if d["error"] is not None]
    if bad:
        raise ValueError(f"rank {bad[0]} of group rejected its input ({gathered[bad[0]]['error']})")
    return gathered, rank


def _describe(hidden: torch.Tensor, tokens: torch.Tensor, temperature: float) -> dict[str, object]:
    """What every rank must agree on, and a fingerprint of its replicated inputs."""
    h = hidden.detach().double()
    return {
        "hidden_shape": tuple(hidden.shape),
        "dtype": str(hidden.dtype),
        "temperature": float(temperature),
        "fingerprint": (float(h.sum()), float(h.square().sum()),
                        int(tokens.sum()), int(tokens.square().sum())),
    }


def _shard(
    group: object | None,
    vocab_rows: list[int],
    described: dict[str, object] | None,
    error: Exception | None,
    names: tuple[str, ...],
) -> _Shard:
    """This rank's slice of the vocabulary (checking that the ranks agree), or the whole of it."""
    if group is None:
        if error is not None:
            raise error
        return _Shard(0, vocab_rows[0], vocab_rows[0], None)
    gathered, rank = _agree(group, dict(described or {}, vocab_rows=vocab_rows), error)
    first = gathered[0]
    for r, d in enumerate(gathered):
        for key, what in (("hidden_shape", f"{names[0]}'s shape"), ("dtype", "the dtype"),
                          ("temperature", "temperature")):
            if d[key] != first[key]:
                raise ValueError(f"{what} differs across the ranks of group: {first[key]} on rank 0, "
                                 f"{d[key]} on rank {r}")
        if d["fingerprint"] != first["fingerprint"]:
            raise ValueError(
                f"{names[0]} and tokens must be the same on every rank of group (replicated); rank {r} "
                "holds different values from rank 0"
            )
    for i in range(1, len(vocab_rows)):  # the reference's slices must match the policy's
        sizes = [d["vocab_rows"][i] for d in gathered]
        if sizes != [d["vocab_rows"][0] for d in gathered]:
            raise ValueError(f"{names[i + 1]} must be split like {names[1]}: slices of "
                             f"{[d['vocab_rows'][0] for d in gathered]} and {sizes} rows on the ranks")
    starts = [sum(d["vocab_rows"][0] for d in gathered[:r]) for r in range(len(gathered) + 1)]
    return _Shard(starts[rank], starts[rank + 1], starts[-1], group)


def _gather_stats(stats: torch.Tensor, shard: _Shard) -> torch.Tensor:
    """(R, N, k): every rank's per-position statistics, in rank order (R = 1 without a group)."""
    if not shard.parallel:
        return stats.unsqueeze(0)
    import torch.distributed as dist

    parts = [torch.empty_like(stats) for _ in range(dist.get_world_size(shard.group))]
    dist.all_gather(parts, stats.contiguous(), group=shard.group)
    return torch.stack(parts)


def _all_reduce(x: torch.Tensor, shard: _Shard) -> None:
    if shard.parallel:
        import torch.distributed as dist

        dist.all_reduce(x, group=shard.group)


# ----------------------------------------------------------------------------------------------------
# Tiles


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class _Tiles:
    """The (positions x vocabulary) grid of one matrix product, walked vocabulary-outer, positions-inner.

    Buffers are allocated once per call and reused by every tile; a half-precision operand is copied to
    float32 one tile at a time.
    """

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, rows: int, cols: int, dtype: torch.dtype,
                 n_buffers: int):
        self.h, self.w, self.dtype = hidden, weight, dtype
        self.N, self.V, H = hidden.shape[0], weight.shape[0], hidden.shape[1]
        self.rows, self.cols = min(rows, self.N), min(cols, self.V)
        self._tiles = torch.empty(n_buffers, self.rows * self.cols, dtype=dtype, device=hidden.device)
        device = hidden.device
        self._h = None if hidden.dtype == dtype else torch.empty(self.rows, H, dtype=dtype, device=device)
        self._w = None if weight.dtype == dtype else torch.empty(self.cols, H, dtype=dtype, device=device)

    def buffer(self, slot: int, n: int, c: int) -> torch.Tensor:
        return self._tiles[slot, : n * c].view(n, c)

    def cols_(self) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(start, stop, weight tile in the compute dtype) for each slice of the vocabulary."""
        for c0 in range(0, self.V, self.cols):
            c1 = min(c0 + self.cols, self.V)
            w = self.w[c0:c1]
            if self._w is not None:
                w = self._w[: c1 - c0].copy_(w)
            yield c0, c1, w

    def rows_(self) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(start, stop, hidden rows in the compute dtype) for each block of positions."""
        for r0 in range(0, self.N, self.rows):
            r1 = min(r0 + self.rows, self.N)
            h = self.h[r0:r1]
            if self._h is not None:
                h = self._h[: r1 - r0].copy_(h)
            yield r0, r1, h

    def logits(self, slot: int, h: torch.Tensor, w: torch.Tensor, temperature: float) -> torch.Tensor:
        """``h @ w.T / temperature`` into buffer ``slot``."""
        x = torch.mm(h, w.t(), out=self.buffer(slot, h.shape[0], w.shape[0]))
        return x if temperature == 1.0 else x.div_(temperature)


_LOG2_E = 1.4426950408889634  # log2(e)


def _exp(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` of a tile into ``out`` (``out`` may be ``x``), as ``2 ** (x log2 e)``.

    On the CPUs measured here ``torch.exp2`` of a float32 tile is four times faster than ``torch.exp``
    (about 0.3 ns against 1.2-1.6 ns per number on one AVX-512 core), fast enough to matter: the forward
    pass takes one exponential per logit, like the unfused ``log_softmax``, whose own kernel is
    vectorised. The product ``x log2 e`` is rounded once (a relative 2^-24 in float32), so each term
    carries a relative error of about ``|x| 2^-24``, below float32's own rounding of ``x`` at the
    arguments that matter (x <= 0 here, and the terms far below 0 add almost nothing).
    """
    return torch.mul(x, _LOG2_E, out=out).exp2_()


class _Gradients:
    """The gradients of ``hidden`` and ``weight`` that a backward pass fills, tile by tile.

    The hidden states' gradient accumulates over the vocabulary slices in the compute dtype; each slice of
    the weight's gradient is complete once its positions are done, and goes straight into the returned
    tensor (through a float32 buffer for half precision).
    """

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, tiles: _Tiles, need_h: bool, need_w: bool):
        dtype, device = tiles.dtype, hidden.device
        self.hidden_dtype = hidden.dtype
        self.h = torch.zeros(hidden.shape, dtype=dtype, device=device) if need_h else None
        self.w = torch.empty(weight.shape, dtype=weight.dtype, device=device) if need_w else None
        self._buf = (torch.empty(tiles.cols, weight.shape[1], dtype=dtype, device=device)
                     if need_w and weight.dtype != dtype else None)
        self._slice: tuple[int, int] = (0, 0)

    def start(self, c0: int, c1: int) -> None:
        """Begin the vocabulary slice ``[c0, c1)``."""
        self._slice = (c0, c1)

    def add(self, G: torch.Tensor, h: torch.Tensor, w: torch.Tensor, r0: int, r1: int) -> None:
        """Add tile ``G`` (positions ``[r0, r1)`` of the current slice): ``G @ w`` and ``G.T @ h``."""
        if self.h is not None:
            self.h[r0:r1].addmm_(G, w)
        if self.w is not None:
            c0, c1 = self._slice
            gw = self.w[c0:c1] if self._buf is None else self._buf[: c1 - c0]
            if r0 == 0:
                torch.mm(G.t(), h, out=gw)
            else:
                gw.addmm_(G.t(), h)

    def end(self) -> None:
        """Finish the current slice (copy a half-precision weight gradient out of its buffer)."""
        if self._buf is not None and self.w is not None:
            c0, c1 = self._slice
            self.w[c0:c1].copy_(self._buf[: c1 - c0])

    def result(self, shard: _Shard) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(gradient of hidden, summed over the ranks of a split vocabulary; gradient of weight)."""
        if self.h is None:
            return None, self.w
        _all_reduce(self.h, shard)  # every rank's slice of the vocabulary contributes
        return self.h.to(self.hidden_dtype), self.w


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise dot product of two (n, c) tensors, without an (n, c) temporary."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def _in_tile(ids: torch.Tensor, c0: int, c1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows whose id lies in [c0, c1), those ids relative to c0)."""
    hit = torch.nonzero((ids >= c0) & (ids < c1)).view(-1)
    return hit, ids[hit] - c0


def _merge(m: torch.Tensor, s: torch.Tensor, u: torch.Tensor | None, m_new: torch.Tensor,
           s_t: torch.Tensor, u_t: torch.Tensor | None) -> None:
    """Fold one tile's (max, sum, entropy sum), measured from ``m_new``, into the running ones, in place."""
    shift = m - m_new  # <= 0
    scale = shift.exp()
    if u is not None:
        u.add_(s * shift).mul_(scale).add_(u_t)
    s.mul_(scale).add_(s_t)
    m.copy_(m_new)


def _combine(m: torch.Tensor, s: torch.Tensor, u: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """(R, N) per-rank statistics, each measured from its own maximum, into (N,) global ones."""
    top = m.amax(0)
    shift = m - top
    scale = shift.exp()
    s_all = (s * scale).sum(0)
    u_all = None if u is None else (scale * (u + s * shift)).sum(0)
    return top, s_all, u_all


# ----------------------------------------------------------------------------------------------------
# Log-probs and entropy


def _logprob_stats(tiles: _Tiles, ids: torch.Tensor, temperature: float, entropy: bool) -> torch.Tensor:
    """(N, 4): running max, sum, entropy sum and the chosen logit (0 where the token is elsewhere)."""
    N, dtype = tiles.N, tiles.dtype
    stats = torch.zeros(N, 4, dtype=dtype, device=ids.device)
    m, s, u, z = (stats[:, i] for i in range(4))
    for c0, c1, w in tiles.cols_():
        for r0, r1, h in tiles.rows_():
            x = tiles.logits(0, h, w, temperature)  # (n, c)
            hit, col = _in_tile(ids[r0:r1], c0, c1)
            z[r0:r1].index_put_((hit,), x[hit, col])
            m_new = x.amax(1) if c0 == 0 else torch.maximum(m[r0:r1], x.amax(1))
            x.sub_(m_new[:, None])
            if entropy:
                e = _exp(x, out=tiles.buffer(1, r1 - r0, c1 - c0))
                s_t, u_t = e.sum(1), _rowdot(e, x)
            else:
                s_t, u_t = _exp(x, out=x).sum(1), None
            if c0 == 0:
                m[r0:r1], s[r0:r1] = m_new, s_t
                if entropy:
                    u[r0:r1] = u_t
            else:
                _merge(m[r0:r1], s[r0:r1], u[r0:r1] if entropy else None, m_new, s_t, u_t)
    return stats


class _LinearLogprobs(torch.autograd.Function):
    """log pi(y) and the entropy from hidden @ weight.T / tau, tile by tile; backward recomputes the tiles."""

    @staticmethod
    def forward(ctx: FunctionCtx, hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor,
                temperature: float, entropy: bool, rows: int, cols: int, shard: _Shard
                ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = _compute_dtype(hidden)
        local = ids - shard.start  # ids relative to this rank's slice; outside [0, V_r) never hit
        tiles = _Tiles(hidden, weight, rows, cols, dtype, 2 if entropy else 1)
        stats = _gather_stats(_logprob_stats(tiles, local, temperature, entropy), shard)  # (R, N, 4)
        top, s, u = _combine(stats[..., 0], stats[..., 1], stats[..., 2] if entropy else None)
        lse = top + s.log()  # (N,): LSE of x = z / tau
        chosen = stats[..., 3].sum(0)  # only the owning rank's entry is not 0
        logp = chosen - lse
        ent = (s.log() - u / s) if entropy else torch.zeros_like(logp)
        if not bool(torch.isfinite(logp).all() & torch.isfinite(ent).all()):
            raise ValueError(
                f"hidden @ weight.T / temperature overflows (temperature={temperature}); "
                "use a larger temperature or smaller inputs"
            )
        ent.clamp_(min=0.0)  # H >= 0; rounding can leave a near-deterministic row a hair below 0
        ctx.save_for_backward(hidden, weight, local, lse, ent)
        ctx.settings = (temperature, entropy, rows, cols, shard)
        if not entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, g_logp: torch.Tensor, g_ent: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, local, lse, ent = ctx.saved_tensors
        temperature, entropy, rows, cols, shard = ctx.settings
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dtype = lse.dtype
        # d/dz = d/dx / tau: fold 1 / tau into the incoming gradients
        ga = g_logp.to(dtype) / temperature  # (N,)
        gb = g_ent.to(dtype) / temperature if entropy else None
        tiles = _Tiles(hidden, weight, rows, cols, dtype, 2)
        grads = _Gradients(hidden, weight, tiles, need_h, need_w)
        for c0, c1, w in tiles.cols_():
            grads.start(c0, c1)
            for r0, r1, h in tiles.rows_():
                x = tiles.logits(0, h, w, temperature).sub_(lse[r0:r1, None])  # log p, (n, c)
                p = _exp(x, out=tiles.buffer(1, r1 - r0, c1 - c0))
                a = ga[r0:r1, None]
                if gb is None:
                    G = p.mul_(a).neg_()  # -g p
                else:  # -g p - g_H p (log p + H)
                    b = gb[r0:r1, None]
                    G = x.add_(ent[r0:r1, None]).mul_(b).add_(a).mul_(p).neg_()
                hit, col = _in_tile(local[r0:r1], c0, c1)
                G.index_put_((hit, col), ga[r0:r1][hit], accumulate=True)  # + g onehot(y)
                grads.add(G, h, w, r0, r1)
            grads.end()
        grad_h, grad_w = grads.result(shard)
        return grad_h, grad_w, None, None, None, None, None, None


def linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_size: int | tuple[int, int] | None = None,
    group: object | None = None,
    vocab_size: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    r"""Log-probabilities of ``tokens`` (and the entropy) under ``softmax(hidden @ weight.T / temperature)``,
    without ever building the logits.

    The same numbers as :func:`naive_linear_logprobs`, ``log_softmax(hidden @ weight.T / temperature)``
    gathered at ``tokens``, computed one tile of positions x vocabulary at a time with a running
    log-sum-exp (see the module docstring); the backward recomputes each tile. No tensor of shape
    (..., V) exists at any point, forward or backward.

    Parameters
    ----------
    hidden : Tensor, shape (..., H)
        The last hidden states (what the output layer reads), any leading shape: (B, T, H), (N, H). The
        same on every rank of ``group``.
    weight : Tensor, shape (V, H)
        The output embedding (``lm_head.weight``), same dtype and device as ``hidden``; with ``group``,
        this rank's contiguous slice (V_r, H) of it, the slices in rank order.
    tokens : Tensor, shape (...), integer
        The chosen token of each position (global ids in ``[0, V)``), the leading shape of ``hidden``.
    temperature : float
        :math:`\tau > 0`; the logits are divided by it (per tile), as the libraries divide theirs.
    return_entropy : bool
        Also return the entropy of each position's next-token distribution, :math:`H = -\sum_v p_v \log p_v`
        (differentiable too).
    chunk_size : int or (int, int), optional
        Positions per tile, or (positions, vocabulary entries); by default :func:`tile_shape`.
    group : torch.distributed process group, optional
        Split the vocabulary over the group's ranks (see the module docstring). Every rank returns the full
        result; the hidden states' gradient is the unsplit computation's (summed over the ranks), each
        rank's weight gradient its own slice's.
    vocab_size : int, optional
        If given, the vocabulary size V that ``weight`` (or the slices together) must hold.

    Returns
    -------
    Tensor, shape (...), or (Tensor, Tensor) with ``return_entropy``
        Log-probs (<= 0), and entropies (>= 0, in nats). float64 for float64 inputs, float32 otherwise.
        Differentiable with respect to ``hidden`` and ``weight``.

    Raises
    ------
    TypeError, ValueError
        For a wrong type, a shape that does not match, NaN or inf in ``hidden`` or ``weight``, a token id
        outside the vocabulary, logits that overflow, or ranks of ``group`` that disagree; the message names
        the argument.

    Notes
    -----
    verl's ``linear_cross_entropy`` (``verl/utils/kernel/linear_cross_entropy.py``) takes the same inputs
    (hidden states, the ``lm_head`` weight, the labels, a temperature, a tensor-parallel group) and
    returns the same two per-token tensors, in Triton on GPUs; Liger Kernel's
    ``LigerFusedLinearCrossEntropyLoss`` returns the negative log-probs (``reduction="none"``) without
    the entropy or a temperature. Here half-precision inputs are computed in float32 one tile at a time,
    so bfloat16 inputs give float32 results, more accurate than a bfloat16 ``log_softmax``.

    Examples
    --------
    >>> hidden = torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # (N, H) = (2, 2)
    >>> weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # (V, H) = (3, 2)
    >>> linear_logprobs(hidden, weight, torch.tensor([0, 1]))  # logits (1, 0, 0) and (0, 2, 0)
    tensor([-0.5514, -0.2395])
    >>> logp, ent = linear_logprobs(hidden, weight, torch.tensor([0, 1]), return_entropy=True)
    >>> ent
    tensor([0.9753, 0.6656])
    """
    temperature = check_positive(temperature, "temperature")
    rows, cols = tile_shape(chunk_size)
    error, ids, described = None, None, None
    try:
        _check_matrix_pair(hidden, "hidden", weight, "weight")
        ids = _check_tokens(tokens, hidden.shape[:-1], hidden.device)
        if group is None:
            _check_vocab(ids, weight.shape[0], vocab_size, "weight")
        else:
            described = _describe(hidden, ids, temperature)
    except (TypeError, ValueError) as err:
        error = err
    shard = _shard(group, [weight.shape[0] if error is None else 0], described, error, ("hidden", "weight"))
    if shard.parallel:
        _check_vocab(ids, shard.vocab, vocab_size, "the slices of weight on the ranks of group")
    lead = hidden.shape[:-1]
    logp, ent = _LinearLogprobs.apply(hidden.reshape(-1, hidden.shape[-1]), weight, ids, temperature,
                                      bool(return_entropy), rows, cols, shard)
    if return_entropy:
        return logp.view(lead), ent.view(lead)
    return logp.view(lead)


def naive_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Baseline (the unfused recipe): ``log_softmax(hidden @ weight.T / temperature).gather(-1, tokens)``.

    In the inputs' own dtype; it builds the (..., V) logits, their log-softmax, and (for the entropy) the
    products ``p * log p``, and autograd keeps them for the backward. The reference that the tests and the
    benchmark compare :func:`linear_logprobs` with; inputs are not checked.

    Returns
    -------
    Tensor, shape (...), or (Tensor, Tensor) with ``return_entropy``
    """
    logits = hidden @ weight.T  # (..., V)
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = F.log_softmax(logits, dim=-1)  # (..., V)
    logp = logp_all.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    if not return_entropy:
        return logp
    return logp, -(logp_all.exp() * logp_all).sum(-1)


# ----------------------------------------------------------------------------------------------------
# Exact KL


def _kl_stats(pol: _Tiles, ref: _Tiles, temperature: float) -> torch.Tensor:
    """(N, 5): running max and sum of both models, and a = sum_v e^(x - m) ((x - m) - (y - m_ref))."""
    stats = torch.zeros(pol.N, 5, dtype=pol.dtype, device=pol.h.device)
    mp, sp, a, mq, sq = (stats[:, i] for i in range(5))
    for (c0, c1, w), (_, _, w_ref) in zip(pol.cols_(), ref.cols_(), strict=True):
        for (r0, r1, h), (_, _, h_ref) in zip(pol.rows_(), ref.rows_(), strict=True):
            n, c = r1 - r0, c1 - c0
            x = pol.logits(0, h, w, temperature)
            y = torch.mm(h_ref, w_ref.t(), out=pol.buffer(1, n, c))
            if temperature != 1.0:
                y.div_(temperature)
            mp_new = x.amax(1) if c0 == 0 else torch.maximum(mp[r0:r1], x.amax(1))
            mq_new = y.amax(1) if c0 == 0 else torch.maximum(mq[r0:r1], y.amax(1))
            x.sub_(mp_new[:, None])
            y.sub_(mq_new[:, None])
            e = _exp(y, out=pol.buffer(2, n, c))
            sq_t = e.sum(1)
            d = y.neg_().add_(x)  # (x - m) - (y - m_ref)
            e = _exp(x, out=pol.buffer(2, n, c))
            sp_t, a_t = e.sum(1), _rowdot(e, d)
            if c0 == 0:
                mp[r0:r1], sp[r0:r1], a[r0:r1], mq[r0:r1], sq[r0:r1] = mp_new, sp_t, a_t, mq_new, sq_t
                continue
            shift_p, shift_q = mp[r0:r1] - mp_new, mq[r0:r1] - mq_new
            a[r0:r1].add_(sp[r0:r1] * (shift_p - shift_q)).mul_(shift_p.exp()).add_(a_t)
            sp[r0:r1].mul_(shift_p.exp()).add_(sp_t)
            sq[r0:r1].mul_(shift_q.exp()).add_(sq_t)
            mp[r0:r1], mq[r0:r1] = mp_new, mq_new
    return stats


class _LinearExactKL(torch.autograd.Function):
    """KL(pi || pi_ref) per position from both models' hidden states and output embeddings, tile by tile."""

    @staticmethod
    def forward(ctx: FunctionCtx, hidden: torch.Tensor, weight: torch.Tensor, ref_hidden: torch.Tensor,
                ref_weight: torch.Tensor, temperature: float, rows: int, cols: int, shard: _Shard
                ) -> torch.Tensor:
        dtype = _compute_dtype(hidden)
        pol = _Tiles(hidden, weight, rows, cols, dtype, 3)
        ref = _Tiles(ref_hidden, ref_weight, rows, cols, dtype, 0)
        stats = _gather_stats(_kl_stats(pol, ref, temperature), shard)  # (R, N, 5)
        mp, sp, a, mq, sq = (stats[..., i] for i in range(5))
        top_p, top_q = mp.amax(0), mq.amax(0)
        shift_p, shift_q = mp - top_p, mq - top_q
        a_all = (shift_p.exp() * (a + sp * (shift_p - shift_q))).sum(0)
        sp_all, sq_all = (sp * shift_p.exp()).sum(0), (sq * shift_q.exp()).sum(0)
        kl = a_all / sp_all - sp_all.log() + sq_all.log()
        if not bool(torch.isfinite(kl).all()):
            raise ValueError(
                f"hidden @ weight.T / temperature or ref_hidden @ ref_weight.T / temperature overflows "
                f"(temperature={temperature}); use a larger temperature or smaller inputs"
            )
        kl.clamp_(min=0.0)  # KL >= 0; rounding can leave a sum of mixed-sign terms a hair below 0
        lse_p, lse_q = top_p + sp_all.log(), top_q + sq_all.log()
        ctx.save_for_backward(hidden, weight, ref_hidden, ref_weight, lse_p, lse_q, kl)
        ctx.settings = (temperature, rows, cols, shard)
        return kl

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, ref_hidden, ref_weight, lse_p, lse_q, kl = ctx.saved_tensors
        temperature, rows, cols, shard = ctx.settings
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dtype = kl.dtype
        gs = g.to(dtype) / temperature
        pol = _Tiles(hidden, weight, rows, cols, dtype, 3)
        ref = _Tiles(ref_hidden, ref_weight, rows, cols, dtype, 0)
        grads = _Gradients(hidden, weight, pol, need_h, need_w)
        for (c0, c1, w), (_, _, w_ref) in zip(pol.cols_(), ref.cols_(), strict=True):
            grads.start(c0, c1)
            for (r0, r1, h), (_, _, h_ref) in zip(pol.rows_(), ref.rows_(), strict=True):
                n, c = r1 - r0, c1 - c0
                x = pol.logits(0, h, w, temperature).sub_(lse_p[r0:r1, None])  # log p
                y = torch.mm(h_ref, w_ref.t(), out=pol.buffer(1, n, c))
                if temperature != 1.0:
                    y.div_(temperature)
                y.sub_(lse_q[r0:r1, None])  # log q
                p = _exp(x, out=pol.buffer(2, n, c))
                # g p (log p - log q - KL) / tau
                grads.add(y.neg_().add_(x).sub_(kl[r0:r1, None]).mul_(p).mul_(gs[r0:r1, None]), h, w, r0, r1)
            grads.end()
        grad_h, grad_w = grads.result(shard)
        return grad_h, grad_w, None, None, None, None, None, None


def linear_exact_kl(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ref_hidden: torch.Tensor,
    ref_weight: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | tuple[int, int] | None = None,
    group: object | None = None,
    vocab_size: int | None = None,
) -> torch.Tensor:
    r"""Exact :math:`\mathrm{KL}(\pi \| \pi_{\mathrm{ref}})` over the whole vocabulary at every position, from
    both models' hidden states and output embeddings, without building either model's logits.

    .. math:: \mathrm{KL} = \sum_v p_v (\log p_v - \log q_v), \quad
              p = \mathrm{softmax}(h W^\top / \tau), \;
              q = \mathrm{softmax}(h_{\mathrm{ref}} W_{\mathrm{ref}}^\top / \tau)

    Equal to :func:`naive_linear_exact_kl` and to :func:`kltutorial.logprobs.exact_kl` of the two models'
    logits; computed tile by tile with running statistics (see the module docstring).

    Parameters
    ----------
    hidden : Tensor, shape (..., H)
        The policy's last hidden states.
    weight : Tensor, shape (V, H)
        The policy's output embedding (with ``group``, this rank's slice).
    ref_hidden : Tensor, shape (..., H_ref)
        The reference model's last hidden states, the leading shape of ``hidden`` (H_ref may differ from H).
    ref_weight : Tensor, shape (V, H_ref)
        The reference's output embedding, sliced like ``weight`` with ``group``.
    temperature : float
        :math:`\tau > 0`, dividing both models' logits.
    chunk_size : int or (int, int), optional
        Positions per tile, or (positions, vocabulary entries); by default :func:`tile_shape`.
    group : torch.distributed process group, optional
        Split the vocabulary over the group's ranks, as in :func:`linear_logprobs`.
    vocab_size : int, optional
        If given, the V the weights (or their slices together) must hold.

    Returns
    -------
    Tensor, shape (...)
        KL in nats, >= 0; float64 for float64 inputs, float32 otherwise. Differentiable with respect to
        ``hidden`` and ``weight``; the reference side is held fixed (no gradient reaches ``ref_hidden`` or
        ``ref_weight``).

    Raises
    ------
    TypeError, ValueError
        As :func:`linear_logprobs`, for either model's inputs.

    Examples
    --------
    >>> h = torch.tensor([[0.0, 0.0]])  # p uniform over V = 2
    >>> w = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    >>> h_ref = torch.log(torch.tensor([[1.0, 3.0]]))  # q = (1/4, 3/4)
    >>> linear_exact_kl(h, w, h_ref, w)  # 0.5 log 2 + 0.5 log(2/3)
    tensor([0.1438])
    """
    temperature = check_positive(temperature, "temperature")
    rows, cols = tile_shape(chunk_size)
    error, described = None, None
    try:
        _check_matrix_pair(hidden, "hidden", weight, "weight")
        _check_matrix_pair(ref_hidden, "ref_hidden", ref_weight, "ref_weight")
        if ref_hidden.shape[:-1] != hidden.shape[:-1]:
            raise ValueError(f"ref_hidden must have the leading shape of hidden, {tuple(hidden.shape[:-1])}, "
                             f"got {tuple(ref_hidden.shape[:-1])}")
        if ref_hidden.dtype != hidden.dtype or ref_hidden.device != hidden.device:
            raise TypeError(f"ref_hidden must have the dtype and device of hidden ({hidden.dtype}, "
                            f"{hidden.device}), got {ref_hidden.dtype}, {ref_hidden.device}")
        if group is None and ref_weight.shape[0] != weight.shape[0]:
            raise ValueError(f"ref_weight must have the V = {weight.shape[0]} rows of weight, got "
                             f"{ref_weight.shape[0]}")
        if group is None and vocab_size is not None and check_positive_int(vocab_size, "vocab_size") != \
                weight.shape[0]:
            raise ValueError(f"vocab_size is {vocab_size}, but weight holds V = {weight.shape[0]} rows")
        if group is not None:
            empty = torch.zeros(0, dtype=torch.long)
            described = _describe(torch.cat([hidden.detach().reshape(-1), ref_hidden.detach().reshape(-1)]),
                                  empty, temperature)
            described["hidden_shape"] = (tuple(hidden.shape), tuple(ref_hidden.shape))
    except (TypeError, ValueError) as err:
        error = err
    sizes = [0, 0] if error is not None else [weight.shape[0], ref_weight.shape[0]]
    shard = _shard(group, sizes, described, error, ("hidden", "weight", "ref_weight"))
    if shard.parallel and vocab_size is not None and \
            check_positive_int(vocab_size, "vocab_size") != shard.vocab:
        raise ValueError(f"vocab_size is {vocab_size}, but the slices of weight on the ranks of group hold "
                         f"V = {shard.vocab} rows")
    lead = hidden.shape[:-1]
    kl = _LinearExactKL.apply(hidden.reshape(-1, hidden.shape[-1]), weight,
                              ref_hidden.detach().reshape(-1, ref_hidden.shape[-1]), ref_weight.detach(),
                              temperature, rows, cols, shard)
    return kl.view(lead)


def naive_linear_exact_kl(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ref_hidden: torch.Tensor,
    ref_weight: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Baseline: both models' logits, their log-softmaxes, ``sum(p * (log p - log q))``, in the inputs' dtype.

    The reference is detached, as in :func:`linear_exact_kl`. Inputs are not checked.
    """
    logp = F.log_softmax(hidden @ weight.T / temperature, dim=-1)  # (..., V)
    with torch.no_grad():
        logq = F.log_softmax(ref_hidden @ ref_weight.T / temperature, dim=-1)  # (..., V)
    return (logp.exp() * (logp - logq)).sum(-1)
