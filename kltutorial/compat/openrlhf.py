"""OpenRLHF's names over the package's code: the KL controllers of
``openrlhf/trainer/ppo_utils/kl_controller.py`` and ``compute_approx_kl``, ``compute_reward``,
``log_probs_from_logits`` and ``masked_mean`` of ``openrlhf/models/utils.py`` (v0.11.0, and
``compute_approx_kl`` as PR #1309 extends it).

``AdaptiveKLController(init_kl_coef, target, horizon)`` with ``update(current, n_steps)``, and
``FixedKLController(kl_coef)``; both keep the coefficient in ``.value``. ``compute_approx_kl(log_probs,
log_probs_base, log_probs_old=None, kl_estimator="k1", unbiased_gradient=False)``: k1, k2 or k3 per token
in float32, clamped to [-10, 10], a ``ValueError`` for any other name, and with ``unbiased_gradient`` the
importance-weighted gradient of the estimators' ``old_logprobs``; ``log_probs_from_logits(logits, labels,
temperature=1.0)`` and ``masked_mean(tensor, mask, dim=None)``;
``compute_reward(r, kl_coef, kl, action_mask, reward_clip_range)``:
``-kl_coef * kl`` at every position (padding included) plus the clipped score at the last position whose
action mask is 1. Where it differs on purpose: a negative ``kl_coef`` raises (OpenRLHF sets it to 0
without a word), and so does a sequence whose action mask is all 0 (OpenRLHF puts its score on the last
position). See
:mod:`kltutorial.compat` for what differs on purpose.

Every function returns the dtype OpenRLHF's returns (v0.11.0, and PR #1309's ``compute_approx_kl``, read
in their source): ``compute_approx_kl`` float32 whatever its inputs (theirs casts both to float32 first;
here float64 input is computed in float64 and rounded once); ``log_probs_from_logits`` the logits' dtype,
float64 included (as OpenRLHF's path without flash-attn, whose flash-attn path returns float32 for
float32 and float64 logits); ``masked_mean`` the dtype of ``(tensor * mask).sum(dim) / mask.sum(dim)``,
the values' dtype under a boolean or integer mask; ``compute_reward`` the dtype of ``kl``.

Examples
--------
>>> from kltutorial.compat import openrlhf
>>> ctl = openrlhf.FixedKLController(kl_coef=0.01)
>>> ctl.update(current=3.0, n_steps=128)
>>> ctl.value
0.01
"""

from __future__ import annotations

import torch

from .._validation import check_float_tensor
from ..estimators import kl_estimate
from ._controllers import PeerAdaptiveKLController, PeerFixedKLController
from ._functional import masked_mean as _masked_mean
from ._functional import token_logprobs
from ._kl import rewards_with_penalty

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "KL_IS_WEIGHT_CLIP",
    "compute_approx_kl",
    "compute_reward",
    "log_probs_from_logits",
    "masked_mean",
]

#: Upper bound of the importance weight pi/pi_old of ``compute_approx_kl(..., unbiased_gradient=True)``,
#: OpenRLHF's name and value (PR #1309).
KL_IS_WEIGHT_CLIP = 10.0


class AdaptiveKLController(PeerAdaptiveKLController):
    """OpenRLHF's ``AdaptiveKLController(init_kl_coef, target, horizon)``; ``update(current, n_steps)``."""


class FixedKLController(PeerFixedKLController):
    """OpenRLHF's ``FixedKLController(kl_coef)``; ``update(current, n_steps)`` changes nothing."""


def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    log_probs_old: torch.Tensor | None = None,
    kl_estimator: str = "k1",
    unbiased_gradient: bool = False,
) -> torch.Tensor:
    """OpenRLHF's ``compute_approx_kl``: the per-token ``kl_estimator`` (``"k1"``, ``"k2"`` or ``"k3"``),
    clamped to [-10, 10], in float32 (computed by :func:`~kltutorial.estimators.kl_estimate`, in float64 for
    float64 input before the cast).

    With ``unbiased_gradient=True`` (OpenRLHF PR #1309, for the KL in the loss) the value is the same, and
    the gradient is the importance-weighted reverse-KL gradient :math:`w\\,\\Delta\\,\\nabla\\log\\pi`, with
    :math:`w = \\min(\\pi/\\pi_{\\mathrm{old}}, 10)` from ``log_probs_old`` (detached; 1 when
    ``log_probs_old`` is None): the estimators' straight-through ``k1+``/``k2+``/``k3+`` with
    ``old_logprobs=log_probs_old, weight_clamp=KL_IS_WEIGHT_CLIP``. Without it ``log_probs_old`` is
    ignored, as OpenRLHF's.

    Where it differs on purpose: a string in ``log_probs_old``'s place is taken as v0.11.0's third
    positional argument, ``kl_estimator`` (``compute_approx_kl(lp, base, "k3")``), where OpenRLHF since
    PR #1309 would silently compute k1; the value is added as ``0 + value`` after the straight-through
    term, not ``value + s - s``, so it is the estimator's to the last bit; k3 is ``expm1(-d) + d``; NaN
    inputs raise.

    Examples
    --------
    >>> compute_approx_kl(torch.tensor([-1.0, -30.0]), torch.tensor([-1.5, -0.5]), kl_estimator="k3")
    tensor([ 0.1065, 10.0000])
    >>> lp = torch.tensor([-1.0], requires_grad=True)
    >>> old = torch.tensor([-1.0]) - torch.tensor(2.0).log()  # pi_old = pi / 2: w = 2
    >>> kl = compute_approx_kl(lp, torch.tensor([-1.5]), old, "k3", unbiased_gradient=True)
    >>> kl.backward()
    >>> kl.detach(), lp.grad  # k3(0.5); w * (log pi - log pi_ref) = 2 * 0.5
    (tensor([0.1065]), tensor([1.]))
    """
    if isinstance(log_probs_old, str):  # v0.11.0's compute_approx_kl(log_probs, log_probs_base, kl_estimator)
        if kl_estimator != "k1":
            raise TypeError(
                f"compute_approx_kl got kl_estimator twice: {log_probs_old!r} in log_probs_old's place "
                f"(v0.11.0's order) and kl_estimator={kl_estimator!r}"
            )
        log_probs_old, kl_estimator = None, log_probs_old
    if kl_estimator not in ("k1", "k2", "k3"):
        raise ValueError(f"Unknown kl_estimator: {kl_estimator}")
    if not isinstance(unbiased_gradient, bool):
        raise TypeError(f"unbiased_gradient must be a bool, got {type(unbiased_gradient).__name__}")
    check_float_tensor(log_probs, "log_probs")
    check_float_tensor(log_probs_base, "log_probs_base")
    if not unbiased_gradient:
        return kl_estimate(log_probs, log_probs_base, kl_estimator, clamp=10.0).float()
    if log_probs_old is not None:
        check_float_tensor(log_probs_old, "log_probs_old")
    clip = None if log_probs_old is None else KL_IS_WEIGHT_CLIP
    return kl_estimate(log_probs, log_probs_base, f"{kl_estimator}+", clamp=10.0,
                       old_logprobs=log_probs_old, weight_clamp=clip).float()


