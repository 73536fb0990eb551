"""The peers' per-token KL functions over the estimators' registry (shared by ``compat.trl`` and
``compat.verl``): their names, their clamps, their output dtype, their exceptions.

The output dtype is theirs: verl's ``kl_penalty`` (``verl/trainer/ppo/core_algos.py``, v0.9 and main
1dda039b9) and TRL's ``PPOTrainer._kl_penalty`` (v0.11.4) compute ``logprob - ref_logprob`` and what follows
in PyTorch's promoted dtype of the two inputs, so float64 stays float64, float32 stays float32, a half
precision pair its own dtype, and a mixed pair the wider (float32 with float64 gives float64; float16 with
bfloat16 gives float32). Here the estimate is computed in float64 if either input is float64 and in
float32 otherwise, then rounded once to that dtype."""

from __future__ import annotations

import torch

from .._validation import check_coef, check_mask, check_tensor_pair
from ..estimators import kl_estimate
from ..objective import last_valid_positions

__all__ = ["peer_dtype", "sampled_penalty", "full_penalty", "rewards_with_penalty"]


def peer_dtype(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.dtype:
    """The dtype of the peers' ``logprob - ref_logprob`` for two tensors of the same shape: PyTorch's
    promotion of the two (float32 and float64 give float64, float16 and bfloat16 give float32)."""
    return torch.promote_types(logprob.dtype, ref_logprob.dtype)


def sampled_penalty(
    logprob: torch.Tensor, ref_logprob: torch.Tensor, name: str, *, allowed: tuple[str, ...],
    library: str,
) -> torch.Tensor:
    """``name``'s estimate of each token, with verl's clamps on the k3 family, in the inputs' promoted dtype
    (:func:`peer_dtype`).

    ``allowed`` are the names the library accepts; any other raises ``NotImplementedError``, as theirs
    does. Computed by :func:`~kltutorial.estimators.kl_estimate` (in float64 if either input is float64,
    else in float32, then rounded once to the peer's dtype).
    """
    if not isinstance(name, str) or name not in allowed:
        raise NotImplementedError(
            f"{library} has no KL penalty {name!r}; its names are {', '.join(map(repr, allowed))}"
        )
    check_tensor_pair(logprob, "logprob", ref_logprob, "ref_logprob")
    k3_family = name.rstrip("+") in ("low_var_kl", "k3")
    clamps = {"clamp": 10.0, "log_ratio_clamp": 20.0} if k3_family else {}
    return kl_estimate(logprob, ref_logprob, name, **clamps).to(peer_dtype(logprob, ref_logprob))


def full_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """The exact KL(pi || pi_ref) at each position from full log-softmax tensors (..., V), shape (...), in
    the inputs' promoted dtype, as TRL's ``F.kl_div(ref_logprob, logprob, log_target=True).sum(-1)``."""
    check_tensor_pair(logprob, "logprob", ref_logprob, "ref_logprob")
    if logprob.ndim < 1:
        raise ValueError("for 'full', logprob and ref_logprob must be log-softmax tensors of shape (..., V)")
    lead, vocab = logprob.shape[:-1], logprob.shape[-1]
    kl = kl_estimate(estimator="full", policy_logits=logprob.reshape(1, -1, vocab),
                     reference_logits=ref_logprob.reshape(1, -1, vocab))
    return kl.reshape(lead).to(peer_dtype(logprob, ref_logprob))


def rewards_with_penalty(
    scores: torch.Tensor, kls: torch.Tensor, masks: torch.Tensor, kl_coef: float, *,
    mask_name: str = "masks", kl_name: str = "logprobs",
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's and OpenRLHF's reward shaping: ``-kl_coef * kl`` at every position (padding included), plus the
    score at the last position whose mask is 1. Returns (rewards, non_score_rewards). Errors name the
    caller's arguments (``mask_name``, ``kl_name``)."""
    kl_coef = check_coef(kl_coef, "kl_coef")
    if kls.ndim != 2:
        raise ValueError(f"{kl_name} must have shape (B, T), got {tuple(kls.shape)}")
    last = last_valid_positions(check_mask(masks, mask_name, kls.shape), mask_name)  # (B,)
    scores = torch.as_tensor(scores).reshape(-1)
    if scores.shape[0] != kls.shape[0]:
        raise ValueError(f"scores must hold one score per sequence ({kls.shape[0]}), got {scores.shape[0]}")
    non_score = -kl_coef * kls
    rewards = non_score.clone()
    rewards[torch.arange(kls.shape[0]), last] += scores.to(rewards.dtype)
    return rewards, non_score
