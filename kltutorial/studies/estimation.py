r"""Bias, spread and sign of the KL estimators, computed exactly or from samples (book section 4).

Every sampled estimator of :mod:`kltutorial.estimators` is a function :math:`k(\Delta)` of the log-ratio
:math:`\Delta = \log\pi(y) - \log\pi_{\mathrm{ref}}(y)` of a draw :math:`y \sim \pi`. How good it is depends
on the distribution of :math:`\Delta` under :math:`\pi`, summarised here by
:class:`~kltutorial.exact.estimates.EstimatorMoments`:

.. math::  \text{bias} = \mathbb{E}_\pi[k] - \mathrm{KL}(\pi\|\pi_{\mathrm{ref}}), \qquad
           \text{std} = \sqrt{\mathrm{Var}_\pi[k]}, \qquad \text{share negative} = P_\pi(k < 0).

Three ways to get them:

* :func:`gaussian_moments`: Schulman's example, policy :math:`\mathcal N(0, 1)` and reference
  :math:`\mathcal N(\mu, 1)`, by Gauss–Legendre quadrature (deterministic, accurate to about 1e-12);
* :func:`sampled_moments`: from the log-probs of samples, as a trainer sees them;
* ``kltutorial.exact.estimates.estimator_moments``: any finite distribution (a categorical, or the
  distribution over the sequences of a listable space), by enumerating its outcomes.

Closed forms for the Gaussian pair, which the tests check the quadrature against: under the policy
:math:`\Delta = \mu^2/2 - \mu x \sim \mathcal N(\mu^2/2, \mu^2)` and :math:`\mathrm{KL} = \mu^2/2`, so

.. math::  \mathrm{std}[k_1] = |\mu|, \qquad
           \mathbb{E}[k_2] - \mathrm{KL} = \mu^4/8, \qquad
           \mathrm{Var}[k_2] = (2\mu^4 + \mu^6)/4, \qquad
           \mathrm{Var}[k_3] = e^{\mu^2} - 1 - \mu^2, \qquad
           P(k_1 < 0) = \Phi(-|\mu|/2).

At :math:`\mu = 0.1` (KL = 0.005) these give the std/KL of Schulman's table, 20 for k1 and 1.42 for k2
and k3, and k2's bias/KL :math:`= \mu^2/4 = 0.0025`; at :math:`\mu = 1` (KL = 0.5), 2, 1.73 and 1.70, and
a bias/KL of 0.25.

Reference: J. Schulman, "Approximating KL Divergence" (2020), http://joschu.net/blog/kl-approx.html.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import check_generator, check_positive_int, check_real, check_tensor_pair
from ..estimators import Estimator, get_estimator, kl_estimate
from ..exact.estimates import EstimatorMoments

__all__ = [
    "EstimatorSamples",
    "estimator_samples",
    "QUADRATURE_NODES",
    "gaussian_moments",
    "sample_gaussian_pair",
    "sampled_moments",
]

#: Gauss–Legendre nodes on each side of :math:`\Delta = 0` in :func:`gaussian_moments`. The integrands
#: are the normal density times a function of :math:`\Delta` that is smooth on either side of 0 (``abs``
#: has its kink there) and at most :math:`e^{2\mu x}` (k3's second moment); 200 nodes per side integrate
#: them to about 1e-12 relative for :math:`|\mu| \le 2` (``tests/test_estimation.py``).
QUADRATURE_NODES: int = 200
# The quadrature covers x in [-12 + min(0, 2 mu), 12 + max(0, 2 mu)]: the normal density's mass, and that
# of the tilted density e^{2 mu x} N(x; 0, 1) ∝ N(x; 2 mu, 1) of k3's second moment, to below 1e-30.
_HALF_WIDTH = 12.0

# The share of negative estimates is the normal mass of the x where the estimate is negative: the sign is
# read on a grid of this many cells, and each sign change located by bisection (to the last bit), so it is
# exact for any estimator whose sign changes at most once per cell (24/4096 of a standard deviation).
_SIGN_GRID_CELLS = 4096
_BISECTIONS = 60


def _check_mu(mu: object) -> float:
    mu = check_real(mu, "mu")
    if mu == 0:
        raise ValueError("mu must be non-zero: at mu = 0 the two Gaussians are equal and the KL is 0")
    return mu


def _gaussian_log_densities(x: torch.Tensor, mu: float) -> tuple[torch.Tensor, torch.Tensor]:
    """log N(x; 0, 1) and log N(x; mu, 1)."""
    c = 0.5 * math.log(2 * math.pi)
    return -0.5 * x.square() - c, -0.5 * (x - mu).square() - c


def gaussian_moments(
    mu: float, estimator: Estimator = "k1", *, nodes: int = QUADRATURE_NODES
) -> EstimatorMoments:
    r"""Exact moments of an estimator for Schulman's pair: policy :math:`\mathcal N(0, 1)`, reference
    :math:`\mathcal N(\mu, 1)`, :math:`\mathrm{KL} = \mu^2/2`.

    The mean and variance are quadrature sums :math:`\sum_i w_i\, \varphi(x_i)\, k(\Delta(x_i))` and
    :math:`\sum_i w_i\, \varphi(x_i)\, (k(\Delta(x_i)) - \mathbb{E}[k])^2`, :math:`\varphi` the standard
    normal density, with Gauss–Legendre nodes on either side of :math:`x = \mu/2`, where
    :math:`\Delta = 0` (so that the kink of ``abs`` falls between the pieces), and :math:`k` evaluated by
    :func:`~kltutorial.estimators.kl_estimate` on the two log-densities. The share of negative estimates,
    the integral of an indicator, which quadrature handles badly, is the normal mass of the x where the
    estimate is negative, found on a fine grid with each sign change located by bisection.

    Parameters
    ----------
    mu : float
        Mean of the reference, non-zero. The closed forms in the module docstring hold for any sign.
    estimator : str
        A sampled estimator's name or alias (``"k1"``, ``"k2"``, ``"k3"``, ``"abs"``, ...).
    nodes : int
        Gauss–Legendre nodes on each side of :math:`\Delta = 0`.

    Returns
    -------
    EstimatorMoments
        With ``n_samples=None``.

    Examples
    --------
    >>> m = gaussian_moments(0.1, "k1")
    >>> round(m.kl, 6), round(m.relative_std, 6)  # std of k1 is |mu|: 0.1 / 0.005
    (0.005, 20.0)
    >>> round(gaussian_moments(1.0, "k2").relative_bias, 6)  # mu**2 / 4
    0.25
    """
    mu = _check_mu(mu)
    spec = get_estimator(estimator)
    if spec.needs_logits:
        raise ValueError(f"estimator must be a sampled estimator, got {estimator!r}, which needs logits")
    nodes = check_positive_int(nodes, "nodes")
    x, w = _quadrature(mu, nodes)  # (2 nodes,) each
    log_policy, log_ref = _gaussian_log_densities(x, mu)
    w = w * log_policy.exp()  # the normal density into the weights: they sum to 1 (to 1e-15)
    values = kl_estimate(log_policy, log_ref, spec.name)  # (2 nodes,)
    mean = float((w * values).sum())
    var = float((w * (values - mean).square()).sum())
    share = _gaussian_share_negative(mu, spec.name)
    return EstimatorMoments(spec.name, mu**2 / 2, mean, math.sqrt(max(var, 0.0)), share)


@functools.lru_cache(maxsize=8)
def _legendre(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes and weights on [-1, 1] (an eigenvalue problem: computed once per size)."""
    t, w = np.polynomial.legendre.leggauss(nodes)
    t.flags.writeable = False
    w.flags.writeable = False
    return t, w


