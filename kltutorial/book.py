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
import math
import numbers
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["SourceListing", "source_of", "show_source", "glue", "glue_many", "glued", "GluedValues",
           "print_table", "power_of_ten"]



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


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_of_ten(value: float) -> str:
    """An exact power of ten as prose writes it, ``10⁻⁹``, for glueing where the prose shows a tolerance.

    >>> power_of_ten(1e-9), power_of_ten(100.0)
    ('10⁻⁹', '10²')
    >>> power_of_ten(2e-9)
    Traceback (most recent call last):
        ...
    ValueError: power_of_ten needs an exact power of ten (1e-9, 100), got 2e-09
    """
    exponent = round(math.log10(value)) if isinstance(value, (int, float)) and value > 0 else None
    if exponent is None or value != 10.0 ** exponent:
        raise ValueError(f"power_of_ten needs an exact power of ten (1e-9, 100), got {value!r}")
    return "10" + str(exponent).translate(_SUPERSCRIPT)


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
    _check_glue_key(name)
    if not isinstance(display, bool):
        raise TypeError(f"display must be a bool, got {type(display).__name__}")
    from myst_nb import glue as myst_nb_glue  # the book's dependency, needed only in a notebook

    myst_nb_glue(name, value, display=display)
    if name.isidentifier() and not keyword.iskeyword(name):
        setattr(glued, name, value)


def _check_glue_key(name: Any) -> None:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not name or name != name.strip():
        raise ValueError(f"name must be a non-empty glue key without surrounding spaces, got {name!r}")


def glue_many(values: Mapping[str, Any], *, digits: int) -> None:
    """:func:`glue` every value of ``values`` under its key, numbers as plain rounded Python numbers.

    The bulk form of ``glue(name, round(float(x), digits))``: an integer (Python's, NumPy's) is glued
    as an ``int``; any other real number, or a 0-d array or tensor, as a ``float`` rounded to
    ``digits`` decimals (as ``int`` when ``digits`` is 0, like ``round(x)``; a value that rounds to
    zero is glued as ``0.0``, never ``-0.0``); a string as it is. Values that need different
    precisions take one call each. Everything is checked before anything is glued.

    Parameters
    ----------
    values : mapping of str to number or str
        Glue keys and their values, glued in the mapping's order.
    digits : int
        Decimals kept of each non-integer number: the precision the prose prints (nbval compares
        what is glued).

    Examples
    --------
    ``glue_many({"kl_mean": kl.mean(), "kl_max": kl.max(), "n_runs": n_runs}, digits=3)`` glues
    two floats rounded to 3 decimals and an int; the prose shows them as ``f"{glued.kl_mean:.3f}"``.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"values must be a mapping of glue keys to values, got {type(values).__name__}")
    if isinstance(digits, bool) or not isinstance(digits, int) or digits < 0:
        raise ValueError(f"digits must be a non-negative int, got {digits!r}")
    for name in values:
        _check_glue_key(name)
    plain = {name: _plain_value(name, value, digits) for name, value in values.items()}
    for name, value in plain.items():
        glue(name, value, display=False)


def _plain_value(name: Any, value: Any, digits: int) -> int | float | str:
    """``value`` as :func:`glue_many` glues it: a plain int, a rounded float, or a str."""
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if not isinstance(value, numbers.Real) and getattr(value, "ndim", None) == 0:
        value = value.item()  # a 0-d NumPy array or torch tensor
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name!r}: glue_many glues numbers and strings, got {type(value).__name__} "
                        "(glue anything else with glue)")
    if not math.isfinite(value):
        raise ValueError(f"{name!r}: {value} is not a finite number")
    if digits == 0:
        return round(float(value))
    return round(float(value), digits) + 0.0  # + 0.0 turns -0.0 into 0.0


#: The book's code column: a printed line wider than this scrolls sideways (tests/test_notebooks.py).
TABLE_MAX_WIDTH = 88


def print_table(rows: Mapping[Any, Sequence[Any]] | Iterable[Sequence[Any]],
                columns: Mapping[str, str] | Sequence[tuple[str, str]], *, gap: int = 1,
                max_width: int | None = TABLE_MAX_WIDTH) -> None:
    """Print rows as a text table: a header line, then one line per row, columns aligned.

    Each column is as wide as its header or its widest value. Each value is written with its
    column's format spec (``format(value, spec)``); a spec that starts with ``<`` (or ``^``), after
    an optional fill character, aligns the column left (or centres it), else it is aligned right.
    A number that rounds to zero at its column's precision is written without a minus sign.

    Parameters
    ----------
    rows : mapping of label to sequence, or iterable of sequences
        The rows. A mapping's keys are each row's first value (under the first column), so
        ``{"β = 0.1": (kl, gold)}`` takes three columns.
    columns : mapping of str to str, or sequence of (str, str)
        Each column's header and format spec, in order: ``{"": "", "KL (nats)": ".3f"}``. A
        sequence of pairs allows two columns with the same header.
    gap : int
        Spaces between columns.
    max_width : int or None
        The widest line allowed (the book's code column, 88 characters); None for no limit.

    Raises
    ------
    ValueError
        If a row has another number of values than there are columns, or a line is wider than
        ``max_width``.

    Examples
    --------
    >>> print_table({"π_ref": (0.0, 1.915), "β = 0.1": (5.208, 2.379)},
    ...             {"": "<", "KL (nats)": ".3f", "gold": ".2f"})
            KL (nats) gold
    π_ref       0.000 1.92
    β = 0.1     5.208 2.38
    """
    pairs = list(columns.items()) if isinstance(columns, Mapping) else [tuple(c) for c in columns]
    if not pairs or any(len(c) != 2 or not all(isinstance(x, str) for x in c) for c in pairs):
        raise ValueError("columns must be a non-empty mapping or sequence of (header, format spec) strings")
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
        raise ValueError(f"gap must be a non-negative int, got {gap!r}")
    if isinstance(rows, Mapping):
        rows = [(label, *values) for label, values in rows.items()]
    cells = []
    for number, row in enumerate(rows):
        row = tuple(row)
        if len(row) != len(pairs):
            raise ValueError(f"row {number} has {len(row)} values for {len(pairs)} columns: {row!r}")
        cells.append([_table_cell(value, spec) for value, (_, spec) in zip(row, pairs, strict=True)])
    aligns = [_table_align(spec) for _, spec in pairs]
    widths = [max([len(header)] + [len(line[i]) for line in cells]) for i, (header, _) in enumerate(pairs)]
    lines = [(" " * gap).join(f"{text:{align}{width}}" for text, align, width
                              in zip(texts, aligns, widths, strict=True)).rstrip()
             for texts in [[header for header, _ in pairs], *cells]]
    wide = max(len(line) for line in lines)
    if max_width is not None and wide > max_width:
        raise ValueError(f"the table is {wide} characters wide, more than {max_width}: shorten its "
                         "headers or labels, or split it")
    print("\n".join(lines))


def _table_cell(value: Any, spec: str) -> str:
    if not isinstance(value, numbers.Real) and getattr(value, "ndim", None) == 0:
        value = value.item()  # a 0-d NumPy array or torch tensor
    text = format(value, spec)
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and value < 0:
        zero = format(0.0, spec)  # -0.0004 at ".2f" is written 0.00, not -0.00
        if format(-value, spec) == zero:
            return zero
    return text


def _table_align(spec: str) -> str:
    if len(spec) > 1 and spec[1] in "<>^":
        return spec[1]
    return spec[0] if spec[:1] in ("<", ">", "^") else ">"
