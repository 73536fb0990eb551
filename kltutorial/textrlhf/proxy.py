r"""The learned proxy reward of the real-text experiment: a Bradley–Terry reward model trained on pairs
labelled by the gold, with label noise (Gao et al.'s setting, at the size of this book).

In RLHF the policy never sees the gold (what people prefer): it sees a reward model learned from a
limited number of noisy comparisons. Optimised hard, the policy finds where the learned model is wrong,
and its gold score turns down while the proxy's keeps rising: over-optimisation. To show it on text,
the gold here is VADER (:func:`~kltutorial.textrlhf.gold_reward`) and the proxy is learned from it:

1. sample :attr:`ProxyConfig.pairs` pairs of responses from the base model (the policy before RLHF, as
   human comparisons are collected on the SFT model's samples), and as many again for validation;
2. label each pair as a noisy annotator would: the first response wins with probability
   :math:`\sigma\big((g_a - g_b)/\tau\big)`, :math:`g` its gold score and :math:`\tau` =
   :attr:`ProxyConfig.label_temperature` (two responses of equal gold are a coin flip);
3. train a ``LlamaForSequenceClassification`` (the base model's body, a scalar head reading the end
   token) with the Bradley–Terry loss :math:`-\log\sigma(s_w - s_l)`, keeping the epoch of lowest
   validation loss.

``python -m kltutorial.textrlhf proxy`` does it and writes the model to :data:`PROXY_DIR` with
``proxy.json`` (the command, machine, date, and the validation accuracies); :func:`load_proxy_reward`
loads it offline. A ``LlamaForSequenceClassification`` with one label is the kind of reward model TRL's
trainers take in ``reward_funcs``.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaForCausalLM, LlamaForSequenceClassification, PreTrainedTokenizerFast

from .._validation import check_generator
from ..toyrlhf.config import check_field
from .generation import check_model, check_tokenizer, decode_responses, sample_unchecked
from .model import no_progress_bars
from .pretrain import encode_quotes
from .reward import gold_reward

__all__ = ["PROXY_DIR", "ProxyConfig", "ProxyReward", "ProxyResult", "Comparisons", "comparisons",
           "pair_accuracies", "train_proxy", "save_proxy", "load_proxy_reward", "proxy_metadata"]

#: Where the stored proxy reward model lives (package data).
PROXY_DIR: Path = Path(__file__).resolve().parent / "data" / "proxy"
#: The metadata file written beside the weights.
METADATA_FILE = "proxy.json"


@dataclass(frozen=True)
class ProxyConfig:
    """The proxy reward model's data and training (the defaults are the stored model's).

    Examples
    --------
    >>> ProxyConfig().pairs
    8192
    >>> ProxyConfig(label_temperature=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ProxyConfig.label_temperature must be a finite number > 0, got 0: ...
    """

    pairs: int = 8192  # training comparisons, each of two base-model samples
    validation_pairs: int = 1024  # held-out comparisons
    label_temperature: float = 0.25  # tau: P(a wins) = sigmoid((gold_a - gold_b) / tau)
    epochs: int = 4
    batch_size: int = 64  # pairs per step
    lr: float = 1e-3  # AdamW's learning rate
    weight_decay: float = 0.01
    max_new_tokens: int = 24  # as the policy's responses (TextTrainConfig)

    def __post_init__(self) -> None:
        for name in ("pairs", "validation_pairs", "epochs", "batch_size", "max_new_tokens"):
            check_field(self, name, f"see ProxyConfig's defaults ({getattr(type(self), name)})", low=1,
                        integer=True)
        check_field(self, "label_temperature", "the annotators' noise: P(a wins) = "
                    "sigmoid((gold_a - gold_b) / label_temperature)", low=0, low_open=True)
        check_field(self, "lr", "it is AdamW's learning rate", low=0, low_open=True)
        check_field(self, "weight_decay", "it is AdamW's decoupled weight decay", low=0)


def _encode(tokenizer: PreTrainedTokenizerFast, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), each (N, L): ``<s> w_1 ... w_n </s>`` right-padded, the end token last."""
    seqs = encode_quotes(tokenizer, texts)
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), tokenizer.pad_token_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    return ids, (ids != tokenizer.pad_token_id).long()


def _scores(model: LlamaForSequenceClassification, tokenizer: PreTrainedTokenizerFast,
            texts: Sequence[str]) -> torch.Tensor:
    """(N,) float32 scores, differentiable: the head's output at each text's end token."""
    ids, attn = _encode(tokenizer, texts)
    return model(input_ids=ids, attention_mask=attn).logits[:, 0].float()