def _quadrature(mu: float, nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gauss–Legendre nodes and weights on [lo, mu/2] and [mu/2, hi]: Δ = mu²/2 - mu x is 0 at x = mu/2."""
    t, w = _legendre(nodes)  # on [-1, 1]
    lo, hi = -_HALF_WIDTH + min(0.0, 2 * mu), _HALF_WIDTH + max(0.0, 2 * mu)
    xs, ws = [], []
    for a, b in ((lo, mu / 2), (mu / 2, hi)):
        xs.append((a + b) / 2 + (b - a) / 2 * t)
        ws.append((b - a) / 2 * w)
    return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ws))


def _gaussian_share_negative(mu: float, estimator: str) -> float:
    """P(k < 0) for x ~ N(0, 1): the normal mass of the parts of the grid cells where the estimate is < 0."""

    def negative(x: torch.Tensor) -> torch.Tensor:
        return kl_estimate(*_gaussian_log_densities(x, mu), estimator) < 0

    lo, hi = -_HALF_WIDTH + min(0.0, 2 * mu), _HALF_WIDTH + max(0.0, 2 * mu)
    edges = torch.linspace(lo, hi, _SIGN_GRID_CELLS + 1, dtype=torch.float64)  # (cells + 1,)
    sign = negative(edges)
    left, right = edges[:-1].clone(), edges[1:].clone()  # (cells,): the negative part of each cell
    neg_left, neg_right = sign[:-1], sign[1:]
    change = neg_left != neg_right
    # 1. Locate each sign change by bisection: a keeps the sign of the cell's left edge.
    a, b = left[change], right[change]
    for _ in range(_BISECTIONS if bool(change.any()) else 0):
        mid = 0.5 * (a + b)
        same = negative(mid) == neg_left[change]
        a, b = torch.where(same, mid, a), torch.where(same, b, mid)
    root = 0.5 * (a + b)
    # 2. A cell that turns negative is negative right of the root; one that turns positive, left of it.
    left[change] = torch.where(neg_right[change], root, left[change])
    right[change] = torch.where(neg_left[change], root, right[change])
    keep = neg_left | neg_right
    return float((torch.special.ndtr(right[keep]) - torch.special.ndtr(left[keep])).sum())


def sample_gaussian_pair(mu: float, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Log-densities of ``n`` draws :math:`x \sim \mathcal N(0, 1)` under the policy :math:`\mathcal N(0, 1)`
    and the reference :math:`\mathcal N(\mu, 1)`: the two inputs of
    :func:`~kltutorial.estimators.kl_estimate` for Schulman's pair.

    Parameters
    ----------
    mu : float
        Mean of the reference, non-zero.
    n : int
        N >= 1.
    generator : torch.Generator

    Returns
    -------
    policy_logprobs, reference_logprobs : Tensor, shape (N,), float64

    Examples
    --------
    >>> lp, lq = sample_gaussian_pair(1.0, 4, torch.Generator().manual_seed(0))
    >>> lp.shape, lp.dtype
    (torch.Size([4]), torch.float64)
    >>> x = torch.randn(4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> torch.allclose(lp - lq, 0.5 - x)  # Δ = mu²/2 - mu x
    True
    """
    mu = _check_mu(mu)
    n = check_positive_int(n, "n")
    generator = check_generator(generator)
    x = torch.randn(n, generator=generator, dtype=torch.float64)  # (N,)
    return _gaussian_log_densities(x, mu)


def sampled_moments(
    policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor, estimator: Estimator, kl: float
) -> EstimatorMoments:
    r"""Sample mean, standard deviation and share of negative values of an estimator on draws from the
    policy, set against the exact ``kl``.

    Parameters
    ----------
    policy_logprobs, reference_logprobs : Tensor, shape (N,)
        :math:`\log\pi(y_i)` and :math:`\log\pi_{\mathrm{ref}}(y_i)` of N >= 2 draws :math:`y_i \sim \pi`.
    estimator : str
        A sampled estimator's name or alias.
    kl : float
        The exact KL the samples estimate (for the bias), >= 0.

    Returns
    -------
    EstimatorMoments
        The standard deviation with Bessel's correction; ``n_samples=N``.

    Examples
    --------
    >>> m = sampled_moments(torch.tensor([0.0, 1.0]), torch.zeros(2), "k1", kl=0.5)
    >>> m.mean, round(m.std, 4), m.share_negative, m.n_samples
    (0.5, 0.7071, 0.0, 2)
    """
    check_tensor_pair(policy_logprobs, "policy_logprobs", reference_logprobs, "reference_logprobs")
    if policy_logprobs.dim() != 1 or policy_logprobs.shape[0] < 2:
        raise ValueError(
            f"policy_logprobs must have shape (N,) with N >= 2 samples, got {tuple(policy_logprobs.shape)}"
        )
    kl = check_real(kl, "kl")
    if kl < 0:
        raise ValueError(f"kl must be >= 0 (a KL divergence), got {kl}")
    spec = get_estimator(estimator)
    values = kl_estimate(policy_logprobs, reference_logprobs, spec.name).detach()  # (N,)
    n = values.shape[0]
    return EstimatorMoments(
        spec.name, kl, float(values.mean()), float(values.std()), float((values < 0).double().mean()), n
    )


@dataclass(frozen=True)
class EstimatorSamples:
    """Per-draw values of several estimators on the same draws from the policy, and the exact KL.

    Attributes
    ----------
    kl : float
        The exact KL the draws estimate (nats).
    values : mapping of str to ndarray, shape (N,)
        Canonical estimator name -> its value on each draw (nats), in the order asked for.
    """

    kl: float
    values: Mapping[str, np.ndarray]

    def share_negative(self, estimator: str) -> float:
        """Share of the draws on which ``estimator`` is negative."""
        return float(np.mean(self.values[get_estimator(estimator).name] < 0))


def estimator_samples(
    policy_logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    estimators: Sequence[Estimator],
    kl: float,
) -> EstimatorSamples:
    r"""The values of each estimator on the same draws :math:`y_i \sim \pi`, for a figure of their
    distributions.

    Parameters
    ----------
    policy_logprobs, reference_logprobs : Tensor, shape (N,)
        :math:`\log\pi(y_i)` and :math:`\log\pi_{\mathrm{ref}}(y_i)`.
    estimators : sequence of str
        Names or aliases of sampled estimators, at least one, no name twice.
    kl : float
        The exact KL, >= 0.

    Returns
    -------
    EstimatorSamples

    Examples
    --------
    >>> s = estimator_samples(torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0]), ["kl", "k2"], 0.0)
    >>> list(s.values), s.values["k1"], s.share_negative("k1")
    (['k1', 'k2'], array([ 1., -1.], dtype=float32), 0.5)
    """
    check_tensor_pair(policy_logprobs, "policy_logprobs", reference_logprobs, "reference_logprobs")
    if policy_logprobs.dim() != 1:
        raise ValueError(f"policy_logprobs must have shape (N,), got {tuple(policy_logprobs.shape)}")
    if isinstance(estimators, str) or not isinstance(estimators, Sequence) or not estimators:
        raise TypeError(f"estimators must be a non-empty sequence of names, got {estimators!r}")
    names = [get_estimator(e).name for e in estimators]
    if len(set(names)) != len(names):
        raise ValueError(f"estimators must name each estimator once, got {list(estimators)!r}")
    for e, name in zip(estimators, names, strict=True):
        if get_estimator(name).needs_logits:
            raise ValueError(f"estimators must be sampled estimators, got {e!r}, which needs logits")
    kl = check_real(kl, "kl")
    if kl < 0:
        raise ValueError(f"kl must be >= 0 (a KL divergence), got {kl}")
    values = {n: kl_estimate(policy_logprobs, reference_logprobs, n).detach().cpu().numpy() for n in names}
    return EstimatorSamples(kl, values)
