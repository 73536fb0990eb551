r"""What a text sample is measured by, besides its reward and KL: diversity and closeness to the corpus.

Both work on the words of a text (:func:`~kltutorial.textrlhf.tokenizer.words` without the punctuation
marks), so that they mean the same whatever the tokenizer.

* :func:`distinct_n` (Li et al., 2016): distinct n-grams over all n-grams of a batch. A varied batch of
  English quotes scores about 0.9 at n = 2; a collapsed policy that writes one phrase scores near 0.
* :func:`running_mean` and :func:`gold_peak`: a batch's mean reward is noisy (64 responses); where a
  run's gold peaks is read from its running mean over a few batches.
* :func:`corpus_share`: the share of a sample's words (n = 1) or word pairs (n = 2) that occur in the
  corpus. With a word-level vocabulary every word the model writes is a corpus word except ``<unk>``;
  pairs say more about fluency: a sample of random words has few pairs that any quote has.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from .tokenizer import words

__all__ = ["text_words", "ngrams", "distinct_n", "corpus_ngrams", "corpus_share", "running_mean",
           "gold_peak"]


def text_words(text: str) -> list[str]:
    """The words of ``text``, lower-cased, without punctuation marks (``<unk>`` reads as ``unk``)."""
    return [w for w in words(text) if not w.startswith("##")]


def ngrams(seq: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The n-grams of one sequence, in order."""
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def _check(texts: object, n: object) -> None:
    if isinstance(texts, str) or not isinstance(texts, Iterable):
        raise TypeError("texts must be a sequence of str (a list of texts, not one str)")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct word n-grams over all word n-grams in ``texts`` (n-grams within each text); NaN with none.

    Examples
    --------
    >>> distinct_n(["love love love", "love love"], 2)  # 3 bigrams, one distinct
    0.3333333333333333
    >>> distinct_n(["a cat sat.", "a dog sat."], 1)  # a cat sat a dog sat
    0.6666666666666666
    """
    _check(texts, n)
    grams = [g for t in texts for g in ngrams(text_words(t), n)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def corpus_ngrams(corpus_texts: Iterable[str], n: int) -> frozenset[tuple[str, ...]]:
    """Every word n-gram of the corpus's texts."""
    return frozenset(g for t in corpus_texts for g in ngrams(text_words(t), n))


def corpus_share(texts: Sequence[str], known: frozenset[tuple[str, ...]], n: int = 1) -> float:
    """The share of the word n-grams of ``texts`` that are in ``known`` (from :func:`corpus_ngrams` with
    the same ``n``); NaN when the texts hold none.

    Examples
    --------
    >>> known = corpus_ngrams(["many hands make light work."], 2)
    >>> corpus_share(["many hands make work"], known, 2)  # (many hands), (hands make) of three
    0.6666666666666666
    """
    _check(texts, n)
    grams = [g for t in texts for g in ngrams(text_words(t), n)]
    return sum(g in known for g in grams) / len(grams) if grams else float("nan")


def running_mean(values: Sequence[float] | np.ndarray, window: int) -> np.ndarray:
    """The mean of each value and the ``window - 1`` before it (fewer at the start), float64.

    Examples
    --------
    >>> running_mean([1.0, 3.0, 5.0, 7.0], 2)
    array([1., 2., 4., 6.])
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}")
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"values must be one-dimensional, got shape {x.shape}")
    return np.array([x[max(0, i - window + 1) : i + 1].mean() for i in range(len(x))])


def gold_peak(run: object, window: int = 20) -> int:
    """The step at which ``run``'s gold reward peaks: the argmax of its :func:`running_mean` over
    ``window`` batches (each entry the mean of that batch and the ``window - 1`` before it), the first
    one on a tie.

    Parameters
    ----------
    run : TextTrainResult
        Anything with a ``gold`` array (one entry per step).
    window : int
    """
    gold = getattr(run, "gold", None)
    if gold is None:
        raise TypeError(f"run must be a TextTrainResult (with .gold), got {type(run).__name__}")
    return int(np.argmax(running_mean(gold, window)))
