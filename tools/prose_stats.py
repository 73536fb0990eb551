"""How much a page asks of its reader: the words of its prose, its numbers, its long sentences.

Prose is what a reader reads top to bottom: the markdown of a notebook's markdown cells (or of a ``.md``
page), without code blocks, display maths, figures (their captions included), exercises, solutions and
folded blocks (``:class: dropdown``), and without the MyST markup itself (roles, targets, directive
options). A number is a run of digits in that prose, or an ``{eval}`` role (which shows one). A sentence
ends at ``.``, ``?`` or ``!`` followed by a space and a capital letter, or at the end of a paragraph.

The status page shows each page's reading time (:func:`reading_minutes`, at :data:`WORDS_PER_MINUTE`, the
book's ``myst_words_per_minute``) beside its execution time; the teach-first plan of CONTRIBUTING.md
holds the core path to its budgets with these counts::

    .venv/bin/python tools/prose_stats.py book/*.ipynb book/*.md
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WORDS_PER_MINUTE", "LONG_SENTENCE", "ProseStats", "prose_of", "stats_of_text", "prose_stats",
           "reading_minutes", "main"]

WORDS_PER_MINUTE = 200  #: as _config.yml's myst words_per_minute
LONG_SENTENCE = 40  #: words; a sentence longer than this counts as long

# Fenced blocks: ``` or ::: fences of any length, with what they hold. Those left out of the prose
# entirely (code, maths, figures, exercises, solutions, folded blocks); other directives (admonitions,
# notes) keep their text.
_FENCE = re.compile(r"^(?P<fence>`{3,}|:{3,})(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$",
                    re.MULTILINE | re.DOTALL)
_DROPPED = re.compile(r"^\{(figure|exercise|solution|solution-start|solution-end|code-cell|math|"
                      r"eval-rst|kltutorial-status)\}|^(python|bash|yaml|text|console|json)?\s*$")
_DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.DOTALL)
_EVAL = re.compile(r"\{eval\}`[^`]*`")
_ROLE = re.compile(r"\{[a-z-]+\}`([^`]*)`")
_INLINE_CODE = re.compile(r"`([^`]*)`")
_INLINE_MATH = re.compile(r"\$[^$\n]+\$")
_OPTION = re.compile(r"^:[\w-]+:.*$", re.MULTILINE)
_TARGET = re.compile(r"^\([\w-]+\)=\s*$", re.MULTILINE)
_WORD = re.compile(r"[A-Za-zÀ-ÿβ][A-Za-zÀ-ÿβ'’-]*|\d[\d,.]*")
_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+(?=[A-Z])|\n\s*\n")


@dataclass(frozen=True)
class ProseStats:
    """The counts of one page (or of several, added)."""

    words: int
    numbers: int
    sentences: int
    long_sentences: int

    def __add__(self, other: ProseStats) -> ProseStats:
        return ProseStats(self.words + other.words, self.numbers + other.numbers,
                          self.sentences + other.sentences, self.long_sentences + other.long_sentences)

    @property
    def numbers_per_100_words(self) -> float:
        return 100 * self.numbers / self.words if self.words else 0.0

    @property
    def long_share(self) -> float:
        """The share of sentences over :data:`LONG_SENTENCE` words."""
        return self.long_sentences / self.sentences if self.sentences else 0.0


def _drop_blocks(text: str) -> str:
    def keep(match: re.Match) -> str:
        info, body = match.group("info").strip(), match.group("body")
        if _DROPPED.match(info) or ":class: dropdown" in body or "dropdown" in info:
            return "\n"
        return "\n" + _OPTION.sub("", body) + "\n"

    previous = None
    while previous != text:  # nested fences: the innermost first, until none is left
        previous, text = text, _FENCE.sub(keep, text)
    return text


def prose_of(markdown: str) -> str:
    """The prose of a page's markdown, ``{eval}`` roles kept as the marker ``0`` (a number)."""
    text = _drop_blocks(markdown)
    text = _DISPLAY_MATH.sub(" ", text)
    text = _TARGET.sub("", text)
    text = _EVAL.sub("0", text)
    text = _ROLE.sub(lambda m: m.group(1).split("<")[0], text)
    text = _INLINE_CODE.sub(lambda m: m.group(1), text)
    text = _INLINE_MATH.sub("x", text)
    text = re.sub(r"^#+\s.*$", "", text, flags=re.MULTILINE)  # headings are not sentences
    text = re.sub(r"^\|.*\|\s*$", "", text, flags=re.MULTILINE)  # tables are not prose
    return text


def stats_of_text(markdown: str) -> ProseStats:
    """:class:`ProseStats` of one page's markdown."""
    prose = prose_of(markdown)
    sentences = [s for s in _SENTENCE_END.split(prose) if _WORD.search(s)]
    lengths = [len(_WORD.findall(s)) for s in sentences]
    return ProseStats(words=sum(lengths), numbers=len(_NUMBER.findall(prose)), sentences=len(sentences),
                      long_sentences=sum(n > LONG_SENTENCE for n in lengths))


def _markdown_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf8"))["cells"]
        return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    if path.suffix == ".md":
        return path.read_text(encoding="utf8")
    raise ValueError(f"path must be a .ipynb or .md page, got {path}")


def prose_stats(path: str | Path) -> ProseStats:
    """:class:`ProseStats` of the page at ``path`` (a notebook or a markdown page)."""
    return stats_of_text(_markdown_of(Path(path)))


def reading_minutes(stats: ProseStats) -> int:
    """Whole minutes to read ``stats.words`` at :data:`WORDS_PER_MINUTE` (at least 1)."""
    return max(1, math.ceil(stats.words / WORDS_PER_MINUTE))


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    total = ProseStats(0, 0, 0, 0)
    print(f"{'page':<40}{'words':>8}{'minutes':>9}{'numbers/100':>13}{'long %':>8}")
    for name in argv:
        s = prose_stats(name)
        total += s
        print(f"{Path(name).name:<40}{s.words:8d}{reading_minutes(s):9d}{s.numbers_per_100_words:13.1f}"
              f"{100 * s.long_share:8.1f}")
    print(f"{'all':<40}{total.words:8d}{reading_minutes(total):9d}{total.numbers_per_100_words:13.1f}"
          f"{100 * total.long_share:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
