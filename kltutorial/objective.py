r"""The KL-penalised RLHF objective (book sections 5 and 8).

Two ways to put the penalty to work, both on log-probs of tokens sampled from the policy:

- :func:`shape_rewards` folds it into per-token rewards, as lm-human-preferences, TRL's PPO trainer,
  OpenRLHF and verl do: :math:`r_t = -\beta\,\mathrm{kl}_t`, with the sequence's score added at its last
  valid token. A PPO/GAE learner then sees the penalty where it was incurred.
- :func:`compute_rlhf_objective` returns ``(loss, info)``, as Spinning Up's losses do: ``loss`` is a
  differentiable surrogate whose expected gradient is exactly :math:`-\nabla J` for the sequence-level
  objective :math:`J = \mathbb{E}[r(y)] - \beta\,\mathrm{KL}(\pi\|\pi_\mathrm{ref})` (REINFORCE with the
  penalty folded into the score and a leave-one-out baseline), and ``info`` holds the numbers worth
  logging, detached: the objective's value on the batch, the KL estimate, and the full-vocabulary KL at
  each position, summed along the response.

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
from .estimators import Estimator, KLInputs, get_estimator
from .logprobs import exact_kl_unchecked, logprobs_for_tokens_unchecked

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
) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    r"""The KL-penalised objective :math:`J = \mathbb{E}[r] - \beta\,\mathrm{KL}` on a sampled batch, as
    ``(loss, info)``: a loss whose gradient is :math:`-\nabla J` in expectation, and what to log.

    1. log-probs of the response tokens under both models
       (:func:`~kltutorial.logprobs.get_logprobs_for_tokens`);
    2. per-token KL estimates with ``estimator``, summed over valid tokens
       (:func:`~kltutorial.estimators.compute_token_kl`), and the penalised reward
       :math:`r - \beta\,\widehat{\mathrm{KL}}` per sequence: the objective's value, to log;
    3. the loss, REINFORCE on the penalised score with k1 (the log-ratio) as the penalty:
       :math:`A_b = r_b - \beta \sum_t m_{b,t} \log\frac{\pi(y_{b,t})}{\pi_\mathrm{ref}(y_{b,t})}` minus the
       mean of the same quantity over the batch's *other* sequences (a leave-one-out baseline, so it
       stays unbiased; none when B = 1), and
       :math:`\mathcal{L} = -\frac1B \sum_b A_b \sum_t m_{b,t} \log \pi(y_{b,t})` with :math:`A_b` held
       constant;
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
        The response, **sampled from the policy**; any other tokens make both the loss and the estimate
        meaningless.
    rewards : Tensor, shape (B,)
        Reward-model scores.
    attention_mask : Tensor, shape (B, T)
        1 for response tokens, 0 for padding.
    beta : float
        :math:`\beta` >= 0.
    estimator : str
        The per-token KL estimator of the *logged* value, any name or alias in
        :data:`~kltutorial.estimators.ESTIMATORS` (``"full"`` uses the logits, so its ``mean_kl`` is
        ``mean_exact_kl``). The loss always uses k1 (see Notes).

    Returns
    -------
    loss : Tensor, scalar
        :math:`\mathcal{L}` of step 3, attached to the graph of ``policy_logits``; minimise it.
    info : dict
        Detached numbers to log: ``objective`` (the batch mean of :math:`r - \beta\,\widehat{\mathrm{KL}}`,
        the value of :math:`J`), ``mean_reward``, ``mean_kl`` (the estimate, per sequence),
        ``mean_exact_kl`` (:math:`\sum_t \mathrm{KL}_t` of step 4, per sequence), ``kl_penalty``
        (:math:`\beta` times ``mean_kl``) as floats, and ``per_token_kl`` (B, T), detached.

    Notes
    -----
    **Why the loss is not the objective's value.** The tokens were sampled from :math:`\pi` and autograd
    does not see the sampling, so the gradient of the batch mean of :math:`r - \beta\,\widehat{\mathrm{KL}}`
    is not :math:`\nabla J`: the reward term has no gradient at all; with ``k1`` the KL term's expected
    gradient is zero, since :math:`\mathbb{E}_{y\sim\pi}[\nabla \log \pi(y)] = 0`; with ``k3`` it is the
    gradient of the forward :math:`\mathrm{KL}(\pi_{\mathrm{ref}} \| \pi)`. The handbook's
    ``compute_rlhf_objective`` returned that value as ``objective`` for the trainer to differentiate;
    here it is only logged.

    **Why the loss uses k1 whatever** ``estimator``. The policy-gradient theorem gives
    :math:`\nabla J = \mathbb{E}_{y\sim\pi}\big[(r(y) - \beta \log\frac{\pi(y)}{\pi_\mathrm{ref}(y)})
    \nabla\log\pi(y)\big]` (the term :math:`-\beta\,\mathbb{E}[\nabla\log\pi(y)]` vanishes), and the log-ratio
    of the sequence is the sum of the tokens' k1. Folding k3 (or k2) into the score instead would follow
    another gradient (book section 9). A baseline that does not depend on :math:`y_b` leaves the expected
    gradient unchanged; the leave-one-out mean is the one RLOO uses. ``tests/test_objective.py`` checks
    both statements exactly, by enumerating every batch of a small space.

    **How this differs from the libraries.** TRL, OpenRLHF and verl fold the penalty into per-token rewards
    (:func:`shape_rewards`) for a PPO learner, or add a KL term to a GRPO loss; this function is the
    sequence-level REINFORCE form of the same objective, small enough to read in one listing.
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
    policy_logprobs = logprobs_for_tokens_unchecked(policy_logits, tokens)  # (B, T)
    reference_logprobs = logprobs_for_tokens_unchecked(reference_logits, tokens)  # (B, T)
    zeros = torch.zeros_like(policy_logprobs)
    # 2. the logged value: per-token estimate, masked, summed per sequence; r - β KL per sequence
    inputs = KLInputs(
        spec, None, None, policy_logprobs, reference_logprobs,
        policy_logits, reference_logits,
    )
    # detached, so no mask is needed to keep padding out of a backward; torch.where zeroes it
    per_token_kl = torch.where(mask, inputs.estimate(), zeros).detach()  # (B, T)
    sequence_kl = per_token_kl.sum(dim=-1)  # (B,)
    penalized = rewards.to(sequence_kl.dtype) - beta * sequence_kl  # (B,)
    # 3. the loss: REINFORCE on r - β log(π/π_ref), leave-one-out baseline
    sequence_logprob = torch.where(mask, policy_logprobs, zeros).sum(dim=-1)  # (B,) log π(y)
    log_ratio = torch.where(mask, policy_logprobs - reference_logprobs, zeros).sum(dim=-1)
    score = (rewards.to(log_ratio.dtype) - beta * log_ratio).detach()  # (B,)
    n = score.shape[0]
    baseline = (score.sum() - score) / (n - 1) if n > 1 else torch.zeros_like(score)
    loss = -((score - baseline) * sequence_logprob).mean()
    # 4. sum_t KL_t, each over the whole vocabulary, beside the estimate
    per_position = exact_kl_unchecked(
        policy_logits.detach(), reference_logits.detach(), mask
    )  # (B, T)
    info = {
        "objective": penalized.mean().item(),
        "mean_reward": rewards.mean().item(),
        "mean_kl": sequence_kl.mean().item(),
        "mean_exact_kl": per_position.sum(dim=-1).mean().item(),
        "kl_penalty": beta * sequence_kl.mean().item(),
        "per_token_kl": per_token_kl,
    }
    return loss, info
