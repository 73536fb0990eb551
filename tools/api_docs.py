"""Sphinx helpers for the book's API reference, ``book/api.md`` (a local extension).

Re-exported names
-----------------
The API reference (``book/api.md``) documents each object once, in the module that defines it:
``kltutorial.estimators.kl_estimate``, ``kltutorial.toyrlhf.task.make_task``. The docstrings, like
the book's readers, use the public import paths instead: ``:func:`kltutorial.exact_kl```, or
``:func:`make_task``` inside the ``kltutorial.toyrlhf`` package docstring. Sphinx looks those names
up literally, finds nothing, and (the book builds with ``-n``) warns.

On ``missing-reference`` this extension imports the name the reference asks for (as written, and
relative to the module the reference sits in), and if it is an object that the Python domain
documents under another name, links there. Only names inside ``kltutorial`` are followed, and only
to an object that *is* the same Python object, so a real typo still warns.

A dataclass field (``:attr:`GaoFit.d```) has no entry of its own: the class docstring's
*Attributes* section is rendered as a list, like *Parameters* (``napoleon_custom_sections`` in
``_config.yml``), so such a reference links to the class, where the list describes the field.

Docstrings of constants, attributes and properties
--------------------------------------------------
napoleon reads the first line of the docstring of a constant, an attribute or a property as
``type: description`` (the Google style). ``#: Every method a case may name: log-probs, ...`` above
a constant, or a property whose docstring starts ``Mask, shape (K,): where ...``, would show the
words before the colon as its *type*, and under ``-n`` warn that no class of that name exists. The
package writes these short docstrings as plain reST; this extension gives autodoc them as written,
before and after napoleon (functions, classes and modules go through napoleon as usual).

What autodoc does itself
------------------------
The page is plain autodoc: one ``automodule`` per module, in the order of the package's layers. A new
module must be added to it by hand; ``tests/test_layout.py`` fails until it is, so the page never
misses one. This extension keeps only the two things autodoc does not do: following references to
re-exported names, and passing short doc comments through napoleon untouched.
"""

from __future__ import annotations

import importlib
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util.nodes import make_refnode

PACKAGE = "kltutorial"


def _import(dotted: str) -> tuple[bool, Any]:
    """The object at ``dotted`` (a module, or attributes of one), or ``(False, None)``."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False, None
        return True, obj
    return False, None


def _candidates(node: nodes.Element) -> list[str]:
    target = node["reftarget"].lstrip("~.")
    module = node.get("py:module")
    names = [target]
    if module:
        names.insert(0, f"{module}.{target}")
    return [name for name in names if name == PACKAGE or name.startswith(PACKAGE + ".")]


def _fields(cls: type) -> set[str]:
    return set(getattr(cls, "__dataclass_fields__", {})) | set(getattr(cls, "__annotations__", {}))


def _documented_as(objects: dict[str, Any], obj: Any, name: str) -> tuple[str, Any] | None:
    """The one documented entry whose object *is* ``obj`` (``name`` itself if documented)."""
    if name in objects and not objects[name].aliased:
        return name, objects[name]
    last = name.rsplit(".", 1)[-1]
    matches = []
    for fullname, entry in objects.items():
        if entry.aliased or not fullname.endswith("." + last):
            continue
        ok, documented = _import(fullname)
        if ok and documented is obj:
            matches.append((fullname, entry))
    return matches[0] if len(matches) == 1 else None


def resolve_reexport(app: Sphinx, env: BuildEnvironment, node: nodes.Element,
                     contnode: nodes.Element) -> nodes.Element | None:
    if node.get("refdomain") != "py":
        return None
    objects = env.get_domain("py").objects  # type: ignore[attr-defined]
    for name in _candidates(node):
        # A dataclass field (``GaoFit.d``) is described in its class's Attributes list.
        parent, _, last = name.rpartition(".")
        ok, owner = _import(parent)
        if not ok and "." not in node["reftarget"].strip("~.").rpartition(".")[0]:
            # ``GaoFit.d`` written in a module that does not import ``GaoFit``: the one documented
            # class of that name, as Sphinx's own search for ``.GaoFit.d`` would find it.
            classes = [full for full, entry in objects.items()
                       if entry.objtype == "class" and full.endswith("." + parent.rsplit(".", 1)[-1])]
            if len(classes) == 1:
                parent = classes[0]
                ok, owner = _import(parent)
        if ok and isinstance(owner, type) and last in _fields(owner):
            hit = _documented_as(objects, owner, parent)
        else:
            ok, obj = _import(name)
            hit = _documented_as(objects, obj, name) if ok else None
        if hit is not None and hit[0] != name:
            fullname, entry = hit
            return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id,
                                contnode, fullname)
    return None


_AS_WRITTEN = ("data", "attribute", "property")
_RAW_DOCS: dict[tuple[str, str], list[str]] = {}


def _keep_raw_doc(app: Sphinx, what: str, name: str, obj: Any, options: Any,
                  lines: list[str]) -> None:
    if what in _AS_WRITTEN:
        _RAW_DOCS[what, name] = list(lines)


def _restore_raw_doc(app: Sphinx, what: str, name: str, obj: Any, options: Any,
                     lines: list[str]) -> None:
    if (what, name) in _RAW_DOCS:
        lines[:] = _RAW_DOCS.pop((what, name))


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("missing-reference", resolve_reexport)
    # napoleon handles autodoc-process-docstring at the default priority, 500.
    app.connect("autodoc-process-docstring", _keep_raw_doc, priority=400)
    app.connect("autodoc-process-docstring", _restore_raw_doc, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
