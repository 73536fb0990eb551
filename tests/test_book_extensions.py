"""The book's own Sphinx extensions, each on a tiny project built in a temporary folder.

* ``tools/bib_backrefs.py``: every entry of the one bibliography links back to each place that
  cites it, on other pages, and every such link lands on the citation;
* ``tools/api_docs.py``: a reference to a re-exported name (``kltutorial.AdaptiveKLController``)
  or to a dataclass field links to where it is documented, a misspelt one still warns, a
  constant's doc comment is rendered as written, and ``remaining-modules`` documents each public
  module the page does not list (under "Other modules"), and nothing when it lists them all.
"""

from __future__ import annotations

import io
import re
import textwrap
from pathlib import Path

import pytest
from sphinx.application import Sphinx
from sphinx.util.docutils import docutils_namespace, patch_docutils

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _build(tmp_path: Path, files: dict[str, str], conf: str) -> tuple[Path, str]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TOOLS)!r})\nnitpicky = True\n" + textwrap.dedent(conf)
    )
    for name, text in files.items():
        (src / name).write_text(textwrap.dedent(text))
    warnings = io.StringIO()
    # As sphinx-build does: each build registers its nodes and directives in a namespace of its own.
    with patch_docutils(str(src)), docutils_namespace():
        app = Sphinx(str(src), str(src), str(tmp_path / "html"), str(tmp_path / "doctrees"), "html",
                     status=None, warning=warnings, freshenv=True)
        app.build()
    return tmp_path / "html", warnings.getvalue()


def _anchors(html: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', html))


BIB = """
@article{alpha2020,
  author = {Alpha, Ann},
  title = {First},
  journal = {J},
  year = {2020}
}

@article{beta2021,
  author = {Beta, Bob},
  title = {Second},
  journal = {J},
  year = {2021}
}
"""


def test_bibliography_entries_link_back_to_every_citation(tmp_path: Path) -> None:
    files = {
        "refs.bib": BIB,
        "index.rst": """
            Home
            ====

            Cited once here :cite:`alpha2020`.

            .. toctree::

               page
               refs
            """,
        "page.rst": """
            Page
            ====

            First :cite:`alpha2020`, then both :cite:`alpha2020,beta2021`.
            """,
        "refs.rst": """
            References
            ==========

            .. bibliography::
            """,
    }
    out, warnings = _build(tmp_path, files, """
        extensions = ["sphinxcontrib.bibtex", "bib_backrefs"]
        bibtex_bibfiles = ["refs.bib"]
        """)
    assert "WARNING" not in warnings, warnings
    refs = (out / "refs.html").read_text()
    lines = re.findall(r'<span class="bib-backrefs">(.*?)</span>', refs, re.S)
    assert len(lines) == 2, refs
    alpha, beta = lines
    # alpha: the home page once (its title links to the place), then the page twice (1, 2)
    assert re.findall(r">([^<]+)</a>", alpha) == ["Home", "Page", "1", "2"]
    assert re.findall(r">([^<]+)</a>", beta) == ["Page"]
    for line in lines:
        for page, anchor in re.findall(r'href="([^"#]+)#([^"]+)"', line):
            html = (out / page).read_text()
            assert anchor in _anchors(html), (page, anchor)
            assert re.search(rf'<span class="bibtex-citation" id="{anchor}"', html), (page, anchor)


def test_api_references_resolve_to_where_the_object_is_documented(tmp_path: Path) -> None:
    files = {
        "index.rst": """
            API
            ===

            A re-export :class:`kltutorial.AdaptiveKLController`, a field
            :attr:`kltutorial.controllers.ControllerHistory.kl`, and
            :data:`kltutorial.controllers.MIN_FACTOR`.

            .. automodule:: kltutorial.controllers
               :members:

            .. automodule:: kltutorial.compat
            """,
    }
    out, warnings = _build(tmp_path, files, """
        extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "api_docs"]
        napoleon_use_param = False
        napoleon_use_rtype = False
        napoleon_custom_sections = [("Attributes", "params_style")]
        nitpick_ignore_regex = [("py:class", r"(torch|numpy|matplotlib|collections\\.abc)\\..*")]
        """)
    assert "WARNING" not in warnings, warnings
    html = (out / "index.html").read_text()
    assert re.search(r'href="#kltutorial\.controllers\.AdaptiveKLController"[^>]*>'
                     r'<code[^>]*><span class="pre">kltutorial.AdaptiveKLController', html)
    assert re.search(r'href="#kltutorial\.controllers\.ControllerHistory"[^>]*>'
                     r'<code[^>]*><span class="pre">kltutorial.controllers.ControllerHistory.kl', html)
    # the doc comment of MIN_FACTOR is prose, not "type: description"
    entry = html[html.index('id="kltutorial.controllers.MIN_FACTOR"'):][:2000]
    assert "The proportional controller" in entry and "Type" not in entry


@pytest.mark.parametrize("target", ["kltutorial.AdaptiveKLControler",
                                    "kltutorial.controllers.ControllerHistory.kll"])
def test_a_misspelt_api_reference_still_warns(tmp_path: Path, target: str) -> None:
    files = {
        "index.rst": f"""
            API
            ===

            Misspelt: :class:`{target}`.

            .. automodule:: kltutorial.controllers
               :members:
            """,
    }
    _, warnings = _build(tmp_path, files, """
        extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "api_docs"]
        napoleon_custom_sections = [("Attributes", "params_style")]
        nitpick_ignore_regex = [("py:class", r"(torch|numpy|matplotlib|collections\\.abc)\\..*")]
        """)
    assert f"reference target not found: {target}" in warnings, warnings


def _demo_package(root: Path) -> None:
    pkg = root / "pgdemo"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""The demo package."""\n')
    (pkg / "a.py").write_text('"""Module a."""\n\n\ndef f():\n    """F."""\n')
    (pkg / "b.py").write_text('"""Module b."""\n\n\ndef g():\n    """G."""\n')
    (pkg / "_private.py").write_text('"""Private."""\n')
    (pkg / "sub" / "__init__.py").write_text('"""A subpackage."""\n')
    (pkg / "sub" / "c.py").write_text('"""Module c."""\n\n\ndef h():\n    """H."""\n')


@pytest.mark.parametrize("listed", [["pgdemo.a"], ["pgdemo", "pgdemo.a", "pgdemo.b", "pgdemo.sub",
                                                   "pgdemo.sub.c"]])
def test_modules_the_page_does_not_list_are_documented_at_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listed: list[str]) -> None:
    _demo_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sections = "".join(f"""
            {name}
            {'-' * len(name)}

            .. automodule:: {name}
               :members:
            """ for name in listed)
    files = {"index.rst": f"""
            API
            ===
            {sections}
            .. remaining-modules:: pgdemo
            """}
    out, warnings = _build(tmp_path, files, """
        extensions = ["sphinx.ext.autodoc", "api_docs"]
        """)
    assert "WARNING" not in warnings, warnings
    html = (out / "index.html").read_text()
    documented = re.findall(r'id="module-(pgdemo[a-z._]*)"', html)
    expected = {"pgdemo", "pgdemo.a", "pgdemo.b", "pgdemo.sub", "pgdemo.sub.c"}
    if len(listed) == 1:
        # listed first, then the rest under "Other modules", a section beside the listed one
        assert re.search(r'<section id="other-modules">\s*<h2>Other modules', html), html
        assert sorted(documented) == sorted(expected) and "_private" not in html
        assert 'id="pgdemo.b.g"' in html and 'id="pgdemo.sub.c.h"' in html
    else:
        assert "Other modules" not in html
        assert sorted(documented) == sorted(expected)
