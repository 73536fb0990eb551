"""Numbers in the prose that both the book and JupyterLab show: ``{eval}`` over glued values.

The problem. myst-nb pastes a value glued in a code cell (and verified by nbval) into the prose
with ``{glue:text}`kl:.3f` ``. jupyterlab-myst, which renders MyST in JupyterLab, does not know
``{glue}`` (jupyterlab-myst #40): a reader running the notebook would see the role's text,
``kl:.3f``, where the number should be. It does evaluate ``{eval}`expr` ``: it sends ``expr`` to
the kernel as a user expression when the Markdown cell is run, shows the result inline, and
stores it in the cell's ``user_expressions`` metadata, from which it shows the number on opening
the notebook, before anything runs. myst-nb evaluates ``{eval}`` only while it executes the
notebook in the build (``execution_mode: inline``); in a build from stored outputs, as
``make test`` does, it has no kernel and reads no metadata.

The mechanism: one syntax, ``{eval}`f"{glued.kl:.3f}"` ``, for both readers.

* The notebooks glue with ``kltutorial.book.glue``, which calls ``myst_nb.glue`` and also sets
  ``kltutorial.book.glued.kl`` (each notebook imports ``glued``). The prose reads only
  ``glued.<name>``, never a variable of the code, so no glued name can shadow one.
* In JupyterLab, jupyterlab-myst evaluates the expression in the reader's kernel.
* In the book, the extension (``kltutorial_book_ext``) renders it without a kernel: the
  expression is evaluated here over the page's **glued** values (the same values nbval checks),
  with a small grammar: ``glued.<name>``, names, literals, f-strings with format specs,
  arithmetic, and ``round``/``abs``/``int``/``float``/``min``/``max``/``format``.
* A bare name (``{eval}`kl` ``, as a notebook gluing with ``myst_nb.glue`` writes it) is the
  kernel variable ``kl``: it must be glued as itself, ``glue("kl", kl)``, or the two differ.
* A name is glued before the prose that shows it, so that running the notebook top to bottom
  never evaluates a name not yet glued.
* ``python tools/myst_eval.py NOTEBOOK...`` stores each Markdown cell's results in its
  ``user_expressions`` metadata, in jupyterlab-myst's format, so a reader who opens the notebook
  sees the numbers before running it; ``--check`` reports instead of writing.

The book build reports (as a warning, so ``-W`` fails it) an expression it cannot evaluate, a
bare name not glued as itself, a name glued only after the prose that shows it, and stored
``user_expressions`` that differ from the glued values (the notebook was re-executed but the
metadata not refreshed).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

GLUE_PREFIX = "application/papermill.record/"
# MyST role syntax: {eval}`expr` or, for an expression holding a backtick, {eval}``expr``.
EVAL_ROLE = re.compile(r"\{eval\}(`+)(.+?)\1")
# The kernel object the notebooks glue into (kltutorial.book.glued): ``glued.kl`` is glued "kl".
GLUED = "glued"
SAFE_CALLS = {"round": round, "abs": abs, "int": int, "float": float, "min": min, "max": max,
              "format": format}
_NODES = (ast.Expression, ast.Name, ast.Load, ast.Constant, ast.JoinedStr, ast.FormattedValue,
          ast.BinOp, ast.UnaryOp, ast.Call, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv,
          ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Attribute)


class EvalError(ValueError):
    """An ``{eval}`` expression that cannot be shown from the glued values."""


def expressions_in(markdown: str) -> list[str]:
    """The ``{eval}`` expressions of a Markdown cell, in order, each once."""
    return list(dict.fromkeys(m.group(2).strip() for m in EVAL_ROLE.finditer(markdown)))


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def glued_values(notebook: dict) -> dict[str, Any]:
    """Every value glued in the notebook's outputs, read back from its ``text/plain``.

    A value whose ``text/plain`` is not a Python literal (a figure, ``np.float64(0.1)``) is kept
    as an :class:`EvalError` to raise if an expression uses it.
    """
    values: dict[str, Any] = {}
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            meta = (output.get("metadata") or {}).get("scrapbook")
            if not meta or "name" not in meta:
                continue
            prefix = meta.get("mime_prefix", "")
            text = (output.get("data") or {}).get(prefix + "text/plain")
            if isinstance(text, list):
                text = "".join(text)
            try:
                values[meta["name"]] = ast.literal_eval(text)
            except (ValueError, SyntaxError, TypeError):
                values[meta["name"]] = EvalError(
                    f"the glued value of {meta['name']!r} is not a plain number or string "
                    f"({str(text)[:40]!r}): glue float(...), int(...) or str(...)")
    return values


def glue_data_values(glue_data: dict[str, Any]) -> dict[str, Any]:
    """:func:`glued_values` from myst-nb's per-document glue store (prefixes already removed)."""
    cell = {"cell_type": "code", "outputs": [
        {"data": out.get("data", {}), "metadata": {"scrapbook": {"name": key}}}
        for key, out in glue_data.items()]}
    return glued_values({"cells": [cell]})


def _tree(expression: str) -> ast.Expression | None:
    try:
        return ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return None


def names_in(expression: str) -> set[str]:
    """The bare names of an expression (each must be a kernel variable holding its glued value)."""
    tree = _tree(expression)
    return set() if tree is None else {
        n.id for n in ast.walk(tree)
        if isinstance(n, ast.Name) and n.id not in SAFE_CALLS and n.id != GLUED}


def glued_names_in(expression: str) -> set[str]:
    """The names read as ``glued.<name>`` (kltutorial.book.glued in the kernel)."""
    tree = _tree(expression)
    return set() if tree is None else {
        n.attr for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == GLUED}


