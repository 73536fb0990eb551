r"""The optimum of the KL-penalised objective and best-of-n, exactly (book sections 5 and 11).

Both are distributions built from :math:`\pi_\mathrm{ref}` and a reward over a listed space: the
closed-form optimum :math:`\pi^*_\beta \propto \pi_\mathrm{ref}\, e^{r/\beta}` with its reward–KL
frontier, and the distribution of the best of n draws. They work for any finite distribution (tensors of
V**T log-probs); the package's introduction is in :mod:`kltutorial.exact`. K is the number of β values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .._validation import check_betas, check_logprobs, check_positive, check_positive_int, check_values
from .space import expected_value_unchecked, sequence_kl_unchecked

__all__ = ["Frontier", "optimal_policy", "optimal_frontier", "best_of_n_logprobs", "best_of_n_kl_bound"]


@dataclass(frozen=True)
class Frontier:
    """Exact reward and KL of the optimal policies :math:`\\pi^*_\\beta` over a grid of β.

    Attributes
    ----------
    betas : ndarray, shape (K,)
        β, in the order given.
    kl : ndarray, shape (K,)
        :math:`\\mathrm{KL}(\\pi^*_\\beta \\| \\pi_\\mathrm{ref})` in nats.
    reward : ndarray, shape (K,)
        :math:`\\mathbb{E}_{\\pi^*_\\beta}[r]`, the reward being optimised.
    measures : dict of str to ndarray, shape (K,)
        The expectation under :math:`\\pi^*_\\beta` of each function passed as ``measures``.
    """

    betas: np.ndarray
    kl: np.ndarray
    reward: np.ndarray
    measures: dict[str, np.ndarray] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------------
# The optimum of the KL-penalised objective


def optimal_policy(ref_logprobs: torch.Tensor, reward: torch.Tensor, beta: float) -> torch.Tensor:
    """Log-probs of :math:`\\pi^*_\\beta(y) = \\pi_\\mathrm{ref}(y)\\, e^{r(y)/\\beta} / Z_\\beta`.

    It maximises :math:`J(\\pi) = \\mathbb{E}_\\pi[r] - \\beta\\,\\mathrm{KL}(\\pi \\| \\pi_\\mathrm{ref})`:
    for every :math:`\\pi`, :math:`J(\\pi^*_\\beta) - J(\\pi) = \\beta\\,\\mathrm{KL}(\\pi \\| \\pi^*_\\beta)
    \\ge 0`, and :math:`\\mathrm{KL}(\\pi^*_\\beta \\| \\pi_\\mathrm{ref})
    = \\mathbb{E}_{\\pi^*_\\beta}[r]/\\beta - \\log Z_\\beta`. Normalised in log space (``logsumexp``), so
    it is exact for small β, where :math:`e^{r/\\beta}` overflows. As :math:`\\beta \\to \\infty` it tends
    to :math:`\\pi_\\mathrm{ref}`; as :math:`\\beta \\to 0`, to :math:`\\pi_\\mathrm{ref}` restricted to
    the maximisers of r.

    Parameters
    ----------
    ref_logprobs : Tensor, shape (V**T,)
        :math:`\\log \\pi_\\mathrm{ref}`.
    reward : Tensor, shape (V**T,)
        :math:`r`, finite.
    beta : float
        :math:`\\beta` > 0.

    Returns
    -------
    Tensor, shape (V**T,)

    Examples
    --------
    >>> ref = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> optimal_policy(ref, torch.tensor([1.0, 3.0], dtype=torch.float64).log(), beta=1.0).exp()
    tensor([0.2500, 0.7500], dtype=torch.float64)
    """
    ref_logprobs = check_logprobs(ref_logprobs, "ref_logprobs")
    reward = check_values(reward, "reward", ref_logprobs.shape[0])
    beta = check_positive(beta, "beta")
    return optimal_policy_unchecked(ref_logprobs, reward, beta)


def optimal_policy_unchecked(ref_logprobs: torch.Tensor, reward: torch.Tensor, beta: float) -> torch.Tensor:
    logits = ref_logprobs + reward / beta  # log pi_ref + r / beta
    return logits - torch.logsumexp(logits, 0)  # - log Z_beta


def optimal_frontier(
    ref_logprobs: torch.Tensor,
    reward: torch.Tensor,
    betas: Sequence[float] | np.ndarray,
    measures: Mapping[str, torch.Tensor] | None = None,
) -> Frontier:
    """The exact reward–KL frontier: :math:`(\\mathrm{KL}(\\pi^*_\\beta \\| \\pi_\\mathrm{ref}),
    \\mathbb{E}_{\\pi^*_\\beta}[r])` for each β in ``betas``.

    No policy reaches a higher expected reward at the same KL from :math:`\\pi_\\mathrm{ref}` (each
    :math:`\\pi^*_\\beta` maximises :math:`\\mathbb{E}[r] - \\beta\\,\\mathrm{KL}`). Both coordinates
    increase as β falls.

    Parameters
    ----------
    ref_logprobs, reward : Tensor, shape (V**T,)
    betas : sequence of float, length K
        Each > 0.
    measures : dict of str to Tensor, shape (V**T,), optional
        Other functions of the sequence (a second reward, an indicator) whose expectation under each
        :math:`\\pi^*_\\beta` to report.

    Returns
    -------
    Frontier

    Examples
    --------
    >>> ref = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> f = optimal_frontier(ref, torch.tensor([1.0, 3.0], dtype=torch.float64).log(), [1.0])
    >>> f.reward.round(4), f.kl.round(4)  # pi* = (1/4, 3/4): E r = 0.75 log 3, KL = 0.1308
    (array([0.824]), array([0.1308]))
    """
    ref_logprobs = check_logprobs(ref_logprobs, "ref_logprobs")
    size = ref_logprobs.shape[0]
    reward = check_values(reward, "reward", size)
    betas = check_betas(betas)
    measures = dict(measures or {})
    for name, values in measures.items():
        check_values(values, f"measures[{name!r}]", size)
    kl, expected = [], []
    extra: dict[str, list[float]] = {name: [] for name in measures}
    for beta in betas:
        logp = optimal_policy_unchecked(ref_logprobs, reward, float(beta))
        kl.append(sequence_kl_unchecked(logp, ref_logprobs))
        expected.append(expected_value_unchecked(logp, reward))
        for name, values in measures.items():
            extra[name].append(expected_value_unchecked(logp, values))
    return Frontier(
        betas=betas,
        kl=np.array(kl),
        reward=np.array(expected),
        measures={name: np.array(v) for name, v in extra.items()},
    )


# ----------------------------------------------------------------------------------------------------
# Best-of-n


def best_of_n_logprobs(ref_logprobs: torch.Tensor, reward: torch.Tensor, n: int) -> torch.Tensor:
    """Exact log-probs of best-of-n: draw n sequences from :math:`\\pi_\\mathrm{ref}`, keep the best.

    With :math:`F(r) = \\pi_\\mathrm{ref}(r(Y) \\le r)`, the best of n draws has a reward at most r with
    probability :math:`F(r)^n`. The sequences that share one reward value r therefore get
    :math:`F(r)^n - F(r^-)^n` together, split among them in proportion to :math:`\\pi_\\mathrm{ref}` (ties
    between draws broken uniformly at random). Computed as :math:`n \\log F(r) + \\log(1 - (F(r^-)/F(r))^n)`,
    which keeps its precision when both powers are tiny.

    Parameters
    ----------
    ref_logprobs, reward : Tensor, shape (V**T,)
    n : int
        Number of draws, >= 1 (n = 1 is :math:`\\pi_\\mathrm{ref}`).

    Returns
    -------
    Tensor, shape (V**T,)
        ``-inf`` where the probability is 0 (or underflows).

    Examples
    --------
    Two sequences, equally likely under the reference, rewards 0 and 1: the best of two draws has reward
    0 only if both draws do, with probability 1/4.

    >>> ref = torch.tensor([0.5, 0.5], dtype=torch.float64).log()
    >>> best_of_n_logprobs(ref, torch.tensor([0.0, 1.0], dtype=torch.float64), n=2).exp()
    tensor([0.2500, 0.7500], dtype=torch.float64)
    """
    ref_logprobs = check_logprobs(ref_logprobs, "ref_logprobs")
    reward = check_values(reward, "reward", ref_logprobs.shape[0])
    n = check_positive_int(n, "n")
    values, group = torch.unique(reward, return_inverse=True)  # sorted ascending
    ref_p = ref_logprobs.exp()
    group_mass = torch.zeros(values.shape[0], dtype=ref_p.dtype).index_add_(0, group, ref_p)
    cdf_above = group_mass.cumsum(0).clamp(max=1.0)  # F(r)
    cdf_below = torch.cat([torch.zeros(1, dtype=ref_p.dtype), cdf_above[:-1]])  # F(r^-)
    # log(F(r)^n - F(r^-)^n) = n log F(r) + log(1 - (F(r^-) / F(r))^n)
    log_above = n * cdf_above.log()
    ratio_n = torch.exp(n * (cdf_below.log() - cdf_above.log()))
    log_group = log_above + torch.log1p(-ratio_n)
    logp = ref_logprobs - group_mass.log()[group] + log_group[group]
    logp = torch.where(ref_p > 0, logp, torch.full_like(logp, -torch.inf))  # never drawn, never best
    return logp - torch.logsumexp(logp, 0)  # renormalise away rounding


def best_of_n_kl_bound(n: int | np.ndarray) -> float | np.ndarray:
    """The best-of-n KL formula, :math:`\\log n - (n - 1)/n` nats: an upper bound on the KL of best-of-n.

    Often quoted as the KL of best-of-n (Stiennon et al. 2020), it is exact only when the reward of a draw
    from :math:`\\pi_\\mathrm{ref}` has a continuous distribution. For discrete outputs it is an upper
    bound (Beirami et al. 2024, "Theoretical guarantees on the best-of-n alignment policy"), strict for
    every n >= 2 even when no two outputs share a reward: each output has a positive probability, so it can
    be drawn more than once among the n, and :math:`\\mathrm{KL}(\\pi_\\mathrm{bon} \\| \\pi_\\mathrm{ref})`
    computed from the exact :func:`best_of_n_logprobs` lies below it (ties between outputs' rewards widen
    the gap).

    Parameters
    ----------
    n : int or ndarray of int
        >= 1.

    Examples
    --------
    >>> round(best_of_n_kl_bound(2), 4)  # log 2 - 1/2; two equally likely sequences give 0.1308
    0.1931
    """
    n_arr = np.asarray(n)
    if n_arr.dtype == bool or not np.issubdtype(n_arr.dtype, np.integer):
        raise TypeError(f"n must be an int or an array of ints, got {n!r}")
    if n_arr.size == 0 or np.any(n_arr < 1):
        raise ValueError(f"n must be >= 1 (the number of draws), got {n!r}")
    n_arr = n_arr.astype(float)
    out = np.log(n_arr) - (n_arr - 1.0) / n_arr
    return float(out) if out.ndim == 0 else out
