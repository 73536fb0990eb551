"""A reader's JupyterLab: ``make lab``'s JupyterLab renders the notebooks' MyST and runs them.

Starts ``jupyter lab`` from the venv on 127.0.0.1 (a free port, a random token, no browser of its
own, its settings and workspaces in a temporary folder) on a copy of the fixture notebook
``tests/fixtures/myst_lab.ipynb``, opens it in headless Chromium through Playwright, and checks:

* on opening, before anything runs, jupyterlab-myst has rendered the Markdown: a ``{math}`` role
  and ``$...$`` as KaTeX, a ``{note}`` admonition as a styled box, and the numbers written with
  ``{eval}`` shown from the stored ``user_expressions`` (tools/myst_eval.py);
* ``notebook:run-all-cells`` (through ``window.jupyterapp``, exposed by ``--expose-app-in-browser``)
  runs every code cell without an error or stderr output, the kernel goes idle, and the numbers
  are still there, now evaluated in the kernel;
* nothing is fetched from outside 127.0.0.1;
* every chapter of book/, opened as a reader opens it, shows its numbers (the ``{eval}``
  results stored by tools/myst_eval.py) and its ``{figure}`` images in the rendered Markdown,
  and no role or directive as raw text or as "Unknown Directive" (but the one interactive
  figure, which needs the built book's plotly);
* its exercises show as numbered exercise boxes, and each solution as a box folded on opening
  (jupyterlab-myst renders ``{solution}`` with ``:class: dropdown`` as a closed ``<details>``; a
  gated ``solution-start`` as a closed "Start of Solution to Exercise N" box holding the text of
  its own cell, the solution's code cells after it, which stay collapsed to a placeholder because
  their ``source_hidden`` metadata says so, and ``solution-end`` as an empty box, jupyterlab-myst
  not joining cells); the solutions' text is read with every box opened, so that its numbers are
  checked too.

A screenshot goes to ``screenshots/jupyterlab/`` next to the built book's HTML folder (see
tests/test_book_html.py). The server is stopped at the end by killing its process group.

Marked ``book``, so it runs in ``make html-check`` (the unit-test run deselects it). Chromium is
pytest-playwright's (``launch_browser``, with the book check's launch options, tests/conftest.py),
launched with the flags below. Without Chromium or jupyterlab-myst it fails (never skips).
"""

from __future__ import annotations

import ast
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path

import nbformat
import pytest
from playwright.sync_api import Browser, Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from test_book_html import CHROMIUM_FLAGS, SCREENSHOT_DIR, _unavailable

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "myst_lab.ipynb"
BOOK = ROOT / "book"
sys.path.insert(0, str(ROOT / "tools"))
import myst_eval  # noqa: E402

FIXTURE_SENTENCE = "The mean of the 4 log-ratios is 2.00 nats, and a quarter of it is 50.0% of a nat."
SERVER_TIMEOUT_S = 30
LAB_TIMEOUT_MS = 45_000
RUN_TIMEOUT_MS = 30_000
# The book check's flags, with 127.0.0.1 (the server) exempt from "no host resolves".
LAB_FLAGS = [f"{flag}, EXCLUDE 127.0.0.1" if flag.startswith("--host-resolver-rules=") else flag
             for flag in CHROMIUM_FLAGS]


