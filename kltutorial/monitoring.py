r"""What to log at every step of a KL-penalised run, and the spikes to flag in the log (book section 12).

The library's monitoring: it imports only the library and works on the tensors a trainer already has.

1. **A log line.** :func:`kl_log_stats` turns the per-token log-probs of a sampled batch into the numbers
   worth logging at every step: the batch means of the per-sequence k1 and k3 sums with their standard
   errors, the share of sequences and of tokens whose k1 is negative, and the largest sequence k1
   (:class:`KLLogStats`); :func:`sequence_k1_k3` gives the two per-sequence sums themselves and
   :func:`entropy` the entropy of next-token distributions. :func:`exact_kl_check` compares k1 with the
   exact per-position KL on the same batch, a check of the sampler whose false alarms far from the
   reference are much rarer than the k1 - k3 gap's, though its tails too are heavier than a Gaussian's
   (book section 12 measures both).
2. **Spikes.** :func:`detect_spikes` flags the steps of a logged series that lie far above the rolling
   median of the steps before them, in units of their median absolute deviation (MAD).

The same log line computed *exactly*, on a listable space and for any sampler, and the samplers that are
not the policy, are the §12 study's (:mod:`kltutorial.studies.diagnostics`).

Shapes: B batch (sequences), T positions, V vocabulary, N steps of a log.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ._validation import (
    check_choice,
    check_float_tensor,
    check_positions_mask,
    check_positive,
    check_positive_int,
    check_tensor_pair,
)

__all__ = [
    "KLLogStats",
    "kl_log_stats",
    "exact_kl_check",
    "sequence_k1_k3",
    "entropy",
    "MAD_TO_STD",
    "SpikeReport",
    "detect_spikes",
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
        y_{<t}))`, which is exactly 0 in expectation for tokens sampled from the policy, whatever the KL.

        Its per-token variance is :math:`\\chi^2(\\pi_\\mathrm{ref} \\| \\pi)` of the next-token
        distributions, and the ratio has a heavy right tail wherever the policy has pushed down tokens the
        reference likes. Near the reference (that :math:`\\chi^2` small) a gap of many ``gap_se`` says
        the tokens did not come from the policy; far from it, correct batches cross that line too, because a
        typical batch misses the rare large ratios and so has a biased mean and too small a standard error
        (:func:`kltutorial.studies.diagnostics.gap_false_alarms` measures how often). There,
        :func:`exact_kl_check` raises far fewer false alarms, read at a high threshold. A k3 clamped at 10,
        as verl and OpenRLHF clamp it, biases the gap upwards on correct samples."""
        return self.k1 - self.k3


