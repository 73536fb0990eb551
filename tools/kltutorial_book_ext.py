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
unbound (see the script's header) and the book's own layout rules.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx


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


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("html-page-context", dedupe_scripts, priority=900)
    app.connect("builder-inited", add_static_path)
    app.add_js_file("kltutorial.js", loading_method="defer")
    app.add_css_file("kltutorial.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
