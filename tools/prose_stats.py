"""How much a page asks of its reader: the words of its prose, its numbers, its long sentences.

Prose is what a reader reads top to bottom: the markdown of a notebook's markdown cells (or of a ``.md``
page) up to its ``## Exercises`` heading, without code blocks, display maths, figures (their captions
included), exercises, solutions and folded blocks (``:class: dropdown``), and without the MyST markup
itself (roles, targets, directive options). A number is a run of digits in that prose, or an ``{eval}``
role (which shows one). A sentence ends at ``.``, ``?`` or ``!`` followed by a space (not in "e.g." and
the like), at the end of a paragraph, or where a list item begins.

The status page shows each page's reading time (:func:`reading_minutes`, at :data:`WORDS_PER_MINUTE`, the
book's ``myst_words_per_minute``) beside its execution time; the teach-first plan of CONTRIBUTING.md
holds the core path to its budgets with these counts::

    .venv/bin/python tools/prose_stats.py book/*.ipynb book/*.md
    .venv/bin/python tools/prose_stats.py --book     # the pages of _toc.yml: core path, deep dives, totals

The last column, ``folded+``, counts a page's words with its folded blocks too.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WORDS_PER_MINUTE", "LONG_SENTENCE", "ProseStats", "prose_of", "stats_of_text", "prose_stats",
           "reading_minutes", "book_pages", "CORE_EXCLUDED_PARTS", "main"]

WORDS_PER_MINUTE = 200  #: as _config.yml's myst words_per_minute
LONG_SENTENCE = 40  #: words; a sentence longer than this counts as long

# Fenced blocks: ``` or ::: fences of any length, with what they hold. Those left out of the prose
# entirely (code, maths, figures, exercises, solutions, folded blocks); other directives (admonitions,
# notes) keep their text.
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|:{3,})(?P<info>[^\n]*)\n(?P<body>.*?)"
                    r"^(?P=indent)(?P=fence)[ \t]*$", re.MULTILINE | re.DOTALL)  # indented in a list too
_DROPPED = re.compile(r"^\{(figure|exercise|solution|solution-start|solution-end|code-cell|math|"
                      r"eval-rst|kltutorial-status)\}|^(python|bash|yaml|text|console|json)?\s*$")
_EXERCISES = re.compile(r"^## Exercises[ \t]*$", re.MULTILINE)
_DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.DOTALL)
_EVAL = re.compile(r"\{eval\}`[^`]*`")
_DOC = re.compile(r"\{doc\}`([^`]*)`")  # a link to a page shows the page's title, not its file name
_ROLE = re.compile(r"\{[a-z-]+\}`([^`]*)`")
_INLINE_CODE = re.compile(r"`([^`]*)`")
_INLINE_MATH = re.compile(r"\$[^$\n]+\$")
_OPTION = re.compile(r"^[ \t]*:[\w-]+:.*$", re.MULTILINE)
_TARGET = re.compile(r"^\([\w-]+\)=\s*$", re.MULTILINE)
_WORD = re.compile(r"[A-Za-zÀ-ÿβ][A-Za-zÀ-ÿβ'’-]*|\d[\d,.]*")
_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
# A sentence ends at . ? or ! followed by a space (not after "e.g.", "i.e.", "et al.", "vs.", "cf."), at a
# paragraph's end, or where a list item begins (a numbered item's "1." ends nothing).
_SENTENCE_END = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bal\.)(?<!\bvs\.)(?<!\bcf\.)"
                           r"(?<!\n\d\.)(?<!\n\d\d\.)(?<=[.?!])\s+(?=\S)|\n\s*\n|\n(?=\s*(?:[*+-]|\d+\.)\s)")


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


def _drop_blocks(text: str, folded: bool = False) -> str:
    def keep(match: re.Match) -> str:
        info, body = match.group("info").strip(), match.group("body")
        if _DROPPED.match(info) or (not folded and (":class: dropdown" in body or "dropdown" in info)):
            return "\n"
        return "\n" + _OPTION.sub("", body) + "\n"

    previous = None
    while previous != text:  # nested fences: the innermost first, until none is left
        previous, text = text, _FENCE.sub(keep, text)
    return text


def prose_of(markdown: str, folded: bool = False) -> str:
    """The prose of a page's markdown, ``{eval}`` roles kept as the marker ``0`` (a number).

    With ``folded`` the folded blocks' text counts too (the whole page, as against its reading path).
    """
    text = _EXERCISES.split(markdown, maxsplit=1)[0]  # a section's exercises close it: not on the path
    text = _drop_blocks(text, folded)
    text = _DISPLAY_MATH.sub(" ", text)
    text = _TARGET.sub("", text)
    text = _EVAL.sub("0", text)
    text = _DOC.sub(lambda m: m.group(1).split("<")[0] if "<" in m.group(1) else "section", text)  # its title
    text = _ROLE.sub(lambda m: m.group(1).split("<")[0], text)
    text = _INLINE_CODE.sub(lambda m: m.group(1), text)
    text = _INLINE_MATH.sub("x", text)
    text = re.sub(r"^#+\s.*$", "", text, flags=re.MULTILINE)  # headings are not sentences
    text = re.sub(r"^([ \t]*)\d+\.(?=\s)", r"\1*", text, flags=re.MULTILINE)  # a list's "1." is no number
    text = re.sub(r"^\|.*\|\s*$", "", text, flags=re.MULTILINE)  # tables are not prose
    return text


def stats_of_text(markdown: str, folded: bool = False) -> ProseStats:
    """:class:`ProseStats` of one page's markdown (its folded blocks too with ``folded``)."""
    prose = prose_of(markdown, folded)
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


