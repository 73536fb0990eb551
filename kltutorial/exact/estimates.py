r"""Estimating a KL from sampled sequences, checked against the exact value (book sections 3 and 4).

On a listable space every estimator is a function of the sampled sequence, so its mean and variance are
finite sums over the :math:`V^T` sequences, exactly; sampling then only has to show how fast the
estimate gets there. Two unbiased estimators of :math:`\mathrm{KL}(\pi\|\pi_{\mathrm{ref}})` from one
sequence :math:`y \sim \pi`:

* :func:`sampled_token_kl`, what a trainer computes from the log-probs of the tokens it sampled,
  :math:`\sum_t k(\Delta_t)` with :math:`\Delta_t = \log\pi(y_t \mid y_{<t}) - \log\pi_{\mathrm{ref}}(y_t
  \mid y_{<t})`. With ``k1`` the sum is :math:`\log\pi(y) - \log\pi_{\mathrm{ref}}(y)`, whose mean is the
  KL by definition; with ``k3`` each term's mean given the prefix is the KL at that prefix, so the sum is
  unbiased too;
* :func:`rao_blackwell_kl`, the exact next-token KL at each prefix of the sample,
  :math:`\sum_t \mathrm{KL}(\pi(\cdot\mid y_{<t}) \| \pi_{\mathrm{ref}}(\cdot\mid y_{<t}))`: the
  expectation, given the prefix, of each sampled term, which needs both models' full next-token rows.
  It is unbiased by the chain rule; it is *an estimate*, not the sequence KL (Amini et al. 2025).

:func:`estimator_moments` gives an estimator's exact bias, spread and sign for any finite pair of
distributions (a categorical, or two distributions over the sequences of a space), and
:func:`exact_mean_and_std` those of any per-sequence statistic. :func:`monte_carlo_convergence` follows
running means of many independent runs against the exact mean and the CLT's :math:`\sigma/\sqrt{n}`.

Shapes: V vocabulary, T positions, V**T sequences, P prefixes, N samples, S runs (seeds), K sample counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import check_logprobs, check_table, check_values
from ..estimators import Estimator, get_estimator, kl_estimate
from ..logprobs import exact_kl
from .space import SequenceSpace, check_space

__all__ = [
    "EstimatorMoments",
    "estimator_moments",
    "exact_mean_and_std",
    "sampled_token_kl",
    "rao_blackwell_kl",
    "MonteCarloConvergence",
    "monte_carlo_convergence",
]


@dataclass(frozen=True)
class EstimatorMoments:
    """Mean, spread and sign of one estimator against the exact KL it estimates.

    Attributes
    ----------
    estimator : str
        The canonical name (an alias such as ``"low_var_kl"`` is resolved to ``"k3"``).
    kl : float
        The exact :math:`\\mathrm{KL}(\\pi\\|\\pi_{\\mathrm{ref}})` in nats.
    mean : float
        :math:`\\mathbb{E}_\\pi[k]` (exact), or the sample mean.
    std : float
        :math:`\\sqrt{\\mathrm{Var}_\\pi[k]}` of one draw (exact), or the sample standard deviation.
    share_negative : float
        :math:`P_\\pi(k < 0)`, or the share of negative samples.
    n_samples : int or None
        ``None`` for exact moments, else the number of samples they were measured on.
    """

    estimator: str
    kl: float
    mean: float
    std: float
    share_negative: float
    n_samples: int | None = None

    @property
    def bias(self) -> float:
        """:math:`\\mathbb{E}[k] - \\mathrm{KL}` in nats."""
        return self.mean - self.kl

    @property
    def relative_bias(self) -> float:
        """bias / KL (Schulman's "bias/true"); NaN when the KL is 0."""
        return self.bias / self.kl if self.kl > 0 else math.nan

    @property
    def relative_std(self) -> float:
        """std / KL (Schulman's "stdev/true"); NaN when the KL is 0."""
        return self.std / self.kl if self.kl > 0 else math.nan

    @property
    def standard_error(self) -> float:
        """std / sqrt(n) of a sampled mean; NaN for exact moments."""
        return self.std / math.sqrt(self.n_samples) if self.n_samples else math.nan


def _sampled_spec(estimator: object, hint: str) -> str:
    spec = get_estimator(estimator)
    if spec.needs_logits:
        raise ValueError(f"estimator must be a sampled estimator such as 'k1' or 'k3', got {estimator!r}; "
                         f"{hint}")
    return spec.name


def _check_indices(space: SequenceSpace, indices: object) -> torch.Tensor:
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"indices must be a torch.Tensor of sequence indices, got {type(indices).__name__}")
    if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
        raise TypeError(f"indices must hold integer sequence indices (torch.long), got dtype {indices.dtype}")
    if indices.dim() != 1 or indices.numel() == 0:
        raise ValueError(f"indices must have shape (N,) with N >= 1, got {tuple(indices.shape)}")
    lo, hi = int(indices.min()), int(indices.max())
    if lo < 0 or hi >= space.n_sequences:
        raise ValueError(
            f"indices must lie in [0, {space.n_sequences}) (rows of space.sequences), "
            f"got values in [{lo}, {hi}]"
        )
    return indices