class ProxyReward:
    """The learned reward, called as :func:`~kltutorial.textrlhf.gold_reward` is: texts in, a float64
    tensor of scores out (no gradient).

    Attributes
    ----------
    model : LlamaForSequenceClassification
        One label: the score read at the end token (eval mode, float32).
    tokenizer : PreTrainedTokenizerFast
        The base model's.

    Examples
    --------
    >>> proxy = load_proxy_reward()
    >>> scores = proxy(["i love it.", "i hate it."])
    >>> scores.dtype, bool(scores[0] > scores[1])
    (torch.float64, True)
    """

    def __init__(self, model: LlamaForSequenceClassification, tokenizer: PreTrainedTokenizerFast) -> None:
        if not isinstance(model, LlamaForSequenceClassification) or model.config.num_labels != 1:
            raise TypeError("model must be a LlamaForSequenceClassification with one label (from "
                            f"train_proxy or load_proxy_reward), got {type(model).__name__}")
        check_tokenizer(tokenizer)
        self.model, self.tokenizer = model, tokenizer

    @torch.no_grad()
    def __call__(self, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a sequence of str (a list of texts, not one str)")
        texts = list(texts)
        if not texts:
            return torch.zeros(0, dtype=torch.float64)
        parts = [_scores(self.model, self.tokenizer, texts[i : i + batch_size])
                 for i in range(0, len(texts), batch_size)]
        return torch.cat(parts).double()

    def __repr__(self) -> str:
        return f"ProxyReward({sum(p.numel() for p in self.model.parameters()):,} parameters)"


@dataclass(frozen=True)
class ProxyResult:
    """What :func:`train_proxy` returns.

    Attributes
    ----------
    proxy : ProxyReward
    validation_loss : list of float
        The Bradley–Terry loss on the held-out (noisy) labels after each epoch.
    accuracies : dict
        :func:`pair_accuracies` on the held-out pairs.
    best_epoch : int
        The epoch kept (1-based).
    seconds : float
    """

    proxy: ProxyReward
    validation_loss: list[float]
    accuracies: dict[str, float]
    best_epoch: int
    seconds: float


@dataclass(frozen=True)
class Comparisons:
    r"""Pairs of responses and their labels: ``a[i]`` against ``b[i]``.

    Attributes
    ----------
    a, b : list of str
    gold_difference : Tensor, shape (n,), float64
        :math:`g_a - g_b`, the gold's own margin.
    labels : Tensor, shape (n,), float64
        1.0 where the annotator preferred ``a``, drawn with probability :math:`\sigma((g_a - g_b)/\tau)`.
    """

    a: list[str]
    b: list[str]
    gold_difference: torch.Tensor
    labels: torch.Tensor


def comparisons(base: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, n: int, config: ProxyConfig,
                generator: torch.Generator) -> Comparisons:
    """``n`` pairs of the base model's samples (``config.max_new_tokens`` tokens at most), labelled as a
    noisy annotator would (``config.label_temperature``); ``generator`` draws the samples, then the labels."""
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    texts: list[str] = []
    while len(texts) < 2 * n:
        batch = min(256, 2 * n - len(texts))
        responses = sample_unchecked(base, bos, eos, pad, batch, config.max_new_tokens, generator)
        texts += decode_responses(tokenizer, responses)
    a, b = texts[0::2], texts[1::2]
    diff = gold_reward(a) - gold_reward(b)
    p_a = torch.sigmoid(diff / config.label_temperature)
    wins = torch.rand(n, generator=generator, dtype=torch.float64) < p_a
    return Comparisons(a, b, diff, wins.double())


def pair_accuracies(proxy: ProxyReward, pairs: Comparisons) -> dict[str, float]:
    """How the proxy orders ``pairs``: ``label_accuracy``, the share of labels it predicts;
    ``gold_accuracy``, among pairs of unequal gold, the share it orders as the gold does;
    ``label_gold_agreement``, the same for the labels (the ceiling the noise leaves); and
    ``unequal_gold_share``, the share of pairs whose gold differs."""
    margin = proxy(pairs.a) - proxy(pairs.b)
    diff, labels = pairs.gold_difference, pairs.labels
    unequal = diff != 0
    return {
        "label_accuracy": float(((margin > 0).double() == labels).double().mean()),
        "gold_accuracy": float(((margin > 0) == (diff > 0))[unequal].double().mean()),
        "label_gold_agreement": float(((labels > 0.5) == (diff > 0))[unequal].double().mean()),
        "unequal_gold_share": float(unequal.double().mean()),
    }


def _bt_loss(model: LlamaForSequenceClassification, tokenizer: PreTrainedTokenizerFast, a: Sequence[str],
             b: Sequence[str], labels: torch.Tensor) -> torch.Tensor:
    """The Bradley–Terry loss, mean over the pairs: :math:`-\\log\\sigma(\\pm(s_a - s_b))`."""
    margin = _scores(model, tokenizer, [*a, *b])
    margin = margin[: len(a)] - margin[len(a):]
    return torch.nn.functional.binary_cross_entropy_with_logits(margin, labels.float())


def train_proxy(base: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, config: ProxyConfig, *,
                generator: torch.Generator, progress: bool = False) -> ProxyResult:
    """Learn the proxy reward from comparisons of the base model's samples (see the module docstring).

    Parameters
    ----------
    base : LlamaForCausalLM
        The base model (:func:`~kltutorial.textrlhf.load_pretrained`): it writes the compared responses,
        and its body (not changed) initialises the reward model's.
    tokenizer : PreTrainedTokenizerFast
    config : ProxyConfig
    generator : torch.Generator
        Draws the responses, the labels, the head's initial weights and the batches.
    progress : bool
        Print one line per epoch.

    Returns
    -------
    ProxyResult
    """
    check_model(base, "base")
    if not isinstance(base, LlamaForCausalLM):
        raise TypeError(f"base must be a LlamaForCausalLM (from load_pretrained()), "
                        f"got {type(base).__name__}")
    check_tokenizer(tokenizer)
    if not isinstance(config, ProxyConfig):
        raise TypeError(f"config must be a ProxyConfig, got {type(config).__name__}")
    check_generator(generator)
    start = time.perf_counter()
    train = comparisons(base, tokenizer, config.pairs, config, generator)
    held = comparisons(base, tokenizer, config.validation_pairs, config, generator)
    rm_config = copy.deepcopy(base.config)
    rm_config.num_labels = 1
    with torch.random.fork_rng(devices=[]):  # transformers draws the head's weights from the global RNG
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
        model = LlamaForSequenceClassification(rm_config)
    model.model.load_state_dict(base.model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    history, best, best_state = [], math.inf, None
    for epoch in range(config.epochs):
        model.train()
        order = torch.randperm(config.pairs, generator=generator).tolist()
        for i in range(0, config.pairs, config.batch_size):
            idx = order[i : i + config.batch_size]
            loss = _bt_loss(model, tokenizer, [train.a[j] for j in idx], [train.b[j] for j in idx],
                            train.labels[idx])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        model.eval()
        with torch.no_grad():
            history.append(float(_bt_loss(model, tokenizer, held.a, held.b, held.labels)))
        if history[-1] < best:
            best, best_state = history[-1], copy.deepcopy(model.state_dict())
        if progress:
            print(f"epoch {epoch + 1}/{config.epochs}: validation loss {history[-1]:.4f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    model.load_state_dict(best_state)
    model.eval()
    proxy = ProxyReward(model, tokenizer)
    return ProxyResult(proxy=proxy, validation_loss=history, accuracies=pair_accuracies(proxy, held),
                       best_epoch=history.index(best) + 1, seconds=time.perf_counter() - start)


def save_proxy(proxy: ProxyReward, directory: Path, metadata: dict[str, Any]) -> None:
    """Write the reward model (float16 safetensors), the tokenizer and ``metadata`` (``proxy.json``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with no_progress_bars():
        copy.deepcopy(proxy.model).to(torch.float16).save_pretrained(directory)
    proxy.tokenizer.save_pretrained(directory)
    (directory / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf8")


def load_proxy_reward(directory: str | Path | None = None) -> ProxyReward:
    """The stored proxy reward, loaded from local files only (float16 weights widened to float32).

    Parameters
    ----------
    directory : str or Path, optional
        Written by :func:`save_proxy`; by default the one the package ships, :data:`PROXY_DIR`.

    Returns
    -------
    ProxyReward
    """
    directory = Path(PROXY_DIR if directory is None else directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"no stored proxy reward in {directory}: run `python -m kltutorial.textrlhf proxy` to write one"
        )
    with no_progress_bars():
        model = LlamaForSequenceClassification.from_pretrained(directory, local_files_only=True,
                                                               dtype=torch.float32)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory, local_files_only=True)
    model.eval()
    return ProxyReward(model, tokenizer)


def proxy_metadata(directory: str | Path | None = None) -> dict[str, Any]:
    """The ``proxy.json`` stored beside the proxy: command, machine, date, data and accuracies."""
    directory = Path(PROXY_DIR if directory is None else directory)
    return json.loads((directory / METADATA_FILE).read_text(encoding="utf8"))
