"""Tests of tools/prose_stats.py: what counts as prose, its words, numbers and long sentences."""

from __future__ import annotations

import json

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