@pytest.fixture
def lab_browser(launch_browser: Callable[..., Browser]) -> Iterator[Browser]:
    """A Chromium of its own (pytest-playwright's launch options) that may reach 127.0.0.1."""
    browser = launch_browser(args=LAB_FLAGS)
    yield browser
    browser.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running JupyterLab on a copy of the fixture; yields its base URL with the token."""
    if find_spec("jupyterlab_myst") is None:
        _unavailable("jupyterlab-myst is not installed (pip install -r requirements.txt)")
    root = tmp_path_factory.mktemp("lab")
    notebooks, home = root / "notebooks", root / "home"
    notebooks.mkdir()
    home.mkdir()
    shutil.copy(FIXTURE, notebooks / FIXTURE.name)
    shutil.copytree(BOOK, notebooks / "book", ignore=shutil.ignore_patterns("_build", ".ipynb_checkpoints"))
    # Render every cell, not only those in view, so that a whole chapter can be read at once.
    tracker = home / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}), encoding="utf8")
    # and no "get notified about Jupyter news?" toast over the screenshots
    news = home / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false"}), encoding="utf8")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_PLATFORM_DIRS="1", JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), PYDEVD_DISABLE_FILE_VALIDATION="1")
    command = [
        str(Path(sys.executable).with_name("jupyter")), "lab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={notebooks}",
        "--expose-app-in-browser",
        f"--LabApp.user_settings_dir={home / 'settings'}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
        # Nothing from the internet: no news feed, no update check.
        "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = (root / "lab.log").open("w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"jupyter lab did not start: {(root / 'lab.log').read_text()[-2000:]}")
                time.sleep(0.2)
        yield f"{base}/lab/tree/{FIXTURE.name}?token={token}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its kernels
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


# The open notebook, as the reader sees it: rendered Markdown per cell, outputs per code cell.
NOTEBOOK_STATE = r"""
() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cells = panel.content.widgets;
  const markdown = cells.filter(c => c.model.type === 'markdown').map(c => {
    const rendered = c.node.querySelector('.jp-MarkdownOutput, .jp-Cell-inputArea > .myst');
    return {
      text: rendered ? rendered.innerText.replace(/\s+/g, ' ').trim() : '',
      katex: rendered ? rendered.querySelectorAll('.katex').length : 0,
      admonitions: rendered ? [...rendered.querySelectorAll('aside, .admonition, [class*="admonition"]')]
        .map(a => (a.textContent || '').replace(/\s+/g, ' ').trim()).filter(Boolean) : [],
    };
  });
  const code = cells.filter(c => c.model.type === 'code').map(c => ({
    executionCount: c.model.executionCount,
    outputs: c.model.outputs.toJSON().map(o => ({type: o.output_type, name: o.name || null,
      text: (o.text || o.evalue || '').toString().slice(0, 200)})),
    errorNodes: c.node.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"],'
      + ' .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]').length,
  }));
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  return {markdown, code, kernel: kernel ? kernel.status : null};
}
"""


def _state(page: Page) -> dict:
    return page.evaluate(NOTEBOOK_STATE)


def _read_in_jupyterlab(lab: str, browser: Browser) -> tuple[dict, dict, list[str], list[str]]:
    """Open the notebook, record what it shows, run every cell, record it again."""
    remote: list[str] = []
    crashes: list[str] = []
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.on("request", lambda r: None if r.url.startswith(
        ("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")) else remote.append(r.url))
    page = context.new_page()
    page.on("pageerror", lambda exc: crashes.append(str(exc)))
    page.goto(lab, wait_until="load", timeout=LAB_TIMEOUT_MS)
    # The notebook is open, its kernel started, its Markdown rendered by jupyterlab-myst.
    page.wait_for_function(
        "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " return Boolean(w && w.content && w.sessionContext && w.sessionContext.session"
        " && w.sessionContext.session.kernel && w.sessionContext.session.kernel.status === 'idle'"
        " && w.node.querySelector('.jp-MarkdownCell .myst .katex')); }",
        timeout=LAB_TIMEOUT_MS)
    opened = _state(page)

    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " const code = w.content.widgets.filter(c => c.model.type === 'code');"
        " return code.every(c => c.model.executionCount !== null)"
        "   && w.sessionContext.session.kernel.status === 'idle'; }",
        timeout=RUN_TIMEOUT_MS)
    # jupyterlab-myst asks the kernel for the {eval} expressions after the cells ran.
    page.wait_for_function(
        f"() => document.body.innerText.replace(/\\s+/g, ' ').includes({FIXTURE_SENTENCE!r})",
        timeout=RUN_TIMEOUT_MS)
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
        timeout=RUN_TIMEOUT_MS)
    ran = _state(page)
    shot = SCREENSHOT_DIR / "jupyterlab" / FIXTURE.with_suffix(".jpg").name
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=shot, type="jpeg", quality=70)
    return opened, ran, remote, crashes


def test_jupyterlab_renders_myst_and_runs_the_notebook(lab: str, lab_browser: Browser) -> None:
    started = time.monotonic()
    opened, ran, remote, crashes = _read_in_jupyterlab(lab, lab_browser)
    elapsed = time.monotonic() - started

    title, numbers = opened["markdown"][0], opened["markdown"][1]
    assert title["katex"] >= 2, f"the {{math}} role and $...$ were not rendered as KaTeX: {title}"
    assert "{math}" not in title["text"] and "$" not in title["text"], f"raw MyST left: {title['text']}"
    assert any("Note" in a and "styled box" in a for a in title["admonitions"]), (
        f"the {{note}} admonition is not a box: {title}")
    assert "```" not in title["text"] and "{note}" not in title["text"], title["text"]
    assert FIXTURE_SENTENCE in numbers["text"], (
        f"on opening, the stored {{eval}} results are not shown: {numbers['text']!r}")

    problems = [f"cell {i}: {o}" for i, cell in enumerate(ran["code"]) for o in cell["outputs"]
                if o["type"] == "error" or o["name"] == "stderr"]
    problems += [f"cell {i}: {cell['errorNodes']} error/stderr output areas"
                 for i, cell in enumerate(ran["code"]) if cell["errorNodes"]]
    assert not problems, "running the notebook in JupyterLab failed:\n" + "\n".join(problems)
    assert all(c["executionCount"] for c in ran["code"]), ran["code"]
    assert ran["code"][0]["outputs"][-1]["text"].startswith("mean of 4 log-ratios: 2.00 nats"), ran["code"]
    assert FIXTURE_SENTENCE in ran["markdown"][1]["text"], ran["markdown"][1]
    assert ran["kernel"] == "idle"
    assert not remote, f"JupyterLab fetched from outside 127.0.0.1: {remote[:5]}"
    assert not crashes, f"uncaught exceptions in JupyterLab: {crashes[:3]}"
    print(f"JupyterLab opened, rendered and ran {FIXTURE.name} in {elapsed:.1f} s")


CHAPTERS = sorted(BOOK.glob("*.ipynb"))
# Only the interactive figure (plotly from the built book's _static) stays a glue:figure.
UNKNOWN_DIRECTIVE_ALLOWED = {"11-real-experiment.ipynb": 1}
RAW_SYNTAX = ("{eval}", "{glue", "glued.", "```", "{figure}", "{numref}", "{doc}", ":::", "{exercise",
              "{solution", ":label:", ":class:")
# The exercise and solution directives of a chapter's Markdown, as jupyterlab-myst draws each a box.
EXERCISE = re.compile(r"^`{3,}\{exercise\}", re.MULTILINE)
SOLUTION = re.compile(r"^`{3,}\{solution(?:-start)?\}", re.MULTILINE)
BOXES = re.compile(r"^`{3,}\{(?:exercise|solution|solution-start|solution-end)\}", re.MULTILINE)

# Before anything is opened: the exercise boxes' titles, whether each solution box is open, and how
# many code cells show only a placeholder for their source (jupyter.source_hidden).
EXERCISE_STATE = r"""
() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const node = panel.content.node;
  const title = box => (box.querySelector('.myst-exercise-title') || box).innerText
    .replace(/\s+/g, ' ').trim();
  return {
    exercises: [...node.querySelectorAll('.jp-MarkdownCell aside.myst-exercise')].map(title)
      .filter(t => t.startsWith('Exercise')),
    solutions: [...node.querySelectorAll('.jp-MarkdownCell details.myst-exercise')]
      .map(d => ({title: title(d.querySelector('summary')), open: d.open}))
      .filter(d => d.title.includes('Solution to')),  // not the "Unknown Directive" box, also a details
    hiddenInputs: panel.content.widgets.filter(c => c.model.type === 'code' && c.inputHidden).length,
  };
}
"""

# Each chapter's rendered Markdown: text, images shown (decoded), and MyST's error boxes.
CHAPTER_STATE = r"""
() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const md = panel.content.widgets.filter(c => c.model.type === 'markdown');
  const rendered = md.map(c => c.node.querySelector('.jp-MarkdownOutput, .jp-Cell-inputArea > .myst'));
  const text = rendered.map(r => r ? r.innerText.replace(/\s+/g, ' ').trim() : '');
  const images = rendered.flatMap(r => r ? [...r.querySelectorAll('img')] : []);
  return {
    cells: md.length, renderedCells: rendered.filter(Boolean).length, text,
    images: images.map(i => ({src: i.getAttribute('src') || '', decoded: i.complete && i.naturalWidth > 0})),
    unknown: text.filter(t => t.includes('Unknown Directive') || t.includes('Unknown Role')).length,
  };
}
"""


def _read_chapters(lab: str, browser: Browser) -> dict[str, dict]:
    """Open each chapter in one JupyterLab page, read what it shows, close it and its kernel."""
    states: dict[str, dict] = {}
    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    # JupyterLab itself, with no document in the URL (one would open after ours, and win).
    page.goto(lab.replace(f"/lab/tree/{FIXTURE.name}", "/lab"), wait_until="load",
              timeout=LAB_TIMEOUT_MS)
    page.wait_for_function("() => Boolean(window.jupyterapp)", timeout=LAB_TIMEOUT_MS)
    page.evaluate("async () => { await window.jupyterapp.restored; return true; }")
    for chapter in CHAPTERS:
        path = f"book/{chapter.name}"
        page.evaluate("async (path) => {"
                      " await window.jupyterapp.commands.execute('docmanager:open', {path});"
                      " return true; }", path)
        prose = "\n".join(c.source for c in nbformat.read(chapter, as_version=4).cells
                          if c.cell_type == "markdown")
        boxes = len(BOXES.findall(prose))
        # jupyterlab-myst has rendered every Markdown cell, the exercise and solution boxes included;
        # images have had time to load.
        try:
            page.wait_for_function(
                "([path, boxes]) => { const w = window.jupyterapp.shell.currentWidget;"
                " if (!w || !w.context || w.context.path !== path || !w.content) return false;"
                " const md = w.content.widgets.filter(c => c.model.type === 'markdown');"
                " return md.length > 0 && md.every(c => c.node.querySelector("
                "   '.jp-MarkdownOutput, .jp-Cell-inputArea > .myst'))"
                "   && w.node.querySelectorAll('.jp-MarkdownCell .myst-exercise').length >= boxes"
                "   && [...w.node.querySelectorAll('.jp-MarkdownCell img')]"
                "        .every(i => i.complete); }",
                arg=[path, boxes], timeout=LAB_TIMEOUT_MS)
        except PlaywrightTimeout:
            pass  # what is shown is read below, and the test says what is missing
        opened = page.evaluate("(path) => { const w = window.jupyterapp.shell.currentWidget;"
                               " return Boolean(w && w.context && w.context.path === path); }", path)
        if opened:
            exercises = page.evaluate(EXERCISE_STATE)
            if exercises["exercises"]:  # a picture of the first exercise and its folded solution
                page.evaluate("() => document.querySelector('.jp-MarkdownCell aside.myst-exercise')"
                              ".scrollIntoView({block: 'start'})")
                shot = SCREENSHOT_DIR / "jupyterlab" / f"{chapter.stem}-exercises.jpg"
                page.screenshot(path=shot, type="jpeg", quality=60)
            # every folded block opened (the solutions, the "Precisely" dropdowns), so that its text is
            # read (and checked) with the rest
            page.evaluate("() => { for (const d of document.querySelectorAll('.jp-MarkdownCell details'))"
                          " d.open = true; }")
            states[chapter.name] = {**page.evaluate(CHAPTER_STATE), **exercises}
        else:
            states[chapter.name] = {"cells": -1, "renderedCells": 0, "text": [], "images": [], "unknown": 0}
        # the screenshot shows the chapter's first figure (or its top), as the reader sees it
        page.evaluate("() => { const img = document.querySelector('.jp-MarkdownCell figure img');"
                      " if (img) img.scrollIntoView({block: 'center'}); }")
        shot = SCREENSHOT_DIR / "jupyterlab" / chapter.with_suffix(".jpg").name
        page.screenshot(path=shot, type="jpeg", quality=60)
        page.evaluate("async () => { const w = window.jupyterapp.shell.currentWidget;"
                      " await w.sessionContext.shutdown(); w.dispose(); }")
    return states


def test_every_chapter_shows_its_numbers_and_figures_in_jupyterlab(lab: str, lab_browser: Browser) -> None:
    (SCREENSHOT_DIR / "jupyterlab").mkdir(parents=True, exist_ok=True)
    states = _read_chapters(lab, lab_browser)
    problems = []
    for chapter in CHAPTERS:
        state, source = states[chapter.name], nbformat.read(chapter, as_version=4)
        prose = [c.source for c in source.cells if c.cell_type == "markdown"]
        figures = sum(s.count("{figure}") for s in prose)
        numbers = sum(len(myst_eval.expressions_in(s)) for s in prose if "{glue:figure}" not in s)
        if state["cells"] < 0:
            problems.append(f"{chapter.name}: did not open in JupyterLab")
            continue
        if state["renderedCells"] != state["cells"]:
            missing = state["cells"] - state["renderedCells"]
            problems.append(f"{chapter.name}: {missing} Markdown cells not rendered")
        raw = sorted({token for text in state["text"] for token in RAW_SYNTAX if token in text})
        if raw:
            problems.append(f"{chapter.name}: raw MyST shown as text: {raw}")
        if state["unknown"] != UNKNOWN_DIRECTIVE_ALLOWED.get(chapter.name, 0):
            problems.append(f"{chapter.name}: {state['unknown']} 'Unknown Directive/Role' boxes")
        decoded = [i for i in state["images"] if i["decoded"] and "images/figures/" in i["src"]]
        if len(decoded) != figures:
            problems.append(f"{chapter.name}: {len(decoded)} figure images shown for {figures} {{figure}} "
                            f"directives: {state['images']}")
        markdown = "\n".join(prose)
        exercises, solutions = len(EXERCISE.findall(markdown)), len(SOLUTION.findall(markdown))
        numbered = [re.match(r"Exercise (\d+)\b", title) for title in state["exercises"]]
        if [int(m.group(1)) if m else None for m in numbered] != list(range(1, exercises + 1)):
            problems.append(f"{chapter.name}: {exercises} exercises, shown: {state['exercises']}")
        if len(state["solutions"]) != solutions or any(s["open"] for s in state["solutions"]):
            problems.append(f"{chapter.name}: {solutions} solutions, each folded; shown: "
                            f"{state['solutions']}")
        hidden = sum(c.cell_type == "code" and c.metadata.get("jupyter", {}).get("source_hidden", False)
                     for c in source.cells)
        if state["hiddenInputs"] != hidden:
            problems.append(f"{chapter.name}: {hidden} code cells with source_hidden (the solutions' code), "
                            f"{state['hiddenInputs']} collapsed")
        if numbers:
            # every stored result shows: the text of the first few stored results appears in the prose
            # (a glue:figure's caption sits inside its "Unknown Directive" box, not shown)
            stored = [e["result"]["data"]["text/plain"] for c in source.cells
                      if c.cell_type == "markdown" and "{glue:figure}" not in c.source
                      for e in c.metadata.get("user_expressions", [])]
            shown = " ".join(state["text"])
            absent = [v for v in stored if myst_eval.shown_text(ast.literal_eval(v)) not in shown]
            if len(stored) < numbers or absent:
                problems.append(f"{chapter.name}: {len(stored)} of {numbers} numbers stored; "
                                f"not shown: {absent[:5]}")
    assert not problems, "what a reader opening the chapters in JupyterLab sees:\n" + "\n".join(problems)