# ----------------------------------------------------------------------------------------------------
# Exact moments


def estimator_moments(
    logp: torch.Tensor, logq: torch.Tensor, estimator: Estimator = "k1"
) -> EstimatorMoments:
    r"""Exact bias, spread and sign of an estimator for a finite pair of distributions, by enumeration.

    .. math::  \mathbb{E}_p[k] = \sum_y p(y)\, k(\Delta_y), \quad
               \mathrm{Var}_p[k] = \sum_y p(y)\, (k(\Delta_y) - \mathbb{E}_p[k])^2, \quad
               P_p(k < 0) = \sum_{y:\, k(\Delta_y) < 0} p(y),

    with :math:`\Delta_y = \log p(y) - \log q(y)` and :math:`k` from
    :func:`~kltutorial.estimators.kl_estimate`. Outcomes impossible under ``p`` are never drawn and
    count for nothing.

    Parameters
    ----------
    logp, logq : Tensor, shape (Y,)
        Log-probabilities of the sampling distribution (the policy) and of the reference over the same Y
        outcomes, each normalised; ``-inf`` allowed, but not in ``logq`` where ``logp`` is finite.
    estimator : str
        A sampled estimator's name or alias.

    Returns
    -------
    EstimatorMoments
        With ``kl`` the exact :math:`\mathrm{KL}(p\|q)` and ``n_samples=None``.

    Examples
    --------
    >>> p = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> q = torch.tensor([0.25, 0.75], dtype=torch.float64).log()
    >>> m = estimator_moments(p, q, "k1")  # Δ = log 2 or log(2/3), each with probability 1/2
    >>> round(m.kl, 4), round(m.std, 4), m.share_negative  # std = (log 2 - log(2/3)) / 2
    (0.1438, 0.5493, 0.5)
    """
    logp = check_logprobs(logp, "logp")
    logq = check_logprobs(logq, "logq", logp.shape[0])
    name = _sampled_spec(estimator, "the exact KL needs no estimate")
    support = torch.isfinite(logp)
    lp, lq = logp[support], logq[support]  # outcomes that can be drawn
    if not torch.isfinite(lq).all():
        raise ValueError(
            "logq is -inf where logp is finite: KL(p || q) is infinite and no estimator has a mean"
        )
    p = lp.exp()
    kl = float((p * (lp - lq)).sum())
    values = kl_estimate(lp, lq, name)
    mean = float((p * values).sum())
    var = float((p * (values - mean).square()).sum())
    return EstimatorMoments(name, kl, mean, math.sqrt(var), float(p[values < 0].sum()))


def exact_mean_and_std(logp: torch.Tensor, values: torch.Tensor) -> tuple[float, float]:
    r"""Mean and standard deviation of a statistic :math:`f(y)` of one draw :math:`y \sim p`, by enumeration.

    .. math::  \mathbb{E}_p[f] = \sum_y p(y) f(y), \qquad
               \mathrm{sd}_p[f] = \Big(\sum_y p(y) (f(y) - \mathbb{E}_p[f])^2\Big)^{1/2}

    Parameters
    ----------
    logp : Tensor, shape (Y,)
        Normalised log-probabilities; outcomes with ``-inf`` count for nothing.
    values : Tensor, shape (Y,)
        :math:`f(y)` for every outcome, finite (e.g. ``sampled_token_kl(space, pi, ref,
        torch.arange(space.n_sequences))``).

    Returns
    -------
    (float, float)
        The mean and the standard deviation of one draw.

    Examples
    --------
    >>> exact_mean_and_std(torch.tensor([0.5, 0.5]).log(), torch.tensor([0.0, 2.0]))
    (1.0, 1.0)
    """
    logp = check_logprobs(logp, "logp")
    values = check_values(values, "values", logp.shape[0])
    p = logp.exp()
    mean = (p * values).sum()
    var = (p * (values - mean).square()).sum()
    return float(mean), math.sqrt(float(var))


# ----------------------------------------------------------------------------------------------------
# Estimates from sampled sequences


