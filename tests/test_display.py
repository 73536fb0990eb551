"""Tests for kltutorial.book: the book shows the real source, without docstrings unless asked,
as a Markdown code block that the book's theme and JupyterLab highlight."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap

import pytest
from IPython.core.formatters import format_display_data
from markdown_it import MarkdownIt
from myst_nb.core.render import base_render_priority

from kltutorial import book
from kltutorial.book import SourceListing, show_source, source_of


# Objects to show. Their exact text is part of the expected values below.
def sample(x: int) -> int:
    """Add one.

    A docstring over several lines.
    """
    note = "a string that is not a docstring"
    return x + len(note)  # the comment stays


class Sample:
    """A class docstring."""

    scale = 2

    def method(self, x: int) -> int:
        """A method docstring."""
        return self.scale * x

    def nested(self) -> int:
        def inner() -> int:
            """An inner docstring."""
            return 1

        return inner()


SAMPLE_WITHOUT_DOCSTRING = '''\
def sample(x: int) -> int:
    note = "a string that is not a docstring"
    return x + len(note)  # the comment stays
'''

CLASS_WITHOUT_DOCSTRINGS = '''\
class Sample:

    scale = 2

    def method(self, x: int) -> int:
        return self.scale * x

    def nested(self) -> int:
        def inner() -> int:
            return 1

        return inner()
'''


def _without_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` with the docstring removed from every function and class body."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and ast.get_docstring(
            node, clean=False
        ) is not None:
            node.body = node.body[1:]
    return tree


def test_function_is_shown_without_its_docstring() -> None:
    assert source_of(sample) == SAMPLE_WITHOUT_DOCSTRING


def test_class_is_shown_without_the_docstrings_of_its_methods_and_inner_functions() -> None:
    assert source_of(Sample) == CLASS_WITHOUT_DOCSTRINGS


def test_method_is_dedented_to_the_left_margin() -> None:
    expected = "def method(self, x: int) -> int:\n    return self.scale * x\n"
    assert source_of(Sample.method) == expected
    assert source_of(Sample().method) == expected  # a bound method shows the same code


def test_docstring_true_keeps_the_source_as_written() -> None:
    shown = source_of(sample, docstring=True)
    assert shown == textwrap.dedent(inspect.getsource(sample))
    assert '"""Add one.\n\n    A docstring over several lines.\n    """' in shown
    assert '"""A method docstring."""' in source_of(Sample, docstring=True)


@pytest.mark.parametrize("obj", [sample, Sample, Sample.method, source_of, show_source])
@pytest.mark.parametrize("docstring", [False, True])
def test_shown_code_is_the_real_code(obj: object, docstring: bool) -> None:
    """The shown text parses to the object's own syntax tree, docstrings aside, and ends in one newline."""
    shown = source_of(obj, docstring=docstring)
    original = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    expected = original if docstring else _without_docstrings(original)
    assert ast.dump(ast.parse(shown)) == ast.dump(expected)
    assert shown.endswith("\n") and not shown.endswith("\n\n")


def test_package_function_loses_only_its_docstring() -> None:
    shown = source_of(source_of)
    assert shown.startswith("def source_of(obj: Any, docstring: bool = False) -> str:\n")
    assert "Parameters" not in shown and '"""' not in shown
    assert "raise TypeError(" in shown
    assert "The source of a function or class" in source_of(source_of, docstring=True)


@pytest.mark.parametrize(
    ("obj", "type_name"),
    [(42, "int"), ("def f(): pass", "str"), (book, "module"), (len, "builtin_function_or_method"),
     (functools.partial(sample, 1), "partial"), (None, "NoneType")],
)
def test_anything_but_a_function_method_or_class_is_refused(obj: object, type_name: str) -> None:
    with pytest.raises(TypeError, match=f"must be a function, method or class, got {type_name}$"):
        source_of(obj)
    with pytest.raises(TypeError, match="must be a function, method or class"):
        show_source(obj)