def evaluate(expression: str, values: dict[str, Any]) -> Any:
    """The value of ``expression`` with the glued ``values`` as its only names."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise EvalError(f"{expression!r} is not a Python expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise EvalError(f"{expression!r}: {type(node).__name__} is not allowed here (names, "
                            "numbers, f-strings, arithmetic, round/abs/int/float/min/max/format)")
        if isinstance(node, ast.Attribute) and not (
                isinstance(node.value, ast.Name) and node.value.id == GLUED):
            raise EvalError(f"{expression!r}: the only attribute access allowed is {GLUED}.<name>, "
                            "a glued value")
        if isinstance(node, ast.Call) and not (
                isinstance(node.func, ast.Name) and node.func.id in SAFE_CALLS and not node.keywords):
            raise EvalError(f"{expression!r}: only round, abs, int, float, min, max and format "
                            "may be called, with positional arguments")
    namespace: dict[str, Any] = {}
    for name in names_in(expression) | glued_names_in(expression):
        if name not in values:
            raise EvalError(f"{expression!r}: {name!r} is not glued in this notebook "
                            f"(glue({name!r}, value, display=False))")
        if isinstance(values[name], EvalError):
            raise values[name]
    for name in names_in(expression):
        namespace[name] = values[name]
    namespace[GLUED] = types.SimpleNamespace(
        **{name: values[name] for name in glued_names_in(expression)})
    try:
        return eval(compile(tree, "<eval>", "eval"), {"__builtins__": SAFE_CALLS}, namespace)
    except Exception as exc:  # the expression's own error, e.g. a bad format spec
        raise EvalError(f"{expression!r}: {type(exc).__name__}: {exc}") from None


def shown_text(value: Any) -> str:
    """What both jupyterlab-myst and the book show: a string without quotes, else its repr."""
    return value if isinstance(value, str) else repr(value)


def user_expressions(expressions: Iterable[str], values: dict[str, Any]) -> list[dict]:
    """jupyterlab-myst's ``user_expressions`` metadata for these expressions."""
    return [{"expression": expr,
             "result": {"data": {"text/plain": repr(evaluate(expr, values))},
                        "metadata": {}, "status": "ok"}}
            for expr in expressions]


def glue_calls(notebook: dict) -> dict[str, str]:
    """Glued name -> the source of the glued value, for every ``glue("name", value, ...)`` call."""
    calls: dict[str, str] = {}
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        try:
            tree = ast.parse(_source(cell))
        except SyntaxError:  # IPython magics: not a cell that glues
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and len(node.args) >= 2):
                continue
            func = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            key = node.args[0].value if isinstance(node.args[0], ast.Constant) else None
            if func == "glue" and isinstance(key, str):
                calls[key] = ast.unparse(node.args[1])
    return calls


def glued_in_cell(notebook: dict) -> dict[str, int]:
    """Glued name -> the index of the first cell whose outputs glue it."""
    where: dict[str, int] = {}
    for index, cell in enumerate(notebook.get("cells", [])):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            meta = (output.get("metadata") or {}).get("scrapbook")
            if meta and "name" in meta:
                where.setdefault(meta["name"], index)
    return where


def problems(notebook: dict) -> list[str]:
    """Everything that would make the book and JupyterLab show different numbers."""
    values = glued_values(notebook)
    glued_as = glue_calls(notebook)
    first_glued = glued_in_cell(notebook)
    found = []
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "markdown":
            continue
        expressions = expressions_in(_source(cell))
        where = f"cell {index}"
        for expr in expressions:
            for name in sorted(names_in(expr) | glued_names_in(expr)):
                if first_glued.get(name, -1) > index:
                    found.append(f"{where}: {{eval}}`{expr}` uses {name!r}, glued only in the later cell "
                                 f"{first_glued[name]}: run top to bottom in JupyterLab, this cell would "
                                 "show an error instead of the number (nothing glued yet); glue it "
                                 "before the prose that shows it")
                if name in names_in(expr) and name in glued_as and glued_as[name] != name:
                    found.append(f"{where}: {{eval}}`{expr}` uses {name!r}, glued as glue({name!r}, "
                                 f"{glued_as[name]}): JupyterLab evaluates the kernel variable {name}; "
                                 f"assign it and glue it under its own name, glue({name!r}, {name})")
            try:
                evaluate(expr, values)
            except EvalError as exc:
                found.append(f"{where}: {exc}")
        stored = (cell.get("metadata") or {}).get("user_expressions")
        if not expressions:
            continue
        try:
            expected = user_expressions(expressions, values)
        except EvalError:
            continue  # reported above
        if stored != expected:
            found.append(f"{where}: stored user_expressions differ from the glued values "
                         f"(run `python tools/myst_eval.py` on the notebook): {stored} != {expected}")
    return found


def fill(notebook: dict) -> bool:
    """Store every Markdown cell's ``user_expressions``; True if anything changed."""
    values = glued_values(notebook)
    changed = False
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        expressions = expressions_in(_source(cell))
        metadata = cell.setdefault("metadata", {})
        if not expressions:
            changed |= metadata.pop("user_expressions", None) is not None
            continue
        new = user_expressions(expressions, values)
        if metadata.get("user_expressions") != new:
            metadata["user_expressions"] = new
            changed = True
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="report problems, write nothing")
    args = parser.parse_args(argv)
    status = 0
    import nbformat  # written as nbformat writes it, so the diff is the metadata only

    for path in args.notebooks:
        notebook = nbformat.read(path, as_version=4)
        if not args.check:
            try:
                if fill(notebook):
                    nbformat.write(notebook, path)
                    print(f"{path}: user_expressions updated")
            except EvalError as exc:
                print(f"{path}: {exc}", file=sys.stderr)
                status = 1
                continue
        for problem in problems(notebook):
            print(f"{path}: {problem}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