def sequence_k1_k3(log_ratio: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence sums of k1 and k3 over the masked positions, (B,) each, in float64.

    ``log_ratio`` (B, T) holds :math:`\\log\\pi - \\log\\pi_\\mathrm{ref}` of the sampled tokens and
    ``mask`` (B, T) is boolean; k3 is computed as ``expm1(-d) + d``, which keeps the digits that
    ``exp(-d) - 1 + d`` loses to cancellation at small ``d``.

    Examples
    --------
    >>> d = torch.tensor([[0.5, -0.5]])
    >>> [round(float(x), 4) for x in sequence_k1_k3(d, torch.tensor([[True, True]]))]
    [0.0, 0.2553]
    """
    d = log_ratio.to(torch.float64)
    zero = torch.zeros_like(d)
    k1 = torch.where(mask, d, zero).sum(-1)
    k3 = torch.where(mask, torch.expm1(-d) + d, zero).sum(-1)  # e^{-d} - 1 + d without cancellation
    return k1, k3



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
    reference can produce some probability). A negative mean k1 says the tokens did not come from the
    policy whose log-probs were used; so does a gap of many ``gap_se`` while the policy is near the
    reference, but far from it the gap's standard error misleads and correct batches cross that line too
    (see :attr:`KLLogStats.gap`; :func:`exact_kl_check` raises far fewer false alarms there).

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
    m = check_positions_mask(mask, tuple(policy_logprobs.shape))
    log_ratio = policy_logprobs.to(torch.float64) - reference_logprobs.to(torch.float64)  # (B, T)
    k1, k3 = sequence_k1_k3(log_ratio, m)  # (B,), (B,)
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


def exact_kl_check(
    policy_logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    position_kl: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[float, float]:
    """k1 against the exact per-position KL on the same batch: the mean of their difference and its
    standard error, a check of the sampler that raises far fewer false alarms than the k1 - k3 gap far from
    the reference.

    .. math::
        D = \\frac{1}{B} \\sum_{i=1}^{B} \\sum_t m_{i,t} \\big(\\Delta_{i,t} - \\mathrm{KL}_{i,t}\\big),
        \\qquad \\mathrm{se} = \\frac{s}{\\sqrt{B}}

    with :math:`\\Delta_{i,t}` the log-ratio of the sampled token and :math:`\\mathrm{KL}_{i,t} =
    \\mathrm{KL}(\\pi(\\cdot \\mid y_{<t}) \\| \\pi_\\mathrm{ref}(\\cdot \\mid y_{<t}))` the exact KL of
    the next-token distributions at its prefix (:func:`kltutorial.logprobs.exact_kl` of both models'
    logits). Given the prefix, :math:`\\Delta_t` has mean :math:`\\mathrm{KL}_t` when the token is drawn
    from the policy, so :math:`D` has mean 0 on correct samples and moves when the tokens come from
    elsewhere. The k1 - k3 gap's per-token variance is :math:`\\chi^2(\\pi_\\mathrm{ref} \\| \\pi)`, where
    a token the policy has pushed down by :math:`\\delta` nats weighs :math:`e^{\\delta}`; here each term's
    variance is that of the log-ratio given the prefix, where it weighs :math:`\\delta`. So on correct
    samples far from the reference ``D / se`` crosses a threshold far less often than the gap's z does,
    though more often than a standard normal would: its tails are heavy too
    (:func:`kltutorial.studies.diagnostics.gap_false_alarms` measures both, book section 12 reports
    them), so read it at a high threshold; and no clamp biases it. The price: both models' full
    next-token distributions at every position, so log it on a few batches.

    Parameters
    ----------
    policy_logprobs, reference_logprobs : Tensor, shape (B, T)
        Log-probs of the sampled tokens under :math:`\\pi` and :math:`\\pi_\\mathrm{ref}`.
    position_kl : Tensor, shape (B, T)
        :math:`\\mathrm{KL}_t` at each position's prefix, finite.
    mask : Tensor, shape (B, T) or (T,), optional
        The positions that count (default: all).

    Returns
    -------
    (float, float)
        :math:`D` and its standard error (NaN for B = 1).

    Examples
    --------
    >>> lp = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    >>> lq = torch.tensor([[-2.0, -1.0], [-1.5, -1.0]])
    >>> kl = torch.tensor([[0.25, 0.0], [0.25, 0.0]])  # per sequence: 0 - 0.25, 0.5 - 0.25
    >>> exact_kl_check(lp, lq, kl)[0]
    0.0
    """
    policy_logprobs, reference_logprobs = check_tensor_pair(
        policy_logprobs, "policy_logprobs", reference_logprobs, "reference_logprobs"
    )
    if policy_logprobs.dim() != 2:
        raise ValueError(f"policy_logprobs must have shape (B, T), got {tuple(policy_logprobs.shape)}")
    position_kl = check_float_tensor(position_kl, "position_kl")
    if position_kl.shape != policy_logprobs.shape:
        raise ValueError(
            f"position_kl must have the shape of the log-probs, {tuple(policy_logprobs.shape)}, one KL per "
            f"sampled position; got {tuple(position_kl.shape)}"
        )
    m = check_positions_mask(mask, tuple(policy_logprobs.shape))
    log_ratio = policy_logprobs.to(torch.float64) - reference_logprobs.to(torch.float64)  # (B, T)
    d = log_ratio - position_kl.to(torch.float64)
    per_sequence = torch.where(m, d, torch.zeros_like(d)).sum(-1)  # (B,)
    B = per_sequence.shape[0]
    se = float(per_sequence.std() / math.sqrt(B)) if B > 1 else math.nan
    return float(per_sequence.mean()), se


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


# ----------------------------------------------------------------------------------------------------
# Spikes

#: :math:`1/\Phi^{-1}(3/4)`: the MAD times this estimates the standard deviation of a normal sample.
MAD_TO_STD: float = 1.482602218505602


@dataclass(frozen=True)
class SpikeReport:
    """The result of :func:`detect_spikes`; arrays of shape (N,), one entry per step of the log.

    Attributes
    ----------
    values : ndarray
        The logged series.
    median, scale : ndarray
        Rolling median of the ``window`` steps before each step, and the robust scale
        ``max(MAD_TO_STD * MAD, min_scale)`` (their mean and standard deviation with ``centre="mean"``);
        NaN for the first ``window`` steps.
    score : ndarray
        ``(values - median) / scale``; NaN for the first ``window`` steps.
    flags : ndarray of bool
        True where the step is a spike.
    threshold : float
    """

    values: np.ndarray
    median: np.ndarray
    scale: np.ndarray
    score: np.ndarray
    flags: np.ndarray
    threshold: float

    @property
    def indices(self) -> np.ndarray:
        """The steps flagged, shape (number of spikes,)."""
        return np.flatnonzero(self.flags)


SIDES: tuple[str, ...] = ("upper", "both")
CENTRES: tuple[str, ...] = ("median", "mean")


def detect_spikes(
    values: Sequence[float] | np.ndarray,
    window: int = 20,
    threshold: float = 6.0,
    *,
    min_scale: float = 1e-9,
    side: str = "upper",
    centre: str = "median",
) -> SpikeReport:
    """Flag the steps of a log that lie far from the rolling median of the steps before them.

    .. math::
        m_t = \\operatorname{median}(x_{t-w}, \\dots, x_{t-1}), \\qquad
        s_t = \\max\\big(1.4826\\, \\operatorname{median}_{j}|x_{t-j} - m_t|,\\; s_\\mathrm{min}\\big),
        \\qquad z_t = \\frac{x_t - m_t}{s_t}

    and step t is a spike when :math:`z_t >` ``threshold`` (``side="upper"``, the KL jumping up) or
    :math:`|z_t| >` ``threshold`` (``side="both"``). Median and MAD ignore a few outliers in the window,
    so one spike neither hides the next nor inflates the scale, unlike a mean and standard deviation; for
    normal noise :math:`1.4826 \\cdot \\mathrm{MAD}` estimates its standard deviation. The window looks
    only backwards, so a flag at step t uses nothing logged after t, as a live monitor must. A lasting
    change of level is flagged until about half the window has seen it.

    Parameters
    ----------
    values : array-like, shape (N,)
        The logged series (e.g. the batch mean of the per-sequence k1 at every step); finite.
    window : int
        w >= 3 past steps; the first w steps get no score.
    threshold : float
        > 0, in robust standard deviations.
    min_scale : float
        > 0, a floor for :math:`s_t`, so that a flat history does not flag rounding noise.
    side : {"upper", "both"}
    centre : {"median", "mean"}
        ``"mean"`` replaces the median and the MAD by the mean and the standard deviation of the window
        (the textbook z-score), for comparison: one spike then inflates the scale for the ``window``
        steps after it and can hide the next one.

    Returns
    -------
    SpikeReport

    Examples
    --------
    >>> x = [1.0, 1.1, 0.9, 1.0, 1.2, 0.8, 5.0, 1.0]
    >>> detect_spikes(x, window=5, threshold=6.0).indices  # MAD of 1, 1.1, 0.9, 1, 1.2 is 0.1
    array([6])
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError("values must be a non-empty 1-d series of finite numbers")
    window = check_positive_int(window, "window")
    if window < 3:
        raise ValueError(f"window must be >= 3 past steps, got {window}")
    threshold = check_positive(threshold, "threshold")
    min_scale = check_positive(min_scale, "min_scale")
    check_choice(side, "side", SIDES)
    check_choice(centre, "centre", CENTRES)
    n = x.size
    median = np.full(n, np.nan)
    scale = np.full(n, np.nan)
    if n > window:
        past = np.lib.stride_tricks.sliding_window_view(x, window)[:-1]  # (n - w, w): steps t-w .. t-1
        if centre == "median":
            median[window:] = np.median(past, axis=1)
            spread = MAD_TO_STD * np.median(np.abs(past - median[window:, None]), axis=1)
        else:
            median[window:] = past.mean(axis=1)
            spread = past.std(axis=1, ddof=1)
        scale[window:] = np.maximum(spread, min_scale)
    score = (x - median) / scale
    with np.errstate(invalid="ignore"):
        flags = score > threshold if side == "upper" else np.abs(score) > threshold
    return SpikeReport(values=x, median=median, scale=scale, score=score, flags=flags, threshold=threshold)
