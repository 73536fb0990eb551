"""Showing the package's own code, and the numbers of its prose, in the book (all sections).

The notebooks never copy code into prose: they display the source of the function that runs, so that
what a reader sees is what is executed and tested, and nbval notices when the two drift apart.

:func:`show_source` returns a :class:`SourceListing`, whose rich display is a fenced ``python`` block
(``text/markdown``) with the bare code as ``text/plain`` fallback, and deliberately no ``text/html``.
myst-nb prefers ``text/markdown`` to ``text/plain`` for HTML (its render priority 80 against 100) and renders
it through Sphinx as an ordinary code block, so the listing takes the theme's own light and dark Pygments
styles and copy button; JupyterLab renders the same markdown. (IPython's ``Code`` object embedded a fixed
Pygments style sheet in its HTML instead: a bright frame around the code in dark mode, and a
``pre { line-height: 125% }`` rule that leaked into every code block of the page.)

:func:`glue` is how a notebook hands a number to its prose, and :data:`glued` where the prose
reads it: the prose writes ``{eval}`` with an f-string, ``f"{glued.kl:.3f}"``, which the book
evaluates over the glued values stored in the notebook (tools/myst_eval.py) and jupyterlab-myst
evaluates in the reader's kernel, where :func:`glue` has put the same value on :data:`glued`.
"""

from __future__ import annotations

import ast
import inspect
import keyword
import re
import textwrap
from typing import Any

__all__ = ["SourceListing", "source_of", "show_source", "glue", "glued", "GluedValues"]



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



class GluedValues:
    """The values a notebook glued, by name: ``glued.kl_mean`` (see :func:`glue`).

    A notebook's prose shows its numbers with the ``{eval}`` role, as ``f"{glued.kl_mean:.3f}"``:
    jupyterlab-myst evaluates that in the reader's kernel, where ``glued`` is this object, and the
    book evaluates it over the values stored in the notebook's glue outputs (tools/myst_eval.py).
    The prose never reads a variable of the notebook's code, so a glued name cannot collide with
    one, and a value glued in a loop (``glue(f"kl_{name}", ...)``) is shown like any other.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"nothing is glued under {name!r} yet: run the cell that glues it "
                             "(the notebook's cells run top to bottom)")

    def __repr__(self) -> str:
        names = sorted(vars(self))
        return f"GluedValues({', '.join(names)})" if names else "GluedValues()"


#: The values this kernel glued, as attributes: what the prose's ``{eval}`` expressions read.
glued = GluedValues()


def glue(name: str, value: Any, display: bool = False) -> None:
    """Glue ``value`` under ``name`` for the book (``myst_nb.glue``), and keep it as ``glued.<name>``.

    The prose shows a glued number with the ``{eval}`` role and an f-string over :data:`glued`,
    ``f"{glued.kl_mean:.3f}"``. The book evaluates that over the glued values stored in the notebook;
    JupyterLab (jupyterlab-myst) evaluates it in the reader's kernel, where :data:`glued` holds the
    same values because this function put them there.

    Parameters
    ----------
    name : str
        The glue key. A key that is a Python identifier is also an attribute of :data:`glued`;
        others (figures, ``"fig-kl-estimates"``) are glued only.
    value : object
        A number or string rounded to the precision its prose prints (what nbval compares), or a
        figure or other displayable object.
    display : bool
        Also show ``value`` as this cell's output (``myst_nb.glue``'s ``display``).

    Examples
    --------
    In a notebook cell, ``glue("kl_mean", round(float(kl.mean()), 3))``; the Markdown shows it with
    the ``{eval}`` role and the expression ``f"{glued.kl_mean:.3f}"``.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not name or name != name.strip():
        raise ValueError(f"name must be a non-empty glue key without surrounding spaces, got {name!r}")
    if not isinstance(display, bool):
        raise TypeError(f"display must be a bool, got {type(display).__name__}")
    from myst_nb import glue as myst_nb_glue  # the book's dependency, needed only in a notebook

    myst_nb_glue(name, value, display=display)
    if name.isidentifier() and not keyword.iskeyword(name):
        setattr(glued, name, value)
