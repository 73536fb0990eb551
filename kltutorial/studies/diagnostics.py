r"""The §12 study of the log line: its exact expectation on a listable space, samplers that are not the
policy, and where the KL sits along a sequence (book section 12).

1. :func:`expected_log_stats` gives the numbers of :func:`kltutorial.monitoring.kl_log_stats` *exactly*,
   as sums over every sequence of a listable space (:mod:`kltutorial.exact`), for sequences drawn from any
   sampler.
2. **Samplers that are not the policy.** The sampled estimates are unbiased only for tokens drawn from the
   policy whose log-probs they use. Decoding settings change the distribution the tokens come from:
   :func:`top_k_logprobs`, :func:`top_p_logprobs` and :func:`temperature_logprobs` act on next-token rows,
   shape (..., V), as generation libraries do; :func:`ban_token_logprobs` (a minimum length bans the end
   token) and :func:`force_token_logprobs` (a forced end token) act at chosen positions of a next-token
   table through :func:`at_positions`.
3. **Where the KL sits.** :class:`TokenKLTable` holds, for sampled sequences, each token's k1 and the
   exact KL of the next-token distributions at its prefix; :func:`token_kl_table` builds it on a
   listable space.
4. **False alarms of the k1 - k3 gap.** On correct samples the gap has mean 0, but its per-token variance
   is :math:`\chi^2(\pi_\mathrm{ref} \| \pi)`, which grows without bound as the policy pushes down
   tokens the reference likes. :func:`gap_false_alarms` measures, over many on-policy batches, how often
   the gap crosses a threshold in standard errors, beside the check of
   :func:`kltutorial.monitoring.exact_kl_check`; :func:`pushed_down_pair` builds a categorical pair
   that is close in KL but far in :math:`\chi^2`.
5. **The vocabulary split over processes.** :func:`split_vocabulary` runs
   :func:`kltutorial.logprobs.hidden.linear_logprobs` and :func:`~kltutorial.logprobs.hidden.linear_exact_kl`
   on ``world_size`` gloo processes, each holding a contiguous slice of the output embedding, and returns
   every rank's results and gradients, to compare with one process.

Shapes: B batch (sequences), T positions, V vocabulary, P prefixes (rows of a next-token table),
V**T sequences.
"""

from __future__ import annotations

import math
import os
import pickle
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import (
    check_coef,
    check_float_tensor,
    check_generator,
    check_positions_mask,
    check_positive,
    check_positive_int,
    check_table,
)
from ..exact import SequenceSpace, sample_sequences, sequence_logprobs, token_logprobs
from ..logprobs import exact_kl
from ..logprobs.hidden import linear_exact_kl, linear_logprobs
from ..monitoring import KLLogStats, sequence_k1_k3

__all__ = [
    "expected_log_stats",
    "TokenKLTable",
    "token_kl_table",
    "top_k_logprobs",
    "top_p_logprobs",
    "temperature_logprobs",
    "ban_token_logprobs",
    "force_token_logprobs",
    "at_positions",
    "GapFalseAlarms",
    "gap_false_alarms",
    "pushed_down_pair",
    "RankResult",
    "split_vocabulary",
    "spawn_ranks",
    "write_rank_result",
]


def _check_rows(logprobs: object, name: str = "logprobs") -> torch.Tensor:
    return check_float_tensor(logprobs, name, allow_inf=True)


def _renormalise(logprobs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, logprobs, torch.full_like(logprobs, -math.inf))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)


