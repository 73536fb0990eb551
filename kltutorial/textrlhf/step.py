r"""One KL-penalised training step for a causal language model, written out line by line (book section 8).

:func:`kl_penalised_step` is the whole step of :func:`~kltutorial.textrlhf.train_text` in one function a
reader can read top to bottom: sample, score, both models' log-probs of the sampled tokens, the per-token
k1, the shaped reward (the penalty at every token, the score at the last), the advantage, the loss. It
computes by hand what :func:`kltutorial.compute_rlhf_objective` computes, and ``tests/test_textrlhf.py``
checks that the two give the same gradient on the same batch.

The same step in the libraries (read in TRL 1.16.0, verl v0.7.0 and OpenRLHF v0.11.0):

* TRL's ``RLOOTrainer._generate_and_score_completions``: ``per_token_kl = old_per_token_logps -
  ref_per_token_logps``, summed over the completion mask, ``rewards = rewards - self.beta * kl``, then the
  leave-one-out baseline inside each group of ``num_generations``;
* verl's ``apply_kl_penalty`` (``verl/trainer/ppo/ray_trainer.py``): ``token_level_rewards =
  token_level_scores - beta * kld``, the score already placed at the last valid token, then its advantage
  estimator (``compute_advantage``);
* OpenRLHF's ``compute_reward`` (``openrlhf/models/utils.py``): ``kl_reward = -kl_coef * kl``, the reward
  added at the end-of-sequence position, then GAE or its REINFORCE-style estimators.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from .._validation import check_coef, check_generator, check_positive, check_positive_int
from .generation import check_model, check_tokenizer, decode_responses, response_logits, sample_unchecked
from .reward import gold_reward

__all__ = ["kl_penalised_step", "training_step"]


def kl_penalised_step(policy: PreTrainedModel, reference: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                      optimizer: torch.optim.Optimizer, *, beta: float, batch_size: int = 64,
                      max_new_tokens: int = 24, max_grad_norm: float | None = 1.0,
                      generator: torch.Generator) -> dict[str, float]:
    """Sample ``batch_size`` responses from ``policy``, score them with the gold reward, and take one
    optimizer step on the KL-penalised REINFORCE loss (k1 in the reward, leave-one-out baseline), the
    gradient's norm clipped to ``max_grad_norm`` (``None``: not clipped). Returns the batch's mean score,
    the mean k1 of a response, and the loss.

    Examples
    --------
    >>> from kltutorial.textrlhf import load_pretrained
    >>> policy, tok = load_pretrained()
    >>> reference, _ = load_pretrained()
    >>> opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    >>> out = kl_penalised_step(policy, reference, tok, opt, beta=0.05, batch_size=8,
    ...                         generator=torch.Generator().manual_seed(0))
    >>> out["k1"]  # the policy was the reference when it sampled
    0.0
    """
    for model, name in ((policy, "policy"), (reference, "reference")):
        check_model(model, name)
    check_tokenizer(tokenizer)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    beta = check_coef(beta, "beta")
    if max_grad_norm is not None:
        max_grad_norm = check_positive(max_grad_norm, "max_grad_norm")
    batch_size = check_positive_int(batch_size, "batch_size")
    max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens")
    check_generator(generator)
    if batch_size < 2:
        raise ValueError("batch_size must be >= 2: the baseline averages the other responses")
    return training_step(policy, reference, tokenizer, optimizer, beta, batch_size, max_new_tokens,
                         max_grad_norm, generator)


def training_step(policy, reference, tokenizer, optimizer, beta, batch_size, max_new_tokens, max_grad_norm,
                  generator):
    """:func:`kl_penalised_step` for a caller that has checked its arguments: the step itself."""
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    # 1. Generate: B responses from the policy, the end token an action; mask (B, T) is 1 up to and
    #    including each response's end token, 0 on the padding after it.
    r = sample_unchecked(policy, bos, eos, pad, batch_size, max_new_tokens, generator)
    tokens, mask = r.tokens, r.mask.float()
    # 2. Score the decoded text: one number per response, (B,).
    score = gold_reward(decode_responses(tokenizer, r))
    # 3. Both models' log-probs of the sampled tokens, (B, T): the policy's with its graph, the
    #    reference's without (it is frozen).
    logp = torch.log_softmax(response_logits(policy, bos, tokens), -1)
    logp = logp.gather(-1, tokens[..., None]).squeeze(-1)
    with torch.no_grad():
        ref_logp = torch.log_softmax(response_logits(reference, bos, tokens), -1)
        ref_logp = ref_logp.gather(-1, tokens[..., None]).squeeze(-1)
    # 4. The per-token k1, log pi - log pi_ref at each sampled token, detached: it is a reward, not a loss.
    k1 = (logp.detach() - ref_logp) * mask
    # 5. The shaped reward: -beta k1 at every token, the score added at each response's last token.
    shaped = -beta * k1
    last = mask.sum(-1).long() - 1  # (B,): the index of each response's last action
    shaped[torch.arange(batch_size), last] += score
    # 6. The return of a whole response (gamma = 1, no critic): score - beta * sum of k1, (B,).
    ret = shaped.sum(-1)
    # 7. The advantage: the return minus the mean return of the *other* responses (leave-one-out).
    advantage = ret - (ret.sum() - ret) / (batch_size - 1)
    # 8. REINFORCE: each response's log-prob, summed over its tokens, times its advantage (held fixed).
    loss = -(advantage.detach() * (logp * mask).sum(-1)).mean()
    optimizer.zero_grad()
    loss.backward()
    if max_grad_norm is not None:  # as train_text and TRL's default
        torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
    optimizer.step()
    return {"score": float(score.mean()), "k1": float(k1.sum(-1).mean()), "loss": float(loss.detach())}
