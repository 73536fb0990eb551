"""The book's status page, generated when the book is written (a local Sphinx extension).

``book/status.md`` holds one directive, ``{kltutorial-status}``, which this extension replaces, when
the page is written (``doctree-resolved``; the page is marked outdated on every build, so an
incremental one, ``make book``, never shows an old copy), with

* **Reading and execution time of each chapter**: the minutes its prose takes to read
  (``tools/prose_stats.py``, at 200 words a minute), one row per page of the book before its appendix;
  and for a notebook, the seconds it took in the last verified run: the times that nbval's passes of
  ``make test`` wrote (``tools/nbval_timing.py``: ``_build/status/nbval-native.json`` and
  ``nbval-second-kernels.json``), against the budget of :data:`BUDGET_S` seconds. A time is shown only
  for the notebook as it is now (its SHA-256 is the one recorded); without a verified run (a plain
  ``make book``), the page says so instead of showing times;
* **Versions**: Python's and each package's of :data:`VERSIONS` as installed in the environment that
  builds the book (``importlib.metadata``), beside the pin in ``requirements.txt``;
* **What CI checks**: the steps of ``make test``, read from the Makefile (the ``$(MAKE) <target>``
  lines of its ``test`` recipe, one or more targets a line), each with the comment above its target
  there, or its commands
  where it has none.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx

#: Seconds a chapter may take to execute (the book's rule for a section).
BUDGET_S = 60
#: The packages whose versions the page shows (Python's is shown first).
VERSIONS = ("torch", "numpy", "jupyter-book", "myst-nb", "nbval")
#: The nbval passes, in the order of ``make test``: file name under the status folder, and label.
RUNS = (("nbval-native.json", "this machine's kernels"),
        ("nbval-second-kernels.json", "second kernel set"))
#: The appendix's pages, which the reading times leave out (reference, not prose to read).
APPENDIX = frozenset({"book/notation", "book/references", "book/api", "book/status"})
NO_RUN = ("No verified run: this build was not preceded by the nbval passes of make test (a plain "
          "make book, or a test run that failed), so there are no execution times to show.")


class status_placeholder(nodes.General, nodes.Element):
    """Where the generated content goes; replaced before the page is written."""


class StatusDirective(Directive):
    has_content = False

    def run(self) -> list[nodes.Node]:
        env = self.state.document.settings.env
        _status_docs(env).add(env.docname)
        return [status_placeholder()]


def _status_docs(env: Any) -> set[str]:
    if not hasattr(env, "kltutorial_status_docs"):
        env.kltutorial_status_docs = set()
    return env.kltutorial_status_docs


def always_outdated(app: Sphinx, env: Any, added: set, changed: set, removed: set) -> list[str]:
    """The status page is rewritten on every build, incremental ones (``make book``) included."""
    return sorted(doc for doc in _status_docs(env) if doc in env.found_docs)


def purge(app: Sphinx, env: Any, docname: str) -> None:
    _status_docs(env).discard(docname)


def merge(app: Sphinx, env: Any, docnames: set, other: Any) -> None:
    _status_docs(env).update(_status_docs(other))


# ---------------------------------------------------------------------------------------------
# What the page reads


def read_runs(status_dir: Path) -> dict[str, dict[str, dict]]:
    """Label -> notebook path -> {"seconds", "sha256"}, for each verified run found."""
    runs = {}
    for filename, label in RUNS:
        path = status_dir / filename
        if path.is_file():
            runs[label] = json.loads(path.read_text(encoding="utf8"))["notebooks"]
    return runs


def pinned_versions(requirements: Path) -> dict[str, str]:
    """Normalised name -> version of each ``name==version`` line of ``requirements.txt``."""
    pins = {}
    for line in requirements.read_text(encoding="utf8").splitlines():
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;#]+)", line)
        if match:
            pins[_normal(match.group(1))] = match.group(2)
    return pins


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_versions() -> dict[str, str]:
    """Python's version, then each package of :data:`VERSIONS` as installed."""
    versions = {"Python": sys.version.split()[0]}
    for name in VERSIONS:
        versions[name] = metadata.version(name)
    return versions