def top_k_logprobs(logprobs: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k sampling's distribution: the ``k`` most likely tokens of each row, renormalised.

    .. math:: q(v) = \\frac{p(v)\\,[v \\in \\mathrm{top}_k(p)]}{\\sum_{u \\in \\mathrm{top}_k(p)} p(u)}

    Ties at the k-th place keep every tied token (Hugging Face's ``TopKLogitsWarper`` keeps the
    tokens whose logit is at least the k-th largest, so it does the same).

    Parameters
    ----------
    logprobs : Tensor, shape (..., V)
    k : int
        k >= 1; k >= V returns the rows unchanged.

    Returns
    -------
    Tensor, shape (..., V)

    Examples
    --------
    >>> top_k_logprobs(torch.tensor([0.5, 0.3, 0.2]).log(), 2).exp()
    tensor([0.6250, 0.3750, 0.0000])
    """
    logprobs = _check_rows(logprobs)
    k = check_positive_int(k, "k")
    if k >= logprobs.shape[-1]:
        return logprobs
    kth = torch.topk(logprobs, k, dim=-1).values[..., -1:]  # (..., 1)
    return _renormalise(logprobs, logprobs >= kth)


def top_p_logprobs(logprobs: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus (top-p) sampling's distribution: the smallest set of most likely tokens with mass >= p.

    A token is kept when the mass of the tokens strictly more likely than it is below ``p`` (so the most
    likely token is always kept), as Holtzman et al. (2020) define the nucleus; the kept tokens are
    renormalised.

    Parameters
    ----------
    logprobs : Tensor, shape (..., V)
    p : float
        In (0, 1]; 1 returns the rows unchanged.

    Returns
    -------
    Tensor, shape (..., V)

    Examples
    --------
    >>> top_p_logprobs(torch.tensor([0.5, 0.3, 0.2]).log(), 0.7).exp()  # 0.5 < 0.7, 0.8 >= 0.7
    tensor([0.6250, 0.3750, 0.0000])
    """
    logprobs = _check_rows(logprobs)
    p = check_positive(p, "p")
    if p > 1:
        raise ValueError(f"p must lie in (0, 1], got {p}")
    if p == 1:
        return logprobs
    sorted_lp, order = torch.sort(logprobs, dim=-1, descending=True)
    before = torch.cumsum(sorted_lp.exp(), dim=-1) - sorted_lp.exp()  # mass of the more likely tokens
    keep_sorted = before < p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return _renormalise(logprobs, keep)


def temperature_logprobs(logprobs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Sampling at a temperature: :math:`q(v) \\propto p(v)^{1/\\tau}`, i.e. ``log_softmax(logits / tau)``.

    Parameters
    ----------
    logprobs : Tensor, shape (..., V)
        Log-probs (or logits: the result is the same).
    temperature : float
        :math:`\\tau > 0`; 1 returns the rows renormalised and otherwise unchanged.

    Returns
    -------
    Tensor, shape (..., V)

    Examples
    --------
    >>> temperature_logprobs(torch.tensor([0.8, 0.2]).log(), 0.5).exp()  # 0.64 : 0.04
    tensor([0.9412, 0.0588])
    """
    logprobs = _check_rows(logprobs)
    temperature = check_positive(temperature, "temperature")
    return torch.log_softmax(logprobs / temperature, dim=-1)


def _check_token(token: object, vocab_size: int) -> int:
    if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < vocab_size:
        raise ValueError(f"token must be an int in [0, {vocab_size}) (a token id), got {token!r}")
    return int(token)


def ban_token_logprobs(logprobs: torch.Tensor, token: int) -> torch.Tensor:
    """The rows with one token made impossible and the rest renormalised, as a minimum length bans the
    end token: :math:`q(v) = p(v)\\,[v \\ne e] / (1 - p(e))`.

    Parameters
    ----------
    logprobs : Tensor, shape (..., V)
    token : int
        The banned token e.

    Returns
    -------
    Tensor, shape (..., V)

    Examples
    --------
    >>> ban_token_logprobs(torch.tensor([0.5, 0.3, 0.2]).log(), 0).exp()
    tensor([0.0000, 0.6000, 0.4000])
    """
    logprobs = _check_rows(logprobs)
    token = _check_token(token, logprobs.shape[-1])
    keep = torch.ones_like(logprobs, dtype=torch.bool)
    keep[..., token] = False
    if not (torch.isfinite(logprobs) & keep).any(-1).all():
        raise ValueError(f"a row puts all its mass on token {token}: banning it leaves nothing to sample")
    return _renormalise(logprobs, keep)


def force_token_logprobs(logprobs: torch.Tensor, token: int) -> torch.Tensor:
    """Rows that always produce one token, as a generator that appends a forced end token:
    :math:`q(v) = [v = e]`.

    Parameters
    ----------
    logprobs : Tensor, shape (..., V)
        Used for its shape and dtype.
    token : int
        The forced token e.

    Returns
    -------
    Tensor, shape (..., V)
        0 at ``token``, ``-inf`` elsewhere.

    Examples
    --------
    >>> force_token_logprobs(torch.zeros(3), 1).exp()
    tensor([0., 1., 0.])
    """
    logprobs = _check_rows(logprobs)
    token = _check_token(token, logprobs.shape[-1])
    out = torch.full_like(logprobs, -math.inf)
    out[..., token] = 0.0
    return out


def at_positions(
    space: SequenceSpace, table: torch.Tensor, positions: Sequence[int], other: torch.Tensor
) -> torch.Tensor:
    """A next-token table that follows ``other`` at the given positions and ``table`` everywhere else.

    Position t uses the rows of the prefixes of length t, ``space.offsets[t]`` to
    ``space.offsets[t + 1] - 1``. So ``at_positions(space, pi, [0, 1], ban_token_logprobs(pi, e))`` is
    the policy with token e banned at the first two positions (a minimum length of 2, e the end token),
    and ``at_positions(space, pi, [0], ref)`` draws the first token from the reference (a prompt from
    the data) and the rest from the policy.

    Parameters
    ----------
    space : SequenceSpace
    table, other : Tensor, shape (P, V)
    positions : sequence of int
        Each in [0, T).

    Returns
    -------
    Tensor, shape (P, V)
        A new tensor.

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> at_positions(space, torch.zeros(3, 2), [1], torch.ones(3, 2))  # rows 1, 2: length-1 prefixes
    tensor([[0., 0.],
            [1., 1.],
            [1., 1.]])
    """
    if not isinstance(space, SequenceSpace):
        raise TypeError(f"space must be a SequenceSpace, got {type(space).__name__}")
    table = check_float_tensor(table, "table", ndim=2, allow_inf=True)
    other = check_float_tensor(other, "other", ndim=2, allow_inf=True)
    want = (space.n_prefixes, space.vocab_size)
    for name, x in (("table", table), ("other", other)):
        if tuple(x.shape) != want:
            raise ValueError(f"{name} must have shape {want}, one row per prefix; got {tuple(x.shape)}")
    out = table.clone()
    for t in positions:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < space.length:
            raise ValueError(f"positions must be ints in [0, {space.length}), got {t!r}")
        rows = slice(space.offsets[t], space.offsets[t + 1])
        out[rows] = other[rows]
    return out


def expected_log_stats(
    space: SequenceSpace,
    policy_table: torch.Tensor,
    reference_table: torch.Tensor,
    sampler_table: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> KLLogStats:
    """The exact expectation of :func:`~kltutorial.monitoring.kl_log_stats` for sequences drawn from a
    sampler, by enumeration.

    .. math::
        \\mathbb{E}_{y \\sim q}\\Big[\\sum_t m_t\\, k(\\Delta_t(y))\\Big]
        = \\sum_{y} q(y) \\sum_t m_t\\, k(\\Delta_t(y))

    The log-probs come from the policy :math:`\\pi` and the reference; the sequences from the sampler
    :math:`q`. With :math:`q = \\pi` and every position counted, the k1 and k3 means both equal
    :math:`\\mathrm{KL}(\\pi \\| \\pi_\\mathrm{ref})`. With another sampler the k1 mean is
    :math:`\\mathrm{KL}(q \\| \\pi_\\mathrm{ref}) - \\mathrm{KL}(q \\| \\pi)`, which can be anything, negative
    included (:math:`-\\mathrm{KL}(\\pi_\\mathrm{ref} \\| \\pi)` for :math:`q = \\pi_\\mathrm{ref}`).

    Parameters
    ----------
    space : SequenceSpace
    policy_table, reference_table : Tensor, shape (P, V)
        Next-token log-probs of :math:`\\pi` and :math:`\\pi_\\mathrm{ref}`, one row per prefix.
    sampler_table : Tensor, shape (P, V), optional
        Next-token log-probs of the sampler :math:`q` (default: the policy).
    mask : Tensor, shape (T,), optional
        The positions that count (default: all).

    Returns
    -------
    KLLogStats
        Standard errors 0, ``n`` None; the shares are probabilities under :math:`q`, the maximum is over
        the sequences :math:`q` can produce.

    Examples
    --------
    One position, two tokens; the policy says (0.5, 0.5), the reference (0.25, 0.75):

    >>> space = SequenceSpace(vocab_size=2, length=1)
    >>> pi = torch.tensor([[0.5, 0.5]], dtype=torch.float64).log()
    >>> ref = torch.tensor([[0.25, 0.75]], dtype=torch.float64).log()
    >>> round(expected_log_stats(space, pi, ref).k1, 4)  # KL(pi || ref) = 0.5 log 2 + 0.5 log(2/3)
    0.1438
    >>> round(expected_log_stats(space, pi, ref, sampler_table=ref).k1, 4)  # -KL(ref || pi)
    -0.1308
    """
    if not isinstance(space, SequenceSpace):
        raise TypeError(f"space must be a SequenceSpace, got {type(space).__name__}")
    lp = token_logprobs(space, policy_table)  # (V**T, T), checks the table
    lq = token_logprobs(space, reference_table)
    if sampler_table is None:
        sampler_table = policy_table
    q = sequence_logprobs(space, sampler_table).exp()  # (V**T,)
    m = check_positions_mask(mask, (space.n_sequences, space.length))
    support = q > 0
    # where q(y) = 0 a log-prob may be -inf; those sequences count for nothing, so give them Delta = 0
    log_ratio = torch.where(support[:, None], lp - lq, torch.zeros_like(lp)).to(torch.float64)
    if not torch.isfinite(log_ratio).all():
        raise ValueError(
            "the sampler draws a sequence that the policy or the reference cannot produce, so its "
            "log-ratio is infinite; the expected estimates are not finite"
        )
    k1, k3 = sequence_k1_k3(log_ratio, m)  # (V**T,) each
    q = q.to(torch.float64)
    n_masked = int(m[0].sum())
    negative_tokens = ((log_ratio < 0) & m).double().sum(-1)  # (V**T,)
    return KLLogStats(
        k1=float((q * k1).sum()),
        k3=float((q * k3).sum()),
        k1_se=0.0,
        k3_se=0.0,
        gap_se=0.0,
        negative_sequences=float(q[k1 < 0].sum()),
        negative_tokens=float((q * negative_tokens).sum()) / n_masked if n_masked else math.nan,
        max_sequence_k1=float(k1[support].max()),
        n=None,
    )


@dataclass(frozen=True)
class TokenKLTable:
    """Per-token KL of sampled sequences: one row per sequence, one column per position.

    Attributes
    ----------
    tokens : Tensor, shape (B, T), int64
        The sampled tokens.
    k1 : Tensor, shape (B, T)
        :math:`\\log\\pi(y_t \\mid y_{<t}) - \\log\\pi_\\mathrm{ref}(y_t \\mid y_{<t})`, what a trainer logs.
    kl : Tensor, shape (B, T)
        :math:`\\mathrm{KL}(\\pi(\\cdot \\mid y_{<t}) \\| \\pi_\\mathrm{ref}(\\cdot \\mid y_{<t}))`, the
        exact KL of the next-token distributions at the token's prefix (the mean of k1 given the
        prefix).
    """

    tokens: torch.Tensor
    k1: torch.Tensor
    kl: torch.Tensor

    @property
    def sequence_k1(self) -> torch.Tensor:
        """Per-sequence sums of k1, shape (B,)."""
        return self.k1.sum(-1)

    @property
    def sequence_kl(self) -> torch.Tensor:
        """Per-sequence sums of the exact next-token KL, shape (B,)."""
        return self.kl.sum(-1)

    def sorted(self) -> TokenKLTable:
        """The rows in decreasing order of their k1 sum (stable for ties)."""
        order = torch.sort(self.sequence_k1, descending=True, stable=True).indices
        return TokenKLTable(tokens=self.tokens[order], k1=self.k1[order], kl=self.kl[order])


def token_kl_table(
    space: SequenceSpace, policy_table: torch.Tensor, reference_table: torch.Tensor, indices: torch.Tensor
) -> TokenKLTable:
    """The :class:`TokenKLTable` of the sequences ``space.sequences[indices]``.

    Parameters
    ----------
    space : SequenceSpace
    policy_table, reference_table : Tensor, shape (P, V)
    indices : Tensor, shape (B,), int64
        Rows of ``space.sequences`` (e.g. from :func:`kltutorial.exact.sample_autoregressive`).

    Returns
    -------
    TokenKLTable

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> pi = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]], dtype=torch.float64).log()
    >>> ref = torch.tensor([[0.5, 0.5], [0.25, 0.75], [0.75, 0.25]], dtype=torch.float64).log()
    >>> table = token_kl_table(space, pi, ref, torch.tensor([1]))  # the sequence 0 1
    >>> table.k1  # log 0.5 - log 0.5, then log 0.5 - log 0.75
    tensor([[ 0.0000, -0.4055]], dtype=torch.float64)
    >>> table.kl  # 0 at the empty prefix; 0.5 log 2 + 0.5 log(2/3) after "0"
    tensor([[0.0000, 0.1438]], dtype=torch.float64)
    """
    if not isinstance(space, SequenceSpace):
        raise TypeError(f"space must be a SequenceSpace, got {type(space).__name__}")
    lp = token_logprobs(space, policy_table)  # (V**T, T), checks the tables
    lq = token_logprobs(space, reference_table)
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int64 or indices.dim() != 1:
        raise TypeError("indices must be a 1-d int64 tensor of sequence indices")
    if indices.numel() == 0 or int(indices.min()) < 0 or int(indices.max()) >= space.n_sequences:
        raise ValueError(f"indices must be non-empty and lie in [0, {space.n_sequences})")
    row_kl = exact_kl(policy_table[None], reference_table[None])[0]  # (P,): KL of each next-token row
    return TokenKLTable(
        tokens=space.sequences[indices],
        k1=lp[indices] - lq[indices],
        kl=row_kl[space.prefix_ids[indices]],
    )


# ----------------------------------------------------------------------------------------------------
# False alarms of the k1 - k3 gap


@dataclass(frozen=True)
class GapFalseAlarms:
    """The result of :func:`gap_false_alarms`: the z of each correct batch, for the gap and for the check.

    Attributes
    ----------
    kl : float
        :math:`\\mathrm{KL}(\\pi \\| \\pi_\\mathrm{ref})` of the sequences (nats), exact.
    gap_variance : float
        Exact variance under :math:`\\pi` of the per-sequence gap
        :math:`g(y) = \\sum_t (1 - \\pi_\\mathrm{ref}(y_t \\mid y_{<t}) / \\pi(y_t \\mid y_{<t}))`. Its terms
        have mean 0 given their prefix, so it equals
        :math:`\\mathbb{E}_\\pi \\sum_t \\chi^2(\\pi_\\mathrm{ref}(\\cdot \\mid y_{<t}) \\| \\pi(\\cdot \\mid
        y_{<t}))`, the :math:`\\chi^2` of the next-token distributions summed over positions; for one
        position, :math:`\\chi^2(\\pi_\\mathrm{ref} \\| \\pi) = \\sum_v \\pi_\\mathrm{ref}(v)^2 / \\pi(v)
        - 1`.
    check_variance : float
        Exact variance under :math:`\\pi` of :math:`\\sum_t (\\Delta_t - \\mathrm{KL}_t)`, the quantity of
        :func:`kltutorial.monitoring.exact_kl_check`.
    gap_z, check_z : ndarray, shape (M,)
        For each batch, its mean gap over its standard error (``gap / gap_se`` of
        :func:`kltutorial.monitoring.kl_log_stats`), and the same for the check.
    batch_size : int
    threshold : float
    clamp : float
    clamped_gap_mean, clamped_gap_variance : float
        Exact mean and variance under :math:`\\pi` of the per-sequence gap with every token's k1 clamped
        to :math:`\\pm c` and its k3 to at most :math:`c` (OpenRLHF clamps every estimate to
        :math:`\\pm 10`; verl clamps k3 at 10 and leaves k1 alone, the same thing where
        :math:`|\\Delta_t| \\le 10`). Not 0: the clamp cuts the tail that keeps the gap's mean at 0.
    """

    kl: float
    gap_variance: float
    check_variance: float
    gap_z: np.ndarray
    check_z: np.ndarray
    batch_size: int
    threshold: float
    clamp: float
    clamped_gap_mean: float
    clamped_gap_variance: float

    @property
    def gap_rate(self) -> float:
        """Share of the batches whose gap is more than ``threshold`` standard errors from 0."""
        return float(np.mean(np.abs(self.gap_z) > self.threshold))

    @property
    def check_rate(self) -> float:
        """Share of the batches whose k1 - exact-KL difference is more than ``threshold`` standard errors
        from 0."""
        return float(np.mean(np.abs(self.check_z) > self.threshold))

    @property
    def gaussian_rate(self) -> float:
        """:math:`P(|Z| > \\mathrm{threshold})` for a standard normal Z: the rate if z were Gaussian."""
        return math.erfc(self.threshold / math.sqrt(2))

    @property
    def clamped_gap_z(self) -> float:
        """The clamped gap's mean in its standard errors at ``batch_size``: where the z of a clamped gap
        centres on correct samples."""
        return self.clamped_gap_mean / math.sqrt(self.clamped_gap_variance / self.batch_size)


def _batch_z(values: torch.Tensor) -> np.ndarray:
    """Mean over standard error of each row of ``values`` (M, B); 0 for a row of zeros."""
    mean = values.mean(1)
    se = values.std(1) / math.sqrt(values.shape[1])
    flat = torch.where(mean == 0, torch.zeros_like(mean), torch.sign(mean) * math.inf)
    return torch.where(se > 0, mean / se, flat).numpy()


def gap_false_alarms(
    space: SequenceSpace,
    policy_table: torch.Tensor,
    reference_table: torch.Tensor,
    batch_size: int,
    n_batches: int,
    generator: torch.Generator,
    *,
    threshold: float = 5.0,
    clamp: float = 10.0,
) -> GapFalseAlarms:
    """How often the k1 - k3 gap of correct on-policy batches lies more than ``threshold`` standard errors
    from 0, and how often k1 against the exact per-position KL does.

    Every batch is drawn from the policy itself, so every alarm is false. Per token the gap is
    :math:`1 - \\rho_t`, :math:`\\rho_t = \\pi_\\mathrm{ref}(y_t \\mid y_{<t}) / \\pi(y_t \\mid y_{<t})`,
    with mean 0 and variance :math:`\\chi^2(\\pi_\\mathrm{ref} \\| \\pi)`. Where the policy has pushed
    down a token the reference likes, :math:`\\rho` is large on a token the policy rarely draws: a typical
    batch holds none, so its mean gap is positive and its standard error, computed from the batch itself,
    too small, and :math:`z` is far from a standard normal. The check's terms
    :math:`\\Delta_t - \\mathrm{KL}_t` have the variance of the log-ratio instead: a token pushed down by
    :math:`\\delta` nats weighs :math:`\\delta` there and :math:`e^{\\delta}` in the gap, so the rare tokens
    dominate the check only much farther from the reference.

    The per-sequence values are computed once for every sequence of the listable space; batch ``i`` is
    draws ``i * batch_size`` to ``(i + 1) * batch_size - 1`` of
    ``sample_sequences(sequence_logprobs(space, policy_table), n_batches * batch_size, generator)``, and
    its z is computed as :func:`kltutorial.monitoring.kl_log_stats` and
    :func:`kltutorial.monitoring.exact_kl_check` compute it (every position counts). Memory: two float64
    arrays of ``n_batches * batch_size``.

    Parameters
    ----------
    space : SequenceSpace
        A ``SequenceSpace(vocab_size=V, length=1)`` holds one categorical pair.
    policy_table, reference_table : Tensor, shape (P, V)
        Next-token log-probs of :math:`\\pi` and :math:`\\pi_\\mathrm{ref}`.
    batch_size : int
        Sequences per batch, >= 2.
    n_batches : int
        M >= 1.
    generator : torch.Generator
    threshold : float
        > 0, in standard errors.
    clamp : float
        > 0, the clamp c of :attr:`GapFalseAlarms.clamped_gap_mean`.

    Returns
    -------
    GapFalseAlarms

    Examples
    --------
    A policy that has pushed the reference's most likely token down from 0.5 to 0.02:

    >>> space = SequenceSpace(vocab_size=3, length=1)
    >>> ref = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64).log()
    >>> pi = torch.tensor([[0.02, 0.68, 0.30]], dtype=torch.float64).log()
    >>> r = gap_false_alarms(space, pi, ref, 64, 1000, torch.Generator().manual_seed(0))
    >>> round(r.gap_variance, 2)  # chi^2(ref || pi) = 0.25/0.02 + 0.0625/0.68 + 0.0625/0.3 - 1
    11.8
    >>> r.gap_rate > 0.2, r.check_rate < 0.01  # one batch in four, against 6e-7 for a Gaussian
    (True, True)
    >>> round(r.clamped_gap_mean, 4)  # 0.02 * (k3 - 10), k3 = 25 - 1 - log 25 on the pushed token
    0.2156
    """
    if not isinstance(space, SequenceSpace):
        raise TypeError(f"space must be a SequenceSpace, got {type(space).__name__}")
    policy_table = check_table(space, policy_table, "policy_table")
    reference_table = check_table(space, reference_table, "reference_table")
    every = token_kl_table(space, policy_table, reference_table, torch.arange(space.n_sequences))
    batch_size = check_positive_int(batch_size, "batch_size")
    if batch_size < 2:
        raise ValueError(f"batch_size must be >= 2 (a standard error needs two sequences), got {batch_size}")
    n_batches = check_positive_int(n_batches, "n_batches")
    generator = check_generator(generator)
    threshold = check_positive(threshold, "threshold")
    clamp = check_positive(clamp, "clamp")
    logp = sequence_logprobs(space, policy_table)  # (V**T,)
    support = torch.isfinite(logp)
    delta = every.k1.to(torch.float64)  # (V**T, T)
    if not torch.isfinite(delta[support]).all():
        raise ValueError(
            "the policy can produce a sequence that the reference cannot, so its log-ratio is infinite "
            "and the KL with it"
        )
    # 1. per-sequence values, 0 where the policy cannot go (those are never drawn)
    zero = torch.zeros_like(delta)
    delta = torch.where(support[:, None], delta, zero)
    kl_t = torch.where(support[:, None], every.kl.to(torch.float64), zero)
    k1, k3 = sequence_k1_k3(delta, torch.ones_like(delta, dtype=torch.bool))  # (V**T,) each
    gap, check = k1 - k3, k1 - kl_t.sum(-1)
    k3_t = torch.expm1(-delta) + delta  # (V**T, T)
    clamped = (delta.clamp(-clamp, clamp) - k3_t.clamp(max=clamp)).sum(-1)
    # 2. their exact moments under the policy
    p = logp.exp().to(torch.float64)

    def mean_var(x: torch.Tensor) -> tuple[float, float]:
        mean = (p * x).sum()
        return float(mean), float((p * (x - mean) ** 2).sum())

    # 3. many batches from the policy, and the z of each
    idx = sample_sequences(logp, n_batches * batch_size, generator).view(n_batches, batch_size)
    clamped_mean, clamped_var = mean_var(clamped)
    return GapFalseAlarms(
        kl=float((p * k1).sum()),
        gap_variance=mean_var(gap)[1],
        check_variance=mean_var(check)[1],
        gap_z=_batch_z(gap[idx]),
        check_z=_batch_z(check[idx]),
        batch_size=batch_size,
        threshold=threshold,
        clamp=clamp,
        clamped_gap_mean=clamped_mean,
        clamped_gap_variance=clamped_var,
    )


def pushed_down_pair(
    vocab_size: int,
    n_pushed: int,
    push: float,
    generator: torch.Generator,
    *,
    scale: float = 2.0,
    noise: float = 0.3,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A categorical reference, and a policy that has pushed the reference's favourite tokens down.

    The reference's logits are :math:`s\\,\\varepsilon_v`, the policy's
    :math:`s\\,\\varepsilon_v + \\sigma\\,\\eta_v - \\delta\\,[v \\in \\mathrm{top}]`, with
    :math:`\\varepsilon, \\eta` standard normal (drawn in that order from ``generator``) and top the
    ``n_pushed`` tokens of largest reference logit: a policy that learned to avoid answers the reference
    likes, as RLHF does. The pushed tokens keep little policy mass, so :math:`\\pi_\\mathrm{ref}/\\pi`
    is about :math:`e^{\\delta}` on them: the KL stays small while :math:`\\chi^2(\\pi_\\mathrm{ref} \\|
    \\pi)` grows like :math:`e^{\\delta}`. The noise gives every other token a log-ratio of its own.

    Parameters
    ----------
    vocab_size : int
        V >= 2.
    n_pushed : int
        In [1, V).
    push : float
        :math:`\\delta \\ge 0`, nats.
    generator : torch.Generator
    scale : float
        s > 0, the spread of the reference's logits.
    noise : float
        :math:`\\sigma \\ge 0`.

    Returns
    -------
    (Tensor, Tensor)
        The policy's and the reference's log-probs, float64, shape (1, V) each: the next-token tables of
        ``SequenceSpace(vocab_size=V, length=1)``.

    Examples
    --------
    >>> pi, ref = pushed_down_pair(5, 1, 0.0, torch.Generator().manual_seed(0), noise=0.0)
    >>> torch.equal(pi, ref)
    True
    """
    vocab_size = check_positive_int(vocab_size, "vocab_size")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    n_pushed = check_positive_int(n_pushed, "n_pushed")
    if n_pushed >= vocab_size:
        raise ValueError(f"n_pushed must be below vocab_size ({vocab_size}), got {n_pushed}")
    push = check_coef(push, "push")
    generator = check_generator(generator)
    scale = check_positive(scale, "scale")
    noise = check_coef(noise, "noise")
    ref_logits = scale * torch.randn(vocab_size, generator=generator, dtype=torch.float64)  # (V,)
    pi_logits = ref_logits + noise * torch.randn(vocab_size, generator=generator, dtype=torch.float64)
    top = torch.topk(ref_logits, n_pushed).indices
    pi_logits[top] -= push
    return torch.log_softmax(pi_logits, -1)[None], torch.log_softmax(ref_logits, -1)[None]