def sampled_token_kl(
    space: SequenceSpace,
    table: torch.Tensor,
    ref_table: torch.Tensor,
    indices: torch.Tensor,
    estimator: Estimator = "k1",
) -> torch.Tensor:
    r"""The estimate a trainer makes from the sampled tokens alone: :math:`\sum_t k(\Delta_t)` per sequence.

    Only the log-probabilities of the tokens actually sampled enter, as in training (one gathered entry of
    each model's next-token row per position). With ``k1`` the sum telescopes to
    :math:`\log\pi(y) - \log\pi_{\mathrm{ref}}(y)`, whose mean under :math:`\pi` is
    :math:`\mathrm{KL}(\pi\|\pi_{\mathrm{ref}})` by definition.

    Parameters
    ----------
    space : SequenceSpace
    table, ref_table : Tensor, shape (P, V)
        Next-token log-probs of the policy :math:`\pi`, from which ``indices`` were drawn, and of the
        reference.
    indices : Tensor, shape (N,), int64
        Rows of ``space.sequences`` (from :func:`~kltutorial.exact.sample_autoregressive`;
        ``torch.arange(V**T)`` gives every sequence, for exact moments with :func:`exact_mean_and_std`).
    estimator : str
        The per-token estimator (``"k1"``, ``"k3"``, ...).

    Returns
    -------
    Tensor, shape (N,)
        Nats, in the tables' dtype.

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> pi = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]], dtype=torch.float64).log()
    >>> ref = torch.tensor([[0.5, 0.5], [0.25, 0.75], [0.75, 0.25]], dtype=torch.float64).log()
    >>> sampled_token_kl(space, pi, ref, torch.tensor([0, 1]))  # log(0.5/0.25), log(0.5/0.75)
    tensor([ 0.6931, -0.4055], dtype=torch.float64)
    """
    check_space(space)
    table = check_table(space, table, "table")
    ref_table = check_table(space, ref_table, "ref_table")
    indices = _check_indices(space, indices)
    name = _sampled_spec(estimator, "for the exact per-position KL use rao_blackwell_kl")
    rows, tokens = space.prefix_ids[indices], space.sequences[indices]  # (N, T) each
    lp, lq = table[rows, tokens], ref_table[rows, tokens]  # (N, T): log-probs of the sampled tokens
    if not (torch.isfinite(lp).all() and torch.isfinite(lq).all()):
        raise ValueError(
            "a sampled token is impossible under table or ref_table (log-prob -inf): indices must be drawn "
            "from table, and ref_table must allow every token the policy can draw (else the KL is infinite)"
        )
    return kl_estimate(lp, lq, name).sum(-1)