def make_test_steps(makefile: Path) -> list[tuple[str, str, list[str]]]:
    """``make test``'s steps: (target, the comment above its rule, its commands), in order."""
    lines = makefile.read_text(encoding="utf8").splitlines()
    rules = {}
    for i, line in enumerate(lines):
        match = re.match(r"^([A-Za-z][\w-]*)\s*:(?!=)", line)
        if match:
            rules[match.group(1)] = i
    if "test" not in rules:
        raise ValueError(f"{makefile} has no test target")

    def recipe(target: str) -> list[str]:
        commands = []
        for line in lines[rules[target] + 1:]:
            if not line.startswith("\t"):
                break
            commands.append(line.strip())
        return commands

    def comment(target: str) -> str:
        """The comment block right above the rule, or above the variables defined right above it."""
        above = lines[:rules[target]]
        while above and above[-1].strip() and not above[-1].startswith("#"):
            above.pop()  # a variable of the target's own (CHROMIUM_BIN ?= ...)
        block = []
        for line in reversed(above):
            if not line.startswith("#") or set(line) <= {"#", "-", " "}:
                break
            block.append(line.lstrip("#").strip())
        return " ".join(reversed(block)).replace("$$", "$")  # make's escape of a dollar

    steps = []
    for command in recipe("test"):
        # $(MAKE) [options] target [target ...]: the targets of one line run side by side (-j2)
        match = re.search(r"\$\(MAKE\)(?:\s+-\S+)*((?:\s+[\w-]+)+)\s*$", command)
        for target in match.group(1).split() if match else []:
            if target not in rules:
                raise ValueError(f"make test runs {target}, which {makefile} does not define")
            steps.append((target, comment(target), recipe(target)))
    return steps


# ---------------------------------------------------------------------------------------------
# The page


