r"""What a log line holds: the KL by k1 and k3 with standard errors, signs, entropy; their exact
expectations on a listable space; per-token KL tables (book section 12).

Part of :mod:`kltutorial.diagnostics`. Shapes: B batch (sequences), T positions, V vocabulary,
P prefixes, V**T sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validation import check_float_tensor, check_mask, check_tensor_pair
from ..logprobs import exact_kl
from ..sequences import SequenceSpace, sequence_logprobs, token_logprobs

__all__ = [
    "KLLogStats",
    "kl_log_stats",
    "expected_log_stats",
    "entropy",
    "TokenKLTable",
    "token_kl_table",
]


@dataclass(frozen=True)
class KLLogStats:
    """The KL numbers of one log line (a batch, or their exact expectation).

    Attributes
    ----------
    k1, k3 : float
        Mean over sequences of :math:`\\sum_t k(\\Delta_t)` over the masked positions, with
        :math:`\\Delta_t = \\log\\pi(y_t \\mid y_{<t}) - \\log\\pi_\\mathrm{ref}(y_t \\mid y_{<t})`,
        k1 :math:`= \\Delta` and k3 :math:`= e^{-\\Delta} - 1 + \\Delta` (nats).
    k1_se, k3_se : float
        Their standard errors, :math:`s/\\sqrt{B}` (0 for an exact expectation).
    gap_se : float
        Standard error of :attr:`gap`, from the per-sequence differences of the same samples.
    negative_sequences : float
        Share of sequences whose k1 sum is negative.
    negative_tokens : float
        Share of masked tokens whose k1 is negative.
    max_sequence_k1 : float
        The largest k1 sum of a sequence (over the sequences a sampler can produce, when exact).
    n : int or None
        Sequences in the batch; None for an exact expectation.
    """

    k1: float
    k3: float
    k1_se: float
    k3_se: float
    gap_se: float
    negative_sequences: float
    negative_tokens: float
    max_sequence_k1: float
    n: int | None

    @property
    def gap(self) -> float:
        """``k1 - k3``: the mean of :math:`\\sum_t (1 - \\pi_\\mathrm{ref}(y_t \\mid y_{<t}) / \\pi(y_t \\mid
        y_{<t}))`, which is exactly 0 in expectation for tokens sampled from the policy, whatever the KL."""
        return self.k1 - self.k3


def _k1_k3(log_ratio: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence sums of k1 and k3 over the masked positions, (B,) each, in float64."""
    d = log_ratio.to(torch.float64)
    zero = torch.zeros_like(d)
    k1 = torch.where(mask, d, zero).sum(-1)
    k3 = torch.where(mask, torch.expm1(-d) + d, zero).sum(-1)  # e^{-d} - 1 + d without cancellation
    return k1, k3


def _check_positions_mask(mask: object, shape: tuple[int, ...]) -> torch.Tensor:
    """A (B, T) or (T,) 0/1 mask, as a boolean tensor broadcastable to ``shape``; None: every position."""
    if mask is None:
        return torch.ones(shape, dtype=torch.bool)
    if isinstance(mask, torch.Tensor) and mask.dim() == 1:
        return check_mask(mask, "mask", torch.Size(shape[-1:])).expand(shape)
    return check_mask(mask, "mask", torch.Size(shape))


