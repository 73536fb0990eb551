"""TRL's names over the package's code (v0.11.4): the KL controllers of ``trl/trainer/utils.py`` and the KL
penalty and reward shaping of ``PPOTrainer`` (``_kl_penalty``, ``compute_rewards``) as functions.

``AdaptiveKLController(init_kl_coef, target, horizon)`` with ``update(current, n_steps)``, and
``FixedKLController(kl_coef)``; both keep the coefficient in ``.value``. ``kl_penalty(logprob,
ref_logprob, kl_penalty="kl")`` takes TRL's names ``kl``, ``abs``, ``mse`` and ``full`` (for ``full`` the
arguments are full log-softmax tensors, (..., V)); ``compute_rewards(scores, logprobs, ref_logprobs,
masks, kl_coef, kl_penalty="kl")`` returns TRL's ``(rewards, non_score_rewards, kls)``, with TRL's padding
convention: ``-kl_coef * kl`` is left at every position, padding included (mask the result, or use
:func:`~kltutorial.objective.shape_rewards`, which gives padding exactly 0). See
:mod:`kltutorial.compat` for what differs on purpose.

Examples
--------
>>> from kltutorial.compat import trl
>>> ctl = trl.AdaptiveKLController(init_kl_coef=0.2, target=6, horizon=10000)
>>> ctl.update(current=9.0, n_steps=256)  # returns None, as TRL's does
>>> round(ctl.value, 8)  # 0.2 * (1 + 0.2 * 256 / 10000)
0.201024
"""

from __future__ import annotations

import torch

from ._controllers import PeerAdaptiveKLController, PeerFixedKLController
from ._kl import full_penalty, rewards_with_penalty, sampled_penalty

__all__ = ["AdaptiveKLController", "FixedKLController", "kl_penalty", "compute_rewards"]


class AdaptiveKLController(PeerAdaptiveKLController):
    """TRL's ``AdaptiveKLController(init_kl_coef, target, horizon)``; ``update(current, n_steps)``."""


class FixedKLController(PeerFixedKLController):
    """TRL's ``FixedKLController(kl_coef)``; ``update(current, n_steps)`` changes nothing."""


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str = "kl") -> torch.Tensor:
    """TRL's ``PPOTrainer._kl_penalty``: ``kl`` (k1), ``abs``, ``mse`` (k2) per token, or ``full``, the exact
    KL(pi || pi_ref) at each position of full log-softmax tensors (..., V); other names raise
    ``NotImplementedError``, as TRL's does.

    Examples
    --------
    >>> kl_penalty(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0]), "mse")
    tensor([0.1250, 0.5000])
    """
    if kl_penalty == "full":
        return full_penalty(logprob, ref_logprob)
    return sampled_penalty(logprob, ref_logprob, kl_penalty, allowed=("kl", "abs", "mse"),
                           library="TRL's PPOTrainer")


def compute_rewards(
    scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, masks: torch.Tensor,
    kl_coef: float, kl_penalty: str = "kl",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TRL's ``PPOTrainer.compute_rewards`` as a function (its ``kl_ctl.value`` is ``kl_coef``): per-token KL
    estimates ``kls`` (B, T), ``non_score_rewards = -kl_coef * kls``, and ``rewards``, the same plus each
    score at its sequence's last position whose mask is 1.

    Examples
    --------
    >>> rewards, non_score, kls = compute_rewards(
    ...     torch.tensor([1.0]), torch.tensor([[-1.0, -1.0, -2.0]]), torch.tensor([[-1.5, -1.0, -1.0]]),
    ...     torch.tensor([[1, 1, 0]]), kl_coef=0.1)
    >>> rewards  # the padded position keeps -0.1 * kl, as TRL's does
    tensor([[-0.0500,  1.0000,  0.1000]])
    """
    kls = _penalty(logprobs, ref_logprobs, kl_penalty)
    rewards, non_score = rewards_with_penalty(scores, kls, masks, kl_coef)
    return rewards, non_score, kls


_penalty = kl_penalty  # compute_rewards' own argument is called kl_penalty, as TRL's