def _table(header: list[str], rows: list[list[nodes.Node | str]], widths: list[int]) -> nodes.table:
    table = nodes.table(classes=["kl-status-table"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)

    def row(cells: list[nodes.Node | str]) -> nodes.row:
        tr = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += nodes.paragraph("", "", cell if isinstance(cell, nodes.Node) else nodes.Text(cell))
            tr += entry
        return tr

    head = nodes.thead()
    head += row(header)
    group += head
    body = nodes.tbody()
    for cells in rows:
        body += row(cells)
    group += body
    return table


def _section(doctree: nodes.document, title: str, ident: str) -> nodes.section:
    section = nodes.section(ids=[ident], names=[ident])
    section += nodes.title(title, title)
    doctree.note_implicit_target(section)
    return section


def chapter_link(app: Sphinx, fromdoc: str, docname: str) -> nodes.Node:
    env = app.env
    number = env.toc_secnumbers.get(docname, {}).get("")
    title = env.titles[docname].astext() if docname in env.titles else docname
    text = f"{'.'.join(map(str, number))}. {title}" if number else title
    return nodes.reference("", text, internal=True, refuri=app.builder.get_relative_uri(fromdoc, docname))


def times_section(app: Sphinx, doctree: nodes.document, fromdoc: str) -> nodes.section:
    from bib_backrefs import _doc_order
    from prose_stats import prose_stats, reading_minutes

    srcdir = Path(app.srcdir)
    section = _section(doctree, "Reading and execution time of each chapter", "status-times")
    runs = read_runs(srcdir / app.config.kltutorial_status_dir)
    labels = [label for _, label in RUNS if label in runs]
    if runs:
        section += nodes.paragraph("", (
            f"Minutes to read each page's prose (at 200 words a minute, code, figures, exercises and "
            f"folded blocks left out), and the seconds each chapter's notebook took to execute in the last "
            f"verified run of make test (nbval: every cell, the kernel's start and shutdown included), on "
            f"{' and on the '.join(labels)}; the budget is {BUDGET_S} s a chapter."))
    else:
        section += nodes.paragraph("", NO_RUN, classes=["kl-status-no-run"])
        section += nodes.paragraph("", "Minutes to read each page's prose (at 200 words a minute, code, "
                                       "figures, exercises and folded blocks left out).")
    rows = []
    for docname in _doc_order(app.env):
        if docname in APPENDIX or docname == fromdoc:
            continue
        source = Path(app.env.doc2path(docname))
        if source.suffix not in (".ipynb", ".md"):
            continue
        cells: list[nodes.Node | str] = [chapter_link(app, fromdoc, docname),
                                         f"{reading_minutes(prose_stats(source))} min"]
        if runs:
            cells += _time_cells(source, srcdir, runs, labels)
        rows.append(cells)
    header = ["Chapter", "Reading", *labels, "Budget"] if runs else ["Chapter", "Reading"]
    section += _table(header, rows, [40, 12] + [15] * (len(header) - 2))
    return section


def _time_cells(source: Path, srcdir: Path, runs: dict, labels: list[str]) -> list[str]:
    """The execution time in each run and the verdict against the budget (dashes for a markdown page)."""
    if source.suffix != ".ipynb":
        return ["—"] * (len(labels) + 1)
    name = source.resolve().relative_to(srcdir.resolve()).as_posix()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    cells, worst = [], None
    for label in labels:
        entry = runs[label].get(name)
        if entry is None:
            cells.append("not run")
        elif entry["sha256"] != digest:
            cells.append("changed since")
        else:
            cells.append(f"{entry['seconds']:.1f} s")
            worst = max(worst or 0.0, entry["seconds"])
    verdict = f"within {BUDGET_S} s" if worst is not None and worst <= BUDGET_S else f"over {BUDGET_S} s"
    cells.append("—" if worst is None else verdict)
    return cells


def versions_section(app: Sphinx, doctree: nodes.document) -> nodes.section:
    srcdir = Path(app.srcdir)
    section = _section(doctree, "Versions", "status-versions")
    section += nodes.paragraph("", (
        "As installed in the environment that built this book, beside the pins of requirements.txt."))
    pins = pinned_versions(srcdir / "requirements.txt")
    rows = [[name, version, "(the interpreter)" if name == "Python"
             else pins.get(_normal(name), "not pinned")]
            for name, version in installed_versions().items()]
    section += _table(["Package", "Installed", "Pinned"], rows, [30, 20, 20])
    return section


def ci_section(app: Sphinx, doctree: nodes.document) -> nodes.section:
    srcdir = Path(app.srcdir)
    section = _section(doctree, "What CI checks", "status-ci")
    section += nodes.paragraph("", "CI runs make test (.ci/run), whose steps, in order, are these "
                                   "(read from the Makefile, with the comment above each target there):")
    items = nodes.enumerated_list()
    for target, comment, commands in make_test_steps(srcdir / "Makefile"):
        item = nodes.list_item()
        para = nodes.paragraph()
        para += nodes.literal(f"make {target}", f"make {target}")
        if comment:
            para += nodes.Text(": ")
            for i, piece in enumerate(comment.split("`")):  # `code` in a comment as code
                para += nodes.literal(piece, piece) if i % 2 else nodes.Text(piece)
            item += para
        else:
            para += nodes.Text(": runs")
            item += para
            for command in commands:
                item += nodes.literal_block(command, command, language="none")
        items += item
    section += items
    return section


def fill_status(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    for placeholder in list(doctree.findall(status_placeholder)):
        placeholder.replace_self([times_section(app, doctree, docname), versions_section(app, doctree),
                                  ci_section(app, doctree)])


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("kltutorial_status_dir", "_build/status", "env")
    app.add_directive("kltutorial-status", StatusDirective)
    app.add_node(status_placeholder)
    app.connect("doctree-resolved", fill_status)
    app.connect("env-get-outdated", always_outdated)
    app.connect("env-purge-doc", purge)
    app.connect("env-merge-info", merge)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
