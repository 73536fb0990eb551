r"""The gold reward of the real-text experiment: VADER's sentiment score, from an installed package.

VADER (Hutto and Gilbert, 2014; the ``vaderSentiment`` package, MIT) scores a text by a hand-made lexicon
of about 7,500 words and a few rules (negation, "very", "but", exclamation marks). Its ``compound`` score
is the lexicon's sum squashed into (-1, 1). Why this scorer: it ships in a small package with no model
weights, runs in about 0.1 ms a text on one CPU thread, is deterministic, and its flaws are the point of
the experiment: it saturates near 1 (a few strongly positive words are as good as a sentence), ignores
words it does not know and never judges fluency, so a policy that maximises it without a penalty writes
"love love love ...". The corpus's quotes score 0.05 on average (its validation quotes), the base
model's samples 0.06.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

__all__ = ["gold_reward"]


@lru_cache(maxsize=1)
def _analyzer():
    try:
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
    except ImportError as err:  # pragma: no cover - the requirements install it
        raise ImportError("the gold reward needs vaderSentiment: pip install -r requirements.txt") from err
    return SentimentIntensityAnalyzer()


def gold_reward(texts: Sequence[str]) -> torch.Tensor:
    """VADER's compound sentiment score of each text, in [-1, 1].

    Parameters
    ----------
    texts : sequence of str

    Returns
    -------
    Tensor, shape (len(texts),), float64

    Examples
    --------
    >>> gold_reward(["many hands make light work.", "love love love", "i hate it.", ""])
    tensor([ 0.0000,  0.9274, -0.5719,  0.0000], dtype=torch.float64)
    """
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a sequence of str (a list of texts, not one str)")
    analyzer = _analyzer()
    return torch.tensor([analyzer.polarity_scores(t)["compound"] for t in texts], dtype=torch.float64)
