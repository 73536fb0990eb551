r"""Value is not gradient: what an estimator's gradient optimises when it is used as a loss (book section 4).

A KL estimator used as a loss term is evaluated on tokens sampled from the policy :math:`\pi_\theta`; the
samples are fixed and autograd differentiates the estimate through :math:`\log\pi_\theta` of the sampled
tokens only. For an estimate :math:`k_\theta(y)` the gradient of its mean is

.. math::  \nabla_\theta\, \mathbb{E}_{y\sim\pi_\theta}[k_\theta(y)]
           = \underbrace{\mathbb{E}_{\pi}\big[k_\theta(y)\, \nabla_\theta \log \pi_\theta(y)\big]}_{
             \text{score-function term: not seen by autograd}}
           + \underbrace{\mathbb{E}_{\pi}\big[\nabla_\theta k_\theta(y)\big]}_{\text{what autograd gives}},

and the loss sees only the second term. With :math:`\Delta = \log\pi_\theta(y) - \log\pi_{\mathrm{ref}}(y)`,
:math:`\nabla_\theta k(\Delta) = k'(\Delta)\, \nabla_\theta\log\pi_\theta(y)`, so

* ``k1``, :math:`k' = 1`: :math:`\mathbb{E}_\pi[\nabla\log\pi] = \sum_y \nabla\pi(y) = \nabla 1 = 0`;
* ``k2``, :math:`k' = \Delta`: :math:`\mathbb{E}_\pi[\Delta\,\nabla\log\pi] =
  \nabla\mathrm{KL}(\pi\|\pi_{\mathrm{ref}})` (the gradient of the KL, whose own score term is 0);
* ``k3``, :math:`k' = 1 - \pi_{\mathrm{ref}}/\pi`: :math:`\mathbb{E}_\pi[\nabla\log\pi] -
  \sum_y \pi_{\mathrm{ref}}(y)\nabla\log\pi(y) = \nabla\mathrm{KL}(\pi_{\mathrm{ref}}\|\pi)`, the
  *forward* KL;
* ``k1+`` and ``k3+`` (verl's straight-through names): the value of k1 or k3, the gradient of k2.

This module computes those expectations **exactly**, by enumerating the outcomes and weighting each with
:math:`\pi_\theta(y)` held fixed (:func:`estimator_gradients` for a categorical, whose outcomes are the
tokens; :func:`sequence_estimator_gradients` for a listable sequence space), so there is no sampling noise
to argue about. On sequences the per-token estimates summed over positions are a different loss from the
estimator applied to the whole sequence's log-ratio: the per-token sum of k2 drops the terms by which a
token changes the KL of the tokens after it, and gives a partial gradient (Tang and Munos 2025).

References: J. Schulman, "Approximating KL Divergence" (2020); Y. Tang and R. Munos, "On a few pitfalls in
KL divergence gradient estimation for RL" (2025, arXiv:2506.09477); verl ``kl_penalty`` in
``verl/trainer/ppo/core_algos.py`` (the ``+`` names, PR #2953).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from .._validation import check_choice, check_float_tensor, check_logprobs, check_table
from ..estimators import Estimator, get_estimator, kl_estimate
from .space import SequenceSpace, check_space

__all__ = [
    "GradientAgreement",
    "EstimatorGradients",
    "estimator_gradients",
    "sequence_estimator_gradients",
]

Target = Literal["reverse", "forward"]
Which = Literal["loss", "mean"]

# A gradient whose norm is below this fraction of its target's is zero up to rounding (k1's exact expected
# gradient is a sum of terms that cancel to about 1e-17): its direction is noise, so no cosine is given.
_ZERO_RELATIVE_NORM = 1e-9


@dataclass(frozen=True)
class GradientAgreement:
    """How close a gradient ``g`` is to a target gradient ``h``.

    Attributes
    ----------
    max_abs_difference : float
        :math:`\\max_i |g_i - h_i|`.
    cosine : float
        :math:`g\\cdot h / (\\|g\\|\\|h\\|)`; NaN when either is zero up to rounding (no direction).
    norm_ratio : float
        :math:`\\|g\\| / \\|h\\|`.
    """

    max_abs_difference: float
    cosine: float
    norm_ratio: float

    def row(self) -> str:
        """``max|diff|`` with 4 decimals and the cosine with 3 (``-`` when it is undefined), for a table.

        Examples
        --------
        >>> GradientAgreement(0.01234, float("nan"), 0.0).row()
        '  0.0123    -  '
        """
        cosine = "  -  " if math.isnan(self.cosine) else f"{self.cosine:5.3f}"
        return f"{self.max_abs_difference:8.4f}  {cosine}"

    @classmethod
    def between(cls, g: torch.Tensor, h: torch.Tensor) -> GradientAgreement:
        """How close the gradient ``g`` is to ``h`` (any shapes with the same number of entries).

        Examples
        --------
        >>> a = GradientAgreement.between(torch.tensor([1.0, 0.0]), torch.tensor([2.0, 0.0]))
        >>> a.max_abs_difference, round(a.cosine, 6), a.norm_ratio
        (1.0, 1.0, 0.5)
        """
        g, h = g.reshape(-1), h.reshape(-1)
        ng, nh = float(g.norm()), float(h.norm())
        scale = max(ng, nh)
        if scale == 0 or min(ng, nh) <= _ZERO_RELATIVE_NORM * scale:
            cosine = float("nan")
        else:
            cosine = float(g @ h) / (ng * nh)
        ratio = ng / nh if nh > 0 else float("nan")
        return cls(float((g - h).abs().max()), cosine, ratio)


@dataclass(frozen=True)
class EstimatorGradients:
    """Exact expected gradients of one estimator, and the two KL gradients to set them against.

    All tensors have the shape of the parameters :math:`\\theta` (the policy's logits).

    Attributes
    ----------
    estimator : str
        The estimator, as given (``"k3+"``, ``"k2"``, ...).
    loss : Tensor
        :math:`\\mathbb{E}_{y\\sim\\pi}[\\nabla_\\theta k_\\theta(y)]`: the expected gradient of the estimate
        used as a loss on samples of the policy, which autograd computes with the samples held fixed.
    mean : Tensor
        :math:`\\nabla_\\theta \\mathbb{E}_{y\\sim\\pi_\\theta}[k_\\theta(y)]`: the gradient of the estimate's
        mean, score-function term included.
    reverse_kl : Tensor
        :math:`\\nabla_\\theta \\mathrm{KL}(\\pi_\\theta \\| \\pi_{\\mathrm{ref}})`, the penalised KL.
    forward_kl : Tensor
        :math:`\\nabla_\\theta \\mathrm{KL}(\\pi_{\\mathrm{ref}} \\| \\pi_\\theta)`.
    """

    estimator: str
    loss: torch.Tensor
    mean: torch.Tensor
    reverse_kl: torch.Tensor
    forward_kl: torch.Tensor

    def agreement(self, which: Which = "loss", target: Target = "reverse") -> GradientAgreement:
        """How close ``loss`` (or ``mean``) is to the gradient of the ``"reverse"`` (or ``"forward"``) KL."""
        check_choice(which, "which", ("loss", "mean"))
        check_choice(target, "target", ("reverse", "forward"))
        g = self.loss if which == "loss" else self.mean
        return GradientAgreement.between(g, self.reverse_kl if target == "reverse" else self.forward_kl)


def check_sampled_estimator(estimator: object) -> str:
    """``estimator`` as given, if it is evaluated on samples (not the exact, logits-based KL)."""
    spec = get_estimator(estimator)
    if spec.needs_logits:
        raise ValueError(
            f"estimator must be a sampled estimator (k1, k2, k3, abs, k1+, k3+, ...), got {estimator!r}: "
            "the exact KL is not evaluated on samples"
        )
    return estimator  # as given: its value is the same as the canonical name's


def _gradients(
    theta: torch.Tensor,
    outcome_logprobs: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    ref_logprobs: torch.Tensor,
    estimate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    estimator: str,
) -> EstimatorGradients:
    """The four gradients, given how the outcomes' log-probs and the estimate follow from the parameters.

    ``outcome_logprobs(theta)`` returns ``(logp, per_token)``: the outcomes' log-probs, shape (Y,), and what
    the estimate is computed from; ``estimate(per_token, ref)`` returns one estimate per outcome, (Y,).
    """
    theta = theta.detach().clone().requires_grad_(True)
    logp, per_token = outcome_logprobs(theta)  # (Y,), (Y, ...)
    p = logp.exp()  # (Y,)
    values = estimate(per_token, ref_logprobs)  # (Y,)
    # 1. The loss on fixed samples: weights pi(y) held constant, the estimate differentiated.
    (loss,) = torch.autograd.grad((p.detach() * values).sum(), theta, retain_graph=True)
    # 2. The gradient of the mean: the weights differentiated too (adds E[k grad log pi]).
    (mean,) = torch.autograd.grad((p * values).sum(), theta, retain_graph=True)
    # 3. The two KL divergences, summed exactly over the outcomes.
    ref = ref_logprobs
    (reverse,) = torch.autograd.grad((p * (logp - ref)).sum(), theta, retain_graph=True)
    (forward,) = torch.autograd.grad((ref.exp() * (ref - logp)).sum(), theta)
    return EstimatorGradients(estimator, loss, mean, reverse, forward)


def estimator_gradients(
    logits: torch.Tensor, ref_logprobs: torch.Tensor, estimator: Estimator
) -> EstimatorGradients:
    r"""Exact expected gradients of an estimator for a categorical policy, :math:`\pi_\theta =
    \mathrm{softmax}(\theta)`.

    .. math::  \texttt{loss} = \sum_y \pi_\theta(y)\,
               \nabla_\theta k\big(\log\pi_\theta(y) - \log\pi_{\mathrm{ref}}(y)\big),
               \qquad \pi_\theta(y) \text{ held fixed}

    which is what a loss built from the estimate on tokens drawn from :math:`\pi_\theta` has as gradient in
    expectation; ``mean`` also differentiates the weights. The estimate is
    :func:`~kltutorial.estimators.kl_estimate`, so a straight-through name (``"k3+"``) gets its own gradient.

    Parameters
    ----------
    logits : Tensor, shape (Y,)
        The policy's logits :math:`\theta`, finite, floating point (float64 for exact comparisons).
    ref_logprobs : Tensor, shape (Y,)
        The reference's log-probabilities, normalised and finite (else the KL is infinite).
    estimator : str
        A sampled estimator's name or alias.

    Returns
    -------
    EstimatorGradients

    Examples
    --------
    >>> theta = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64)
    >>> ref = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64).log()
    >>> g = estimator_gradients(theta, ref, "k1")
    >>> float(g.loss.abs().max()) < 1e-15  # E[grad log pi] = 0
    True
    >>> torch.allclose(estimator_gradients(theta, ref, "k3").loss, g.forward_kl)
    True
    """
    logits = check_float_tensor(logits, "logits", ndim=1)
    ref = check_float_tensor(ref_logprobs, "ref_logprobs", ndim=1)
    ref = check_logprobs(ref, "ref_logprobs", logits.shape[0])
    name = check_sampled_estimator(estimator)

    def outcome_logprobs(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp = torch.log_softmax(theta, dim=-1)  # (Y,)
        return logp, logp

    return _gradients(logits, outcome_logprobs, ref, lambda lp, lq: kl_estimate(lp, lq, name), name)


def sequence_estimator_gradients(
    space: SequenceSpace,
    logits: torch.Tensor,
    ref_table: torch.Tensor,
    estimator: Estimator,
    *,
    per_token: bool = True,
) -> EstimatorGradients:
    r"""Exact expected gradients of a KL estimate on whole sequences, for an autoregressive policy
    :math:`\pi_\theta(\cdot\mid h) = \mathrm{softmax}(\theta_h)` on a listable space.

    With ``per_token`` the estimate of a sequence is :math:`\sum_t k(\Delta_t)`, the per-token loss
    trainers use; without, it is :math:`k(\sum_t \Delta_t)`, the estimator of the sequence's log-ratio.
    The targets are the gradients of the sequence KLs, :math:`\mathrm{KL}(\pi_\theta\|\pi_{\mathrm{ref}})` and
    :math:`\mathrm{KL}(\pi_{\mathrm{ref}}\|\pi_\theta)` over the :math:`V^T` sequences. For k2,

    .. math::  \mathbb{E}\Big[\nabla \sum_t \tfrac12\Delta_t^2\Big] = \mathbb{E}\Big[\sum_t \Delta_t\,
               \nabla\log\pi(y_t\mid y_{<t})\Big] \quad\text{but}\quad
               \nabla\mathrm{KL} = \mathbb{E}\Big[\sum_t \Big(\sum_{s \ge t}\Delta_s\Big)\,
               \nabla\log\pi(y_t\mid y_{<t})\Big]:

    the per-token loss misses the later log-ratios :math:`\sum_{s > t}\Delta_s` that token :math:`t` leads
    to (Tang and Munos 2025), while ``per_token=False`` gives the exact gradient.

    Parameters
    ----------
    space : SequenceSpace
    logits : Tensor, shape (P, V)
        The policy's logits, one row per prefix, finite.
    ref_table : Tensor, shape (P, V)
        The reference's next-token log-probs, finite.
    estimator : str
        A sampled estimator's name or alias.
    per_token : bool
        Sum the per-token estimates (default) or apply the estimator to the sequence log-ratio.

    Returns
    -------
    EstimatorGradients
        Gradients of shape (P, V).

    Examples
    --------
    >>> space = SequenceSpace(vocab_size=2, length=2)
    >>> g = torch.Generator().manual_seed(0)
    >>> theta = torch.randn(3, 2, generator=g, dtype=torch.float64)
    >>> ref = torch.log_softmax(torch.randn(3, 2, generator=g, dtype=torch.float64), dim=-1)
    >>> whole = sequence_estimator_gradients(space, theta, ref, "k2", per_token=False)
    >>> torch.allclose(whole.loss, whole.reverse_kl)
    True
    >>> torch.allclose(sequence_estimator_gradients(space, theta, ref, "k2").loss, whole.reverse_kl)
    False
    """
    check_space(space)
    logits = check_float_tensor(logits, "logits", ndim=2)
    want = (space.n_prefixes, space.vocab_size)
    if tuple(logits.shape) != want:
        raise ValueError(f"logits must have shape {want}, one row per prefix, got {tuple(logits.shape)}")
    ref_table = check_table(space, check_float_tensor(ref_table, "ref_table", ndim=2), "ref_table")
    if not isinstance(per_token, bool):
        raise TypeError(f"per_token must be a bool, got {type(per_token).__name__}")
    name = check_sampled_estimator(estimator)
    rows, tokens = space.prefix_ids, space.sequences  # (V**T, T) each
    ref_tokens = ref_table[rows, tokens]  # (V**T, T)

    def outcome_logprobs(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        per_tok = torch.log_softmax(theta, dim=-1)[rows, tokens]  # (V**T, T)
        return per_tok.sum(-1), per_tok

    def estimate(per_tok: torch.Tensor, _ref: torch.Tensor) -> torch.Tensor:
        if per_token:
            return kl_estimate(per_tok, ref_tokens, name).sum(-1)  # (V**T,): sum_t k(Δ_t)
        return kl_estimate(per_tok.sum(-1), ref_tokens.sum(-1), name)  # (V**T,): k(sum_t Δ_t)

    return _gradients(logits, outcome_logprobs, ref_tokens.sum(-1), estimate, name)
