r"""KL divergence, entropy and cross-entropy of categorical distributions, and the optimum of a
forward-KL penalty (book sections 1 and 2).

The package's introduction to the KL divergence is in :mod:`kltutorial.exact`. Distributions are
arrays of probabilities whose last axis holds the K categories; the optimum takes log-probs as
:func:`kltutorial.exact.optimal_policy` does, over any finite set of outcomes (N of them).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._validation import check_choice, check_logprobs, check_positive, check_values

__all__ = ["NATS_PER_BIT", "UNITS", "entropy", "cross_entropy", "kl_divergence", "forward_kl_optimal_policy"]

#: One bit is :math:`\log 2 \approx 0.693` nats: a KL in nats divided by this is the KL in bits.
NATS_PER_BIT: float = math.log(2.0)
#: The units :func:`entropy`, :func:`cross_entropy` and :func:`kl_divergence` report.
UNITS: tuple[str, ...] = ("nats", "bits")


def _check_probs(p: object, name: str) -> np.ndarray:
    """A float64 array of probabilities, at least 1-D, each row (last axis) summing to 1."""
    try:
        arr = np.asarray(p, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an array of probabilities, got {type(p).__name__}") from None
    if np.asarray(p).dtype == bool:
        raise TypeError(f"{name} must hold probabilities (floats), got booleans")
    if arr.ndim == 0 or arr.shape[-1] == 0:
        raise ValueError(f"{name} must have at least one category along its last axis, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must hold finite probabilities >= 0")
    off = np.max(np.abs(arr.sum(-1) - 1.0))
    if not off <= 1e-9 * arr.shape[-1]:
        raise ValueError(
            f"{name} must sum to 1 along its last axis (the categories), but a row is off by {off:.3g}; "
            f"normalise it with {name} / {name}.sum(-1, keepdims=True)"
        )
    return arr


def _check_pair(p: object, q: object) -> tuple[np.ndarray, np.ndarray]:
    p_arr, q_arr = _check_probs(p, "p"), _check_probs(q, "q")
    if p_arr.shape != q_arr.shape:
        raise ValueError(f"p and q must have the same shape, got {p_arr.shape} and {q_arr.shape}")
    return p_arr, q_arr


def _in_unit(nats: np.ndarray, unit: str) -> float | np.ndarray:
    out = nats / NATS_PER_BIT if unit == "bits" else nats
    return float(out) if np.ndim(out) == 0 else out


def _neg_p_log(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    r""":math:`-\sum_x p(x) \log q(x)` over the last axis, with :math:`0 \log q = 0` (also for q = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(q), 0.0)  # -inf * 0 never reaches the sum
    return terms.sum(-1)


def entropy(p: object, unit: str = "nats") -> float | np.ndarray:
    r"""Shannon entropy :math:`H(p) = -\sum_x p(x) \log p(x)`, with :math:`0 \log 0 = 0`.

    Parameters
    ----------
    p : array_like, shape (..., K)
        Probabilities over K categories, each row summing to 1.
    unit : {"nats", "bits"}
        Natural logarithm (nats) or base 2 (bits; :math:`H_\text{bits} = H_\text{nats} / \log 2`).

    Returns
    -------
    float or ndarray, shape (...)
        Between 0 (a point mass) and :math:`\log K` (uniform).

    Examples
    --------
    >>> entropy([0.5, 0.5], unit="bits")  # a fair coin: one bit
    1.0
    >>> round(entropy([0.5, 0.5]), 4)  # log 2 nats
    0.6931
    """
    check_choice(unit, "unit", UNITS)
    p_arr = _check_probs(p, "p")
    return _in_unit(_neg_p_log(p_arr, p_arr), unit)


