"""Showing the package's own code in the book (all sections).

The notebooks never copy code into prose: they display the source of the function that runs, so that
what a reader sees is what is executed and tested, and nbval notices when the two drift apart.

:func:`show_source` returns a :class:`SourceListing`, whose rich display is a fenced ``python`` block
(``text/markdown``) with the bare code as ``text/plain`` fallback, and deliberately no ``text/html``.
myst-nb prefers ``text/markdown`` to ``text/plain`` for HTML (its render priority 80 against 100) and renders
it through Sphinx as an ordinary code block, so the listing takes the theme's own light and dark Pygments
styles and copy button; JupyterLab renders the same markdown. (IPython's ``Code`` object embedded a fixed
Pygments style sheet in its HTML instead: a bright frame around the code in dark mode, and a
``pre { line-height: 125% }`` rule that leaked into every code block of the page.)
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from typing import Any

__all__ = ["SourceListing", "source_of", "show_source"]


def source_of(obj: Any, docstring: bool = False) -> str:
    """The source of a function or class, optionally without its docstrings.

    Parameters
    ----------
    obj : function, method or class
        What to show.
    docstring : bool
        Keep the docstrings (of the object and, for a class, of its methods). Off by default: the
        book explains the code in prose around it.
    """
    if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj)):
        raise TypeError(f"obj must be a function, method or class, got {type(obj).__name__}")
    src = textwrap.dedent(inspect.getsource(obj))
    if docstring:
        return src.rstrip() + "\n"
    tree = ast.parse(src)
    lines = src.splitlines()
    drop: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                first.value.value, str
            ):
                drop.update(range(first.lineno - 1, first.end_lineno))
    kept = [line for i, line in enumerate(lines) if i not in drop]
    return "\n".join(kept).rstrip() + "\n"


class SourceListing:
    """Source code to display: a fenced code block as ``text/markdown``, the bare code as ``text/plain``.

    Parameters
    ----------
    code : str
        The code, shown exactly as given.
    language : str
        The fence's language, which picks the highlighter (Pygments' lexer name).
    """

    def __init__(self, code: str, language: str = "python") -> None:
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        if not re.fullmatch(r"[\w+#.-]+", language):
            raise ValueError(f"language must be a lexer name such as 'python', got {language!r}")
        self.code = code
        self.language = language

    def _repr_markdown_(self) -> str:
        # A fence longer than any run of backticks in the code, so the code cannot close it.
        longest = max((len(run) for run in re.findall(r"`+", self.code)), default=0)
        fence = "`" * max(3, longest + 1)
        body = self.code if self.code.endswith("\n") else self.code + "\n"
        return f"{fence}{self.language}\n{body}{fence}\n"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.code.rstrip("\n"))

    def __str__(self) -> str:
        return self.code

    def __repr__(self) -> str:
        return f"SourceListing({self.code!r}, language={self.language!r})"


def show_source(obj: Any, docstring: bool = False) -> SourceListing:
    """Display :func:`source_of` ``obj`` as highlighted Python in a notebook (see :class:`SourceListing`)."""
    return SourceListing(source_of(obj, docstring=docstring), language="python")
