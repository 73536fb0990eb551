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
