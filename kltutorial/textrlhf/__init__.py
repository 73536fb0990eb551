r"""RLHF on real English text: the KL penalty on a small language model (the book's real-text chapter).

The toy task of section 11 can be enumerated, so every number there is exact, but no page of it shows a
sentence. This room, beside :mod:`kltutorial.toyrlhf`, trains a small language model on real quotes and
shows the penalty on what it writes, with nothing downloaded at run time and everything on one CPU thread:

=================  ==========================================================================
``corpus``         :func:`load_corpus`: 13,000 short quotes of the Unix ``fortune`` files, read from
                   installed packages, cleaned, filtered (off-colour and dated quotes out, the rule
                   in the docstring) and split into training and validation quotes once and for all
``tokenizer``      a word-level vocabulary, the corpus's 4,096 most common words and six
                   punctuation marks: every token is a word, and a per-token KL is a KL per word
``model``          :func:`load_pretrained`: the stored base model (a 0.95 M-parameter Llama, float16
                   safetensors, loaded offline) and its tokenizer, as TRL takes them
``pretrain``       how the base model was trained: ``python -m kltutorial.textrlhf pretrain``
``reward``         :func:`gold_reward`: VADER's sentiment score, a rule-based scorer from a package
``proxy``          :func:`load_proxy_reward`: a Bradley–Terry reward model learned from noisy
                   comparisons labelled by the gold (``python -m kltutorial.textrlhf proxy``)
``generation``     sampling with a KV cache (the end token an action), :func:`token_kl`: the exact
                   KL of the next-word distributions (and k1) at every word of a text,
                   :func:`position_kl`: where along its own responses a policy's KL goes
``metrics``        distinct-n, and the share of a sample's words and word pairs found in the corpus
``config``         :class:`TextTrainConfig`, frozen and validated; the book's β sweep
``trainer``        :func:`train_text`: REINFORCE with β times the sequence's k1 in the reward,
                   through :func:`kltutorial.compute_rlhf_objective`
``step``           :func:`~kltutorial.textrlhf.step.kl_penalised_step`: one training step written out
                   line by line (book section 8), the gradient of ``train_text``'s
``runs``           the book's stored runs (``python -m kltutorial.textrlhf.runs``)
``trl_run``        the β = 0.05 run through TRL's ``RLOOTrainer`` with ``KLMonitorCallback``
                   (``python -m kltutorial.textrlhf.trl_run``)
``cli``            ``python -m kltutorial.textrlhf pretrain``, ``... proxy`` and ``... sweep``
                   (``--help``)
=================  ==========================================================================

It needs ``transformers`` and the text packages (``pip install 'kltutorial[text]'``, which
requirements.txt pins); :mod:`kltutorial` itself does not import it. Randomness is passed in: every
sampling function takes a ``torch.Generator``.

Examples
--------
>>> import torch
>>> from kltutorial import textrlhf as text
>>> model, tok = text.load_pretrained()
>>> run = text.train_text(model, tok, text.TextTrainConfig(beta=0.05, steps=2, batch_size=8),
...                       generator=torch.Generator().manual_seed(0))
>>> run.kl.shape, float(run.kl[0])  # three batches: the base model's, then two after an update each
((3,), 0.0)
"""

try:
    import transformers  # noqa: F401
    import vaderSentiment  # noqa: F401
except ImportError as err:  # pragma: no cover - the requirements install both
    raise ImportError(
        "kltutorial.textrlhf needs transformers and vaderSentiment, and reads its text from the fortune "
        "packages: pip install 'kltutorial[text]' (or pip install -r requirements.txt)"
    ) from err

from .config import TEXT_BETAS, TextTrainConfig
from .corpus import Corpus, load_corpus
from .generation import (
    PositionKL,
    Responses,
    TokenKL,
    WordShift,
    decode_responses,
    next_word_shift,
    position_kl,
    sample_responses,
    token_kl,
)
from .metrics import corpus_ngrams, corpus_share, distinct_n
from .model import PRETRAINED_DIR, load_pretrained, pretrained_metadata
from .pretrain import PretrainConfig, perplexity, pretrain
from .proxy import (
    PROXY_DIR,
    Comparisons,
    ProxyConfig,
    ProxyResult,
    ProxyReward,
    comparisons,
    load_proxy_reward,
    pair_accuracies,
    proxy_metadata,
    train_proxy,
)
from .reward import gold_reward
from .trainer import REWARDS, BatchStats, TextTrainResult, evaluate_policy, train_text

__all__ = [
    "TEXT_BETAS",
    "TextTrainConfig",
    "Corpus",
    "load_corpus",
    "Responses",
    "TokenKL",
    "decode_responses",
    "sample_responses",
    "token_kl",
    "PositionKL",
    "position_kl",
    "WordShift",
    "next_word_shift",
    "corpus_ngrams",
    "corpus_share",
    "distinct_n",
    "PRETRAINED_DIR",
    "load_pretrained",
    "pretrained_metadata",
    "PretrainConfig",
    "perplexity",
    "pretrain",
    "gold_reward",
    "PROXY_DIR",
    "Comparisons",
    "ProxyConfig",
    "ProxyResult",
    "ProxyReward",
    "comparisons",
    "load_proxy_reward",
    "pair_accuracies",
    "proxy_metadata",
    "train_proxy",
    "REWARDS",
    "BatchStats",
    "TextTrainResult",
    "evaluate_policy",
    "train_text",
]
