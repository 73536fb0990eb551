r"""What the reference model costs, and how trainers pay for it (book section 6).

The KL penalty needs :math:`\log\pi_\mathrm{ref}(y_t \mid y_{<t})` for every sampled token: one extra
forward pass of a second model per rollout batch. Two habits keep that cost down:

1. the batch is fixed while PPO runs its epochs over it, so the reference log-probs are computed once,
   right after sampling, and reused by every epoch and minibatch (lm-human-preferences computes
   ``ref_logprobs`` once in ``PPOTrainer.step`` and then runs ``noptepochs`` epochs on the stored
   rollouts; TRL and verl do the same);
2. with LoRA, the reference is the base model itself with the adapter switched off (PEFT's
   ``disable_adapter()``, which TRL's trainers enter in ``null_ref_context``), so no second copy of the
   weights is held.

:class:`LoRABigram` is a model small enough to show both: a bigram language model whose frozen base
table :math:`W` gets a low-rank update :math:`AB`, zero at the start as in LoRA.
:func:`reference_reuse_check` runs PPO-style epochs on one fixed batch and counts the reference's
forward passes. Shapes: B sequences, T tokens, V vocabulary, r the adapter's rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from .._validation import check_generator, check_positive, check_positive_int, check_token_ids

__all__ = ["LoRABigram", "ReuseCheck", "reference_reuse_check"]


class LoRABigram(nn.Module):
    """A bigram language model with a LoRA adapter: next-token logits :math:`W_{y_{t-1}} + (AB)_{y_{t-1}}`.

    The base table :math:`W` (V + 1 rows: one per token and one for the start of the sequence, V
    columns) is frozen; :math:`A` (V + 1, r) is drawn at random and :math:`B` (r, V) starts at zero, so
    the adapted model starts equal to the base. Inside :meth:`disable_adapter` the model *is* the base
    model: the reference policy without a second copy of the weights.

    Parameters
    ----------
    vocab_size : int
        V >= 2.
    rank : int
        r >= 1.
    generator : torch.Generator
        Draws :math:`W` and :math:`A`.

    Attributes
    ----------
    n_forward, n_forward_base : int
        Forward passes so far: all of them, and those with the adapter off (the reference's).
    """

    def __init__(self, vocab_size: int, rank: int, *, generator: torch.Generator) -> None:
        super().__init__()
        vocab_size = check_positive_int(vocab_size, "vocab_size")
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        rank = check_positive_int(rank, "rank")
        generator = check_generator(generator)
        self.vocab_size = vocab_size
        w = torch.randn(vocab_size + 1, vocab_size, generator=generator, dtype=torch.float64)
        self.base = nn.Parameter(w, requires_grad=False)  # frozen
        a = torch.randn(vocab_size + 1, rank, generator=generator, dtype=torch.float64) / rank**0.5
        self.lora_a = nn.Parameter(a)
        self.lora_b = nn.Parameter(torch.zeros(rank, vocab_size, dtype=torch.float64))  # LoRA: B = 0
        self._adapter_on = True
        self.n_forward = 0
        self.n_forward_base = 0

    @contextmanager
    def disable_adapter(self) -> Iterator[None]:
        """Within the block, the model computes the base logits :math:`W` only (PEFT's name)."""
        previous, self._adapter_on = self._adapter_on, False
        try:
            yield
        finally:
            self._adapter_on = previous

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Log-probs of the given tokens, :math:`\\log\\pi(y_t \\mid y_{t-1})`, shape (B, T).

        Parameters
        ----------
        tokens : LongTensor, shape (B, T)
        """
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2:
            raise ValueError("tokens must be a LongTensor of shape (B, T)")
        tokens = check_token_ids(tokens, "tokens", tokens.shape, self.vocab_size)
        self.n_forward += 1
        self.n_forward_base += int(not self._adapter_on)
        start = torch.full_like(tokens[:, :1], self.vocab_size)  # the start-of-sequence row
        prev = torch.cat([start, tokens[:, :-1]], dim=1)  # (B, T)
        table = self.base + self.lora_a @ self.lora_b if self._adapter_on else self.base  # (V + 1, V)
        logp = torch.log_softmax(table[prev], dim=-1)  # (B, T, V)
        return logp.gather(-1, tokens[..., None]).squeeze(-1)  # (B, T)


@dataclass(frozen=True)
class ReuseCheck:
    """What :func:`reference_reuse_check` measured.

    Attributes
    ----------
    reference_passes_cached : int
        Forward passes of the reference when its log-probs are computed once per batch (1).
    reference_passes_recomputed : int
        Those a trainer would make recomputing them in every minibatch of every epoch.
    max_cache_error : float
        Largest :math:`|\\log\\pi_\\mathrm{ref}|` difference between the cached log-probs and a fresh
        computation at each minibatch (0: the base is frozen).
    kl_start, kl_end : float
        Batch mean of the per-sequence sum of :math:`\\log\\pi_\\theta - \\log\\pi_\\mathrm{ref}` before and
        after training: the adapter moved the policy away from the base it is measured against.
    """

    reference_passes_cached: int
    reference_passes_recomputed: int
    max_cache_error: float
    kl_start: float
    kl_end: float


def reference_reuse_check(
    model: LoRABigram,
    tokens: torch.Tensor,
    scores: torch.Tensor,
    *,
    beta: float,
    ppo_epochs: int,
    n_minibatches: int,
    lr: float = 0.5,
    generator: torch.Generator,
) -> ReuseCheck:
    """PPO-style epochs on one fixed batch, with the reference log-probs computed once and reused.

    1. Once, with no gradient and the adapter off: ``ref = model(tokens)``, the reference log-probs
       (one forward pass of the base model).
    2. For each of ``ppo_epochs`` epochs, for each of ``n_minibatches`` shuffled minibatches: the policy's
       log-probs (adapter on), the loss :math:`-\\frac{1}{B}\\sum_i (s_i - \\beta\\,\\mathrm{sg}(S_i))
       \\sum_t \\log\\pi_\\theta(y_{i,t}\\mid y_{i,t-1})` with :math:`S_i = \\sum_t(\\log\\pi_\\theta -
       \\mathrm{ref})`, one SGD step on :math:`A, B`; and, only to check the cache, a fresh reference
       pass on the minibatch compared with the cached rows.

    Parameters
    ----------
    model : LoRABigram
        Trained in place.
    tokens : LongTensor, shape (B, T)
        The fixed batch of responses (sampled before the epochs start).
    scores : Tensor, shape (B,)
        Reward-model scores of the responses.
    beta : float
        KL coefficient > 0.
    ppo_epochs, n_minibatches : int
        >= 1; ``n_minibatches`` <= B.
    lr : float
        SGD step > 0.
    generator : torch.Generator
        Shuffles the minibatches.

    Returns
    -------
    ReuseCheck
    """
    if not isinstance(model, LoRABigram):
        raise TypeError(f"model must be a LoRABigram, got {type(model).__name__}")
    if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2:
        raise ValueError("tokens must be a LongTensor of shape (B, T)")
    tokens = check_token_ids(tokens, "tokens", tokens.shape, model.vocab_size)
    batch = tokens.shape[0]
    if not isinstance(scores, torch.Tensor) or scores.shape != (batch,) or not scores.is_floating_point():
        raise ValueError(f"scores must be a float tensor of shape ({batch},), one per response")
    beta = check_positive(beta, "beta")
    ppo_epochs = check_positive_int(ppo_epochs, "ppo_epochs")
    n_minibatches = check_positive_int(n_minibatches, "n_minibatches")
    if n_minibatches > batch:
        raise ValueError(f"n_minibatches must be <= the batch size {batch}, got {n_minibatches}")
    lr = check_positive(lr, "lr")
    generator = check_generator(generator)
    scores = scores.to(torch.float64)

    # 1. The reference, once per batch.
    base_before = model.n_forward_base
    with torch.no_grad(), model.disable_adapter():
        ref = model(tokens)  # (B, T)
    cached_passes = model.n_forward_base - base_before
    with torch.no_grad():
        kl_start = float((model(tokens) - ref).sum(-1).mean())

    # 2. Epochs over the fixed batch.
    opt = torch.optim.SGD([model.lora_a, model.lora_b], lr=lr)
    max_err, recomputed = 0.0, 0
    for _ in range(ppo_epochs):
        order = torch.randperm(batch, generator=generator)
        for idx in order.chunk(n_minibatches):
            logp = model(tokens[idx])  # (b, T), adapter on
            kl_seq = (logp.detach() - ref[idx]).sum(-1)  # (b,), reuses the cached reference
            loss = -((scores[idx] - beta * kl_seq) * logp.sum(-1)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad(), model.disable_adapter():  # the check only: recompute and compare
                fresh = model(tokens[idx])
            recomputed += 1
            max_err = max(max_err, float((fresh - ref[idx]).abs().max()))
    with torch.no_grad():
        kl_end = float((model(tokens) - ref).sum(-1).mean())
    return ReuseCheck(
        reference_passes_cached=cached_passes,
        reference_passes_recomputed=recomputed,
        max_cache_error=max_err,
        kl_start=kl_start,
        kl_end=kl_end,
    )
