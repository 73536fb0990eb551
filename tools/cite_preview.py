"""A preview of the reference beside every citation (a local Sphinx extension).

A ``{cite}`` renders as a link to its entry on the bibliography page (``book/references.md``),
with the formatted entry in the link's ``title``: a tooltip that only a mouse can see, after a
second's wait, and that neither a keyboard nor a touch screen ever shows. The reader who wants to
know what "[GSH23]" is has to leave the page.

This post-transform writes the reference next to each citation link, when the book is built, from
the same bibliography (``book/references.bib``, read by sphinxcontrib-bibtex): a
``<span class="kl-cite-preview" role="tooltip">`` right after the link, with one line each for the
authors, the title, the venue and the year. ``book/_static/cite-preview.js`` links it to the
citation (``aria-describedby``, so a screen reader reads it with the link) and shows it beside the
link on hover, on keyboard focus and on a tap (a second tap hides it, a tap on the preview opens the
entry in the references); Escape hides it. ``book/_static/cite-preview.css`` styles it in the
theme's colours, light and dark, and keeps it inside the screen. Nothing is fetched: the text is in
the page.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.writers.html5 import HTML5Translator

CLASS = "kl-cite-preview"
MAX_AUTHORS = 3  # more are shortened to the first and "et al."


class cite_preview(nodes.inline):  # noqa: N801  (docutils names node classes in lower case)
    """The reference shown beside one citation link: authors, title, venue, year."""


def visit_cite_preview(self: HTML5Translator, node: cite_preview) -> None:
    self.body.append(self.starttag(node, "span", "", CLASS=CLASS, role="tooltip",
                                   **{"data-key": node["data-key"]}))


def depart_cite_preview(self: HTML5Translator, node: cite_preview) -> None:
    self.body.append("</span>")


def skip(self: Any, node: nodes.Node) -> None:
    raise nodes.SkipNode


def _text(latex: str) -> str:
    """A BibTeX field as plain text: ``Approximating {KL} Divergence`` -> ``Approximating KL Divergence``."""
    from pybtex.richtext import Text

    return Text.from_latex(latex).render_as("text").strip()


def _person(person: Any) -> str:
    parts = person.first_names + person.middle_names + person.prelast_names + person.last_names
    name = " ".join(_text(part) for part in parts if part)
    return "others" if name == "others" else name


def authors(entry: Any) -> str:
    """"A", "A and B", "A, B and C", or "A et al." for more than three (or a trailing "others")."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_person(p) for p in people]
    if not names:
        return ""
    if len(names) > MAX_AUTHORS or names[-1] == "others":
        return f"{names[0]} et al."
    if len(names) == 1:
        return names[0]
    return f"{', '.join(names[:-1])} and {names[-1]}"


def venue(entry: Any) -> str:
    """Where the work appeared: the journal, proceedings, publisher, institution or form; else its
    preprint number (``arXiv:2402.03300``)."""
    fields = entry.fields
    for name in ("journal", "booktitle", "publisher", "institution", "howpublished"):
        if fields.get(name):
            text = _text(fields[name])
            if not text.startswith(("http://", "https://", "\\url")):
                return text
    if fields.get("eprint"):
        return f"{fields.get('archiveprefix', 'arXiv')}:{fields['eprint']}"
    return ""


def preview_node(entry: Any, label: str, node_id: str) -> cite_preview:
    """The preview of one bibliography entry; ``label`` is the citation's own text ("GSH23")."""
    node = cite_preview(ids=[node_id])
    node["data-key"] = entry.key
    lines = [
        ("authors", authors(entry)),
        ("title", _text(entry.fields.get("title", ""))),
        ("venue", venue(entry)),
        ("year", entry.fields.get("year", "")),
    ]
    for part, text in lines:
        if text:
            node += nodes.inline(text, text, classes=[f"{CLASS}-{part}"])
    node += nodes.inline(f"[{label}] in the references", f"[{label}] in the references",
                         classes=[f"{CLASS}-more"])
    return node


class CitationPreviews(SphinxPostTransform):
    """After each citation link, the preview of the entry it points to."""

    # After Sphinx's ReferencesResolver (priority 10), which turns sphinxcontrib-bibtex's pending
    # references into the citation links.
    default_priority = 20
    builders = ("html", "dirhtml")

    def run(self, **kwargs: Any) -> None:
        domain = self.env.get_domain("cite")
        by_id = {cit.citation_id: cit for cit in domain.citations}  # type: ignore[attr-defined]
        if not by_id:
            return
        count = 0
        for citation in list(self.document.findall(nodes.inline)):
            if "bibtex-citation" not in citation["classes"]:
                continue
            for link in list(citation.findall(nodes.reference)):
                target = link.get("refid") or link.get("refuri", "").partition("#")[2]
                cit = by_id.get(target)
                if cit is None:
                    continue
                count += 1
                preview = preview_node(cit.entry, link.astext(), f"cite-preview-{count}")
                link.parent.insert(link.parent.index(link) + 1, preview)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinxcontrib.bibtex")
    app.add_node(cite_preview, html=(visit_cite_preview, depart_cite_preview),
                 latex=(skip, None), text=(skip, None), man=(skip, None), texinfo=(skip, None))
    app.add_post_transform(CitationPreviews)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
