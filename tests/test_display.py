"""Tests for kltutorial.display: the book shows the real source, without docstrings unless asked."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap

import pytest
from IPython.display import Code

from kltutorial import display
from kltutorial.display import show_source, source_of


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
    [(42, "int"), ("def f(): pass", "str"), (display, "module"), (len, "builtin_function_or_method"),
     (functools.partial(sample, 1), "partial"), (None, "NoneType")],
)
def test_anything_but_a_function_method_or_class_is_refused(obj: object, type_name: str) -> None:
    with pytest.raises(TypeError, match=f"must be a function, method or class, got {type_name}$"):
        source_of(obj)
    with pytest.raises(TypeError, match="must be a function, method or class"):
        show_source(obj)


def test_show_source_is_highlighted_python_of_source_of() -> None:
    shown = show_source(sample)
    assert isinstance(shown, Code)
    assert shown.language == "python"
    assert shown.data == SAMPLE_WITHOUT_DOCSTRING
    html = shown._repr_html_()
    assert "sample" in html and "Add one" not in html
    assert "<span" in html  # Pygments markup, not plain text


def test_show_source_passes_docstring_on() -> None:
    assert show_source(sample, docstring=True).data == source_of(sample, docstring=True)
    assert "Add one" in show_source(sample, docstring=True)._repr_html_()
