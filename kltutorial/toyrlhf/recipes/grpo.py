r"""GRPO and Dr. GRPO with the KL penalty in the loss (book section 9): recipes ``grpo-k3-loss``,
``dr-grpo-k3-loss``, ``dr-grpo-k2-loss``, ``dr-grpo-k3plus-loss`` and ``dr-grpo-k1-loss``.

Per batch of B sequences, drawn as B / G groups of G (Shao et al. 2024, DeepSeekMath, eq. 3 and section 4.1.2;
Liu et al. 2025, "Understanding R1-Zero-like training", section 3.1):

1. the advantage of sequence :math:`i` of a group, on every one of its tokens: :math:`A_i = s_i - \mu_G`
   (Dr. GRPO), or :math:`(s_i - \mu_G)/(\mathrm{std}(s) + \varepsilon)` (GRPO; the group's standard
   deviation with Bessel's correction, as ``torch.std`` and TRL compute it, :math:`\varepsilon = 10^{-4}`);
2. ``epochs`` passes of ``minibatches`` minibatches, each one Adam step on the per-token loss

   .. math::  \ell_t = \max\big(-A\rho_t, -A\,\mathrm{clip}(\rho_t, 1-\epsilon, 1+\epsilon)\big)
              + \beta\,w_t\,k\big(\log\pi_\theta(y_t\mid y_{<t}) - \log\pi_\mathrm{ref}(y_t\mid y_{<t})\big),

   averaged over the tokens (every sequence has T tokens, so GRPO's per-sequence mean and Dr. GRPO's sum over
   a constant length differ only by a constant factor), with :math:`k` from the estimators' registry,
   evaluated at the *current* policy and differentiated by autograd.

**The KL's importance weight** :math:`w_t` in later epochs, where the samples came from
:math:`\pi_{\theta_\mathrm{old}}` but the penalty is evaluated at :math:`\pi_\theta`. TRL's
``GRPOTrainer`` by default, verl (``use_kl_loss``) and OpenRLHF (``--algo.kl.use_loss``) add the per-token KL
with no weight (:math:`w_t = 1`, ``kl_weight="none"``, the default here): after the first minibatch step of a
batch, the penalty's gradient is taken on samples of the old policy as if they were the current one's.
``kl_weight="ratio"`` multiplies it by the ratio :math:`\rho_t`, not detached and not clipped, as TRL's
``use_bias_correction_kl=True`` does (from v0.26). That is more than a correction for later epochs: even
at :math:`\rho_t = 1` the ratio's own gradient adds :math:`k\,\nabla\log\pi_\theta`, so the term's
expected gradient becomes that of :math:`\mathbb{E}_{\pi_\theta}[k]`, for k3 the per-token *reverse* KL's
instead of the forward KL's, and a k3 recipe with ``kl_weight="ratio"`` stops at the reverse per-token fixed
point (that of ``dr-grpo-k2-loss``), not at its registered one.

Where the run ends (:mod:`kltutorial.exact.fixed_points`): k2, k1+ and k3+ follow the per-token reverse
KL, k3 the per-token forward KL, k1 nothing (its expected gradient is 0). A group mean that includes the
sample scales the score's expected gradient by :math:`(G-1)/G`; GRPO's division by the group's std scales it
by about :math:`1/\sigma_\pi`, the policy's own score std.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..._validation import check_choice
from ...estimators import get_estimator, kl_estimate
from ..config import check_field
from .common import Batch, clipped_pg_loss, minibatches, token_logprobs

__all__ = ["GRPOSettings", "grpo_loss", "grpo_update", "group_advantages"]

KL_WEIGHTS: tuple[str, ...] = ("none", "ratio")


@dataclass(frozen=True)
class GRPOSettings:
    """GRPO's own settings (group size, std scaling, the loss's estimator, clipping, epochs)."""

    estimator: str = "k3"  # the per-token penalty in the loss (GRPO's k3; k2, k3+, k1 for the variants)
    scale_by_std: bool = True  # GRPO divides by the group's std; Dr. GRPO does not
    group_size: int = 16  # G samples per group (TRL's num_generations defaults to 8)
    clip: float = 0.2  # epsilon of the clipped ratio (TRL, verl)
    epochs: int = 1  # passes over each batch (TRL's num_iterations, verl's ppo_epochs: 1)
    minibatches: int = 1  # minibatches per pass
    kl_weight: str = "none"  # "none" (TRL, verl) or "ratio": the KL term's importance weight
    eps: float = 1e-4  # added to the group's std (TRL)

    def __post_init__(self) -> None:
        get_estimator(self.estimator)  # raises for an unknown name, listing the registered ones
        check_field(self, "group_size", "samples per group; a baseline needs at least 2", low=2, integer=True)
        check_field(self, "clip", "PPO's clip range epsilon (the default is 0.2)", low=0, low_open=True)
        check_field(self, "epochs", "passes over each batch (the default is 1)", low=1, integer=True)
        check_field(self, "minibatches", "minibatches per pass (the default is 1)", low=1, integer=True)
        check_field(self, "eps", "added to the group's std (the default is 1e-4)", low=0)
        check_choice(self.kl_weight, "kl_weight", KL_WEIGHTS)


def group_advantages(scores: torch.Tensor, group_size: int, scale_by_std: bool, eps: float) -> torch.Tensor:
    r"""Each sequence's advantage against its group, shape (B,): :math:`s_i - \mu_G`, divided by
    :math:`\mathrm{std}(s) + \varepsilon` when ``scale_by_std``; consecutive rows form the groups.

    Examples
    --------
    >>> group_advantages(torch.tensor([1.0, 3.0, 0.0, 0.0]), 2, scale_by_std=False, eps=0.0)
    tensor([-1.,  1.,  0.,  0.])
    """
    groups = scores.reshape(-1, group_size)  # (B / G, G)
    adv = groups - groups.mean(-1, keepdim=True)
    if scale_by_std:
        adv = adv / (groups.std(-1, keepdim=True) + eps)
    return adv.reshape(-1)


def grpo_loss(
    logprobs: torch.Tensor, batch: Batch, advantages: torch.Tensor, beta: float, settings: GRPOSettings
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""GRPO's loss on a (mini)batch: the clipped surrogate plus :math:`\beta\,w_t\,k(\Delta_t)`, averaged
    over the tokens (the module docstring's step 2).

    Parameters
    ----------
    logprobs : Tensor, shape (M, T)
        :math:`\log\pi_\theta(y_t\mid y_{<t})` of ``batch``'s tokens under the current policy, differentiable.
    batch : Batch
        The minibatch (its sampling policy's and the reference's log-probs).
    advantages : Tensor, shape (M, T)
    beta : float
    settings : GRPOSettings

    Returns
    -------
    loss : Tensor, shape ()
    info : dict
        ``"pg"`` and ``"penalty"``, the two per-token terms (M, T), the penalty with its weight.
    """
    pg, ratio = clipped_pg_loss(logprobs, batch.old_logprobs, advantages, settings.clip)
    penalty = kl_estimate(logprobs, batch.ref_logprobs, settings.estimator)  # (M, T), at pi_theta
    if settings.kl_weight == "ratio":
        penalty = ratio * penalty
    return (pg + beta * penalty).mean(), {"pg": pg, "penalty": penalty}


def grpo_update(
    policy: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch, beta: float,
    settings: GRPOSettings, generator: torch.Generator,
) -> None:
    """One GRPO update on ``batch`` (the module docstring's steps 1-2)."""
    with torch.no_grad():  # 1.
        adv = group_advantages(batch.scores, settings.group_size, settings.scale_by_std, settings.eps)
        adv = adv[:, None].expand_as(batch.old_logprobs)  # (B, T): the sequence's advantage on each token
    for _ in range(settings.epochs):  # 2.
        for rows in minibatches(len(batch), settings.minibatches, generator):
            mb = batch.select(rows)
            loss, _ = grpo_loss(token_logprobs(policy, mb.sequences), mb, adv[rows], beta, settings)
            opt.zero_grad()
            loss.backward()
            opt.step()
