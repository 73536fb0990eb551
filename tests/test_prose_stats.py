"""Tests of tools/prose_stats.py: what counts as prose, its words, numbers and long sentences."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tools.prose_stats import (
    LONG_SENTENCE,
    ProseStats,
    book_pages,
    prose_of,
    prose_stats,
    reading_minutes,
    stats_of_text,
)


def test_code_maths_figures_exercises_and_folded_blocks_are_not_prose() -> None:
    text = """# A title

The penalty keeps the policy close. It costs 3 nats here, {eval}`f"{glued.kl:.2f}"` in the run.

```python
x = 1  # code is not prose
```

$$
J = r - \\beta\\,\\mathrm{KL}
$$

```{figure} images/a.png
:name: fig-a

A caption is not read top to bottom.
```

```{exercise} An exercise
:label: ex-a

Not prose either.
```

```{admonition} Precisely
:class: dropdown

Folded, so not on the path.
```

```{note}
A note is read.
```

| a table | is not prose |
|---|---|
"""
    prose = prose_of(text)
    for gone in ("code is not prose", "beta", "caption", "Not prose either", "Folded", "table", "title"):
        assert gone not in prose, gone
    assert "A note is read." in prose and "keeps the policy close" in prose
    s = stats_of_text(text)
    assert s.numbers == 2  # "3" and the {eval} role
    assert s.sentences == 3 and s.long_sentences == 0
    assert s.words == len("The penalty keeps the policy close".split()) + len(
        "It costs 3 nats here 0 in the run".split()) + len("A note is read".split())


def test_a_long_sentence_and_the_rates() -> None:
    long = " ".join(["word"] * (LONG_SENTENCE + 1)) + ". Short one here."
    s = stats_of_text(long)
    assert (s.sentences, s.long_sentences) == (2, 1) and s.long_share == 0.5
    assert ProseStats(200, 4, 10, 1).numbers_per_100_words == 2.0
    assert ProseStats(1, 0, 1, 0) + ProseStats(2, 1, 1, 1) == ProseStats(3, 1, 2, 1)
    assert reading_minutes(ProseStats(201, 0, 1, 0)) == 2 and reading_minutes(ProseStats(0, 0, 0, 0)) == 1


def test_a_notebook_counts_its_markdown_cells_only(tmp_path) -> None:
    nb = {"cells": [{"cell_type": "markdown", "source": ["One sentence of prose."], "metadata": {}},
                    {"cell_type": "code", "source": ["print('not prose')"], "metadata": {}, "outputs": [],
                     "execution_count": None}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "page.ipynb"
    path.write_text(json.dumps(nb), encoding="utf8")
    assert prose_stats(path) == ProseStats(4, 0, 1, 0)
    with pytest.raises(ValueError, match=r"\.ipynb or \.md"):
        prose_stats(tmp_path / "page.txt")


def test_folded_blocks_count_with_folded_and_the_book_splits_core_from_deep_dives(tmp_path) -> None:
    text = "Read this.\n\n```{admonition} Precisely\n:class: dropdown\n\nFolded words here.\n```\n"
    assert stats_of_text(text).words == 2
    assert stats_of_text(text, folded=True).words == 2 + 3
    (tmp_path / "book").mkdir()
    for name in ("intro.md", "a.md", "b.ipynb", "deep.md", "notes.md"):
        path = tmp_path / "book" / name
        if name.endswith(".ipynb"):
            path.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": ["Two words."]}]}))
        else:
            path.write_text("One two three.\n")
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nparts:\n"
        "  - caption: Sections\n    chapters:\n      - file: book/a\n        sections:\n"
        "          - file: book/b\n"
        "  - caption: Deep dives\n    chapters:\n      - file: book/deep\n"
        "  - caption: Appendix\n    chapters:\n      - file: book/notes\n")
    core, rest = book_pages(tmp_path / "_toc.yml")
    assert [p.name for p in core] == ["intro.md", "a.md", "b.ipynb"]
    assert [p.name for p in rest] == ["deep.md", "notes.md"]
    assert sum(prose_stats(p).words for p in core) == 3 + 3 + 2


def test_a_sections_exercises_are_not_on_the_path() -> None:
    text = "Read this.\n\n## Exercises\n\nEach exercise is one of three kinds.\n\nA solution's words.\n"
    assert stats_of_text(text).words == 2 and stats_of_text(text, folded=True).words == 2
    assert stats_of_text("## Exercises to come\n\nRead this too.\n").words == 3  # only the heading itself


def test_sentences_end_before_a_lower_case_word_and_at_each_list_item() -> None:
    text = ("k1 is the log-ratio. k3 is another estimate, e.g. of the same KL. `token_kl` computes it.\n\n"
            "* one item here\n* another item\n- a third\n1. a fourth\n")
    s = stats_of_text(text)
    assert s.sentences == 3 + 4


def test_a_folded_block_inside_a_list_item_is_folded() -> None:
    text = ("1. Do this first.\n\n   ```{admonition} Precisely\n   :class: dropdown\n\n"
            "   Folded words.\n   ```\n")
    assert stats_of_text(text).words == 3 and stats_of_text(text, folded=True).words == 3 + 2
    assert stats_of_text(text).numbers == 0


def test_a_link_to_a_page_reads_as_its_title_not_its_file_name() -> None:
    s = stats_of_text("As {doc}`04-estimating-kl` showed, and {doc}`the card <kl-in-one-page>` says.")
    assert s.numbers == 0 and s.words == len("As section showed and the card says".split())


# The teach-first budgets of CONTRIBUTING.md ("The teach-first redesign"), on the book as it is: the core
# path (the pages of _toc.yml outside its Deep dives and Appendix parts, folded blocks and exercises left
# out) is short and plain, and the whole book, folded blocks and deep dives included, is shorter than the
# 46,100 words it held before the redesign (tools/prose_stats.py on main at 18e5b9d).
ROOT = Path(__file__).resolve().parents[1]
CORE_WORDS, NUMBERS_PER_100, LONG_SHARE, WHOLE_BOOK_BEFORE = 20_000, 2.0, 0.10, 46_100
SECTIONS = sorted((ROOT / "book").glob("[01][0-9]-*.ipynb"))
DISPLAY_MATH = re.compile(r"\$\$|```\{math\}")
TAKEAWAYS = re.compile(r"```\{admonition\} Takeaways\n:class: tip\n")


def _total(pages: list[Path], folded: bool = False) -> ProseStats:
    return sum((prose_stats(p, folded=folded) for p in pages), ProseStats(0, 0, 0, 0))


def test_the_core_path_meets_its_budgets() -> None:
    core, _ = book_pages(ROOT / "_toc.yml")
    total = _total(core)
    assert total.words <= CORE_WORDS, f"the core path holds {total.words:,} words (at most {CORE_WORDS:,})"
    assert total.numbers_per_100_words <= NUMBERS_PER_100, (
        f"{total.numbers_per_100_words:.2f} numbers per 100 words on the core path "
        f"(at most {NUMBERS_PER_100})")
    assert total.long_share <= LONG_SHARE, (
        f"{100 * total.long_share:.1f} % of the core path's sentences run over {LONG_SENTENCE} words")


def test_the_whole_book_is_shorter_than_before_the_redesign() -> None:
    core, rest = book_pages(ROOT / "_toc.yml")
    whole = _total(core + rest, folded=True)
    assert whole.words < WHOLE_BOOK_BEFORE, f"{whole.words:,} words, folded blocks and deep dives included"


@pytest.mark.parametrize("section", SECTIONS, ids=[p.stem for p in SECTIONS])
def test_a_section_opens_with_words_and_closes_with_takeaways(section: Path) -> None:
    cells = json.loads(section.read_text(encoding="utf8"))["cells"]
    markdown = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    before_maths = DISPLAY_MATH.split(markdown, maxsplit=1)[0]
    assert stats_of_text(before_maths).words >= 60, (
        f"{section.name}: its key idea in words (at least 60) comes before its first display equation")
    body = markdown.split("\n## Exercises", 1)[0]
    boxes = list(TAKEAWAYS.finditer(body))
    assert boxes, f"{section.name}: no Takeaways box (```{{admonition}} Takeaways, :class: tip)"
    after = body[boxes[-1].end():]
    assert after.count("```") == 1, (
        f"{section.name}: the Takeaways box is not the last thing before its exercises")