def _fenced_blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block, as a CommonMark parser reads ``markdown``."""
    tokens = MarkdownIt("commonmark").parse(markdown)
    return [(t.info.strip(), t.content) for t in tokens if t.type == "fence"]


def _shown_mime(bundle: dict) -> str:
    """The MIME type myst-nb renders in an HTML build: the lowest priority number it has."""
    priority = base_render_priority()["html"]
    return min((m for m in bundle if priority.get(m) is not None), key=priority.__getitem__)


def test_show_source_is_a_python_code_block_of_source_of() -> None:
    shown = show_source(sample)
    assert isinstance(shown, SourceListing)
    assert shown.code == SAMPLE_WITHOUT_DOCSTRING and shown.language == "python"
    assert _fenced_blocks(shown._repr_markdown_()) == [("python", SAMPLE_WITHOUT_DOCSTRING)]


def test_show_source_displays_as_markdown_without_html_or_style_sheet() -> None:
    """The notebook output is text/markdown (rendered by Sphinx and JupyterLab) plus plain text, no HTML.

    An HTML output with its own Pygments style sheet ignored the theme's dark mode and set
    ``pre { line-height }`` for the whole page: it must not come back.
    """
    bundle, _ = format_display_data(show_source(Sample))
    assert set(bundle) == {"text/markdown", "text/plain"}
    assert _shown_mime(bundle) == "text/markdown"  # what myst-nb puts on the HTML page
    assert _fenced_blocks(bundle["text/markdown"]) == [("python", CLASS_WITHOUT_DOCSTRINGS)]
    assert bundle["text/plain"] == CLASS_WITHOUT_DOCSTRINGS.rstrip("\n")
    assert "<style" not in bundle["text/markdown"] and "line-height" not in bundle["text/markdown"]


def test_show_source_passes_docstring_on() -> None:
    shown = show_source(sample, docstring=True)
    assert shown.code == source_of(sample, docstring=True)
    assert "Add one" in shown._repr_markdown_() and "Add one" not in show_source(sample)._repr_markdown_()


@pytest.mark.parametrize("code", ["x = '```'\n", "s = '````python'\n", "`", "no newline at the end"])
def test_backticks_in_the_code_cannot_close_the_fence(code: str) -> None:
    blocks = _fenced_blocks(SourceListing(code)._repr_markdown_())
    assert blocks == [("python", code if code.endswith("\n") else code + "\n")]


def test_listing_shows_the_code_as_str_and_checks_its_arguments() -> None:
    listing = SourceListing("x = 1\n", language="pycon")
    assert str(listing) == "x = 1\n"
    assert _fenced_blocks(listing._repr_markdown_()) == [("pycon", "x = 1\n")]
    assert eval(repr(listing), {"SourceListing": SourceListing}).code == "x = 1\n"
    with pytest.raises(TypeError, match="code must be a str, got bytes"):
        SourceListing(b"x = 1")
    with pytest.raises(ValueError, match="language must be a lexer name"):
        SourceListing("x = 1", language="python\n```")


# --- glue: the prose's numbers, for the book and for JupyterLab ----------------------------------


@pytest.fixture
def glue_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Record what reaches myst_nb.glue, and give each test an empty ``glued``."""
    import myst_nb

    calls: list[tuple] = []
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: calls.append(
        (name, value, display)))
    monkeypatch.setattr(book, "glued", book.GluedValues())
    return calls


def test_glue_hands_the_value_to_myst_nb_and_keeps_it_on_glued(glue_calls: list[tuple]) -> None:
    book.glue("kl_mean", 0.123)
    book.glue("n_runs", 12, display=True)
    assert glue_calls == [("kl_mean", 0.123, False), ("n_runs", 12, True)]
    assert book.glued.kl_mean == 0.123 and book.glued.n_runs == 12
    assert repr(book.glued) == "GluedValues(kl_mean, n_runs)"
    # A cell run again replaces the value, as the glue output in the notebook is replaced.
    book.glue("kl_mean", 0.5)
    assert book.glued.kl_mean == 0.5


