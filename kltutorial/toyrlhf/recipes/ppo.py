r"""PPO with the KL penalty in the reward, as TRL (<= 0.11, and its current ``PPOTrainer``) and OpenRLHF run
it (book section 9): recipes ``ppo-k1-reward`` and ``ppo-k3-reward``.

Per batch (Ouyang et al. 2022; Huang et al. 2024, "The N+ implementation details of RLHF with PPO"):

1. per-token penalty :math:`k(\Delta_t)` of the sampling policy's tokens (the estimators' registry:
   k1 by default, k3 for TRL's ``kl_estimator="k3"``), and shaped rewards :math:`r_t = -\beta k(\Delta_t)`
   plus the score at the last token (:func:`~kltutorial.shape_rewards`);
2. the critic's values :math:`V(y_{<t})` of the sampling policy, GAE with :math:`\gamma = 1` and
   :math:`\lambda` (:func:`~kltutorial.exact.placement.gae_advantages`), and the returns
   :math:`R_t = A_t + V_t` as the critic's target;
3. advantages whitened over the batch (TRL and OpenRLHF do), which rescales the whole gradient, penalty
   and score alike, so it does not move the fixed point;
4. ``epochs`` passes of ``minibatches`` minibatches: the clipped surrogate
   (:func:`~kltutorial.toyrlhf.recipes.common.clipped_pg_loss`) plus ``vf_coef`` times the critic's squared
   error, one Adam step each. A policy with a ``fit_values`` method (the table policy, whose critic is a
   table) fits its critic to the returns once per batch instead, by a running average per prefix as
   :func:`~kltutorial.toyrlhf.train_policy` does: on the toy task, a value table moved by Adam's
   fixed-size steps stays noisy, and with :math:`\lambda < 1` that noise biases the advantages (0.09 nats
   from :math:`\pi^*_{0.3}` at the end of a default run, against 0.04 with the running average).

**The KL's importance weight in later epochs**: the penalty is part of the reward, computed once from the
sampling policy's log-probs, so in every epoch it is weighted like the score, by PPO's clipped ratio
:math:`\pi_\theta/\pi_{\theta_\mathrm{old}}` on the advantage. There is nothing else to weight.

Where the run ends: with k1, at :math:`\pi^*_\beta` (at a fixed point the critic is exact, and then GAE's
:math:`\lambda` does not bias the gradient); with k3 in the reward, nowhere near the reference (the
penalty's expected gradient is the sequence KL's *minus* the per-token forward KL's, section 9).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...estimators import kl_estimate
from ...exact.placement import gae_advantages
from ...objective import shape_rewards
from ..config import check_field
from .common import Batch, clipped_pg_loss, minibatches, token_logprobs

__all__ = ["PPOSettings", "ppo_update"]


@dataclass(frozen=True)
class PPOSettings:
    """PPO's own settings; the defaults are TRL's and OpenRLHF's except where a comment says why not."""

    estimator: str = "k1"  # the per-token penalty in the reward: k1, or k3 (TRL's kl_estimator="k3")
    lam: float = 0.95  # GAE's lambda (TRL's PPO up to v1.9; OpenRLHF's default is 1 since v0.6.4); gamma is 1
    clip: float = 0.2  # epsilon of the clipped ratio (TRL's cliprange, OpenRLHF's eps_clip)
    epochs: int = 4  # passes over each batch (TRL's ppo_epochs / num_ppo_epochs)
    minibatches: int = 1  # minibatches per pass (TRL's num_mini_batches)
    vf_coef: float = 0.1  # weight of the critic's squared error in the loss (TRL's vf_coef)
    whiten: bool = True  # whiten the advantages over the batch (TRL, OpenRLHF)

    def __post_init__(self) -> None:
        check_field(self, "lam", "GAE's lambda (the default is 0.95)", low=0, high=1)
        check_field(self, "clip", "PPO's clip range epsilon (the default is 0.2)", low=0, low_open=True)
        check_field(self, "epochs", "passes over each batch (the default is 4)", low=1, integer=True)
        check_field(self, "minibatches", "minibatches per pass (the default is 1)", low=1, integer=True)
        check_field(self, "vf_coef", "the critic loss's weight (the default is 0.1)", low=0, low_open=True)


def ppo_update(
    policy: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch, beta: float,
    settings: PPOSettings, generator: torch.Generator,
) -> None:
    """One PPO update on ``batch`` (the module docstring's steps 1-4)."""
    mask = torch.ones_like(batch.sequences, dtype=torch.bool)  # every sequence has all T tokens
    with torch.no_grad():
        # 1. the penalty, frozen into the rewards
        penalty = kl_estimate(batch.old_logprobs, batch.ref_logprobs, settings.estimator)  # (B, T)
        rewards = shape_rewards(batch.scores, penalty, mask, beta=beta)  # (B, T)
        # 2. GAE from the critic of the sampling policy
        values = policy.values(batch.sequences)  # (B, T)
        advantages, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=settings.lam)
        # 3. whitened advantages
        if settings.whiten:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    # the table's critic is a running average of its returns; a network's value head is fitted in the loss
    fit_values = getattr(policy, "fit_values", None)
    if fit_values is not None:
        fit_values(batch.sequences, returns)
    # 4. epochs of minibatches
    for _ in range(settings.epochs):
        for rows in minibatches(len(batch), settings.minibatches, generator):
            mb = batch.select(rows)
            pg, _ = clipped_pg_loss(token_logprobs(policy, mb.sequences), mb.old_logprobs, advantages[rows],
                                    settings.clip)
            loss = pg.mean()
            if fit_values is None:
                vf = 0.5 * (policy.values(mb.sequences) - returns[rows]).pow(2)  # (M, T)
                loss = loss + settings.vf_coef * vf.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
