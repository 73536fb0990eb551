r"""The sequence space: every sequence listed, next-token tables, the chain rule, KL and sampling.

Book section 3 (the chain rule, checked exactly); the package's introduction is in
:mod:`kltutorial.exact`. Shapes: V vocabulary, T positions, V**T sequences, P prefixes, N samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .._validation import (
    check_generator,
    check_logprobs,
    check_positive_int,
    check_table,
    check_values,
)
from ..logprobs import exact_kl

__all__ = [
    "MAX_SEQUENCES",
    "SequenceSpace",
    "sequence_logprobs",
    "token_logprobs",
    "next_token_logprobs",
    "sequence_kl",
    "per_position_kl",
    "expected_reward",
    "sample_sequences",
    "sample_autoregressive",
]

#: The largest space that :class:`SequenceSpace` lists, 2**22 sequences; their (V**T, T) int64 index
#: tensors take 32 MiB per position, twice over (tokens and prefix rows).
MAX_SEQUENCES: int = 2**22


@dataclass(frozen=True)
class SequenceSpace:
    """Every sequence of ``length`` tokens from a vocabulary of ``vocab_size``, and its prefix rows.

    Parameters
    ----------
    vocab_size : int
        V >= 1.
    length : int
        T >= 1, with V**T <= ``MAX_SEQUENCES``.

    Attributes
    ----------
    sequences : Tensor, shape (V**T, T), int64
        Every sequence, lexicographic: row i is i written in base V.
    prefix_ids : Tensor, shape (V**T, T), int64
        The row of a next-token table used at each position of each sequence.
    offsets : tuple of int, length T + 1
        Prefixes of length L occupy the rows ``offsets[L]`` to ``offsets[L + 1] - 1``;
        ``offsets[T]`` is P, the number of rows.

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> space.sequences.tolist()
    [[0, 0], [0, 1], [1, 0], [1, 1]]
    >>> space.prefix_ids.tolist()  # row 0: the empty prefix; rows 1, 2: the prefixes "0" and "1"
    [[0, 1], [0, 1], [0, 2], [0, 2]]
    >>> space.n_sequences, space.n_prefixes
    (4, 3)
    """

    vocab_size: int
    length: int
    sequences: torch.Tensor = field(init=False, repr=False, compare=False)
    prefix_ids: torch.Tensor = field(init=False, repr=False, compare=False)
    offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        V = check_positive_int(self.vocab_size, "vocab_size")
        T = check_positive_int(self.length, "length")
        if V**T > MAX_SEQUENCES:
            raise ValueError(
                f"vocab_size**length must be at most {MAX_SEQUENCES:,} sequences to list them, got "
                f"{V}**{T} = {V**T:,}; use a smaller vocabulary or shorter sequences"
            )
        offsets = tuple(sum(V**k for k in range(L)) for L in range(T + 1))  # 0, 1, 1 + V, ...
        index = torch.arange(V**T)
        powers = V ** torch.arange(T - 1, -1, -1)
        sequences = (index[:, None] // powers) % V  # (V**T, T)
        prefix_ids = torch.empty_like(sequences)  # (V**T, T)
        code = torch.zeros(V**T, dtype=torch.long)  # y_<t read in base V
        for t in range(T):
            prefix_ids[:, t] = offsets[t] + code
            code = code * V + sequences[:, t]
        object.__setattr__(self, "sequences", sequences)
        object.__setattr__(self, "prefix_ids", prefix_ids)
        object.__setattr__(self, "offsets", offsets)

    @property
    def n_sequences(self) -> int:
        """V**T."""
        return self.vocab_size**self.length

    @property
    def n_prefixes(self) -> int:
        """P = 1 + V + ... + V**(T-1), the rows of a next-token table."""
        return self.offsets[-1]


# ----------------------------------------------------------------------------------------------------
# Checks (each public function checks its arguments once; the private helpers trust them)


def check_space(space: object) -> SequenceSpace:
    if not isinstance(space, SequenceSpace):
        raise TypeError(
            f"space must be a SequenceSpace (e.g. SequenceSpace(vocab_size=2, length=3)), "
            f"got {type(space).__name__}"
        )
    return space


# ----------------------------------------------------------------------------------------------------
# Between a next-token table and a distribution over sequences


def sequence_logprobs(space: SequenceSpace, table: torch.Tensor) -> torch.Tensor:
    """Log-probability of every sequence, :math:`\\log \\pi(y) = \\sum_{t} \\log \\pi(y_t \\mid y_{<t})`.

    Parameters
    ----------
    space : SequenceSpace
    table : Tensor, shape (P, V)
        Next-token log-probs of the model, one row per prefix (rows normalised).

    Returns
    -------
    Tensor, shape (V**T,)
        In the table's dtype; ``-inf`` for a sequence with an impossible token.

    Examples
    --------
    Two tokens, two positions. The first token is 0 or 1 with probability 1/2; after a 0 the next is 0
    with probability 0.9, after a 1 it is 1 with probability 0.8:

    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> table = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]], dtype=torch.float64).log()
    >>> sequence_logprobs(space, table).exp()  # 00, 01, 10, 11: 0.5 x 0.9, 0.5 x 0.1, ...
    tensor([0.4500, 0.0500, 0.1000, 0.4000], dtype=torch.float64)
    """
    check_space(space)
    check_table(space, table, "table")
    return token_logprobs_unchecked(space, table).sum(-1)


def token_logprobs(space: SequenceSpace, table: torch.Tensor) -> torch.Tensor:
    """Per-position log-probs of every sequence, :math:`\\log \\pi(y_t \\mid y_{<t})`.

    Parameters
    ----------
    space : SequenceSpace
    table : Tensor, shape (P, V)

    Returns
    -------
    Tensor, shape (V**T, T)
        Row i sums to ``sequence_logprobs(space, table)[i]``.

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> table = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]], dtype=torch.float64).log()
    >>> token_logprobs(space, table)[1].exp()  # sequence 01: first 0, then 1 after a 0
    tensor([0.5000, 0.1000], dtype=torch.float64)
    """
    check_space(space)
    check_table(space, table, "table")
    return token_logprobs_unchecked(space, table)


def token_logprobs_unchecked(space: SequenceSpace, table: torch.Tensor) -> torch.Tensor:
    return table[space.prefix_ids, space.sequences]  # (V**T, T)


def next_token_logprobs(space: SequenceSpace, logprobs: torch.Tensor) -> torch.Tensor:
    """The next-token table of a distribution over sequences, :math:`\\log p(v \\mid h) = \\log p(hv) -
    \\log p(h)`, with :math:`p(h) = \\sum_{y \\text{ starting with } h} p(y)`.

    The inverse of :func:`sequence_logprobs`: any distribution over sequences (a trained policy,
    :math:`\\pi^*_\\beta`, best-of-n) is an autoregressive model, and this is its table. The prefix
    marginals are summed in log space (``logsumexp``), so tiny probabilities keep their precision. A
    prefix of probability 0 has no conditional; its row is uniform, :math:`-\\log V`.

    Parameters
    ----------
    space : SequenceSpace
    logprobs : Tensor, shape (V**T,)

    Returns
    -------
    Tensor, shape (P, V)

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> p = torch.tensor([0.45, 0.05, 0.1, 0.4], dtype=torch.float64)
    >>> next_token_logprobs(space, p.log()).exp()  # P(first = 0) = 0.5, P(0 | 0) = 0.45 / 0.5, ...
    tensor([[0.5000, 0.5000],
            [0.9000, 0.1000],
            [0.2000, 0.8000]], dtype=torch.float64)
    """
    check_space(space)
    logprobs = check_logprobs(logprobs, "logprobs", space.n_sequences)
    V, T = space.vocab_size, space.length
    marginals = [logprobs]  # log p(h) for the prefixes of length T, T - 1, ..., 0
    for _ in range(T):
        marginals.append(torch.logsumexp(marginals[-1].reshape(-1, V), dim=-1))
    marginals.reverse()  # marginals[L]: shape (V**L,)
    rows = []
    for L in range(T):
        cond = marginals[L + 1].reshape(V**L, V) - marginals[L][:, None]  # (V**L, V)
        possible = torch.isfinite(marginals[L])[:, None]
        rows.append(torch.where(possible, cond, torch.full_like(cond, -math.log(V))))
    return torch.cat(rows)  # (P, V)


def _prefix_logprobs(space: SequenceSpace, table: torch.Tensor) -> torch.Tensor:
    """log π(h) for every prefix row h: the empty prefix 0, then log π(h) + log π(v | h) for its children."""
    out = table.new_zeros(space.n_prefixes)  # (P,)
    o = space.offsets
    for L in range(1, space.length):
        parents = slice(o[L - 1], o[L])
        # child hv of parent h has code h * V + v: the (parents, V) block read row by row
        out[o[L] : o[L + 1]] = (out[parents][:, None] + table[parents]).reshape(-1)
    return out


# ----------------------------------------------------------------------------------------------------
# KL and expected reward


def sequence_kl(logp: torch.Tensor, logq: torch.Tensor) -> float:
    """Exact :math:`\\mathrm{KL}(p \\| q) = \\sum_y p(y) (\\log p(y) - \\log q(y))` in nats.

    Computed by :func:`kltutorial.exact_kl`, the KL over a vocabulary, with the sequences as the
    vocabulary of one position. A sequence impossible under ``p`` contributes 0 (0 log 0 = 0).

    Parameters
    ----------
    logp, logq : Tensor, shape (V**T,)
        Log-probabilities of two distributions over the same sequences; ``-inf`` allowed.

    Returns
    -------
    float
        >= 0; ``inf`` if ``p`` puts mass where ``q`` puts none.

    Examples
    --------
    >>> p = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> q = torch.tensor([0.25, 0.75], dtype=torch.float64).log()
    >>> round(sequence_kl(p, q), 4)  # 0.5 log 2 + 0.5 log(2/3)
    0.1438
    """
    logp = check_logprobs(logp, "logp")
    logq = check_logprobs(logq, "logq", logp.shape[0])
    return sequence_kl_unchecked(logp, logq)


def sequence_kl_unchecked(logp: torch.Tensor, logq: torch.Tensor) -> float:
    return float(exact_kl(logp.view(1, 1, -1), logq.view(1, 1, -1)))  # (1, 1, V**T): one "position"


def per_position_kl(space: SequenceSpace, table: torch.Tensor, ref_table: torch.Tensor) -> torch.Tensor:
    """The chain-rule terms: :math:`\\mathrm{KL}_t = \\mathbb{E}_{y_{<t} \\sim \\pi}\\,
    \\mathrm{KL}(\\pi(\\cdot \\mid y_{<t}) \\| \\pi_\\mathrm{ref}(\\cdot \\mid y_{<t}))`.

    The KL of the next-token distributions at each prefix (:func:`kltutorial.exact_kl` over the rows
    of the two tables), averaged over the prefixes of length t under the policy. By the chain rule they
    sum to the sequence KL, :math:`\\sum_t \\mathrm{KL}_t = \\mathrm{KL}(\\pi \\| \\pi_\\mathrm{ref})`.

    Parameters
    ----------
    space : SequenceSpace
    table, ref_table : Tensor, shape (P, V)
        Next-token log-probs of the policy :math:`\\pi` and of the reference.

    Returns
    -------
    Tensor, shape (T,)
        Nats, >= 0. For a distribution given over sequences, pass ``next_token_logprobs(space, logp)``.

    Examples
    --------
    Policy and reference share the first token (KL 0 at t = 0) and differ after it:

    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> pi = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]], dtype=torch.float64).log()
    >>> ref = torch.tensor([[0.5, 0.5], [0.25, 0.75], [0.75, 0.25]], dtype=torch.float64).log()
    >>> per_position_kl(space, pi, ref)  # t = 1: 0.5 log 2 + 0.5 log(2/3) after either prefix
    tensor([0.0000, 0.1438], dtype=torch.float64)
    """
    check_space(space)
    table = check_table(space, table, "table")
    ref_table = check_table(space, ref_table, "ref_table")
    kl = exact_kl(table[None], ref_table[None])[0]  # (P,): KL of the next-token rows
    weight = _prefix_logprobs(space, table).exp()  # (P,): pi(prefix)
    terms = torch.where(weight > 0, weight * kl, torch.zeros_like(kl))  # 0 x inf = 0 for unseen prefixes
    o = space.offsets
    return torch.stack([terms[o[t] : o[t + 1]].sum() for t in range(space.length)])


def expected_reward(logp: torch.Tensor, reward: torch.Tensor) -> float:
    """Exact :math:`\\mathbb{E}_{y \\sim p}[r(y)] = \\sum_y p(y)\\, r(y)`.

    Parameters
    ----------
    logp : Tensor, shape (V**T,)
    reward : Tensor, shape (V**T,)
        Any finite function of the sequence (an indicator gives a probability).

    Examples
    --------
    >>> expected_reward(torch.tensor([0.25, 0.75]).log(), torch.tensor([0.0, 1.0]))
    0.75
    """
    logp = check_logprobs(logp, "logp")
    reward = check_values(reward, "reward", logp.shape[0])
    return expected_value_unchecked(logp, reward)


def expected_value_unchecked(logp: torch.Tensor, values: torch.Tensor) -> float:
    return float((logp.exp() * values).sum())  # sum_y p(y) f(y); 0 where p(y) = 0

# ----------------------------------------------------------------------------------------------------
# Sampling


def sample_sequences(logprobs: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """Indices of ``n`` sequences drawn independently (with replacement) from the distribution ``logprobs``.

    Parameters
    ----------
    logprobs : Tensor, shape (V**T,)
    n : int
        N >= 1.
    generator : torch.Generator
        The caller's generator, e.g. ``torch.Generator().manual_seed(0)``.

    Returns
    -------
    Tensor, shape (N,), int64

    Examples
    --------
    >>> sample_sequences(torch.tensor([0.0, -torch.inf]), 3, torch.Generator().manual_seed(0))
    tensor([0, 0, 0])
    """
    logprobs = check_logprobs(logprobs, "logprobs")
    n = check_positive_int(n, "n")
    generator = check_generator(generator)
    return torch.multinomial(logprobs.exp(), n, replacement=True, generator=generator)


def sample_autoregressive(
    space: SequenceSpace, table: torch.Tensor, n: int, generator: torch.Generator
) -> torch.Tensor:
    """Draw ``n`` sequences token by token, :math:`y_t \\sim \\pi(\\cdot \\mid y_{<t})`, as a language model
    generates; return their indices.

    The same distribution as ``sample_sequences(sequence_logprobs(space, table), ...)``, reached the
    way RLHF samples: one next-token row per position.

    Parameters
    ----------
    space : SequenceSpace
    table : Tensor, shape (P, V)
    n : int
        N >= 1.
    generator : torch.Generator

    Returns
    -------
    Tensor, shape (N,), int64
        Row indices into ``space.sequences``.

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> table = torch.tensor([[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]], dtype=torch.float64).log()
    >>> sample_autoregressive(space, table, 3, torch.Generator().manual_seed(0))  # always 1, then 0
    tensor([2, 2, 2])
    """
    check_space(space)
    table = check_table(space, table, "table")
    n = check_positive_int(n, "n")
    generator = check_generator(generator)
    V = space.vocab_size
    code = torch.zeros(n, dtype=torch.long)  # (N,): the prefix so far, in base V
    probs = table.exp()  # (P, V)
    for t in range(space.length):
        rows = probs[space.offsets[t] + code]  # (N, V)
        token = torch.multinomial(rows, 1, generator=generator).squeeze(1)  # (N,)
        code = code * V + token
    return code
