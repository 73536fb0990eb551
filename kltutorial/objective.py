r"""The KL-penalised RLHF objective (book sections 5 and 8).

Two ways to put the penalty to work, both on log-probs of tokens sampled from the policy:

- :func:`shape_rewards` folds it into per-token rewards, as lm-human-preferences, TRL's PPO trainer,
  OpenRLHF and verl do: :math:`r_t = -\beta\,\mathrm{kl}_t`, with the sequence's score added at its last
  valid token. A PPO/GAE learner then sees the penalty where it was incurred.
- :func:`compute_rlhf_objective` computes the value of the sequence-level objective
  :math:`\mathbb{E}[r(y)] - \beta\,\mathrm{KL}` on a sampled batch and the diagnostics worth logging,
  with the full-vocabulary KL at each position, summed along the response, next to the sampled estimate.
  It is a value to log, not a loss: its autograd gradient is not the objective's (see its Notes).

The KL coefficient is ``beta`` here, the book's :math:`\beta` (the libraries' ``kl_coef``; their
signatures are in :mod:`kltutorial.compat`).

.. rubric:: How the libraries' reward shaping differs

- **Padding.** TRL up to v0.11 (``PPOTrainer.compute_rewards``) and OpenRLHF (``compute_reward`` in
  ``openrlhf/models/utils.py``) compute :math:`-\beta\,\mathrm{kl}_t` at every position and leave it at
  the padded ones: mask the result yourself, or the padding's log-ratio leaks into the returns. verl's
  ``apply_kl_penalty`` multiplies the KL by the response mask first, so padding gets 0, as here; here
  ``torch.where`` is used, so an infinite estimate at a padded position still gives exactly 0 (a product
  would give NaN). TRL's later ``PPOTrainer`` sets both models' log-probs at padding to the same constant,
  which makes their k1 and k3 there 0.
- **Where the score goes.** TRL (v0.11) adds it at the last position whose mask is 1, and OpenRLHF at the
  last position whose action mask is 1, as here; lm-human-preferences adds it at the last position of the
  fixed-length response; verl receives token-level scores already placed by its reward manager.
- **Precision.** TRL's ``selective_log_softmax`` and OpenRLHF's ``log_probs_from_logits`` return
  log-probs in the logits' dtype (bfloat16 for a bfloat16 model); TRL's and verl's KL functions then
  compute in whatever dtype the log-probs have, while OpenRLHF's ``compute_approx_kl`` casts them to
  float32. Here :func:`~kltutorial.logprobs.get_logprobs_for_tokens` returns float32 for half-precision
  logits and the estimators compute in float32.
"""

from __future__ import annotations

import torch

from ._validation import (
    check_coef,
    check_float_tensor,
    check_logits,
    check_mask,
    check_same_shape,
    check_scores,
    check_token_ids,
)
from .estimators import Estimator, _estimate, _KLInputs, get_estimator
from .logprobs import _exact_kl_trusted, _token_logprobs_trusted

__all__ = ["shape_rewards", "compute_rlhf_objective", "last_valid_positions"]


def last_valid_positions(mask: torch.Tensor, name: str = "attention_mask") -> torch.Tensor:
    """The last position whose (boolean, (B, T)) ``mask`` is true in each sequence, shape (B,): where a
    sequence's score goes. A sequence with no valid position raises ``ValueError`` naming ``name``.

    Examples
    --------
    >>> last_valid_positions(torch.tensor([[True, True, False], [False, True, True]]))
    tensor([1, 2])
    """
    if not mask.any(dim=-1).all():
        empty = torch.nonzero(~mask.any(dim=-1)).flatten().tolist()
        raise ValueError(f"{name} has no valid token in sequence(s) {empty}; each needs one for its score")
    positions = torch.arange(mask.shape[-1], device=mask.device)
    return torch.where(mask, positions, -1).amax(dim=-1)


