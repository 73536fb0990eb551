"""The KL-penalised RLHF objective (book sections 5 and 8).

Two ways to put the penalty to work, both on log-probs of tokens sampled from the policy:

- :func:`shape_rewards` folds it into per-token rewards, as lm-human-preferences, TRL's PPO trainer and
  OpenRLHF do: :math:`r_t = -\\beta\\,\\mathrm{kl}_t`, with the sequence's score added at its last valid
  token. A PPO/GAE learner then sees the penalty where it was incurred.
- :func:`compute_rlhf_objective` computes the sequence-level objective
  :math:`\\mathbb{E}[r(y)] - \\beta\\,\\mathrm{KL}` and the diagnostics worth logging, with the exact KL
  over the whole vocabulary next to the sampled estimate.
"""

from __future__ import annotations

import torch

from ._validation import check_coef, check_float_tensor, check_mask, check_same_shape
from .estimators import Estimator, compute_token_kl
from .logprobs import exact_kl, get_logprobs_for_tokens

__all__ = ["shape_rewards", "compute_rlhf_objective"]


def _check_scores(scores: object, name: str, batch: int) -> torch.Tensor:
    check_float_tensor(scores, name, ndim=1)
    if scores.shape[0] != batch:
        raise ValueError(
            f"{name} must have shape ({batch},), one score per sequence, got {tuple(scores.shape)}"
        )
    return scores


def shape_rewards(
    scores: torch.Tensor,
    per_token_kl: torch.Tensor,
    attention_mask: torch.Tensor,
    kl_coef: float,
) -> torch.Tensor:
    r"""Per-token rewards: the KL penalty at every token, the score at the last valid token.

    .. math::  r_t = -\beta\, \mathrm{kl}_t\, m_t + s \cdot [t = t_{\mathrm{last}}]

    where :math:`t_{\mathrm{last}}` is the last position with :math:`m_t = 1`. Summed over a sequence
    this is :math:`s - \beta \sum_t \mathrm{kl}_t`, the sequence-level penalised reward.

    Parameters
    ----------
    scores : Tensor, shape (B,)
        One reward-model score per sequence.
    per_token_kl : Tensor, shape (B, T)
        Per-token KL estimates (e.g. from :func:`~kltutorial.compute_token_kl`).
    attention_mask : Tensor, shape (B, T)
        1 for response tokens, 0 for padding. Padding may sit anywhere (left or right); every sequence
        needs at least one valid token to receive its score.
    kl_coef : float
        :math:`\beta` >= 0.

    Returns
    -------
    Tensor, shape (B, T)
        Per-token rewards; exactly 0 at padding.

    Examples
    --------
    >>> shape_rewards(torch.tensor([1.0]), torch.tensor([[0.5, 0.5, 9.0]]),
    ...               torch.tensor([[1, 1, 0]]), kl_coef=0.1)
    tensor([[-0.0500,  0.9500,  0.0000]])
    """
    check_float_tensor(per_token_kl, "per_token_kl", ndim=2)
    batch = per_token_kl.shape[0]
    _check_scores(scores, "scores", batch)
    mask = check_mask(attention_mask, "attention_mask", per_token_kl.shape)
    beta = check_coef(kl_coef, "kl_coef")
    if not mask.any(dim=-1).all():
        empty = torch.nonzero(~mask.any(dim=-1)).flatten().tolist()
        raise ValueError(
            f"attention_mask has no valid token in sequence(s) {empty}; each needs one for its score"
        )
    zeros = torch.zeros_like(per_token_kl)
    rewards = torch.where(mask, -beta * per_token_kl, zeros)
    # Index of the last valid token: the largest position whose mask is 1.
    positions = torch.arange(per_token_kl.shape[1], device=per_token_kl.device)
    last = torch.where(mask, positions, -1).amax(dim=-1)  # (B,)
    rewards[torch.arange(batch), last] += scores.to(rewards.dtype)
    return rewards


def compute_rlhf_objective(
    policy_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    response_tokens: torch.Tensor,
    rewards: torch.Tensor,
    attention_mask: torch.Tensor,
    kl_coef: float,
    estimator: Estimator = "k1",
) -> dict[str, torch.Tensor | float]:
    r"""The KL-penalised objective :math:`\mathbb{E}[r] - \beta\,\mathrm{KL}` with its diagnostics.

    1. log-probs of the response tokens under both models (:func:`get_logprobs_for_tokens`);
    2. per-token KL estimates, summed over valid tokens (:func:`compute_token_kl`);
    3. the penalised reward :math:`r - \beta\,\widehat{\mathrm{KL}}` per sequence, and its mean;
    4. the exact KL over the vocabulary at each position, summed likewise (:func:`exact_kl`), which
       the estimate should match on average when ``response_tokens`` were sampled from the policy.

    Parameters
    ----------
    policy_logits, reference_logits : Tensor, shape (B, T, V)
        Next-token logits of the policy and the reference at each response position.
    response_tokens : Tensor, shape (B, T), integer
        The response, **sampled from the policy**; any other tokens make the estimate meaningless.
    rewards : Tensor, shape (B,)
        Reward-model scores.
    attention_mask : Tensor, shape (B, T)
        1 for response tokens, 0 for padding.
    kl_coef : float
        :math:`\beta` >= 0.
    estimator : {"k1", "k2", "k3", "abs"}
        The per-token KL estimator.

    Returns
    -------
    dict
        ``objective`` (scalar tensor, differentiable in ``policy_logits``), ``mean_reward``,
        ``mean_kl`` (the estimate, per sequence), ``mean_exact_kl``, ``mean_penalized_reward``,
        ``kl_penalty`` (:math:`\beta` times ``mean_kl``) as floats, and ``per_token_kl`` (B, T).
    """
    if isinstance(policy_logits, torch.Tensor) and isinstance(reference_logits, torch.Tensor):
        check_same_shape(policy_logits, "policy_logits", reference_logits, "reference_logits")
    policy_logprobs = get_logprobs_for_tokens(policy_logits, response_tokens)
    reference_logprobs = get_logprobs_for_tokens(reference_logits, response_tokens)
    batch = policy_logprobs.shape[0]
    _check_scores(rewards, "rewards", batch)
    check_mask(attention_mask, "attention_mask", policy_logprobs.shape)
    beta = check_coef(kl_coef, "kl_coef")

    per_token_kl, sequence_kl = compute_token_kl(
        policy_logprobs, reference_logprobs, attention_mask, estimator=estimator, reduction="sum"
    )
    penalized = rewards.to(sequence_kl.dtype) - beta * sequence_kl  # r - β KL per sequence
    exact = exact_kl(policy_logits, reference_logits, attention_mask).sum(dim=-1)
    return {
        "objective": penalized.mean(),
        "mean_reward": rewards.mean().item(),
        "mean_kl": sequence_kl.mean().item(),
        "mean_exact_kl": exact.mean().item(),
        "mean_penalized_reward": penalized.mean().item(),
        "kl_penalty": beta * sequence_kl.mean().item(),
        "per_token_kl": per_token_kl,
    }