# ----------------------------------------------------------------------------------------------------
# The vocabulary split over processes


@dataclass(frozen=True)
class RankResult:
    """What one rank of :func:`split_vocabulary` computed (every field a float64 or float32 tensor).

    Attributes
    ----------
    logprobs, entropy, kl : Tensor, shape (N,)
        The full results, the same on every rank.
    grad_hidden : Tensor, shape (N, H)
        The gradient of ``sum(logprobs + entropy + kl)`` with respect to the hidden states.
    grad_weight : Tensor, shape (V_r, H)
        Its gradient with respect to this rank's slice of the output embedding.
    vocab_slice : (int, int)
        The ids ``[start, stop)`` this rank held.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor
    kl: torch.Tensor
    grad_hidden: torch.Tensor
    grad_weight: torch.Tensor
    vocab_slice: tuple[int, int]


def write_rank_result(folder: str, rank: int, result: object) -> None:
    """Store one rank's result for :func:`spawn_ranks`, atomically (a process killed while writing leaves
    no file, never half of one)."""
    path = os.path.join(folder, f"rank{rank}.pkl")
    with open(path + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(path + ".tmp", path)


def spawn_ranks(target, world_size: int, args: tuple = (), *, timeout: float = 300.0) -> list[object]:
    """Run ``target(rank, world_size, folder, *args)`` in ``world_size`` fresh processes (spawn) and return
    what each stored with :func:`write_rank_result`, in rank order.

    ``folder`` is a new temporary folder, for the file rendezvous of ``torch.distributed`` and the results.
    A process that fails before storing its result fails the call (its exception or signal is raised); one
    that fails after, while tearing down, does not: torch 2.13's gloo backend has been seen to abort a
    process with SIGABRT ("terminate called without an active exception") after
    ``destroy_process_group``, when every result had been computed and stored (once, in one of this
    project's CI runs). Raises TimeoutError after ``timeout`` seconds.
    """
    import torch.multiprocessing as mp

    world_size = check_positive_int(world_size, "world_size")
    timeout = check_positive(timeout, "timeout")
    with tempfile.TemporaryDirectory() as folder:
        ctx = mp.start_processes(target, args=(world_size, folder, *args), nprocs=world_size, join=False,
                                 start_method="spawn")
        paths = [os.path.join(folder, f"rank{r}.pkl") for r in range(world_size)]
        deadline = timeout
        try:
            while not ctx.join(timeout=min(deadline, 5.0)):
                deadline -= 5.0
                if deadline <= 0:
                    for p in ctx.processes:
                        p.kill()
                    raise TimeoutError(f"the {world_size} processes did not finish within {timeout} s")
        except mp.ProcessExitedException:
            if not all(os.path.exists(p) for p in paths):  # it failed before its result was stored
                raise
        results = []
        for path in paths:
            with open(path, "rb") as f:
                results.append(pickle.load(f))
    return results


def _split_rank(rank: int, world: int, folder: str, inputs: dict, slices: list[int],
                temperature: float, chunk_size: int | tuple[int, int] | None) -> None:
    """One process of :func:`split_vocabulary` (the target of :func:`spawn_ranks`)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(folder, 'rendezvous')}",
                            rank=rank, world_size=world)
    try:
        lo, hi = slices[rank], slices[rank + 1]
        hidden = inputs["hidden"].clone().requires_grad_()
        weight = inputs["weight"][lo:hi].clone().requires_grad_()
        logp, ent = linear_logprobs(hidden, weight, inputs["tokens"], temperature=temperature,
                                    return_entropy=True, chunk_size=chunk_size,
                                    group=dist.group.WORLD)
        kl = linear_exact_kl(hidden, weight, inputs["ref_hidden"], inputs["ref_weight"][lo:hi],
                             temperature=temperature, chunk_size=chunk_size, group=dist.group.WORLD)
        (logp + ent + kl).sum().backward()
        result = RankResult(logp.detach(), ent.detach(), kl.detach(), hidden.grad, weight.grad, (lo, hi))
        write_rank_result(folder, rank, result)
        dist.barrier()  # no rank tears its connections down while another still exchanges
    finally:
        dist.destroy_process_group()