def rao_blackwell_kl(
    space: SequenceSpace, table: torch.Tensor, ref_table: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    r"""The exact next-token KL summed along each sampled prefix,
    :math:`\sum_t \mathrm{KL}(\pi(\cdot\mid y_{<t}) \,\|\, \pi_{\mathrm{ref}}(\cdot\mid y_{<t}))`.

    An unbiased estimate of the sequence KL, not the sequence KL itself: its mean under
    :math:`y \sim \pi` is the chain rule's :math:`\sum_t \mathbb{E}_{y_{<t}}\mathrm{KL}_t` (see
    :func:`~kltutorial.exact.per_position_kl`). Each term is the conditional mean, given the prefix,
    of the sampled term :math:`\Delta_t` of :func:`sampled_token_kl` (Rao–Blackwellisation, position by
    position), so no term varies more than the one it replaces; the variance of the sum also holds
    covariances between positions, and is smaller in the usual case but not always
    (``tests/test_sequence_estimates.py`` has a two-token model where the sampled-token sum is constant
    and this one is not). It needs both models' whole next-token rows at every sampled prefix, which a
    trainer has as logits.

    Parameters
    ----------
    space : SequenceSpace
    table, ref_table : Tensor, shape (P, V)
    indices : Tensor, shape (N,), int64

    Returns
    -------
    Tensor, shape (N,)
        Nats, >= 0; ``inf`` if the reference rules out a token the policy allows at a visited prefix.

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> pi = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]], dtype=torch.float64).log()
    >>> ref = torch.tensor([[0.5, 0.5], [0.25, 0.75], [0.75, 0.25]], dtype=torch.float64).log()
    >>> rao_blackwell_kl(space, pi, ref, torch.tensor([0, 1]))  # 0 + 0.1438 whatever the tokens
    tensor([0.1438, 0.1438], dtype=torch.float64)
    """
    check_space(space)
    table = check_table(space, table, "table")
    ref_table = check_table(space, ref_table, "ref_table")
    indices = _check_indices(space, indices)
    row_kl = exact_kl(table[None], ref_table[None])[0]  # (P,): KL of each pair of next-token rows
    return row_kl[space.prefix_ids[indices]].sum(-1)  # (N,)


# ----------------------------------------------------------------------------------------------------
# Convergence of running means


@dataclass(frozen=True)
class MonteCarloConvergence:
    """Running means of S independent runs of an estimator, against its exact mean and spread.

    Attributes
    ----------
    sample_counts : ndarray, shape (K,), int
        The numbers of samples n at which the runs are recorded, increasing, >= 2.
    estimates : ndarray, shape (S, K)
        The mean of the first n draws of each run.
    standard_errors : ndarray, shape (S, K)
        Each run's own standard error, its sample standard deviation (Bessel) over :math:`\\sqrt{n}`.
    exact_mean, exact_std : float
        The estimator's exact mean and the standard deviation of one draw.
    """

    sample_counts: np.ndarray
    estimates: np.ndarray
    standard_errors: np.ndarray
    exact_mean: float
    exact_std: float

    @property
    def clt_standard_error(self) -> np.ndarray:
        """:math:`\\sigma/\\sqrt{n}` at each sample count, shape (K,): the spread the runs should show."""
        return self.exact_std / np.sqrt(self.sample_counts)

    def coverage(self, z: float = 1.96) -> np.ndarray:
        """Share of runs whose interval ``estimate ± z * standard_error`` holds the exact mean, shape (K,)."""
        hit = np.abs(self.estimates - self.exact_mean) <= z * self.standard_errors
        return hit.mean(axis=0)


def monte_carlo_convergence(
    draws: torch.Tensor | np.ndarray, sample_counts: Sequence[int], exact_mean: float, exact_std: float
) -> MonteCarloConvergence:
    r"""Running mean and standard error of each row of ``draws`` at the given sample counts.

    .. math::  \hat\mu_n = \frac1n \sum_{i \le n} x_i, \qquad
               \widehat{\mathrm{se}}_n = \frac{1}{\sqrt n}
               \Big(\frac{1}{n-1}\sum_{i\le n}(x_i - \hat\mu_n)^2\Big)^{1/2}

    Parameters
    ----------
    draws : Tensor or ndarray, shape (S, N)
        S independent runs of N draws each (e.g. :func:`sampled_token_kl` of ``S * N`` sampled sequences,
        reshaped), finite.
    sample_counts : sequence of int, length K
        Increasing, each in [2, N].
    exact_mean, exact_std : float
        The exact mean and one-draw standard deviation (:func:`exact_mean_and_std`).

    Returns
    -------
    MonteCarloConvergence

    Examples
    --------
    >>> run = monte_carlo_convergence(np.array([[0.0, 2.0, 1.0, 1.0]]), [2, 4], 1.0, 1.0)
    >>> run.estimates, run.standard_errors.round(4)
    (array([[1., 1.]]), array([[1.    , 0.4082]]))
    """
    x = np.asarray(draws.detach().cpu() if isinstance(draws, torch.Tensor) else draws, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 2:
        raise ValueError(f"draws must have shape (S, N) with N >= 2 draws per run, got {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("draws must be finite")
    counts = np.asarray(sample_counts)
    if counts.ndim != 1 or counts.size == 0 or not np.issubdtype(counts.dtype, np.integer):
        raise TypeError(f"sample_counts must be a non-empty sequence of ints, got {sample_counts!r}")
    if counts[0] < 2 or counts[-1] > x.shape[1] or np.any(np.diff(counts) <= 0):
        raise ValueError(
            f"sample_counts must increase and lie in [2, {x.shape[1]}] (the draws per run), "
            f"got {counts.tolist()}"
        )
    exact_mean, exact_std = (float(v) for v in (exact_mean, exact_std))
    if not (math.isfinite(exact_mean) and math.isfinite(exact_std) and exact_std >= 0):
        raise ValueError(
            f"exact_mean must be finite and exact_std finite and >= 0, got {exact_mean}, {exact_std}"
        )
    # Shift by the exact mean before summing squares, so that the running variance does not cancel.
    centred = x - exact_mean
    s1 = np.cumsum(centred, axis=1)[:, counts - 1]  # (S, K)
    s2 = np.cumsum(centred**2, axis=1)[:, counts - 1]  # (S, K)
    n = counts.astype(np.float64)
    var = np.maximum(s2 - s1**2 / n, 0.0) / (n - 1)
    return MonteCarloConvergence(counts.copy(), exact_mean + s1 / n, np.sqrt(var / n), exact_mean, exact_std)
