"""OpenRLHF's names over the package's code (v0.11.0): the KL controllers of
``openrlhf/trainer/ppo_utils/kl_controller.py`` and ``compute_approx_kl`` and ``compute_reward`` of
``openrlhf/models/utils.py``.

``AdaptiveKLController(init_kl_coef, target, horizon)`` with ``update(current, n_steps)``, and
``FixedKLController(kl_coef)``; both keep the coefficient in ``.value``. ``compute_approx_kl(log_probs,
log_probs_base, kl_estimator="k1")``: k1, k2 or k3 per token in float32, clamped to [-10, 10], a
``ValueError`` for any other name; ``compute_reward(r, kl_coef, kl, action_mask, reward_clip_range)``:
``-kl_coef * kl`` at every position (padding included) plus the clipped score at the last position whose
action mask is 1. Where it differs on purpose: a negative ``kl_coef`` raises (OpenRLHF sets it to 0
without a word), and so does a sequence whose action mask is all 0 (OpenRLHF puts its score on the last
position). See
:mod:`kltutorial.compat` for what differs on purpose.

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
from ._kl import rewards_with_penalty

__all__ = ["AdaptiveKLController", "FixedKLController", "compute_approx_kl", "compute_reward"]


class AdaptiveKLController(PeerAdaptiveKLController):
    """OpenRLHF's ``AdaptiveKLController(init_kl_coef, target, horizon)``; ``update(current, n_steps)``."""


class FixedKLController(PeerFixedKLController):
    """OpenRLHF's ``FixedKLController(kl_coef)``; ``update(current, n_steps)`` changes nothing."""


def compute_approx_kl(
    log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_estimator: str = "k1"
) -> torch.Tensor:
    """OpenRLHF's ``compute_approx_kl``: the per-token ``kl_estimator`` (``"k1"``, ``"k2"`` or ``"k3"``),
    clamped to [-10, 10], in float32 (computed by :func:`~kltutorial.estimators.kl_estimate`, in float64 for
    float64 input before the cast).

    Examples
    --------
    >>> compute_approx_kl(torch.tensor([-1.0, -30.0]), torch.tensor([-1.5, -0.5]), kl_estimator="k3")
    tensor([ 0.1065, 10.0000])
    """
    if kl_estimator not in ("k1", "k2", "k3"):
        raise ValueError(f"Unknown kl_estimator: {kl_estimator}")
    check_float_tensor(log_probs, "log_probs")
    check_float_tensor(log_probs_base, "log_probs_base")
    return kl_estimate(log_probs, log_probs_base, kl_estimator, clamp=10.0).float()


def compute_reward(
    r: torch.Tensor, kl_coef: float, kl: torch.Tensor, action_mask: torch.Tensor | None = None,
    reward_clip_range: tuple[float, float] | None = None,
) -> torch.Tensor:
    """OpenRLHF's ``compute_reward``: ``-kl_coef * kl`` (B, T) plus each score ``r`` (B,), clipped to
    ``reward_clip_range`` if given, at its sequence's last position whose ``action_mask`` is 1.

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
