r"""The base model of the real-text experiment: a small ``transformers`` Llama over the word-level
vocabulary, stored in the package and loaded offline.

:func:`load_pretrained` returns ``(model, tokenizer)``, the same kinds of object TRL's trainers and
:class:`~kltutorial.integrations.trl.KLMonitorCallback` take: a ``LlamaForCausalLM`` in float32 and a
``PreTrainedTokenizerFast``. They come from :data:`PRETRAINED_DIR` (``safetensors`` weights in float16,
the configuration, the tokenizer, and ``pretrain.json``: the command, machine, date, corpus sizes and
validation perplexity of the run that wrote them), never from the Hub: the loading is local only, so it
works with ``HF_HUB_OFFLINE=1`` and no network. ``python -m kltutorial.textrlhf pretrain`` writes them
(:func:`~kltutorial.textrlhf.pretrain.pretrain`).

Why a Llama: it is the architecture of the book's TRL runs (``integrations.trl.toy_model``), and
``transformers`` builds it from a configuration alone. Tied input and output embeddings halve the
parameters the vocabulary costs.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from .tokenizer import SPECIAL_TOKENS

__all__ = ["PRETRAINED_DIR", "model_config", "load_pretrained", "pretrained_metadata", "save_pretrained"]

#: Where the stored base model lives (package data).
PRETRAINED_DIR: Path = Path(__file__).resolve().parent / "data" / "pretrained"
#: The metadata file written beside the weights.
METADATA_FILE = "pretrain.json"


def model_config(vocab_size: int, *, hidden_size: int = 128, num_layers: int = 2, num_heads: int = 4,
                 intermediate_size: int = 384, max_positions: int = 96) -> LlamaConfig:
    """The Llama configuration of the base model (special-token ids from
    :data:`~kltutorial.textrlhf.tokenizer.SPECIAL_TOKENS`, tied embeddings, no dropout)."""
    pad, bos, eos = (SPECIAL_TOKENS.index(t) for t in ("<pad>", "<s>", "</s>"))
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=max_positions, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad,
        tie_word_embeddings=True,
    )


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off ("Loading weights: 100%" has no place in a notebook's output), and
    back as they were after."""
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def save_pretrained(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, directory: Path,
                    metadata: dict[str, Any]) -> None:
    """Write the model (float16 safetensors), the tokenizer and ``metadata`` (as ``pretrain.json``) to
    ``directory``; the model passed in is left in its own precision."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with no_progress_bars():
        copy.deepcopy(model).to(torch.float16).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf8")


def load_pretrained(directory: str | Path | None = None) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """The stored base model and its tokenizer, loaded from local files only.

    Parameters
    ----------
    directory : str or Path, optional
        A directory written by :func:`save_pretrained`; by default the one the package ships,
        :data:`PRETRAINED_DIR`.

    Returns
    -------
    (model, tokenizer)
        A ``LlamaForCausalLM`` in float32 (its float16 weights widened exactly), in eval mode, and a
        ``PreTrainedTokenizerFast``. Each call builds new objects: train one, keep another as the reference.

    Examples
    --------
    >>> model, tok = load_pretrained()
    >>> type(model).__name__, model.dtype, tok.decode(tok("Many hands make light work.").input_ids)
    ('LlamaForCausalLM', torch.float32, 'many hands make light work.')
    """
    directory = Path(PRETRAINED_DIR if directory is None else directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"no stored model in {directory}: run `python -m kltutorial.textrlhf pretrain` to write one"
        )
    with no_progress_bars():
        model = LlamaForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory, local_files_only=True)
    model.eval()
    return model, tokenizer


def pretrained_metadata(directory: str | Path | None = None) -> dict[str, Any]:
    """The ``pretrain.json`` stored beside the model: command, machine, date, corpus sizes, perplexity."""
    directory = Path(PRETRAINED_DIR if directory is None else directory)
    return json.loads((directory / METADATA_FILE).read_text(encoding="utf8"))
