"""Sample-based KL estimators (book sections 4 and 8).

Every estimator here is a function of the log-ratio of one token sampled from the policy,

.. math::  \\Delta = \\log \\pi(y) - \\log \\pi_{\\mathrm{ref}}(y), \\qquad y \\sim \\pi,

and estimates :math:`\\mathrm{KL}(\\pi \\,\\|\\, \\pi_{\\mathrm{ref}}) = \\mathbb{E}_{y\\sim\\pi}[\\Delta]`:

======  ==========================  ====================================================
name    formula                     property
======  ==========================  ====================================================
k1      :math:`\\Delta`              unbiased; negative for many samples; high variance
k2      :math:`\\tfrac12\\Delta^2`     biased (second-order accurate); always >= 0
k3      :math:`e^{-\\Delta}-1+\\Delta`   unbiased; always >= 0; low variance near pi_ref
abs     :math:`|\\Delta|`            biased upwards; always >= 0 (a TRL option)
======  ==========================  ====================================================

The estimates are only right for tokens **sampled from the policy**. Evaluated on tokens drawn any
other way (uniformly, say) the log-ratio's mean is not a KL and can be negative.

References: J. Schulman, "Approximating KL Divergence" (2020); TRL, OpenRLHF and verl name the same
estimators ``kl``/``k1``, ``mse``/``k2``, ``low_var_kl``/``k3`` and ``abs``.
"""

from __future__ import annotations

from typing import Literal

import torch

from ._validation import check_choice, check_float_tensor, check_mask, check_same_shape

__all__ = ["ESTIMATORS", "Estimator", "Reduction", "kl_estimate", "compute_token_kl"]

Estimator = Literal["k1", "k2", "k3", "abs"]
Reduction = Literal["sum", "mean"]
ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "abs")
REDUCTIONS: tuple[str, ...] = ("sum", "mean")


def _check_logprob_pair(policy_logprobs: object, reference_logprobs: object) -> None:
    check_float_tensor(policy_logprobs, "policy_logprobs", allow_inf=False)
    check_float_tensor(reference_logprobs, "reference_logprobs", allow_inf=False)
    check_same_shape(policy_logprobs, "policy_logprobs", reference_logprobs, "reference_logprobs")


def kl_estimate(
    policy_logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    estimator: Estimator = "k1",
) -> torch.Tensor:
    r"""Per-token estimate of KL(pi || pi_ref) from the log-ratio of tokens sampled from pi.

    With :math:`\Delta = \log\pi(y) - \log\pi_{\mathrm{ref}}(y)`:
    ``k1`` = :math:`\Delta`, ``k2`` = :math:`\tfrac12\Delta^2`,
    ``k3`` = :math:`e^{-\Delta} - 1 + \Delta`, ``abs`` = :math:`|\Delta|`.

    Parameters
    ----------
    policy_logprobs : Tensor, any shape
        :math:`\log\pi(y)` of tokens ``y`` sampled from the policy.
    reference_logprobs : Tensor, same shape
        :math:`\log\pi_{\mathrm{ref}}(y)` of the same tokens.
    estimator : {"k1", "k2", "k3", "abs"}
        Which estimator; see the module docstring for their bias and variance.

    Returns
    -------
    Tensor, same shape
        One estimate per token. Averaged over samples from pi, ``k1`` and ``k3`` converge to the
        exact KL; ``k2`` to it plus a bias of order :math:`\mathbb{E}[\Delta^3]`.

    Examples
    --------
    >>> d = torch.tensor([0.5, -0.5])
    >>> kl_estimate(d, torch.zeros(2), "k3")  # exp(-0.5) - 1 + 0.5, exp(0.5) - 1 - 0.5
    tensor([0.1065, 0.1487])
    """
    _check_logprob_pair(policy_logprobs, reference_logprobs)
    check_choice(estimator, "estimator", ESTIMATORS)
    log_ratio = policy_logprobs - reference_logprobs  # Δ
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        # r - 1 - log r with r = pi_ref / pi = exp(-Δ); expm1 keeps precision when Δ is small.
        return torch.expm1(-log_ratio) + log_ratio
    return log_ratio.abs()


def compute_token_kl(
    policy_logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    estimator: Estimator = "k1",
    reduction: Reduction = "sum",
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Per-token KL estimates and their per-sequence reduction, padding excluded.

    .. math::  \mathrm{kl}_t = m_t \, k(\Delta_t), \qquad
               \mathrm{KL}_{\mathrm{seq}} = \sum_t \mathrm{kl}_t \;\; (\text{"sum"}) \quad\text{or}\quad
               \frac{\sum_t \mathrm{kl}_t}{\sum_t m_t} \;\; (\text{"mean"})

    The sum estimates the sequence-level KL (the chain rule makes it the sum of per-token KLs); this is
    what lm-human-preferences and TRL feed their KL controllers. The token mean is what verl logs and
    controls. A target of 6 nats means very different things under the two, so the choice is explicit.

    Parameters
    ----------
    policy_logprobs : Tensor, shape (B, T)
        Log-probs under the policy of tokens sampled from the policy.
    reference_logprobs : Tensor, shape (B, T)
        Log-probs of the same tokens under the reference model.
    attention_mask : Tensor, shape (B, T), optional
        1 for response tokens, 0 for padding; masked positions contribute exactly 0. ``None`` means
        every position is valid.
    estimator : {"k1", "k2", "k3", "abs"}
        Per-token estimator, see :func:`kl_estimate`.
    reduction : {"sum", "mean"}
        ``"sum"`` over valid tokens, or ``"mean"`` over valid tokens (a sequence with no valid token
        gets 0).

    Returns
    -------
    per_token : Tensor, shape (B, T)
        Masked per-token estimates.
    per_sequence : Tensor, shape (B,)
        Their sum or token mean per sequence.
    """
    _check_logprob_pair(policy_logprobs, reference_logprobs)
    if policy_logprobs.dim() != 2:
        raise ValueError(
            f"policy_logprobs must have shape (B, T), got {tuple(policy_logprobs.shape)}"
        )
    check_choice(reduction, "reduction", REDUCTIONS)
    per_token = kl_estimate(policy_logprobs, reference_logprobs, estimator)
    if attention_mask is None:
        mask = torch.ones_like(per_token, dtype=torch.bool)
    else:
        mask = check_mask(attention_mask, "attention_mask", per_token.shape)
    # torch.where, not multiplication: 0 * inf would be NaN for a padded position.
    per_token = torch.where(mask, per_token, torch.zeros_like(per_token))
    per_sequence = per_token.sum(dim=-1)
    if reduction == "mean":
        n_valid = mask.sum(dim=-1).clamp(min=1).to(per_sequence.dtype)
        per_sequence = per_sequence / n_valid
    return per_token, per_sequence
