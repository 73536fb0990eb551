r"""REINFORCE leave-one-out with the KL in the reward (Ahmadian et al. 2024, "Back to basics"; Kool et al.
2019): recipe ``rloo-k1-reward`` (book section 9).

Per batch of B sequences, drawn as B / k groups of k:

1. each sequence's penalised reward :math:`R_i = s_i - \beta\sum_t k_1(\Delta_t)`, the per-token KL of the
   sampling policy summed over the sequence (TRL's ``RLOOTrainer``), held constant;
2. the advantage against the mean of the *other* :math:`k - 1` rewards of its group,
   :math:`A_i = R_i - \frac{1}{k-1}\sum_{j\ne i} R_j`, which is independent of sample :math:`i`, so the
   baseline adds no bias: the expected gradient is exactly :math:`\nabla(\mathbb{E}[s] - \beta\,
   \mathrm{KL}(\pi_\theta\|\pi_\mathrm{ref}))`, whose fixed point is :math:`\pi^*_\beta`;
3. the whole sequence is one action: the loss :math:`-A_i\log\pi_\theta(y_i)`, through the clipped
   surrogate so that ``epochs`` > 1 is PPO-style (TRL implements RLOO as PPO with one epoch and one
   minibatch, the defaults here). The KL is in :math:`R_i`, so in later epochs it is weighted like the score,
   by the ratio on the advantage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...estimators import get_estimator, kl_estimate
from ..config import check_field
from .common import Batch, clipped_pg_loss, minibatches, token_logprobs

__all__ = ["RLOOSettings", "rloo_update", "leave_one_out_advantages"]


@dataclass(frozen=True)
class RLOOSettings:
    """RLOO's own settings."""

    estimator: str = "k1"  # the per-token penalty summed into the sequence's reward
    group_size: int = 4  # k samples per group (Ahmadian et al. use 2 and 4)
    clip: float = 0.2  # epsilon of the clipped ratio, active only with epochs > 1
    epochs: int = 1
    minibatches: int = 1

    def __post_init__(self) -> None:
        get_estimator(self.estimator)
        check_field(self, "group_size", "samples per group; leave-one-out needs at least 2", low=2,
                    integer=True)
        check_field(self, "clip", "PPO's clip range epsilon (the default is 0.2)", low=0, low_open=True)
        check_field(self, "epochs", "passes over each batch (the default is 1)", low=1, integer=True)
        check_field(self, "minibatches", "minibatches per pass (the default is 1)", low=1, integer=True)


def leave_one_out_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    r""":math:`R_i - \frac{1}{k-1}\sum_{j\ne i} R_j` within each group of ``group_size`` consecutive rows,
    shape (B,).

    Examples
    --------
    >>> leave_one_out_advantages(torch.tensor([1.0, 2.0, 3.0]), 3)  # 1 - 2.5, 2 - 2, 3 - 1.5
    tensor([-1.5000,  0.0000,  1.5000])
    """
    groups = rewards.reshape(-1, group_size)  # (B / k, k)
    others = (groups.sum(-1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others).reshape(-1)


def rloo_update(
    policy: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch, beta: float,
    settings: RLOOSettings, generator: torch.Generator,
) -> None:
    """One RLOO update on ``batch`` (the module docstring's steps 1-3)."""
    with torch.no_grad():
        penalty = kl_estimate(batch.old_logprobs, batch.ref_logprobs, settings.estimator).sum(-1)  # (B,)
        adv = leave_one_out_advantages(batch.scores - beta * penalty, settings.group_size)  # 1., 2.
        adv = adv[:, None].expand_as(batch.old_logprobs)  # (B, T)
    for _ in range(settings.epochs):  # 3.
        for rows in minibatches(len(batch), settings.minibatches, generator):
            mb = batch.select(rows)
            pg, _ = clipped_pg_loss(token_logprobs(policy, mb.sequences), mb.old_logprobs, adv[rows],
                                    settings.clip)
            loss = pg.sum(-1).mean()  # sum over the tokens: -A_i log pi(y_i)
            opt.zero_grad()
            loss.backward()
            opt.step()
