r"""The exact maths of the book: what is computed in closed form or as a finite sum, never sampled.

Three parts, importing only the library and one another (never a section's study):

* **divergences** (sections 1 and 2): KL, entropy and cross-entropy of categoricals, Gaussians, and the
  two ways to fit one Gaussian to a mixture (modules ``categorical`` and ``gaussian``);
* **listable sequence spaces** (sections 3, 4, 5, 9 and 11): the chain rule, estimates against the exact
  KL, :math:`\pi^*_\beta`, the penalised objective, and the per-token fixed points of each recipe
  (modules ``space``, ``estimates``, ``optimum``, ``penalised``, ``fixed_points``);
* **exact gradients** (sections 4 and 9): what an estimator's gradient optimises when it is used as a
  loss (:mod:`kltutorial.exact.gradients`), and the KL in the reward or in the loss
  (:mod:`kltutorial.exact.placement`); these two are imported by their module name.

The names of the first two parts are imported from here.

Listable sequence spaces
------------------------

Exact probabilities on a sequence space small enough to list (book sections 3, 5 and 11).

Sequences of :math:`T` tokens from a vocabulary of :math:`V`: while :math:`V^T` is at most a few million,
every sequence can be listed, and every probability, KL divergence and expected reward is a finite sum,
computed exactly instead of estimated. Section 3 checks the chain rule on such a space, section 5
computes the closed-form optimum :math:`\pi^*_\beta` and its reward–KL frontier, and section 11 trains
a policy on one and measures it against both. Nothing here knows about any particular task.

Two representations, and the functions that go between them:

* an autoregressive model is a **next-token table**, one row of log-probabilities per prefix,
  ``table[h, v]`` :math:`= \log \pi(v \mid h)`. The rows of the prefixes of length :math:`L` are
  ``space.offsets[L]`` to ``space.offsets[L + 1] - 1``, in lexicographic order, so the prefix
  :math:`y_{<t}` has row ``offsets[t]`` + (:math:`y_{<t}` read as a number in base :math:`V`). A model
  given by logits :math:`z` has the table ``torch.log_softmax(z, dim=-1)``.
* a **distribution over sequences** is a tensor of :math:`V^T` log-probabilities in the order of
  ``space.sequences``, where sequence :math:`i` is :math:`i` written in base :math:`V`, most significant
  token first. The functions of distributions (KL, expected reward, :math:`\pi^*_\beta`, best-of-n,
  sampling) work for any finite distribution and need no space.

The formulas, each in its function's docstring:

1. the chain rule of probability, :math:`\log \pi(y) = \sum_t \log \pi(y_t \mid y_{<t})`
   (:func:`sequence_logprobs`), and back (:func:`next_token_logprobs`);
2. the chain rule of KL (Cover and Thomas, *Elements of Information Theory*, Theorem 2.5.3),
   :math:`\mathrm{KL}(\pi \| \pi_\mathrm{ref}) = \sum_t \mathbb{E}_{y_{<t} \sim \pi}\,
   \mathrm{KL}(\pi(\cdot \mid y_{<t}) \| \pi_\mathrm{ref}(\cdot \mid y_{<t}))`
   (:func:`sequence_kl`, :func:`per_position_kl`);
3. the optimum of the KL-penalised objective, :math:`\pi^*_\beta(y) \propto \pi_\mathrm{ref}(y)\,
   e^{r(y)/\beta}` (Korbak et al. 2022; Rafailov et al. 2023, eq. 4), and its frontier
   (:func:`optimal_policy`, :func:`optimal_frontier`);
4. best-of-n sampling, exactly, and the formula :math:`\log n - (n-1)/n` for its KL, which is an upper
   bound on a finite space (Stiennon et al. 2020; :func:`best_of_n_logprobs`, :func:`best_of_n_kl_bound`).

Five modules, all imported from here: ``space`` (the listed sequences, tables and distributions, KL,
sampling: items 1 and 2), ``optimum`` (:math:`\pi^*_\beta`, its frontier, best-of-n: items 3 and 4),
``estimates`` (Monte Carlo estimates of the sequence KL against the exact value, section 3),
``fixed_points`` (where a per-token KL penalty in the loss stops the policy, section 9) and
``penalised`` (the penalised objective, its optimum value, the frontier's slope, perturbation checks and
the exact policy gradient, section 5).

Shapes: V vocabulary, T positions, V**T sequences, P = 1 + V + ... + V**(T-1) prefixes (the rows of a
next-token table), N samples, K values of β.

Divergences
-----------

The KL divergence itself (book sections 1 and 2): categorical distributions, Gaussians, and the two
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
   :func:`kltutorial.exact.optimal_policy`.

Everything is deterministic: the quadrature grid is fixed, and the optimiser (L-BFGS, then Newton steps)
starts where it is told.

Two modules: ``categorical`` (items 1 and 4) and ``gaussian`` (items 2 and 3).

References: S. Kullback and R. A. Leibler, "On Information and Sufficiency", *Ann. Math. Statist.* 22
(1951); T. M. Cover and J. A. Thomas, *Elements of Information Theory*, 2nd ed. (2006), §2.3 and §2.6;
C. M. Bishop, *Pattern Recognition and Machine Learning* (2006), §10.1.2 and §10.7; T. Minka, "Divergence
measures and message passing", MSR-TR-2005-173 (2005).
"""
from .categorical import NATS_PER_BIT, UNITS, cross_entropy, entropy, forward_kl_optimal_policy, kl_divergence
from .estimates import (
    EstimatorMoments,
    MonteCarloConvergence,
    estimator_moments,
    exact_mean_and_std,
    monte_carlo_convergence,
    rao_blackwell_kl,
    sampled_token_kl,
)
from .fixed_points import PER_TOKEN_DIVERGENCES, per_token_fixed_point
from .gaussian import (
    Gaussian,
    GaussianMixture,
    fit_forward_kl,
    fit_reverse_kl,
    kl_gaussians,
    kl_profile,
    kl_quadrature,
)
from .optimum import Frontier, best_of_n_kl_bound, best_of_n_logprobs, optimal_frontier, optimal_policy
from .penalised import (
    PerturbationCheck,
    beta_for_budget,
    frontier_slope,
    optimal_value,
    penalised_objective,
    perturbation_check,
    policy_gradient,
)
from .space import (
    MAX_SEQUENCES,
    SequenceSpace,
    expected_reward,
    next_token_logprobs,
    per_position_kl,
    sample_autoregressive,
    sample_sequences,
    sequence_kl,
    sequence_logprobs,
    token_logprobs,
)

__all__ = [
    "EstimatorMoments",
    "MAX_SEQUENCES",
    "SequenceSpace",
    "Frontier",
    "sequence_logprobs",
    "token_logprobs",
    "next_token_logprobs",
    "sequence_kl",
    "per_position_kl",
    "expected_reward",
    "optimal_policy",
    "optimal_frontier",
    "PER_TOKEN_DIVERGENCES",
    "per_token_fixed_point",
    "best_of_n_logprobs",
    "best_of_n_kl_bound",
    "sample_sequences",
    "sample_autoregressive",
    "estimator_moments",
    "exact_mean_and_std",
    "sampled_token_kl",
    "rao_blackwell_kl",
    "MonteCarloConvergence",
    "monte_carlo_convergence",
    "penalised_objective",
    "optimal_value",
    "frontier_slope",
    "beta_for_budget",
    "PerturbationCheck",
    "perturbation_check",
    "policy_gradient",
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