def compute_reward(
    r: torch.Tensor, kl_coef: float, kl: torch.Tensor, action_mask: torch.Tensor | None = None,
    reward_clip_range: tuple[float, float] | None = None,
) -> torch.Tensor:
    """OpenRLHF's ``compute_reward``: ``-kl_coef * kl`` (B, T) plus each score ``r`` (B,), clipped to
    ``reward_clip_range`` if given, at its sequence's last position whose ``action_mask`` is 1; in ``kl``'s
    dtype, the score cast to it, as OpenRLHF's.

    Examples
    --------
    >>> compute_reward(torch.tensor([2.0]), 0.1, torch.tensor([[0.5, 0.5, 9.0]]),
    ...                action_mask=torch.tensor([[1, 1, 0]]), reward_clip_range=(-1.0, 1.0))
    tensor([[-0.0500,  0.9500, -0.9000]])
    """
    if action_mask is None:
        raise TypeError("compute_reward needs action_mask (B, T): it places each score at the last action")
    check_float_tensor(kl, "kl", ndim=2)
    r = torch.as_tensor(r)
    if reward_clip_range:
        r = r.clamp(min=reward_clip_range[0], max=reward_clip_range[1])
    rewards, _ = rewards_with_penalty(r, kl, action_mask, kl_coef, mask_name="action_mask", kl_name="kl")
    return rewards


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """OpenRLHF's ``log_probs_from_logits``: ``log_softmax(logits / temperature, -1)`` gathered at ``labels``;
    logits (..., V), labels (...), the result the shape of ``labels`` in the logits' dtype.

    Computed by :func:`~kltutorial.logprobs.get_logprobs_for_tokens`, which divides each chunk by the
    temperature. Where it differs on purpose: the caller's logits are left as they are (OpenRLHF's divides
    them in place, ``logits.div_(temperature)``, so the caller's tensor comes back divided); the division and
    the log-softmax of half-precision logits are computed in float32 and rounded once (OpenRLHF's in the
    logits' dtype); a temperature that is not a finite number > 0 raises ``ValueError``; NaN, ``+inf`` and
    all ``-inf`` positions raise. The dtype is that of OpenRLHF's path without flash-attn (v0.11.0), the
    logits' dtype: float64 logits give float64 log-probs, computed in float64, and half-precision logits
    log-probs of their dtype; OpenRLHF's flash-attn path returns float32 for float32 and float64 logits.

    Examples
    --------
    >>> logits = torch.log(torch.tensor([[0.25, 0.75]]))
    >>> log_probs_from_logits(logits, torch.tensor([0]), temperature=0.5)  # p ~ (1, 9): log 1/10
    tensor([-2.3026])
    """
    return token_logprobs(logits, labels, temperature=temperature)


def masked_mean(tensor: torch.Tensor, mask: torch.Tensor | None, dim: int | None = None) -> torch.Tensor:
    """OpenRLHF's ``masked_mean``: ``(tensor * mask).sum(dim) / mask.sum(dim)``, or ``tensor.mean(dim)`` when
    ``mask`` is None; ``mask`` broadcasts to ``tensor`` as OpenRLHF's does.

    Where it differs on purpose: an all-zero mask along ``dim`` raises ``ValueError`` (OpenRLHF's divides 0
    by 0 and returns NaN); entries where the mask is 0 never count, whatever their value (OpenRLHF's
    multiplies, so NaN or inf there gives NaN); NaN where the mask is not 0 raises; half precision is summed
    in float32 and rounded once to OpenRLHF's dtype, the dtype of its expression (v0.11.0): the values'
    dtype under a boolean or integer mask or with ``mask=None``, float64 computed in float64.

    Examples
    --------
    >>> masked_mean(torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[1, 1], [1, 0]]), dim=-1)
    tensor([2., 5.])
    """
    return _masked_mean(tensor, mask, dim, eps=None, values_name="tensor", mask_name="mask", dim_name="dim")