def prose_stats(path: str | Path, folded: bool = False) -> ProseStats:
    """:class:`ProseStats` of the page at ``path`` (a notebook or a markdown page; ``folded``: its folded
    blocks too)."""
    return stats_of_text(_markdown_of(Path(path)), folded)


def reading_minutes(stats: ProseStats) -> int:
    """Whole minutes to read ``stats.words`` at :data:`WORDS_PER_MINUTE` (at least 1)."""
    return max(1, math.ceil(stats.words / WORDS_PER_MINUTE))


CORE_EXCLUDED_PARTS = ("Deep dives", "Appendix")  #: the parts of ``_toc.yml`` off the core path


def book_pages(toc: str | Path = "_toc.yml") -> tuple[list[Path], list[Path]]:
    """The pages of the core path (the root and every part but :data:`CORE_EXCLUDED_PARTS`) and the rest,
    in the order of ``toc``, as paths relative to its folder."""
    import yaml

    toc = Path(toc)
    data = yaml.safe_load(toc.read_text(encoding="utf8"))

    def files(entries: list[dict]) -> list[str]:
        out = []
        for entry in entries:
            out.append(entry["file"])
            out += files(entry.get("sections", []))
        return out

    def path(name: str) -> Path:
        candidates = [toc.parent / f"{name}{suffix}" for suffix in (".ipynb", ".md")]
        return next((c for c in candidates if c.exists()), candidates[0])

    core, rest = [path(data["root"])], []
    for part in data.get("parts", []):
        (rest if part.get("caption") in CORE_EXCLUDED_PARTS else core).extend(
            path(f) for f in files(part["chapters"]))
    return core, rest


def _row(name: str, s: ProseStats, whole: ProseStats) -> str:
    return (f"{name:<40}{s.words:8d}{reading_minutes(s):9d}{s.numbers_per_100_words:13.1f}"
            f"{100 * s.long_share:8.1f}{whole.words:8d}")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    groups: list[tuple[str, list[Path]]]
    if argv[0] == "--book":  # the pages of _toc.yml: the core path, then the rest
        core, rest = book_pages(argv[1] if len(argv) > 1 else "_toc.yml")
        groups = [("core path", core), ("deep dives and appendix", rest)]
    else:
        groups = [("all", [Path(a) for a in argv])]
    print(f"{'page':<40}{'words':>8}{'minutes':>9}{'numbers/100':>13}{'long %':>8}{'folded+':>8}")
    book, book_whole = ProseStats(0, 0, 0, 0), ProseStats(0, 0, 0, 0)
    for label, pages in groups:
        total, total_whole = ProseStats(0, 0, 0, 0), ProseStats(0, 0, 0, 0)
        for page in pages:
            s, whole = prose_stats(page), prose_stats(page, folded=True)
            total, total_whole = total + s, total_whole + whole
            print(_row(page.name, s, whole))
        print(_row(label, total, total_whole))
        book, book_whole = book + total, book_whole + total_whole
    if len(groups) > 1:
        print(_row("whole book", book, book_whole))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
