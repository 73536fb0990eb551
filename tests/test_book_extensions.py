"""The book's own Sphinx extensions, each on a tiny project built in a temporary folder.

* ``tools/bib_backrefs.py``: every entry of the one bibliography links back to each place that
  cites it, on other pages, and every such link lands on the citation; the entries are list items;
* ``tools/cite_preview.py``: every citation link is followed by the preview of its entry (authors,
  title, venue, year);
* ``tools/api_docs.py``: a reference to a re-exported name (``kltutorial.AdaptiveKLController``)
  or to a dataclass field links to where it is documented, a misspelt one still warns, a
  constant's doc comment is rendered as written.
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


def test_each_citation_is_followed_by_its_reference(tmp_path: Path) -> None:
    bib = BIB + """
        @misc{gamma2022,
          author = {Gamma, Gil and Delta, Dee and Epsilon, Eve and Zeta, Zed},
          title = {Approximating {KL} Divergence},
          howpublished = {Blog post},
          year = {2022}
        }
        """
    files = {
        "refs.bib": bib,
        "index.rst": """
            Home
            ====

            One :cite:`alpha2020`, two :cite:`beta2021,gamma2022`, and again :cite:`alpha2020`.

            .. toctree::

               refs
            """,
        "refs.rst": """
            References
            ==========

            .. bibliography::
            """,
    }
    out, warnings = _build(tmp_path, files, """
        extensions = ["sphinxcontrib.bibtex", "bib_backrefs", "cite_preview"]
        bibtex_bibfiles = ["refs.bib"]
        """)
    assert "WARNING" not in warnings, warnings
    home = (out / "index.html").read_text()
    previews = re.findall(r'</a><span class="kl-cite-preview" data-key="([^"]+)" id="([^"]+)" '
                          r'role="tooltip">(.*?)</span></span>', home)
    assert [key for key, _, _ in previews] == ["alpha2020", "beta2021", "gamma2022", "alpha2020"]
    assert len({id_ for _, id_, _ in previews}) == 4, previews
    lines = {key: dict(re.findall(r'<span class="kl-cite-preview-(\w+)">([^<]*)', text))
             for key, _, text in previews}
    assert lines["alpha2020"] == {"authors": "Ann Alpha", "title": "First", "venue": "J", "year": "2020",
                                  "more": "[Alp20] in the references"}
    assert lines["gamma2022"] == {"authors": "Gil Gamma et al.", "title": "Approximating KL Divergence",
                                  "venue": "Blog post", "year": "2022", "more": "[GDEZ22] in the references"}
    refs = (out / "refs.html").read_text()
    assert refs.count('role="listitem"') == 3 and "doc-biblioentry" not in refs, refs


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