def split_vocabulary(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    ref_hidden: torch.Tensor,
    ref_weight: torch.Tensor,
    *,
    world_size: int = 2,
    temperature: float = 1.0,
    chunk_size: int | tuple[int, int] | None = None,
    timeout: float = 300.0,
) -> list[RankResult]:
    """Log-probs, entropy and exact KL with the vocabulary split over ``world_size`` gloo processes.

    Starts ``world_size`` fresh processes (:func:`spawn_ranks`: spawn, a file rendezvous in a temporary
    folder); rank r holds rows ``[r V / R, (r + 1) V / R)`` of ``weight`` and ``ref_weight``
    (rounded down), the hidden states and tokens whole, and computes
    ``linear_logprobs(..., return_entropy=True, group=WORLD)`` and ``linear_exact_kl(..., group=WORLD)``
    and the gradients of the sum of all three.

    Parameters
    ----------
    hidden : Tensor, shape (N, H)
    weight : Tensor, shape (V, H)
    tokens : Tensor, shape (N,), integer
    ref_hidden : Tensor, shape (N, H_ref)
    ref_weight : Tensor, shape (V, H_ref)
    world_size : int
        Processes, each with a non-empty slice (at most V).
    temperature : float
    chunk_size : int or (int, int), optional
        The tile, as in :func:`~kltutorial.logprobs.hidden.linear_logprobs`.
    timeout : float
        Seconds to wait for the processes.

    Returns
    -------
    list of RankResult
        One per rank, in rank order.
    """
    world_size = check_positive_int(world_size, "world_size")
    timeout = check_positive(timeout, "timeout")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError("weight must be a (V, H) tensor")
    if world_size > weight.shape[0]:
        raise ValueError(f"world_size must be at most V = {weight.shape[0]}, got {world_size}")
    V = weight.shape[0]
    slices = [r * V // world_size for r in range(world_size + 1)]
    inputs = {"hidden": hidden.detach(), "weight": weight.detach(), "tokens": tokens,
              "ref_hidden": ref_hidden.detach(), "ref_weight": ref_weight.detach()}
    return spawn_ranks(_split_rank, world_size, (inputs, slices, temperature, chunk_size), timeout=timeout)