def test_glue_keys_that_are_not_identifiers_are_glued_but_not_attributes(glue_calls: list[tuple]) -> None:
    figure = object()
    book.glue("fig-kl-estimates", figure)
    book.glue("class", "a keyword")
    assert [c[0] for c in glue_calls] == ["fig-kl-estimates", "class"]
    assert vars(book.glued) == {}


def test_a_name_not_glued_yet_says_so(glue_calls: list[tuple]) -> None:
    with pytest.raises(AttributeError, match="nothing is glued under 'kl' yet: run the cell that glues it"):
        book.glued.kl  # noqa: B018
    assert not hasattr(book.glued, "__wrapped__")  # dunder look-ups stay ordinary


@pytest.mark.parametrize(("name", "display_flag", "error", "message"), [
    (3, False, TypeError, "name must be a str, got int"),
    ("", False, ValueError, "name must be a non-empty glue key"),
    (" kl", False, ValueError, "without surrounding spaces, got ' kl'"),
    ("kl", "yes", TypeError, "display must be a bool, got str"),
])
def test_glue_refuses_bad_arguments(glue_calls: list[tuple], name: object, display_flag: object,
                                    error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        book.glue(name, 0.1, display=display_flag)
    assert glue_calls == []


def test_the_prose_expression_gives_the_same_text_in_the_kernel_and_in_the_book(
        glue_calls: list[tuple]) -> None:
    """What jupyterlab-myst evaluates in the kernel equals what the book evaluates from the outputs."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import myst_eval

    book.glue("kl", round(0.123456, 3))
    book.glue("share", 0.25)
    expression = 'f"{glued.kl:.3f} nats, {glued.share:.0%} of it"'
    in_kernel = eval(expression, {"glued": book.glued})  # noqa: S307  (what the kernel does)
    in_book = myst_eval.evaluate(expression, {"kl": 0.123, "share": 0.25})
    assert in_kernel == in_book == "0.123 nats, 25% of it"


# --- glue_many: several numbers of one precision at once --------------------------------------------


def test_glue_many_glues_plain_rounded_numbers_in_order(glue_calls: list[tuple]) -> None:
    import numpy as np
    import torch

    book.glue_many({"kl_mean": np.float64(0.123456), "kl_max": torch.tensor(1.98765),
                       "n_runs": np.int64(12), "n_seeds": 5, "tiny": -0.0001, "label": "k3",
                       "share": 0.5}, digits=3)
    assert glue_calls == [("kl_mean", 0.123, False), ("kl_max", 1.988, False), ("n_runs", 12, False),
                          ("n_seeds", 5, False), ("tiny", 0.0, False), ("label", "k3", False),
                          ("share", 0.5, False)]
    # plain Python numbers, as glue's convention asks (what nbval compares and myst_eval reads)
    assert [type(c[1]) for c in glue_calls] == [float, float, int, int, float, str, float]
    assert str(glue_calls[4][1]) == "0.0"  # not -0.0
    assert book.glued.kl_max == 1.988 and book.glued.n_runs == 12


def test_glue_many_with_no_digits_glues_ints_as_round_does(glue_calls: list[tuple]) -> None:
    book.glue_many({"bias_pct": 12.6, "count": 3}, digits=0)
    assert glue_calls == [("bias_pct", 13, False), ("count", 3, False)]
    assert type(glue_calls[0][1]) is int


@pytest.mark.parametrize(("values", "digits", "error", "message"), [
    ({"kl": 0.1, "fig": object()}, 2, TypeError, "'fig': glue_many glues numbers and strings, got object"),
    ({"kl": 0.1, "flag": True}, 2, TypeError, "'flag': glue_many glues numbers and strings, got bool"),
    ({"kl": float("nan")}, 2, ValueError, "'kl': nan is not a finite number"),
    ({"kl": 0.1, " kl": 1.0}, 2, ValueError, "without surrounding spaces, got ' kl'"),
    ({"kl": 0.1}, -1, ValueError, "digits must be a non-negative int, got -1"),
    ({"kl": 0.1}, 2.0, ValueError, "digits must be a non-negative int, got 2.0"),
    ([("kl", 0.1)], 2, TypeError, "values must be a mapping of glue keys to values, got list"),
])
def test_glue_many_checks_everything_before_gluing_anything(
        glue_calls: list[tuple], values: object, digits: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        book.glue_many(values, digits=digits)
    assert glue_calls == []


# --- print_table: the notebooks' printed tables --------------------------------------------------


def _near_zero_row() -> list[tuple]:
    import numpy as np
    import torch

    return [(-0.0004, np.float64(-0.001), torch.tensor(-0.0002), -0.006, -0.0004)]


@pytest.mark.parametrize(("rows", "columns", "kwargs", "printed"), [
    pytest.param(
        {"π_ref": (0.0, 0.0241, 1.915), "β = 0.001": (12.629, 2.011, -5.0)},
        {"": "", "KL (nats)": ".3f", "proxy": ".3f", "gold": ".2f"}, {},
        "          KL (nats) proxy  gold\n"
        "    π_ref     0.000 0.024  1.92\n"
        "β = 0.001    12.629 2.011 -5.00\n",
        id="labelled rows, aligned right"),
    pytest.param(
        [("ppo-k1-reward", 2.16, 0.03, 4), ("dr-grpo-k3-loss", 1.73, 0.055, 12)],
        [("recipe", "<"), ("min", ".2f"), ("min", ".3f"), ("step", "d")], {"gap": 2},
        "recipe            min    min  step\n"
        "ppo-k1-reward    2.16  0.030     4\n"
        "dr-grpo-k3-loss  1.73  0.055    12\n",
        id="a left-aligned column, a repeated header, a wider gap"),
    pytest.param(
        _near_zero_row(), [("a", ".2f"), ("b", ".2f"), ("c", ".2f"), ("d", ".2f"), ("e", ".1%")], {},
        "   a    b    c     d    e\n"
        "0.00 0.00 0.00 -0.01 0.0%\n",
        id="a number that rounds to zero is written without its sign"),
])
def test_print_table_prints_an_aligned_header_and_rows(
        capsys: pytest.CaptureFixture[str], rows: object, columns: object, kwargs: dict,
        printed: str) -> None:
    book.print_table(rows, columns, **kwargs)
    assert capsys.readouterr().out == printed


@pytest.mark.parametrize(("rows", "columns", "kwargs", "message"), [
    ([(1.0, 2.0)], {"x": ".1f"}, {}, r"row 0 has 2 values for 1 columns: \(1.0, 2.0\)"),
    ({"a": (1.0,)}, {"": "", "x": ".1f", "y": ".1f"}, {}, "row 0 has 2 values for 3 columns"),
    ([(1.0,)], {}, {}, "columns must be a non-empty mapping"),
    ([(1.0,)], [("x",)], {}, "columns must be a non-empty mapping"),
    ([(1.0,)], {"x": ".1f"}, {"gap": -1}, "gap must be a non-negative int, got -1"),
    ([("a" * 80, 1.0)], [("name", ""), ("value", ".3f")], {"max_width": 80},
     "the table is 86 characters wide, more than 80"),
    ([("a" * 82, 1.0)], [("name", ""), ("value", ".3f")], {"gap": 3},
     "the table is 90 characters wide, more than 88"),
])
def test_print_table_refuses_bad_rows_and_lines_wider_than_the_column(
        capsys: pytest.CaptureFixture[str], rows: object, columns: object, kwargs: dict,
        message: str) -> None:
    with pytest.raises(ValueError, match=message):
        book.print_table(rows, columns, **kwargs)
    assert capsys.readouterr().out == ""


def test_print_table_without_a_width_limit(capsys: pytest.CaptureFixture[str]) -> None:
    book.print_table([("a" * 100,)], [("name", "")], max_width=None)
    assert [len(line) for line in capsys.readouterr().out.splitlines()] == [100, 100]