def kl_log_stats(
    policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor, mask: torch.Tensor | None = None
) -> KLLogStats:
    """The KL numbers of one log line, from the per-token log-probs of a sampled batch.

    .. math::
        \\widehat{\\mathrm{KL}}_{k} = \\frac{1}{B} \\sum_{i=1}^{B} \\sum_{t} m_{i,t}\\, k(\\Delta_{i,t}),
        \\qquad \\mathrm{se} = \\frac{s}{\\sqrt{B}}

    with :math:`s` the sample standard deviation of the per-sequence sums. On tokens sampled from the
    policy, k1 and k3 both estimate :math:`\\mathrm{KL}(\\pi \\| \\pi_\\mathrm{ref})` without bias: their
    difference, per token :math:`1 - \\pi_\\mathrm{ref}(y_t \\mid y_{<t}) / \\pi(y_t \\mid y_{<t})`, has mean
    :math:`1 - \\sum_v \\pi_\\mathrm{ref}(v \\mid y_{<t}) = 0` (where the policy gives every token the
    reference can produce some probability). A gap of many ``gap_se``, or a negative
    mean k1, says the tokens did not come from the policy whose log-probs were used.

    Parameters
    ----------
    policy_logprobs, reference_logprobs : Tensor, shape (B, T)
        :math:`\\log\\pi(y_t \\mid y_{<t})` and :math:`\\log\\pi_\\mathrm{ref}(y_t \\mid y_{<t})` of the
        sampled tokens.
    mask : Tensor, shape (B, T) or (T,), optional
        1 for the positions that count (the response), 0 elsewhere; default: every position.

    Returns
    -------
    KLLogStats
        ``n`` = B; the standard errors are NaN for B = 1.

    Examples
    --------
    >>> lp = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    >>> lq = torch.tensor([[-2.0, -1.0], [-1.5, -1.0]])
    >>> s = kl_log_stats(lp, lq)  # k1 sums: 1 - 1 = 0 and 0.5
    >>> s.k1, s.negative_tokens, s.negative_sequences
    (0.25, 0.25, 0.0)
    """
    policy_logprobs, reference_logprobs = check_tensor_pair(
        policy_logprobs, "policy_logprobs", reference_logprobs, "reference_logprobs"
    )
    if policy_logprobs.dim() != 2:
        raise ValueError(f"policy_logprobs must have shape (B, T), got {tuple(policy_logprobs.shape)}")
    m = _check_positions_mask(mask, tuple(policy_logprobs.shape))
    log_ratio = policy_logprobs.to(torch.float64) - reference_logprobs.to(torch.float64)  # (B, T)
    k1, k3 = _k1_k3(log_ratio, m)  # (B,), (B,)
    B = k1.shape[0]
    n_tokens = int(m.sum())
    se = (lambda x: float(x.std() / math.sqrt(B))) if B > 1 else (lambda x: math.nan)
    return KLLogStats(
        k1=float(k1.mean()),
        k3=float(k3.mean()),
        k1_se=se(k1),
        k3_se=se(k3),
        gap_se=se(k1 - k3),
        negative_sequences=float((k1 < 0).double().mean()),
        negative_tokens=float(((log_ratio < 0) & m).sum()) / n_tokens if n_tokens else math.nan,
        max_sequence_k1=float(k1.max()),
        n=B,
    )


def expected_log_stats(
    space: SequenceSpace,
    policy_table: torch.Tensor,
    reference_table: torch.Tensor,
    sampler_table: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> KLLogStats:
    """The exact expectation of :func:`kl_log_stats` for sequences drawn from a sampler, by enumeration.

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
    m = _check_positions_mask(mask, (space.n_sequences, space.length))
    support = q > 0
    # where q(y) = 0 a log-prob may be -inf; those sequences count for nothing, so give them Delta = 0
    log_ratio = torch.where(support[:, None], lp - lq, torch.zeros_like(lp)).to(torch.float64)
    if not torch.isfinite(log_ratio).all():
        raise ValueError(
            "the sampler draws a sequence that the policy or the reference cannot produce, so its "
            "log-ratio is infinite; the expected estimates are not finite"
        )
    k1, k3 = _k1_k3(log_ratio, m)  # (V**T,) each
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


def entropy(logprobs: torch.Tensor) -> torch.Tensor:
    """Entropy of each next-token distribution, :math:`H = -\\sum_v p_v \\log p_v` (nats, 0 log 0 = 0).

    Parameters
    ----------
    logprobs : Tensor, shape (..., V)
        Normalised log-probabilities (a log-softmax); ``-inf`` for an impossible token.

    Returns
    -------
    Tensor, shape (...)

    Examples
    --------
    >>> entropy(torch.tensor([[0.5, 0.5], [1.0, 0.0]]).log())  # log 2, and 0
    tensor([0.6931, 0.0000])
    """
    logprobs = check_float_tensor(logprobs, "logprobs", allow_inf=True)
    terms = torch.where(torch.isinf(logprobs), torch.zeros_like(logprobs), -logprobs.exp() * logprobs)
    return terms.sum(-1)




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
        Rows of ``space.sequences`` (e.g. from :func:`kltutorial.sequences.sample_autoregressive`).

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