def cross_entropy(p: object, q: object, unit: str = "nats") -> float | np.ndarray:
    r"""Cross-entropy :math:`H(p, q) = -\mathbb{E}_{x\sim p}[\log q(x)] = -\sum_x p(x) \log q(x)`.

    The expected surprise of :math:`q` at draws from :math:`p`; :math:`H(p, q) - H(p) =
    \mathrm{KL}(p \| q)`. Infinite if :math:`q(x) = 0` where :math:`p(x) > 0`.

    Parameters
    ----------
    p, q : array_like, shape (..., K)
        Probabilities, each row summing to 1.
    unit : {"nats", "bits"}

    Returns
    -------
    float or ndarray, shape (...)

    Examples
    --------
    >>> cross_entropy([1.0, 0.0], [0.25, 0.75], unit="bits")  # -log2(1/4)
    2.0
    """
    check_choice(unit, "unit", UNITS)
    p_arr, q_arr = _check_pair(p, q)
    return _in_unit(_neg_p_log(p_arr, q_arr), unit)


def kl_divergence(p: object, q: object, unit: str = "nats") -> float | np.ndarray:
    r"""Kullback–Leibler divergence :math:`\mathrm{KL}(p \| q) = \sum_x p(x) \log \frac{p(x)}{q(x)}`.

    Conventions (Cover and Thomas 2006, §2.3): :math:`0 \log \frac{0}{q} = 0`, and
    :math:`p \log \frac{p}{0} = \infty` for :math:`p > 0`, so the KL is infinite when :math:`q` misses
    an outcome that :math:`p` can produce. It is :math:`\ge 0`, and 0 only when :math:`p = q` (Gibbs'
    inequality), and in general :math:`\mathrm{KL}(p \| q) \ne \mathrm{KL}(q \| p)`.

    Parameters
    ----------
    p, q : array_like, shape (..., K)
        Probabilities, each row summing to 1; rows are paired (``p[i]`` with ``q[i]``).
    unit : {"nats", "bits"}
        Nats (natural log, what every RLHF library reports) or bits: 1 bit = :math:`\log 2` nats.

    Returns
    -------
    float or ndarray, shape (...)
        Computed as :math:`\sum_x p(x)(\log p(x) - \log q(x))`; never below 0 by more than rounding.

    Examples
    --------
    >>> round(kl_divergence([0.5, 0.5], [0.25, 0.75]), 4)  # 0.5 log 2 + 0.5 log(2/3)
    0.1438
    >>> kl_divergence([0.5, 0.5], [1.0, 0.0])  # q cannot produce the second outcome
    inf
    >>> kl_divergence([1.0, 0.0], [0.5, 0.5], unit="bits")  # a point mass against a fair coin
    1.0
    """
    check_choice(unit, "unit", UNITS)
    p_arr, q_arr = _check_pair(p, q)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p_arr > 0, p_arr * (np.log(p_arr) - np.log(q_arr)), 0.0)
    return _in_unit(terms.sum(-1), unit)


# ----------------------------------------------------------------------------------------------------
# The penalised optimum under the other direction


