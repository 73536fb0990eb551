"""Serve plotly's JavaScript from the built book (loaded from _config.yml as a local extension).

The book's one interactive figure (section 11, :mod:`kltutorial.plotting.interactive`) is a notebook
output whose HTML loads ``../_static/plotly.min.js`` relative to its page, never a CDN, so that the book
works from ``file://`` with the network cut. This extension puts that file there: when an HTML build
finishes, it copies ``plotly/package_data/plotly.min.js`` from the installed plotly package (the version
pinned in requirements.txt, so the JavaScript always matches the Python that wrote the figure) into the
build's ``_static`` folder. Non-HTML builders are left alone.
"""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

#: The name the notebook output refers to, under the build's ``_static``.
TARGET = "plotly.min.js"


def plotly_js_source() -> Path:
    """Path of ``plotly.min.js`` inside the installed plotly package."""
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


def copy_plotly_js(app: Sphinx, exception: Exception | None) -> None:
    """Copy ``plotly.min.js`` into ``<outdir>/_static`` after a successful HTML build."""
    if exception is not None or app.builder.format != "html":
        return
    source = plotly_js_source()
    if not source.is_file():
        raise FileNotFoundError(f"{source} is missing: install the plotly pinned in requirements.txt")
    static = Path(app.outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    target = static / TARGET
    if not target.is_file() or not filecmp.cmp(source, target, shallow=False):
        shutil.copyfile(source, target)
        logger.info(f"plotly_offline: copied {source.name} into {static}")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("build-finished", copy_plotly_js)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
