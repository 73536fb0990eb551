"""Showing the package's own code in the book (all sections).

The notebooks never copy code into prose: they display the source of the function that runs, so that
what a reader sees is what is executed and tested, and nbval notices when the two drift apart.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

__all__ = ["source_of", "show_source"]


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


def show_source(obj: Any, docstring: bool = False) -> Any:
    """Display :func:`source_of` ``obj`` as highlighted Python in a notebook."""
    from IPython.display import Code

    return Code(source_of(obj, docstring=docstring), language="python")
