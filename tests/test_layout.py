"""The package's layout rules (CONTRIBUTING.md, "Layout"), checked on its source.

* the library (``logprobs``, ``estimators``, ``objective``, ``controllers``, ``monitoring``, ``compat``
  and the shared checks in ``_validation``) imports only the library;
* ``exact`` imports only the library and itself, never a study, the toy experiment or the plots;
* no module imports another module's private name (shared checks live in ``_validation``);
* at most nine modules at the top level of the package.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kltutorial"
LIBRARY = {"logprobs", "estimators", "objective", "controllers", "monitoring", "compat", "_validation"}


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) for every ``import``/``from ... import`` in ``path``."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
    return found


def _part(module: str, names: list[str]) -> set[str]:
    """The top-level parts of the package an import reaches (``from kltutorial import x`` reaches x)."""
    parts = module.split(".")
    if parts[0] != "kltutorial":
        return set()
    return {parts[1]} if len(parts) > 1 else set(names)


SOURCES = sorted(PACKAGE.rglob("*.py"))


def _ids(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


@pytest.mark.parametrize("path", [p for p in SOURCES if p.relative_to(PACKAGE).parts[0].removesuffix(".py")
                                  in LIBRARY], ids=_ids)
def test_the_library_imports_only_the_library(path: Path) -> None:
    reached = set().union(*(_part(m, n) for m, n in _imports(path)))
    assert reached <= LIBRARY, f"{path.name} imports {sorted(reached - LIBRARY)}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "exact").rglob("*.py")), ids=_ids)
def test_exact_imports_no_study(path: Path) -> None:
    reached = set().union(*(_part(m, n) for m, n in _imports(path)))
    assert reached <= LIBRARY | {"exact"}, f"{path.name} imports {sorted(reached - LIBRARY - {'exact'})}"


@pytest.mark.parametrize("path", SOURCES, ids=_ids)
def test_no_private_name_crosses_a_module(path: Path) -> None:
    private = [(m, n) for m, names in _imports(path) if m.startswith("kltutorial") and m != "__future__"
               for n in names if n.startswith("_")]
    assert not private, f"{path.name} imports private names {private}"


def test_at_most_nine_top_level_modules() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 9, modules


def _public_modules() -> list[str]:
    names = []
    for path in SOURCES:
        name = _module(path)
        if not any(part.startswith("_") for part in name.split(".")):
            names.append(name)
    return sorted(set(names))


def test_the_api_page_documents_every_public_module() -> None:
    """book/api.md lists the modules by hand (plain autodoc); a module added to the package must be
    added there too, or its docstrings and cross-references are missing from the book."""
    page = (PACKAGE.parent / "book" / "api.md").read_text(encoding="utf8")
    documented = set(re.findall(r"^\.\. automodule:: ([\w.]+)$", page, re.M))
    missing = sorted(set(_public_modules()) - documented)
    assert not missing, f"add to book/api.md: {missing}"
    assert "kltutorial.exact.space" in documented and "kltutorial.compat.trl" in documented


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """The import reader sees a private name and a study imported from the library."""
    bad = tmp_path / "kltutorial" / "estimators.py"
    bad.parent.mkdir()
    bad.write_text("from .studies.control import _plant\nfrom . import exact\n", encoding="utf8")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "kltutorial"
    try:
        found = _imports(bad)
    finally:
        PACKAGE = saved
    assert found == [("kltutorial.studies.control", ["_plant"]), ("kltutorial", ["exact"])]
    assert set().union(*(_part(m, n) for m, n in found)) == {"studies", "exact"}


# A control character in a source file is almost always an escape that lost its backslash: "\b" of
# "\beta" written into a file as a backspace, which MathJax then cannot typeset on the API page.
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
TEXT_SOURCES = sorted(
    p for pattern in ("kltutorial/**/*.py", "tests/**/*.py", "tools/**/*.py", "book/*.md", "book/*.ipynb",
                      "book/*.bib", "*.md", "*.yml", "*.toml")
    for p in PACKAGE.parent.glob(pattern)
)


@pytest.mark.parametrize("path", TEXT_SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_control_character_in_a_source_file(path: Path) -> None:
    text = path.read_text(encoding="utf8")
    if path.suffix == ".ipynb":  # JSON writes a control character as an escape: read the cells
        text = "\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])
    bad = [(text.count("\n", 0, m.start()) + 1, repr(m.group())) for m in CONTROL.finditer(text)]
    assert not bad, f"{path.name}: control characters (line, char) {bad[:5]}; an escape lost its backslash?"


def test_the_control_character_check_sees_a_backspace() -> None:
    assert CONTROL.search(":math:`c = \beta`") and not CONTROL.search(r":math:`c = \beta`\n\t")