def forward_kl_optimal_policy(ref_logprobs: torch.Tensor, reward: torch.Tensor, beta: float) -> torch.Tensor:
    r"""Log-probs of the maximiser of :math:`J_\mathrm{fwd}(\pi) = \mathbb{E}_\pi[r] - \beta\,
    \mathrm{KL}(\pi_\mathrm{ref} \| \pi)`: the optimum if RLHF penalised the forward KL instead.

    Stationarity of the Lagrangian gives, on the support :math:`S` of :math:`\pi_\mathrm{ref}`,

    .. math::  \pi(y) = \frac{\beta\, \pi_\mathrm{ref}(y)}{\lambda - r(y)}, \qquad
               \lambda > \max_{y \in S} r(y),

    a hyperbolic tilt of :math:`\pi_\mathrm{ref}` instead of the exponential :math:`\pi_\mathrm{ref}\,
    e^{r/\beta}` of the reverse KL, and *every* :math:`y \in S` keeps mass (the penalty is infinite if
    :math:`\pi` drops one: mass-covering). Outside :math:`S` the penalty does not look at all: if an
    outcome the reference never produces has reward :math:`r_\text{out} = \max_{y \notin S} r(y)` above
    the largest on :math:`S`, then :math:`\lambda = \max(\lambda_0, r_\text{out})`, where
    :math:`\lambda_0` solves :math:`\sum_S \beta\pi_\mathrm{ref}/(\lambda_0 - r) = 1`, and the mass
    :math:`S` leaves over, :math:`1 - \sum_S \beta\pi_\mathrm{ref}/(\lambda - r)`, goes to the best
    outcome(s) outside :math:`S` (split equally among ties, which the objective cannot tell apart).
    :math:`\lambda_0 - \max_S r` lies in :math:`(0, \beta]` and is found by bisection, in float64.

    Parameters
    ----------
    ref_logprobs : Tensor, shape (N,)
        :math:`\log \pi_\mathrm{ref}`, normalised; ``-inf`` marks outcomes outside its support (at least
        one must be inside).
    reward : Tensor, shape (N,)
        :math:`r`, finite.
    beta : float
        :math:`\beta > 0`.

    Returns
    -------
    Tensor, shape (N,), float64
        :math:`\log \pi`; ``-inf`` outside :math:`S` except at the best outcome(s) there when they
        receive mass.

    Examples
    --------
    Two outcomes the reference finds equally likely, rewards 0 and 1, :math:`\beta = 1`: then
    :math:`\lambda = 1 + 1/\sqrt2` and :math:`\pi = (0.293, 0.707)`, where the reverse KL gives
    :math:`(0.269, 0.731)`.

    >>> ref = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> forward_kl_optimal_policy(ref, torch.tensor([0.0, 1.0], dtype=torch.float64), 1.0).exp()
    tensor([0.2929, 0.7071], dtype=torch.float64)

    An outcome outside the reference's support with the highest reward takes what is left:

    >>> ref = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64).log()
    >>> forward_kl_optimal_policy(ref, torch.tensor([0.0, 1.0, 3.0], dtype=torch.float64), 1.0).exp()
    tensor([0.1667, 0.2500, 0.5833], dtype=torch.float64)
    """
    ref_logprobs = check_logprobs(ref_logprobs, "ref_logprobs").to(torch.float64)
    reward = check_values(reward, "reward", ref_logprobs.shape[0]).to(torch.float64)
    beta = check_positive(beta, "beta")
    inside = torch.isfinite(ref_logprobs)
    r_in = reward[inside]
    top = float(r_in.max())
    gap = top - r_in  # >= 0: distance below the best reward on the support, kept apart for precision
    ref_in = ref_logprobs[inside].exp()

    def mass(delta: float) -> float:  # sum_S beta pi_ref / (lambda - r), with lambda = top + delta
        return float((beta * ref_in / (delta + gap)).sum())

    # 1. lambda_0 = top + delta: mass is decreasing in delta, > 1 near 0 and <= 1 at delta = beta.
    lo, hi = 0.0, beta
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        lo, hi = (mid, hi) if mass(mid) > 1.0 else (lo, mid)
    delta = hi
    # 2. An outcome outside the support with a higher reward sets lambda and takes the rest.
    out = ~inside
    best_out = torch.zeros_like(out)
    if out.any():
        r_out = float(reward[out].max())
        if r_out - top > delta:
            delta = r_out - top
            best_out = out & (reward == r_out)
    logp = torch.full_like(ref_logprobs, -torch.inf)
    logp[inside] = math.log(beta) + ref_logprobs[inside] - torch.log(delta + gap)
    if best_out.any():
        left = max(1.0 - mass(delta), 0.0)
        logp[best_out] = math.log(left / int(best_out.sum())) if left > 0 else -math.inf
    return logp - torch.logsumexp(logp, 0)  # renormalise away the bisection's last digit
