"""Sphinx fixes for the kltutorial book (loaded from _config.yml as a local extension).

Duplicate inline scripts
------------------------
Sphinx 7.4 registers a script added with ``app.add_js_file(None, body=...)`` after
``Builder.init()`` twice: once with ``filename=None`` when it is added, and again
with ``filename=''`` in ``StandaloneHTMLBuilder.prepare_writing``, which re-adds
every registered asset as ``js_filename or ''``. ``None != ''``, so the usual
de-duplication misses it and the page carries the inline script twice.
sphinx-thebe adds ``const THEBE_JS_URL = ...`` this way, and a second ``const``
declaration of the same name is a SyntaxError that the browser reports on every
page ("Identifier 'THEBE_JS_URL' has already been declared"); sphinx-togglebutton's
``var togglebuttonSelector`` is duplicated the same way (harmless, but noise).

The handler below runs last on ``html-page-context`` and drops any script whose
filename (``None`` read as ``''``), priority and attributes (inline body included)
repeat an earlier one, keeping the first.

Page fixes
----------
``tools/static`` is added to the HTML static path, and ``kltutorial.js`` /
``kltutorial.css`` to every page: the sidebar buttons that the themes leave
unbound, wide content that scrolls with a visible cue, figures that open at
full size (see the script's header), and the book's own layout rules; and
``kltutorial-print.css`` for print only (the layout of ``make pdf``).

Numbers written as ``{eval}``
-----------------------------
The ``eval`` role is replaced by one that needs no kernel: in a notebook, it
evaluates its expression over the values glued in that notebook (the outputs
nbval verifies) and shows the result as text, as jupyterlab-myst shows the same
expression evaluated in the reader's kernel (``tools/myst_eval.py`` explains
the scheme). When a notebook is read, every ``{eval}`` in it is checked, and
its stored ``user_expressions`` compared with the glued values; a problem is a
warning, so the strict build (``-W``) fails on it.

The number is an ``<span class="kl-eval">``, set like the words around it. It
does not take myst-nb's class ``pasted-text``, which myst-nb's own style sheet
sets in bold (``span.pasted-text {font-weight: bold}``, for ``{glue}``): every
number of the prose was bold, and the pages speckled with bold digits.

Exercises
---------
sphinx-exercise gives the body of every exercise the id ``exercise-content`` and
of every solution ``solution-content``, so a page with several has the same id
several times. Each body's id is made its box's label plus ``-content``
(``ex-k3-stable-content``), unique on the page.

One page for the PDF
--------------------
``make pdf`` prints Sphinx's ``singlehtml`` build of the book (tools/book_pdf.py). Sphinx gives a
builder the node handlers registered under its own name and falls back to those of its format
(``html``) only when no extension registered any under its name; some do for ``singlehtml``, so
myst-nb's folded-input node (registered for ``html`` only) would have no handler there. The
``html`` handlers that ``singlehtml`` lacks are copied to it when that builder starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

sys.path.insert(0, str(Path(__file__).resolve().parent))
import myst_eval  # noqa: E402  (tools/, next to this file)

logger = logging.getLogger(__name__)


def _script_key(script: Any) -> tuple:
    filename = getattr(script, "filename", script)
    attributes = getattr(script, "attributes", {}) or {}
    return (
        os.fspath(filename or ""),
        getattr(script, "priority", None),
        tuple(sorted((str(k), str(v)) for k, v in attributes.items())),
    )


def dedupe_scripts(app: Sphinx, pagename: str, templatename: str,
                   context: dict, doctree: Any) -> None:
    """Remove repeated entries from the page's ``script_files``, in place."""
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen: set[tuple] = set()
    unique = []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique


STATIC = Path(__file__).resolve().parent / "static"


def add_static_path(app: Sphinx) -> None:
    app.config.html_static_path.append(str(STATIC))


def eval_role(name: str, rawtext: str, text: str, lineno: int, inliner: Any,
              options: dict | None = None, content: list | None = None) -> tuple[list, list]:
    """``{eval}`expr` ``: ``expr`` evaluated over the page's glued values, shown as text."""
    document = inliner.document
    renderer = document.get("nb_renderer") if hasattr(document, "get") else None
    try:
        if renderer is None:
            raise myst_eval.EvalError(f"{{eval}}`{text}` outside a notebook: there are no glued values")
        values = myst_eval.glue_data_values(renderer.renderer.nb_client.glue_data)
        shown = myst_eval.shown_text(myst_eval.evaluate(text, values))
    except myst_eval.EvalError as exc:
        message = inliner.reporter.warning(str(exc), line=lineno)
        problem = inliner.problematic(rawtext, rawtext, message)
        return [problem], [message]
    return [nodes.inline(shown, shown, classes=["kl-eval"])], []


def check_evals(app: Sphinx, doctree: nodes.document) -> None:
    """Warn about every ``{eval}`` of a notebook page that the book and JupyterLab would show differently."""
    source = Path(app.env.doc2path(app.env.docname))
    if source.suffix != ".ipynb":
        return
    import nbformat

    notebook = nbformat.read(source, as_version=4)
    for problem in myst_eval.problems(notebook):
        logger.warning(problem, location=app.env.docname, type="kltutorial", subtype="eval")


def unique_exercise_ids(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Give each exercise's and solution's body an id of its own: its box's label + ``-content``."""
    for section in doctree.findall(nodes.section):
        if section["ids"] in (["exercise-content"], ["solution-content"]) and section.parent["ids"]:
            section["ids"] = [f"{section.parent['ids'][0]}-content"]


def singlehtml_handlers(app: Sphinx) -> None:
    """Give the ``singlehtml`` builder every ``html`` node handler it lacks (see the module docstring)."""
    if app.builder.name != "singlehtml":
        return
    handlers = app.registry.translation_handlers
    for node, pair in handlers.get("html", {}).items():
        handlers.setdefault("singlehtml", {}).setdefault(node, pair)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("myst_nb")  # its own eval role first, so that ours replaces it
    app.add_role("eval", eval_role, override=True)
    app.connect("doctree-read", check_evals)
    app.connect("doctree-resolved", unique_exercise_ids)
    app.connect("html-page-context", dedupe_scripts, priority=900)
    app.connect("builder-inited", add_static_path)
    app.connect("builder-inited", singlehtml_handlers)
    app.add_js_file("kltutorial.js", loading_method="defer")
    app.add_css_file("kltutorial.css")
    app.add_css_file("kltutorial-print.css", media="print")
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
