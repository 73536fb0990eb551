"""The notebooks bundle: one zip that runs the book's chapters offline (a local Sphinx extension).

A chapter's own ``.ipynb`` download (the theme's download menu) is not enough to run it: its figures
are PNG files beside it (``{figure} images/figures/....png``) and its code imports the ``kltutorial``
package. When an HTML build finishes, this extension writes :data:`BUNDLE` into the build,
``_downloads/kltutorial-notebooks.zip``, holding under one folder, :data:`ROOT`:

* ``book/``: every chapter notebook the table of contents lists, and every file under ``book/`` that
  one of them refers to by a relative path (the figure PNGs, at the same relative paths, so each
  ``{figure}`` resolves when the notebook is opened from the bundle; the stored runs under
  ``book/data/`` that its code reads, so that it runs);
* ``requirements.txt`` (the exact pins of the whole environment) and ``pyproject.toml``;
* ``kltutorial/``, the package's source (no ``__pycache__``), installed with ``pip install -e .``;
* ``README.md``, :data:`README`: the two commands that set it up and open the chapters.

The files are taken from the source tree as the build read them, in sorted order, with a fixed
timestamp, so the same sources give the same zip.

Links: the role ``{notebooks-bundle}`text``` (``book/intro.md``) links to the zip from any page, and
the theme's download menu of every page (a chapter's offers its ``.ipynb`` and ``.pdf``) gets a
"notebooks (.zip)" entry after the page's own source file.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

#: The zip, relative to the HTML build's root.
BUNDLE = "_downloads/kltutorial-notebooks.zip"
#: The one folder the zip unpacks to.
ROOT = "kltutorial-notebooks"
#: Files of the repository root that go into the bundle as they are.
PROJECT_FILES = ("requirements.txt", "pyproject.toml")
PACKAGE = "kltutorial"
#: A fixed timestamp for every entry (the zip format starts in 1980).
TIMESTAMP = (1980, 1, 1, 0, 0, 0)

README = """\
# The KL Penalty in RLHF: the chapters as notebooks

Every chapter of the book as a Jupyter notebook (`book/`), with the figures it shows
(`book/images/figures/`) and the stored runs it reads (`book/data/`), the `kltutorial` package its
code imports (`kltutorial/`) and the exact versions of everything it needs (`requirements.txt`). With
Python 3.11, from this folder:

```bash
python3.11 -m venv .venv && .venv/bin/pip install -r requirements.txt && .venv/bin/pip install --no-deps -e .
.venv/bin/jupyter lab book/
```

The first command downloads the packages once; after it, nothing needs the network. The second
opens JupyterLab on the chapters: run a notebook top to bottom (Run > Run All Cells) to reproduce
its numbers and figures. Each chapter is meant to run in under a minute on a CPU; the book's
status page gives the times of its last verified run.
"""

# A relative path in a notebook's Markdown or code: a link or image target, a {figure} argument.
_RELATIVE_FILE = re.compile(
    r"""(?<![\w/.-])((?:\.\./)*[\w.-]+(?:/[\w.-]+)*\.(?:png|jpe?g|svg|gif|csv|json|npz))\b""")


def chapter_notebooks(app: Sphinx) -> list[Path]:
    """The notebooks of the table of contents, in reading order."""
    from bib_backrefs import _doc_order

    notebooks = []
    for docname in _doc_order(app.env):
        source = Path(app.env.doc2path(docname))
        if source.suffix == ".ipynb":
            notebooks.append(source)
    return notebooks


def referenced_files(notebook: Path) -> list[Path]:
    """The files next to ``notebook`` (under its folder) that its cells refer to by a relative path."""
    import nbformat

    text = "\n".join(cell.source for cell in nbformat.read(notebook, as_version=4).cells)
    found = []
    for match in _RELATIVE_FILE.findall(text):
        path = (notebook.parent / match).resolve()
        if path.is_file() and notebook.parent.resolve() in path.parents:
            found.append(path)
    return sorted(set(found))


def bundle_members(app: Sphinx) -> dict[str, Path]:
    """Name in the zip -> file in the source tree, for everything the bundle holds."""
    srcdir = Path(app.srcdir).resolve()
    members: dict[str, Path] = {}

    def add(path: Path) -> None:
        members[str(PurePosixPath(ROOT, path.resolve().relative_to(srcdir).as_posix()))] = path

    for notebook in chapter_notebooks(app):
        add(notebook)
        for path in referenced_files(notebook):
            add(path)
    for name in PROJECT_FILES:
        add(srcdir / name)
    for path in sorted((srcdir / PACKAGE).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in {".pyc", ".pyo"}:
            add(path)
    return members


def write_bundle(app: Sphinx, exception: Exception | None) -> None:
    """Write :data:`BUNDLE` into the HTML build (after a successful build; not the PDF's one page)."""
    if exception is not None or app.builder.name not in ("html", "dirhtml"):
        return
    members = bundle_members(app)
    target = Path(app.outdir) / BUNDLE
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        entries = [(f"{ROOT}/README.md", README.encode())]
        entries += [(name, path.read_bytes()) for name, path in sorted(members.items())]
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=TIMESTAMP)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            bundle.writestr(info, data)
    logger.info(f"notebooks_bundle: {len(members) + 1} files in {target}")


def bundle_uri(app: Sphinx, docname: str) -> str:
    """The zip's address relative to the page of ``docname``."""
    target = app.builder.get_target_uri(docname)
    depth = target.split("#")[0].count("/")
    return "../" * depth + BUNDLE


#: The class that marks a link to the zip, its address filled in per page (:func:`resolve_links`).
LINK_CLASS = "kl-notebooks-bundle"


def bundle_role(name: str, rawtext: str, text: str, lineno: int, inliner: Any,
                options: dict | None = None, content: list | None = None) -> tuple[list, list]:
    """``{notebooks-bundle}`text` ``: a link to the notebooks bundle."""
    return [nodes.reference(rawtext, text, refuri=BUNDLE, classes=[LINK_CLASS])], []


def resolve_links(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Point each link to the zip at its address relative to the page."""
    if app.builder.format != "html":
        return
    for node in doctree.findall(nodes.reference):
        if LINK_CLASS in node.get("classes", ()):
            node["refuri"] = bundle_uri(app, docname)


def add_download_entry(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """Add the bundle to the theme's download menu (on every page that has one), after the page's source."""
    for button in context.get("header_buttons", []):
        if button.get("label") == "download-buttons":
            button["buttons"].insert(1, {
                "type": "link",
                "url": context["pathto"](BUNDLE, 1),
                "text": "notebooks (.zip)",
                "tooltip": "Download every chapter as a notebook, with its figures and the package",
                "icon": "fas fa-file-zipper",
                "label": "download-notebooks-bundle-button",
            })


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_role("notebooks-bundle", bundle_role)
    app.connect("doctree-resolved", resolve_links)
    # After sphinx-book-theme's add_header_buttons (priority 501) has built the menu.
    app.connect("html-page-context", add_download_entry, priority=600)
    app.connect("build-finished", write_bundle)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
