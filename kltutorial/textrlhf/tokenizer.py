r"""A word-level tokenizer: every token is a word of the corpus or a punctuation mark.

With a word-level vocabulary every sampled token is a real word, so a generated text is made of English
words whatever the model's quality, and the per-token KL of the book's heat maps is a KL per word. The
price is a closed vocabulary: a word outside it is ``<unk>``. The corpus's :data:`VOCAB_SIZE` most
common words cover about nine in ten of its words; the rest (names, rare words) become ``<unk>``, which
the pretraining never uses as a target (:mod:`~kltutorial.textrlhf.pretrain`), so the model learns to
write around them and almost never emits one.

The pipeline, all of it inside a ``tokenizers`` object (so that ``transformers`` and TRL use the same one):

1. **normalise**: accents stripped, lower case; every character other than letters, digits, ``'`` and
   ``. , ! ? ; :`` becomes a space (quotes, brackets and hyphens go: "half-lives" is two words); an
   apostrophe survives only inside a word ("don't"); each punctuation mark becomes the token ``##.``,
   ``##,``, ... with spaces around it;
2. **split** on whitespace;
3. **look up** each piece in the vocabulary (``<unk>`` if absent);
4. **decode** with the WordPiece decoder: tokens joined by spaces, a ``##`` token glued to the one before,
   so punctuation attaches to its word ("hello, world.").

Decoding is the inverse of encoding on normalised text: ``decode(encode(t))`` is the canonical form of
``t`` (lower case, one space between words, punctuation attached), and encoding that gives the same ids.

Ids: ``<pad>`` 0, ``<s>`` 1 (every sequence starts with it: the prompt of an unconditional sample),
``</s>`` 2 (the end of a quote, an action of the policy), ``<unk>`` 3, then the punctuation marks, then
the words from the most common down.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

__all__ = ["SPECIAL_TOKENS", "PUNCTUATION", "VOCAB_SIZE", "words", "build_vocabulary", "build_tokenizer"]

#: Padding, start, end and unknown word, ids 0 to 3.
SPECIAL_TOKENS: tuple[str, str, str, str] = ("<pad>", "<s>", "</s>", "<unk>")
#: The punctuation marks kept, each a token of its own (``##`` + mark).
PUNCTUATION: str = ".,!?;:"
#: Words in the book's vocabulary (with the 4 special and 6 punctuation tokens, 4,106 tokens).
VOCAB_SIZE: int = 4096


def _normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence([
        normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[^a-z0-9'.,!?;:]+"), " "),
        normalizers.Replace(Regex(r"(?<![a-z0-9])'|'(?![a-z])"), " "),  # an apostrophe inside a word only
        *[normalizers.Replace(mark, f" ##{mark} ") for mark in PUNCTUATION],
    ])


def _pipeline(vocab: dict[str, int]) -> Tokenizer:
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.normalizer = _normalizer()
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # WordPiece's decoder glues "##," to the word before; Replace drops the "##" a response may start with
    core.decoder = decoders.Sequence([
        decoders.WordPiece(prefix="##", cleanup=False), decoders.Replace("##", ""),
    ])
    return core


_SPLITTER = _pipeline({"<unk>": 0})


def words(text: str) -> list[str]:
    """The tokens of ``text`` before the vocabulary look-up: its words and ``##`` punctuation marks.

    Examples
    --------
    >>> words("Don't panic -- it's only half-time!")
    ["don't", 'panic', "it's", 'only', 'half', 'time', '##!']
    """
    normal = _SPLITTER.normalizer.normalize_str(text)
    return [piece for piece, _ in _SPLITTER.pre_tokenizer.pre_tokenize_str(normal)]


def build_vocabulary(texts: Iterable[str], size: int = VOCAB_SIZE) -> tuple[str, ...]:
    """The tokenizer's vocabulary: :data:`SPECIAL_TOKENS`, the punctuation marks, then the ``size`` most
    common words of ``texts`` (ties in alphabetical order, so the result does not depend on the order of
    ``texts``).

    Examples
    --------
    >>> build_vocabulary(["A cat, a dog.", "The cat!"], size=2)
    ('<pad>', '<s>', '</s>', '<unk>', '##.', '##,', '##!', '##?', '##;', '##:', 'a', 'cat')
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive int (the number of words), got {size!r}")
    marks = [f"##{m}" for m in PUNCTUATION]
    counts = Counter(w for text in texts for w in words(text) if not w.startswith("##"))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:size]
    return (*SPECIAL_TOKENS, *marks, *(w for w, _ in ranked))


def build_tokenizer(vocabulary: Sequence[str]) -> PreTrainedTokenizerFast:
    """A fast tokenizer over ``vocabulary`` (from :func:`build_vocabulary`), for ``transformers`` and TRL.

    It adds no special token itself (``add_special_tokens`` has nothing to add): a caller that wants
    the start token puts ``<s>`` first, as the package's sampler and :func:`~kltutorial.textrlhf.token_kl`
    do. Padding is on the right.

    Examples
    --------
    >>> tok = build_tokenizer(build_vocabulary(["Many hands make light work."]))
    >>> ids = tok("Many hands make LIGHT work!").input_ids
    >>> tok.convert_ids_to_tokens(ids)
    ['many', 'hands', 'make', 'light', 'work', '##!']
    >>> tok.decode(ids)
    'many hands make light work!'
    """
    vocabulary = tuple(vocabulary)
    if vocabulary[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
        raise ValueError(f"vocabulary must start with {SPECIAL_TOKENS} (use build_vocabulary)")
    if len(set(vocabulary)) != len(vocabulary):
        raise ValueError("vocabulary holds a token twice")
    pad, bos, eos, unk = SPECIAL_TOKENS
    tok = PreTrainedTokenizerFast(
        tokenizer_object=_pipeline({w: i for i, w in enumerate(vocabulary)}),
        pad_token=pad, bos_token=bos, eos_token=eos, unk_token=unk,
    )
    tok.padding_side = "right"
    return tok
