"""Every public function and constructor rejects bad input with a message naming the argument."""

from __future__ import annotations

import math

import pytest
import torch

import kltutorial as kt

B, T, V = 2, 3, 5
LOGITS = torch.zeros(B, T, V)
TOKENS = torch.zeros(B, T, dtype=torch.long)
LP = torch.full((B, T), -1.0)
MASK = torch.ones(B, T)
SCORES = torch.zeros(B)
NAN_LOGITS = LOGITS.clone()
NAN_LOGITS[0, 0, 0] = math.nan
NAN_LP = LP.clone()
NAN_LP[1, 2] = math.nan


def _objective(**override):
    args = dict(
        policy_logits=LOGITS, reference_logits=LOGITS, response_tokens=TOKENS, rewards=SCORES,
        attention_mask=MASK, kl_coef=0.1,
    )
    args.update(override)
    return lambda: kt.compute_rlhf_objective(**args)


CASES = [
    # (id, call, exception, words the message must contain)
    # get_logprobs_for_tokens
    ("lp-tokens-shape", lambda: kt.get_logprobs_for_tokens(LOGITS, TOKENS[:, :2]), ValueError, "tokens"),
    ("lp-token-high", lambda: kt.get_logprobs_for_tokens(LOGITS, TOKENS + V), ValueError, "tokens"),
    ("lp-token-negative", lambda: kt.get_logprobs_for_tokens(LOGITS, TOKENS - 1), ValueError, "tokens"),
    ("lp-token-float", lambda: kt.get_logprobs_for_tokens(LOGITS, TOKENS.float()), TypeError, "tokens"),
    ("lp-logits-nan", lambda: kt.get_logprobs_for_tokens(NAN_LOGITS, TOKENS), ValueError, "NaN"),
    ("lp-logits-int", lambda: kt.get_logprobs_for_tokens(LOGITS.long(), TOKENS), TypeError, "logits"),
    ("lp-logits-rank", lambda: kt.get_logprobs_for_tokens(LOGITS[0], TOKENS[0]), ValueError, "logits"),
    ("lp-not-tensor", lambda: kt.get_logprobs_for_tokens(LOGITS.numpy(), TOKENS), TypeError, "logits"),
    ("lp-empty", lambda: kt.get_logprobs_for_tokens(LOGITS[:0], TOKENS[:0]), ValueError, "empty"),
    # exact_kl
    ("ekl-shape", lambda: kt.exact_kl(LOGITS, LOGITS[:, :, :4]), ValueError, "reference_logits"),
    ("ekl-mask-shape", lambda: kt.exact_kl(LOGITS, LOGITS, MASK[:, :2]), ValueError, "attention_mask"),
    ("ekl-mask-values", lambda: kt.exact_kl(LOGITS, LOGITS, MASK * 2), ValueError, "attention_mask"),
    ("ekl-nan", lambda: kt.exact_kl(LOGITS, NAN_LOGITS), ValueError, "NaN"),
    ("ekl-empty", lambda: kt.exact_kl(LOGITS[:0], LOGITS[:0]), ValueError, "empty"),
    # kl_estimate / compute_token_kl
    ("est-unknown", lambda: kt.kl_estimate(LP, LP, "k4"), ValueError, "estimator"),
    ("est-shape", lambda: kt.kl_estimate(LP, LP[:, :2]), ValueError, "reference_logprobs"),
    ("est-nan", lambda: kt.kl_estimate(NAN_LP, LP), ValueError, "NaN"),
    ("est-int", lambda: kt.kl_estimate(LP.long(), LP), TypeError, "policy_logprobs"),
    ("est-empty", lambda: kt.kl_estimate(LP[:0], LP[:0]), ValueError, "empty"),
    ("tok-mask-shape", lambda: kt.compute_token_kl(LP, LP, MASK[:1]), ValueError, "attention_mask"),
    ("tok-mask-values", lambda: kt.compute_token_kl(LP, LP, MASK * 0.5), ValueError, "attention_mask"),
    ("tok-mask-type", lambda: kt.compute_token_kl(LP, LP, [[1, 1, 1]] * 2), TypeError, "attention_mask"),
    ("tok-reduction", lambda: kt.compute_token_kl(LP, LP, MASK, reduction="max"), ValueError, "reduction"),
    ("tok-rank", lambda: kt.compute_token_kl(LP[0], LP[0]), ValueError, "(B, T)"),
    ("tok-nan", lambda: kt.compute_token_kl(LP, NAN_LP), ValueError, "NaN"),
    # shape_rewards
    ("sr-scores-shape", lambda: kt.shape_rewards(SCORES[:1], LP, MASK, 0.1), ValueError, "scores"),
    ("sr-scores-nan", lambda: kt.shape_rewards(torch.tensor([0.0, math.nan]), LP, MASK, 0.1), ValueError, "NaN"),
    ("sr-beta-negative", lambda: kt.shape_rewards(SCORES, LP, MASK, -0.1), ValueError, "kl_coef"),
    ("sr-beta-inf", lambda: kt.shape_rewards(SCORES, LP, MASK, math.inf), ValueError, "kl_coef"),
    ("sr-beta-nan", lambda: kt.shape_rewards(SCORES, LP, MASK, math.nan), ValueError, "kl_coef"),
    ("sr-beta-str", lambda: kt.shape_rewards(SCORES, LP, MASK, "0.1"), TypeError, "kl_coef"),
    ("sr-mask-shape", lambda: kt.shape_rewards(SCORES, LP, MASK[:, :1], 0.1), ValueError, "attention_mask"),
    ("sr-empty-row", lambda: kt.shape_rewards(SCORES, LP, MASK * torch.tensor([[1.0], [0.0]]), 0.1),
     ValueError, "attention_mask"),
    # compute_rlhf_objective
    ("obj-logit-shapes", _objective(reference_logits=torch.zeros(B, T, V + 1)), ValueError, "reference_logits"),
    ("obj-tokens", _objective(response_tokens=TOKENS[:, :1]), ValueError, "tokens"),
    ("obj-rewards-shape", _objective(rewards=torch.zeros(B + 1)), ValueError, "rewards"),
    ("obj-rewards-nan", _objective(rewards=torch.tensor([0.0, math.nan])), ValueError, "NaN"),
    ("obj-mask", _objective(attention_mask=MASK * 3), ValueError, "attention_mask"),
    ("obj-beta", _objective(kl_coef=-1.0), ValueError, "kl_coef"),
    ("obj-estimator", _objective(estimator="kl"), ValueError, "estimator"),
    # controllers
    ("fixed-negative", lambda: kt.FixedKLController(-0.1), ValueError, "kl_coef"),
    ("fixed-nan", lambda: kt.FixedKLController(math.nan), ValueError, "kl_coef"),
    ("adaptive-target", lambda: kt.AdaptiveKLController(0.1, 0.0, 100), ValueError, "target"),
    ("adaptive-horizon", lambda: kt.AdaptiveKLController(0.1, 6.0, -5), ValueError, "horizon"),
    ("adaptive-init", lambda: kt.AdaptiveKLController(0.0, 6.0, 100), ValueError, "init_kl_coef"),
    ("adaptive-init-inf", lambda: kt.AdaptiveKLController(math.inf, 6.0, 100), ValueError, "init_kl_coef"),
    ("doubling-target", lambda: kt.DoublingKLController(target_kl=-6.0), ValueError, "target_kl"),
    ("doubling-factor", lambda: kt.DoublingKLController(factor=1.0), ValueError, "factor"),
    ("doubling-band", lambda: kt.DoublingKLController(band=0.5), ValueError, "band"),
    ("doubling-bounds", lambda: kt.DoublingKLController(min_coef=1.0, max_coef=0.5), ValueError, "min_coef"),
    ("doubling-init", lambda: kt.DoublingKLController(init_kl_coef=20.0), ValueError, "init_kl_coef"),
    ("exp-gain", lambda: kt.ExponentialKLController(gain=0.0), ValueError, "gain"),
    ("exp-target", lambda: kt.ExponentialKLController(target_kl=math.nan), ValueError, "target_kl"),
    ("update-nan", lambda: kt.AdaptiveKLController(0.1, 6.0, 10).update(math.nan), ValueError, "current_kl"),
    ("update-str", lambda: kt.FixedKLController(0.1).update("6"), TypeError, "current_kl"),
    ("update-steps", lambda: kt.AdaptiveKLController(0.1, 6.0, 10).update(1.0, n_steps=0), ValueError, "n_steps"),
    ("update-steps-float", lambda: kt.DoublingKLController().update(1.0, n_steps=1.5), TypeError, "n_steps"),
]


@pytest.mark.parametrize(("call", "exc", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_rejected_with_a_clear_message(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value), str(info.value)
