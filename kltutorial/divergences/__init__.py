r"""The KL divergence itself (book sections 1 and 2): categorical distributions, Gaussians, and the two
directions of fitting one Gaussian to a mixture.

For distributions :math:`p` and :math:`q` on the same space, the Kullback–Leibler divergence is

.. math::  \mathrm{KL}(p \,\|\, q) = \mathbb{E}_{x \sim p}\Big[\log \frac{p(x)}{q(x)}\Big]
           = \underbrace{-\mathbb{E}_p[\log q]}_{\text{cross-entropy } H(p, q)}
           \; - \; \underbrace{(-\mathbb{E}_p[\log p])}_{\text{entropy } H(p)},

in nats with the natural logarithm (divide by :math:`\log 2` for bits). It is :math:`\ge 0`, with
equality only when :math:`p = q` (Gibbs' inequality; Cover and Thomas 2006, Theorem 2.6.3), and it is not
symmetric. What this package holds:

1. **categorical distributions** (arrays of probabilities, the last axis the categories):
   :func:`entropy`, :func:`cross_entropy`, :func:`kl_divergence`, in nats or bits;
2. **one-dimensional Gaussians and Gaussian mixtures** (:class:`Gaussian`, :class:`GaussianMixture`):
   the closed form :func:`kl_gaussians`, and :func:`kl_quadrature` for any pair, by quadrature on a
   fixed grid over each component of the first argument;
3. **the two ways to fit one Gaussian to a mixture** (Bishop 2006, §10.1.2 and §10.7; Minka 2005):
   the forward fit :math:`\arg\min_q \mathrm{KL}(p \| q)` matches moments (:func:`fit_forward_kl`,
   closed form), the reverse fit :math:`\arg\min_q \mathrm{KL}(q \| p)` settles in a mode and is found
   numerically, from a start (:func:`fit_reverse_kl`), and :func:`kl_profile` gives either KL as a
   function of the Gaussian's mean, its width chosen best for each mean;
4. **what a forward-KL penalty would do** in RLHF: :func:`forward_kl_optimal_policy`, the maximiser of
   :math:`\mathbb{E}_\pi[r] - \beta\,\mathrm{KL}(\pi_\mathrm{ref} \| \pi)`, beside the reverse-KL optimum
   :func:`kltutorial.sequences.optimal_policy`.

Everything is deterministic: the quadrature grid is fixed, and the optimiser (L-BFGS, then Newton steps)
starts where it is told.

Two modules: ``categorical`` (items 1 and 4) and ``gaussian`` (items 2 and 3); import both from here.

References: S. Kullback and R. A. Leibler, "On Information and Sufficiency", *Ann. Math. Statist.* 22
(1951); T. M. Cover and J. A. Thomas, *Elements of Information Theory*, 2nd ed. (2006), §2.3 and §2.6;
C. M. Bishop, *Pattern Recognition and Machine Learning* (2006), §10.1.2 and §10.7; T. Minka, "Divergence
measures and message passing", MSR-TR-2005-173 (2005).
"""

from .categorical import NATS_PER_BIT, UNITS, cross_entropy, entropy, forward_kl_optimal_policy, kl_divergence
from .gaussian import (
    Gaussian,
    GaussianMixture,
    fit_forward_kl,
    fit_reverse_kl,
    kl_gaussians,
    kl_profile,
    kl_quadrature,
)

__all__ = [
    "NATS_PER_BIT",
    "UNITS",
    "entropy",
    "cross_entropy",
    "kl_divergence",
    "forward_kl_optimal_policy",
    "Gaussian",
    "GaussianMixture",
    "kl_gaussians",
    "kl_quadrature",
    "fit_forward_kl",
    "fit_reverse_kl",
    "kl_profile",
]
