r"""The KL-penalised objective on a listed space, exactly (book section 5).

For a distribution :math:`\pi` over the listed sequences, a reward :math:`r` and :math:`\beta > 0`,

.. math::  J_\beta(\pi) = \mathbb{E}_{\pi}[r] - \beta\, \mathrm{KL}(\pi \,\|\, \pi_\mathrm{ref})
           = \beta \log Z_\beta - \beta\, \mathrm{KL}(\pi \,\|\, \pi^*_\beta),
   \qquad \pi^*_\beta = \pi_\mathrm{ref}\, e^{r/\beta} / Z_\beta,

so :math:`\pi^*_\beta` (:func:`~kltutorial.exact.optimal_policy`) is the unique maximiser and the
maximum is :math:`\beta \log Z_\beta` (the Gibbs variational principle). This module computes what
section 5 checks about that statement:

1. the value :math:`J_\beta(\pi)` (:func:`penalised_objective`) and its maximum
   :math:`\beta\log Z_\beta` (:func:`optimal_value`);
2. the constrained view, :math:`\max_\pi \mathbb{E}_\pi[r]` subject to
   :math:`\mathrm{KL}(\pi\|\pi_\mathrm{ref}) \le \epsilon`: the β whose optimum spends the budget
   exactly (:func:`beta_for_budget`), and the slope of the exact frontier, which equals β
   (:func:`frontier_slope`);
3. random perturbations of :math:`\pi^*_\beta` in logit space, every one of them lower, by a gap
   quadratic in the perturbation's size (:func:`perturbation_check`, :class:`PerturbationCheck`);
4. the exact expected policy gradient of :math:`J_\beta` for a tabular autoregressive policy, with a
   constant baseline subtracted from the reward (:func:`policy_gradient`): the same for every baseline.

References: T. Korbak, E. Perez and C. L. Buckley, "RL with KL penalties is better viewed as Bayesian
inference" (2022); R. Rafailov et al., "Direct Preference Optimization" (2023), eq. 4.
Shapes: V**T sequences, P prefixes, V tokens, S perturbation sizes, N perturbations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import (
    check_float_tensor,
    check_generator,
    check_logprobs,
    check_positive,
    check_positive_int,
    check_real,
    check_values,
)
from .optimum import optimal_policy_unchecked
from .space import (
    SequenceSpace,
    check_space,
    expected_value_unchecked,
    sequence_kl_unchecked,
    token_logprobs_unchecked,
)

__all__ = [
    "penalised_objective",
    "optimal_value",
    "frontier_slope",
    "beta_for_budget",
    "PerturbationCheck",
    "perturbation_check",
    "policy_gradient",
]


def _check_problem(ref_logprobs: object, reward: object) -> tuple[torch.Tensor, torch.Tensor]:
    ref_logprobs = check_logprobs(ref_logprobs, "ref_logprobs")
    reward = check_values(reward, "reward", ref_logprobs.shape[0])
    return ref_logprobs, reward


def _objective(logp: torch.Tensor, ref_logprobs: torch.Tensor, reward: torch.Tensor, beta: float) -> float:
    return expected_value_unchecked(logp, reward) - beta * sequence_kl_unchecked(logp, ref_logprobs)


# ----------------------------------------------------------------------------------------------------
# The value and its maximum


def penalised_objective(
    logp: torch.Tensor, ref_logprobs: torch.Tensor, reward: torch.Tensor, beta: float
) -> float:
    r"""Exact :math:`J_\beta(\pi) = \mathbb{E}_\pi[r] - \beta\,\mathrm{KL}(\pi \| \pi_\mathrm{ref})`.

    In reward units: :math:`\beta` converts nats into reward units.

    Parameters
    ----------
    logp, ref_logprobs : Tensor, shape (V**T,)
        :math:`\log \pi` and :math:`\log \pi_\mathrm{ref}`.
    reward : Tensor, shape (V**T,)
    beta : float
        > 0.

    Examples
    --------
    >>> ref = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> p = torch.tensor([0.25, 0.75], dtype=torch.float64).log()
    >>> r = torch.tensor([0.0, 1.0], dtype=torch.float64)
    >>> round(penalised_objective(p, ref, r, beta=1.0), 4)  # 0.75 - KL = 0.75 - 0.1308
    0.6192
    """
    ref_logprobs, reward = _check_problem(ref_logprobs, reward)
    logp = check_logprobs(logp, "logp", ref_logprobs.shape[0])
    beta = check_positive(beta, "beta")
    return _objective(logp, ref_logprobs, reward, beta)


def optimal_value(ref_logprobs: torch.Tensor, reward: torch.Tensor, beta: float) -> float:
    r"""The maximum of :math:`J_\beta`, :math:`\beta \log Z_\beta = \beta \log \sum_y
    \pi_\mathrm{ref}(y)\, e^{r(y)/\beta}`, reached at :math:`\pi^*_\beta`.

    Computed with ``logsumexp``, so it stays finite where :math:`e^{r/\beta}` overflows. It lies
    between :math:`\mathbb{E}_{\pi_\mathrm{ref}}[r]` (Jensen) and :math:`\max_y r(y)`.

    Parameters
    ----------
    ref_logprobs, reward : Tensor, shape (V**T,)
    beta : float
        > 0.

    Examples
    --------
    >>> ref = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> round(optimal_value(ref, torch.tensor([0.0, 1.0], dtype=torch.float64), beta=1.0), 4)
    0.6201
    """
    ref_logprobs, reward = _check_problem(ref_logprobs, reward)
    beta = check_positive(beta, "beta")
    return beta * float(torch.logsumexp(ref_logprobs + reward / beta, 0))


# ----------------------------------------------------------------------------------------------------
# The constrained view: beta as the Lagrange multiplier of the KL budget


def frontier_slope(
    ref_logprobs: torch.Tensor, reward: torch.Tensor, beta: float, rel_step: float = 1e-3
) -> float:
    r"""Slope :math:`d\,\mathbb{E}[r] / d\,\mathrm{KL}` of the exact frontier at :math:`\pi^*_\beta`, by a
    central difference in β.

    Both coordinates of the frontier are exact at :math:`\beta(1 \pm h)`, and the slope is
    :math:`(\mathbb{E}_+ - \mathbb{E}_-)/(\mathrm{KL}_+ - \mathrm{KL}_-)`. In closed form,
    :math:`d\,\mathbb{E}_{\pi^*_\beta}[r]/d\beta = -\mathrm{Var}_{\pi^*_\beta}(r)/\beta^2` and, from
    :math:`\mathrm{KL}(\pi^*_\beta\|\pi_\mathrm{ref}) = \mathbb{E}_{\pi^*_\beta}[r]/\beta - \log Z_\beta`
    with :math:`d\log Z_\beta/d\beta = -\mathbb{E}_{\pi^*_\beta}[r]/\beta^2`,
    :math:`d\,\mathrm{KL}/d\beta = -\mathrm{Var}_{\pi^*_\beta}(r)/\beta^3`; their ratio is β. The finite
    difference is a check of that, with an error of order :math:`h^2`.

    Parameters
    ----------
    ref_logprobs, reward : Tensor, shape (V**T,)
        ``reward`` must not be constant on the support of :math:`\pi_\mathrm{ref}` (the frontier would be
        one point).
    beta : float
        > 0.
    rel_step : float
        h, in (0, 0.5).

    Returns
    -------
    float
        Reward units per nat.

    Examples
    --------
    >>> ref = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> round(frontier_slope(ref, torch.tensor([0.0, 1.0], dtype=torch.float64), beta=0.3), 6)
    0.3
    """
    ref_logprobs, reward = _check_problem(ref_logprobs, reward)
    beta = check_positive(beta, "beta")
    rel_step = check_positive(rel_step, "rel_step")
    if rel_step >= 0.5:
        raise ValueError(f"rel_step must lie in (0, 0.5), a small relative step in beta; got {rel_step!r}")
    points = []
    for b in (beta * (1.0 + rel_step), beta * (1.0 - rel_step)):
        logp = optimal_policy_unchecked(ref_logprobs, reward, b)
        points.append((sequence_kl_unchecked(logp, ref_logprobs), expected_value_unchecked(logp, reward)))
    (kl_hi, r_hi), (kl_lo, r_lo) = points
    if not kl_lo > kl_hi:
        raise ValueError("the frontier does not move with beta: is the reward constant where pi_ref > 0?")
    return (r_lo - r_hi) / (kl_lo - kl_hi)


def beta_for_budget(
    ref_logprobs: torch.Tensor, reward: torch.Tensor, budget: float, rtol: float = 1e-8
) -> float:
    r"""The Lagrange multiplier of a KL budget: the β with
    :math:`\mathrm{KL}(\pi^*_\beta \| \pi_\mathrm{ref}) = \epsilon`.

    :math:`\pi^*_\beta` then solves :math:`\max_\pi \mathbb{E}_\pi[r]` subject to
    :math:`\mathrm{KL}(\pi\|\pi_\mathrm{ref}) \le \epsilon`: for any such :math:`\pi`,
    :math:`\mathbb{E}_\pi[r] \le \mathbb{E}_{\pi^*_\beta}[r] - \beta(\epsilon - \mathrm{KL}(\pi\|
    \pi_\mathrm{ref})) \le \mathbb{E}_{\pi^*_\beta}[r]`. The KL of :math:`\pi^*_\beta` falls
    monotonically from :math:`-\log \pi_\mathrm{ref}(\arg\max r)` (β → 0) to 0 (β → ∞), so the β is
    found by bisection on :math:`\log\beta`.

    Parameters
    ----------
    ref_logprobs, reward : Tensor, shape (V**T,)
    budget : float
        :math:`\epsilon` > 0 nats, below the KL of :math:`\pi_\mathrm{ref}` restricted to the maximisers of
        r (a larger budget does not bind: its multiplier is 0).
    rtol : float
        Relative precision of β, > 0.

    Returns
    -------
    float

    Examples
    --------
    >>> ref = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> b = beta_for_budget(ref, torch.tensor([0.0, 1.0], dtype=torch.float64), budget=0.1308)
    >>> round(b, 3)  # pi* = (1/4, 3/4): e^(1/beta) = 3
    0.91
    """
    ref_logprobs, reward = _check_problem(ref_logprobs, reward)
    budget = check_positive(budget, "budget")
    rtol = check_positive(rtol, "rtol")
    best = reward[ref_logprobs > -math.inf].max()
    top = (reward == best) & (ref_logprobs > -math.inf)
    kl_max = -float(torch.logsumexp(ref_logprobs[top], 0))  # KL of pi_ref restricted to argmax r
    if not budget < kl_max:
        raise ValueError(
            f"budget {budget!r} nats does not bind: the best responses alone are {kl_max:.4g} nats from "
            f"pi_ref, so maximising the reward needs no more; pass a budget below that"
        )

    def kl_at(log_beta: float) -> float:
        optimum = optimal_policy_unchecked(ref_logprobs, reward, math.exp(log_beta))
        return sequence_kl_unchecked(optimum, ref_logprobs)

    lo, hi = 0.0, 0.0  # log beta: kl_at(lo) > budget > kl_at(hi)
    while kl_at(lo) <= budget:
        lo -= 1.0
    while kl_at(hi) > budget:
        hi += 1.0
    while hi - lo > rtol:
        mid = 0.5 * (lo + hi)
        if kl_at(mid) > budget:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


# ----------------------------------------------------------------------------------------------------
# Random perturbations of the optimum


@dataclass(frozen=True)
class PerturbationCheck:
    r"""How much :math:`J_\beta` loses when :math:`\pi^*_\beta` is perturbed in logit space.

    Attributes
    ----------
    beta : float
    optimum : float
        :math:`J_\beta(\pi^*_\beta)`.
    scales : ndarray, shape (S,)
        Perturbation sizes δ, in nats of logit.
    gaps : ndarray, shape (S, N)
        :math:`J_\beta(\pi^*_\beta) - J_\beta(\pi_{\delta,n})` for each size and each of the N random
        directions (the same N directions at every size).
    """

    beta: float
    optimum: float
    scales: np.ndarray
    gaps: np.ndarray

    def min_gap(self) -> float:
        """The smallest gap over every size and direction (> 0 when :math:`\\pi^*_\\beta` wins them all)."""
        return float(self.gaps.min())

    def curvature(self) -> np.ndarray:
        """``gaps / scales**2``, shape (S, N): constant in δ where the gap is quadratic."""
        return self.gaps / self.scales[:, None] ** 2

    def order(self) -> float:
        r"""The exponent p of :math:`\mathrm{gap} \propto \delta^p`: least-squares slope of the log median
        gap against :math:`\log\delta` (2 for a smooth maximum)."""
        x, y = np.log(self.scales), np.log(np.median(self.gaps, axis=1))
        return float(np.polyfit(x, y, 1)[0])


def perturbation_check(
    ref_logprobs: torch.Tensor,
    reward: torch.Tensor,
    beta: float,
    scales: Sequence[float] | np.ndarray,
    n: int,
    generator: torch.Generator,
) -> PerturbationCheck:
    r"""Compare :math:`\pi^*_\beta` with N random perturbations of itself at each size δ.

    Each perturbation adds :math:`\delta\,\xi` to the logits :math:`\log\pi^*_\beta` and renormalises,
    :math:`\pi_{\delta,n} \propto \pi^*_\beta\, e^{\delta\,\xi_n}`, with one direction
    :math:`\xi_n \sim \mathcal{N}(0, I)` over the :math:`V^T` sequences, shared by all sizes. The gap is
    computed from the two values of :math:`J_\beta`; the identity of the module docstring says it equals
    :math:`\beta\,\mathrm{KL}(\pi_{\delta,n}\|\pi^*_\beta) \approx \tfrac{\beta}{2}\,\delta^2\,
    \mathrm{Var}_{\pi^*_\beta}(\xi_n)` for small δ: positive, and quadratic in δ.

    Parameters
    ----------
    ref_logprobs, reward : Tensor, shape (V**T,)
        float64 recommended: the smallest gaps are of order :math:`\beta\delta^2`.
    beta : float
        > 0.
    scales : sequence of float, length S
        Each > 0.
    n : int
        Directions, >= 1.
    generator : torch.Generator

    Returns
    -------
    PerturbationCheck
    """
    ref_logprobs, reward = _check_problem(ref_logprobs, reward)
    beta = check_positive(beta, "beta")
    try:
        sizes = np.asarray(scales, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise TypeError(f"scales must be a sequence of numbers, got {type(scales).__name__}") from None
    if sizes.size == 0 or not np.all(np.isfinite(sizes)) or np.any(sizes <= 0):
        raise ValueError(f"scales must be a non-empty sequence of finite numbers > 0, got {scales!r}")
    n = check_positive_int(n, "n")
    generator = check_generator(generator)
    best = optimal_policy_unchecked(ref_logprobs, reward, beta)
    optimum = _objective(best, ref_logprobs, reward, beta)
    size = ref_logprobs.shape[0]
    xi = torch.randn(n, size, generator=generator, dtype=ref_logprobs.dtype)  # (N, V**T)
    gaps = np.empty((sizes.size, n))
    for i, delta in enumerate(sizes):
        logits = best + float(delta) * xi  # (N, V**T)
        logp = logits - torch.logsumexp(logits, -1, keepdim=True)
        p = logp.exp()
        # J = sum_y p (r - beta (log p - log pi_ref)); 0 where p(y) = 0 (pi_ref(y) = 0 too)
        terms = torch.where(p > 0, p * (reward - beta * (logp - ref_logprobs)), torch.zeros_like(p))
        gaps[i] = (optimum - terms.sum(-1)).numpy()
    return PerturbationCheck(beta=beta, optimum=optimum, scales=sizes, gaps=gaps)


# ----------------------------------------------------------------------------------------------------
# The policy gradient does not see the level of the reward


def policy_gradient(
    space: SequenceSpace,
    logits: torch.Tensor,
    ref_logprobs: torch.Tensor,
    reward: torch.Tensor,
    beta: float,
    baseline: float = 0.0,
) -> torch.Tensor:
    r"""Exact expected policy gradient of :math:`J_\beta` for a tabular policy, with a constant baseline.

    The policy is :math:`\pi_z(y_t \mid y_{<t}) = \mathrm{softmax}(z_{y_{<t}})_{y_t}`, one row of logits
    per prefix. With the penalised reward :math:`R(y) = r(y) - \beta(\log\pi_z(y) - \log\pi_\mathrm{ref}(y))`
    and a constant b,

    .. math::  g(b) = \sum_y \pi_z(y)\, \big(R(y) - b\big)\, \nabla_z \log \pi_z(y)
               = \nabla_z J_\beta(\pi_z) \quad\text{for every } b,

    since :math:`\sum_y \pi_z(y)\, \nabla_z \log\pi_z(y) = \nabla_z \sum_y \pi_z(y) = 0`: the baseline
    changes the level of the reward (and of :math:`J_\beta`, by b) and the variance of a sampled
    estimate, never the expected gradient. (The penalty's own score term,
    :math:`-\beta\,\mathbb{E}[\nabla\log\pi]`, is 0 for the same reason.) Computed by autograd through a
    surrogate whose weights :math:`\pi_z(y)(R(y) - b)` are held fixed.

    Parameters
    ----------
    space : SequenceSpace
    logits : Tensor, shape (P, V)
        Finite logits of the policy, one row per prefix.
    ref_logprobs, reward : Tensor, shape (V**T,)
    beta : float
        > 0.
    baseline : float
        b, in reward units.

    Returns
    -------
    Tensor, shape (P, V)

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=1)
    >>> ref = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> r = torch.tensor([0.0, 1.0], dtype=torch.float64)
    >>> z = torch.zeros(1, 2, dtype=torch.float64)
    >>> policy_gradient(space, z, ref, r, beta=0.5), policy_gradient(space, z, ref, r, 0.5, baseline=7.0)
    (tensor([[-0.2500,  0.2500]], dtype=torch.float64), tensor([[-0.2500,  0.2500]], dtype=torch.float64))
    """
    check_space(space)
    logits = check_float_tensor(logits, "logits", ndim=2)
    if tuple(logits.shape) != (space.n_prefixes, space.vocab_size):
        raise ValueError(
            f"logits must have shape {(space.n_prefixes, space.vocab_size)}, one row per prefix; "
            f"got {tuple(logits.shape)}"
        )
    ref_logprobs = check_logprobs(ref_logprobs, "ref_logprobs", space.n_sequences)
    reward = check_values(reward, "reward", space.n_sequences)
    beta = check_positive(beta, "beta")
    baseline = check_real(baseline, "baseline")
    z = logits.detach().clone().requires_grad_(True)
    logp = token_logprobs_unchecked(space, torch.log_softmax(z, dim=-1)).sum(-1)  # (V**T,)
    with torch.no_grad():
        weight = logp.exp() * (reward - beta * (logp - ref_logprobs) - baseline)  # pi(y) (R(y) - b)
    (grad,) = torch.autograd.grad((weight * logp).sum(), z)
    return grad
