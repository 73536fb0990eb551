"""Links from each bibliography entry back to the places that cite it (a local Sphinx extension).

The book has one ``{bibliography}`` directive, on ``book/references.md``, and a ``{cite}`` on any
page links to its entry there. The way back is missing: sphinxcontrib-bibtex (2.7) adds the
usual "back references" only for citations made on the bibliography's own page, because Sphinx
and docutils resolve a citation's ``backrefs`` within one document
(sphinxcontrib-bibtex issues #194 and #389). A reader who follows a citation from a section
lands on the references page with no link back to the sentence they were reading.

This post-transform adds them: below each entry of the bibliography, a line
"Cited in: *page*, *page* (1, 2)" whose page titles link to the first place each page cites the
entry and whose numbers, for a page that cites it more than once, link to each place in turn.
It reads what sphinxcontrib-bibtex records anyway: every ``{cite}`` is a ``CitationRef`` (its
document and the id of the citation node, which stays on the rendered citation as its anchor),
every bibliography entry a ``Citation`` with the id of its node. Citations on the
bibliography's own page keep the native back references and are not repeated here.

The entries are list items. docutils (0.21) writes the bibliography as ``<div role="list">`` of
``<div role="doc-biblioentry">``; ARIA 1.3 and DPUB-ARIA 1.1 deprecate ``doc-biblioentry``, so
browsers and axe-core ignore it, and the list then holds no items, only the entries' text and
links (axe-core's ``aria-required-children``, critical). Each entry is written with
``role="listitem"`` instead, which is what ``doc-biblioentry`` meant.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform

CLASS = "bib-backrefs"


class BibliographyBackrefs(SphinxPostTransform):
    """Append a "Cited in" line with links to every entry of a bibliography."""

    # After sphinxcontrib-bibtex's BibliographyTransform (priority 5) has turned the
    # bibliography node into citation nodes; links are plain references, nothing to resolve.
    default_priority = 6
    builders = ("html", "dirhtml")

    def run(self, **kwargs: Any) -> None:
        domain = self.env.get_domain("cite")
        citations = {
            cit.citation_id: cit for cit in domain.citations  # type: ignore[attr-defined]
        }
        if not citations:
            return
        order = {name: i for i, name in enumerate(_doc_order(self.env))}
        for node in list(self.document.findall(nodes.citation)):
            ids = node.get("ids") or []
            citation = citations.get(ids[0]) if ids else None
            if citation is None:
                continue
            here = citation.bibliography_key.docname
            places: dict[str, list[tuple[int, str]]] = defaultdict(list)
            for ref in domain.citation_refs:  # type: ignore[attr-defined]
                if ref.docname != here and citation.key in {t.key for t in ref.targets}:
                    places[ref.docname].append((ref.line or 0, ref.citation_ref_id))
            if not places:
                continue
            # Inside the entry's paragraph (shown as a line of its own by the page's CSS), so
            # the entry keeps the spacing of one without back references.
            entries = [child for child in node.children if isinstance(child, nodes.paragraph)]
            if entries:
                entries[-1] += self._cited_in(here, places, order)
            else:
                node += nodes.paragraph("", "", self._cited_in(here, places, order))

    def _cited_in(self, here: str, places: dict[str, list[tuple[int, str]]],
                  order: dict[str, int]) -> nodes.inline:
        para = nodes.inline(classes=[CLASS])
        para += nodes.Text("Cited in: ")
        docs = sorted(places, key=lambda doc: (order.get(doc, len(order)), doc))
        for i, doc in enumerate(docs):
            if i:
                para += nodes.Text(", ")
            anchors = [ref_id for _, ref_id in sorted(places[doc])]
            uri = self.app.builder.get_relative_uri(here, doc)
            title = self.env.titles[doc].astext() if doc in self.env.titles else doc
            para += nodes.reference("", title, internal=True, refuri=f"{uri}#{anchors[0]}")
            if len(anchors) > 1:
                para += nodes.Text(" (")
                for n, anchor in enumerate(anchors, start=1):
                    if n > 1:
                        para += nodes.Text(", ")
                    para += nodes.reference("", str(n), internal=True, refuri=f"{uri}#{anchor}",
                                            reftitle=f"{title}, citation {n}")
                para += nodes.Text(")")
        return para


def _doc_order(env: Any) -> list[str]:
    """Documents in reading order: the root, then the table of contents, depth first."""
    root = env.config.root_doc
    seen: list[str] = []

    def walk(doc: str) -> None:
        if doc in seen:
            return
        seen.append(doc)
        for child in env.toctree_includes.get(doc, []):
            walk(child)

    walk(root)
    return seen


def visit_citation(self: Any, node: nodes.citation) -> None:
    """docutils' own ``visit_citation``, with ``role="listitem"`` for the deprecated role."""
    type(self).visit_citation(self, node)
    self.body[-1] = self.body[-1].replace('role="doc-biblioentry"', 'role="listitem"')


def depart_citation(self: Any, node: nodes.citation) -> None:
    type(self).depart_citation(self, node)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinxcontrib.bibtex")
    app.add_post_transform(BibliographyBackrefs)
    app.add_node(nodes.citation, override=True, html=(visit_citation, depart_citation))
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
