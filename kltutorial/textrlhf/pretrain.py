r"""Pretraining the base model on the corpus: next-word prediction, a few minutes on one CPU thread.

``python -m kltutorial.textrlhf pretrain`` runs :func:`pretrain` with :class:`PretrainConfig`'s defaults
and writes the result to :data:`~kltutorial.textrlhf.model.PRETRAINED_DIR`, with the command, machine,
date, corpus sizes and validation perplexity in ``pretrain.json``.

The recipe (nanoGPT's, scaled down): every quote is one sequence ``<s> w_1 ... w_n </s>``; batches of
quotes of similar length, padded on the right; cross-entropy on every next token except padding and
``<unk>`` (so the model never learns to emit an unknown word, and writes around the rare ones); AdamW
with weight decay, a linear warm-up and a cosine decay; the epoch with the lowest validation loss is kept
(the corpus is small: a larger model or more epochs overfit it).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from .._validation import check_generator
from ..toyrlhf.config import check_field
from .corpus import Corpus
from .model import model_config
from .tokenizer import VOCAB_SIZE, build_tokenizer, build_vocabulary

__all__ = ["PretrainConfig", "PretrainResult", "encode_quotes", "perplexity", "pretrain"]

IGNORE = -100  # the label torch's cross-entropy skips


@dataclass(frozen=True)
class PretrainConfig:
    """The base model and its training (the defaults are the stored model's).

    Examples
    --------
    >>> PretrainConfig().hidden_size
    128
    >>> PretrainConfig(epochs=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: PretrainConfig.epochs must be an int >= 1, got 0: ...
    """

    vocab_size: int = VOCAB_SIZE  # words (4 special tokens and 6 punctuation marks come on top)
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 384  # the MLP's width, 3 x hidden_size
    epochs: int = 12  # the best validation perplexity comes near the end of the cosine decay
    batch_size: int = 32  # quotes per step
    lr: float = 3e-3  # AdamW's peak learning rate
    weight_decay: float = 0.1
    warmup_steps: int = 200

    def __post_init__(self) -> None:
        for name, low in (("vocab_size", 1), ("hidden_size", 1), ("num_layers", 1), ("num_heads", 1),
                          ("intermediate_size", 1), ("epochs", 1), ("batch_size", 1),
                          ("warmup_steps", 0)):
            check_field(self, name, f"see PretrainConfig's defaults ({getattr(type(self), name)})",
                        low=low, integer=True)
        if self.hidden_size % self.num_heads:
            raise ValueError(f"PretrainConfig.hidden_size ({self.hidden_size}) must be a multiple of "
                             f"num_heads ({self.num_heads})")
        check_field(self, "lr", "it is AdamW's peak learning rate", low=0, low_open=True)
        check_field(self, "weight_decay", "it is AdamW's decoupled weight decay", low=0)


@dataclass(frozen=True)
class PretrainResult:
    """What :func:`pretrain` returns: the model (float32, eval mode), its tokenizer, and the run's record.

    Attributes
    ----------
    validation_perplexity : list of float
        :func:`perplexity` on the validation quotes after each epoch.
    best_epoch : int
        The epoch kept (1-based), the one with the lowest validation perplexity.
    seconds, cpu_seconds : float
        Wall-clock and CPU time of the training loop (on a shared machine the first is the larger).
    """

    model: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerFast
    validation_perplexity: list[float]
    best_epoch: int
    seconds: float
    cpu_seconds: float


def encode_quotes(tokenizer: PreTrainedTokenizerFast, texts: Sequence[str]) -> list[torch.Tensor]:
    """Each text as the 1-d id tensor ``<s> w_1 ... w_n </s>``."""
    encoded = tokenizer(list(texts), add_special_tokens=False).input_ids
    return [torch.tensor([tokenizer.bos_token_id, *ids, tokenizer.eos_token_id]) for ids in encoded]


def _batch(seqs: list[torch.Tensor], pad: int, unk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, attention mask, labels), each (B, L), right-padded; labels skip padding and ``<unk>``."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    attn = ids != pad
    labels = ids.masked_fill(~attn | (ids == unk), IGNORE)
    return ids, attn.long(), labels


def _loss(model: LlamaForCausalLM, ids: torch.Tensor, attn: torch.Tensor, labels: torch.Tensor,
          reduction: str = "mean") -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # (B, L-1, V)
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=IGNORE,
        reduction=reduction,
    )


@torch.no_grad()
def perplexity(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, texts: Sequence[str],
               batch_size: int = 64) -> float:
    """:math:`\\exp` of the mean cross-entropy per predicted token over ``texts`` (each ``<s> ... </s>``),
    padding and ``<unk>`` targets excluded: a perplexity per word or punctuation mark, the end included."""
    model.eval()
    seqs = sorted(encode_quotes(tokenizer, texts), key=len)
    total, count = 0.0, 0
    for i in range(0, len(seqs), batch_size):
        ids, attn, labels = _batch(seqs[i : i + batch_size], tokenizer.pad_token_id, tokenizer.unk_token_id)
        total += float(_loss(model, ids, attn, labels, reduction="sum"))
        count += int((labels[:, 1:] != IGNORE).sum())
    return math.exp(total / count)


def _batches(seqs: list[torch.Tensor], batch_size: int, generator: torch.Generator) -> list[list[int]]:
    """Indices of one epoch's batches: shuffled, then sorted by length within windows of 50 batches (so a
    batch holds quotes of similar length and little padding), the batches in a shuffled order."""
    order = torch.randperm(len(seqs), generator=generator).tolist()
    window = 50 * batch_size
    batches = []
    for start in range(0, len(order), window):
        part = sorted(order[start : start + window], key=lambda i: len(seqs[i]))
        batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def pretrain(corpus: Corpus, config: PretrainConfig, *, generator: torch.Generator,
             progress: bool = False) -> PretrainResult:
    """Build the vocabulary and the model, and train it on ``corpus.train`` (see the module docstring).

    Parameters
    ----------
    corpus : Corpus
        From :func:`~kltutorial.textrlhf.load_corpus`.
    config : PretrainConfig
    generator : torch.Generator
        Seeds the initial weights (drawn inside a forked global RNG, which is left as it was) and orders
        every epoch's batches.
    progress : bool
        Print one line per epoch.

    Returns
    -------
    PretrainResult
    """
    if not isinstance(corpus, Corpus):
        raise TypeError(f"corpus must be a Corpus (from load_corpus()), got {type(corpus).__name__}")
    if not isinstance(config, PretrainConfig):
        raise TypeError(f"config must be a PretrainConfig, got {type(config).__name__}")
    check_generator(generator)
    tokenizer = build_tokenizer(build_vocabulary(corpus.train, config.vocab_size))
    train = encode_quotes(tokenizer, corpus.train)
    mc = model_config(len(tokenizer), hidden_size=config.hidden_size, num_layers=config.num_layers,
                      num_heads=config.num_heads, intermediate_size=config.intermediate_size,
                      max_positions=max(96, max(map(len, train))))
    with torch.random.fork_rng(devices=[]):  # transformers draws the initial weights from the global RNG
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
        model = LlamaForCausalLM(mc)
    steps = config.epochs * math.ceil(len(train) / config.batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                            betas=(0.9, 0.95))

    def schedule(step: int) -> float:  # linear warm-up, then cosine decay to a tenth of the peak
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        done = (step - config.warmup_steps) / max(1, steps - config.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    pad, unk = tokenizer.pad_token_id, tokenizer.unk_token_id
    history, best, best_state = [], math.inf, None
    start, cpu_start = time.perf_counter(), time.process_time()
    for epoch in range(config.epochs):
        model.train()
        for batch in _batches(train, config.batch_size, generator):
            ids, attn, labels = _batch([train[i] for i in batch], pad, unk)
            loss = _loss(model, ids, attn, labels)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        history.append(perplexity(model, tokenizer, corpus.validation))
        if history[-1] < best:
            best, best_state = history[-1], copy.deepcopy(model.state_dict())
        if progress:
            print(f"epoch {epoch + 1}/{config.epochs}: validation perplexity {history[-1]:.2f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    model.load_state_dict(best_state)
    model.eval()
    return PretrainResult(model, tokenizer, history, history.index(best) + 1, time.perf_counter() - start,
                          time.process_time() - cpu_start)