def shape_rewards(
    scores: torch.Tensor,
    per_token_kl: torch.Tensor,
    attention_mask: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    r"""Per-token rewards: the KL penalty at every token, the score at the last valid token.

    .. math::  r_t = -\beta\, \mathrm{kl}_t\, m_t + s \cdot [t = t_{\mathrm{last}}]

    where :math:`t_{\mathrm{last}}` is the last position with :math:`m_t = 1`. Summed over a sequence
    this is :math:`s - \beta \sum_t \mathrm{kl}_t`, the sequence-level penalised reward. Unlike TRL's
    and OpenRLHF's ``compute_reward(s)``, padded positions get exactly 0 (see the module docstring).

    Parameters
    ----------
    scores : Tensor, shape (B,)
        One reward-model score per sequence.
    per_token_kl : Tensor, shape (B, T)
        Per-token KL estimates (e.g. from :func:`~kltutorial.estimators.compute_token_kl`).
    attention_mask : Tensor, shape (B, T)
        1 for response tokens, 0 for padding. Padding may sit anywhere (left or right); every sequence
        needs at least one valid token to receive its score.
    beta : float
        :math:`\beta` >= 0.

    Returns
    -------
    Tensor, shape (B, T)
        Per-token rewards; exactly 0 at padding.

    Examples
    --------
    >>> shape_rewards(torch.tensor([1.0]), torch.tensor([[0.5, 0.5, 9.0]]),
    ...               torch.tensor([[1, 1, 0]]), beta=0.1)
    tensor([[-0.0500,  0.9500,  0.0000]])
    """
    check_float_tensor(per_token_kl, "per_token_kl", ndim=2)
    batch = per_token_kl.shape[0]
    check_scores(scores, "scores", batch)
    mask = check_mask(attention_mask, "attention_mask", per_token_kl.shape)
    beta = check_coef(beta, "beta")
    last = last_valid_positions(mask)  # (B,)
    rewards = torch.where(mask, -beta * per_token_kl, torch.zeros_like(per_token_kl))
    rewards[torch.arange(batch), last] += scores.to(rewards.dtype)
    return rewards


def compute_rlhf_objective(
    policy_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    response_tokens: torch.Tensor,
    rewards: torch.Tensor,
    attention_mask: torch.Tensor,
    beta: float,
    estimator: Estimator = "k1",
) -> dict[str, torch.Tensor | float]:
    r"""The value of the KL-penalised objective :math:`\mathbb{E}[r] - \beta\,\mathrm{KL}` on a batch,
    with its diagnostics: numbers to log, not a loss (see Notes).

    1. log-probs of the response tokens under both models
       (:func:`~kltutorial.logprobs.get_logprobs_for_tokens`);
    2. per-token KL estimates, summed over valid tokens (:func:`~kltutorial.estimators.compute_token_kl`);
    3. the penalised reward :math:`r - \beta\,\widehat{\mathrm{KL}}` per sequence, and its mean;
    4. :math:`\sum_t \mathrm{KL}_t`, the KL over the whole vocabulary at each valid position
       (:func:`~kltutorial.logprobs.exact_kl`), summed along the response. Each term is exact, but the
       positions are those of the sampled prefix, so the sum is itself an estimate of the sequence KL:
       unbiased when ``response_tokens`` were sampled from the policy (the chain rule of KL), and
       typically of much lower variance than the sampled one (it averages each position over the whole
       vocabulary). It equals the sequence KL only when the logits do not depend on the prefix.

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
    beta : float
        :math:`\beta` >= 0.
    estimator : str
        The per-token KL estimator, any name or alias in :data:`~kltutorial.estimators.ESTIMATORS`
        (``"full"`` uses the logits, so its ``mean_kl`` is ``mean_exact_kl``).

    Returns
    -------
    dict
        ``objective``: the batch mean of :math:`r - \beta\,\widehat{\mathrm{KL}}` as a scalar tensor,
        still attached to the graph of ``policy_logits`` through the KL estimate, but **not a loss**
        (see Notes); ``mean_reward``, ``mean_kl`` (the estimate, per sequence), ``mean_exact_kl``
        (:math:`\sum_t \mathrm{KL}_t` of step 4, per sequence), ``mean_penalized_reward`` (the value of
        ``objective``), ``kl_penalty`` (:math:`\beta` times ``mean_kl``) as floats, and
        ``per_token_kl`` (B, T).

    Notes
    -----
    **What the value is for.** ``objective`` estimates
    :math:`J(\pi) = \mathbb{E}_{y\sim\pi}[r(y)] - \beta\,\mathrm{KL}(\pi \| \pi_{\mathrm{ref}})` on
    the batch: log it and watch its trend. Its level sets no direction of training (a policy-gradient
    step uses advantages, from which a baseline removes any constant).

    **Why it is not a loss.** The tokens were sampled from :math:`\pi` and autograd does not see the
    sampling, so the expected gradient of ``objective`` over :math:`y \sim \pi` is not
    :math:`\nabla J`:

    - the reward term has no gradient at all (``rewards`` are constants);
    - with ``k1`` the KL term's expected gradient is zero, since
      :math:`\mathbb{E}_{y\sim\pi}[\nabla \log \pi(y)] = 0`;
    - with ``k3`` it is the gradient of the forward :math:`\mathrm{KL}(\pi_{\mathrm{ref}} \| \pi)`, not of
      the penalised :math:`\mathrm{KL}(\pi \| \pi_{\mathrm{ref}})`.

    The gradient of :math:`J` takes a policy-gradient term for the reward,
    :math:`\mathbb{E}_{y\sim\pi}[r(y)\,\nabla \log \pi(y)]` (REINFORCE, PPO), and for the KL either
    the same treatment (the penalty folded into the reward, :func:`shape_rewards`) or a loss estimator
    whose expected gradient is :math:`\nabla \mathrm{KL}(\pi \| \pi_{\mathrm{ref}})`: ``k2``, or the
    straight-through ``k3+`` (the value of k3, the gradient of k2). Book sections 4 (estimators: value
    and gradient) and 9 (KL in the reward or in the loss) derive both; ``tests/test_objective.py``
    checks each statement above exactly, by enumeration.
    """
    # 0. check every input once; the helpers below trust them
    check_logits(policy_logits, "policy_logits")
    check_logits(reference_logits, "reference_logits")
    check_same_shape(
        policy_logits, "policy_logits", reference_logits, "reference_logits"
    )
    shape, vocab = policy_logits.shape[:-1], policy_logits.shape[-1]  # (B, T), V
    tokens = check_token_ids(response_tokens, "response_tokens", shape, vocab)
    check_scores(rewards, "rewards", shape[0])
    mask = check_mask(attention_mask, "attention_mask", shape)
    beta = check_coef(beta, "beta")
    spec = get_estimator(estimator)

    # 1. log-probs of the sampled tokens (NaN/+inf logits are caught here, row by row)
    policy_logprobs = _token_logprobs_trusted(policy_logits, tokens)  # (B, T)
    reference_logprobs = _token_logprobs_trusted(reference_logits, tokens)  # (B, T)
    # 2. per-token estimate, masked, summed per sequence
    inputs = _KLInputs(
        spec, None, None, policy_logprobs, reference_logprobs,
        policy_logits, reference_logits,
    )
    per_token_kl = _estimate(inputs, mask)
    zeros = torch.zeros_like(per_token_kl)
    per_token_kl = torch.where(mask, per_token_kl, zeros)  # (B, T)
    sequence_kl = per_token_kl.sum(dim=-1)  # (B,)
    # 3. r - β KL per sequence
    penalized = rewards.to(sequence_kl.dtype) - beta * sequence_kl
    # 4. sum_t KL_t, each over the whole vocabulary, beside the estimate
    per_position = _exact_kl_trusted(
        policy_logits.detach(), reference_logits.detach(), mask
    )  # (B, T)
    exact = per_position.sum(dim=-1)  # (B,)
    return {
        "objective": penalized.mean(),
        "mean_reward": rewards.mean().item(),
        "mean_kl": sequence_kl.mean().item(),
        "mean_exact_kl": exact.mean().item(),
        "mean_penalized_reward": penalized.mean().item(),
        "kl_penalty": beta * sequence_kl.mean().item(),
        "per_token_kl": per_token_kl,
    }
