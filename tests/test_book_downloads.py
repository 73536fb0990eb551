"""The notebooks bundle and the status page of the built book.

tools/notebooks_bundle.py writes the bundle, tools/status_page.py the status page.

Run with the browser checks after the strict build (``pytest tests -m "book and not pdf"``); none of
these needs the browser (tests/test_book_html.py opens each page's download menu and follows the
intro's link to the bundle).

* The bundle, ``_downloads/kltutorial-notebooks.zip``, holds exactly what is needed to run the
  chapters, derived here from the sources: every notebook of ``_toc.yml``, every image or data file
  under ``book/`` whose path a notebook names (a ``{figure}``, a file it reads), the package's files,
  ``requirements.txt`` (the repository's, byte for byte), ``pyproject.toml`` and a README with the
  two commands. One chapter
  (the fastest of the last verified run) is executed from the unpacked zip, against the bundled
  package, not the installed one.
* The status page lists every chapter notebook with the time each verified nbval pass recorded (or
  says plainly that there was no verified run), the versions installed here, and the steps of
  ``make test`` as the Makefile has them.
"""

from __future__ import annotations

import hashlib
import html
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
import yaml

from tools.prose_stats import prose_stats, reading_minutes

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[1]
HTML_DIR = Path(os.environ.get("KLTUTORIAL_HTML_DIR", ROOT / "_build" / "html")).resolve()
BUNDLE = HTML_DIR / "_downloads" / "kltutorial-notebooks.zip"
STATUS_PAGE = HTML_DIR / "book" / "status.html"
STATUS_DIR = ROOT / "_build" / "status"  # where make test's nbval passes write their times
RUNS = {"nbval-native.json": "this machine's kernels", "nbval-second-kernels.json": "second kernel set"}
FOLDER = "kltutorial-notebooks"
BUDGET_S = 60
#: Files a notebook shows ({figure}) or reads: images and data.
DATA_SUFFIXES = {".png", ".jpg", ".jpeg", ".svg", ".gif", ".csv", ".json", ".npz"}


def toc_files() -> list[str]:
    """Every file of ``_toc.yml`` (without suffix), in reading order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf8"))
    files = [toc["root"]]

    def walk(entries: list[dict]) -> None:
        for entry in entries:
            files.append(entry["file"])
            walk(entry.get("sections", []))

    for part in toc.get("parts", []):
        walk(part["chapters"])
    return files


def chapter_notebooks() -> list[Path]:
    return [ROOT / f"{name}.ipynb" for name in toc_files() if (ROOT / f"{name}.ipynb").is_file()]


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


# ---------------------------------------------------------------------------------------------
# The bundle


def expected_members() -> set[str]:
    """What the bundle must hold, from the sources: the notebooks, every image or data file under
    ``book/`` whose path (relative to ``book/``) a notebook names, the package, and the project files."""
    names = {"README.md", "requirements.txt", "pyproject.toml"}
    book = ROOT / "book"
    files = [p for p in book.rglob("*") if p.is_file() and p.suffix.lower() in DATA_SUFFIXES
             and "_build" not in p.parts and ".ipynb_checkpoints" not in p.parts]
    for notebook in chapter_notebooks():
        names.add(notebook.relative_to(ROOT).as_posix())
        text = "\n".join(cell.source for cell in nbformat.read(notebook, as_version=4).cells)
        for path in files:
            if re.search(rf"(?<![\w/.-]){re.escape(path.relative_to(book).as_posix())}\b", text):
                names.add(path.relative_to(ROOT).as_posix())
    for path in (ROOT / "kltutorial").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            names.add(path.relative_to(ROOT).as_posix())
    return {f"{FOLDER}/{name}" for name in names}


@pytest.fixture(scope="module")
def bundle() -> zipfile.ZipFile:
    if not BUNDLE.is_file():
        pytest.fail(f"no notebooks bundle at {BUNDLE}: build the book first (make book-verified)")
    with zipfile.ZipFile(BUNDLE) as zf:
        yield zf


def test_bundle_holds_every_chapter_its_figures_and_the_package(bundle: zipfile.ZipFile) -> None:
    held = set(bundle.namelist())
    expected = expected_members()
    assert any(name.endswith(".png") for name in expected), "no figure found in the notebooks"
    assert not expected - held, f"missing from the bundle: {sorted(expected - held)}"
    assert not held - expected, f"in the bundle but not needed: {sorted(held - expected)}"
    assert bundle.read(f"{FOLDER}/requirements.txt") == (ROOT / "requirements.txt").read_bytes()
    for notebook in chapter_notebooks():
        name = f"{FOLDER}/{notebook.relative_to(ROOT).as_posix()}"
        assert bundle.read(name) == notebook.read_bytes(), f"{name} differs from {notebook}"


def test_bundle_readme_gives_the_two_commands(bundle: zipfile.ZipFile) -> None:
    readme = bundle.read(f"{FOLDER}/README.md").decode()
    commands = re.search(r"```bash\n(.*?)```", readme, re.DOTALL)
    assert commands, "the bundle's README has no commands"
    lines = [line for line in commands.group(1).splitlines() if line.strip()]
    assert len(lines) == 2, lines
    for part in ("venv", "install -r requirements.txt", "install --no-deps -e ."):
        assert part in lines[0], lines[0]
    assert "jupyter lab" in lines[1] and "book" in lines[1]


def test_intro_links_to_the_bundle() -> None:
    intro = (HTML_DIR / "book" / "intro.html").read_text(encoding="utf8")
    links = re.findall(r'<a [^>]*href="([^"]*kltutorial-notebooks\.zip)"', intro)
    assert links, "the intro has no link to the notebooks bundle"
    for href in links:
        assert ((HTML_DIR / "book" / href).resolve()) == BUNDLE, href


def fastest_chapter() -> Path:
    """The chapter that took least time in the last verified run (``make test`` runs nbval first);
    without one, the book's first chapter (the number of code cells says little: §9a has five, and
    trains for a minute)."""
    for name in RUNS:  # whichever pass make test ran (the second kernel set's; the native one by hand)
        record = STATUS_DIR / name
        if record.is_file():
            times = json.loads(record.read_text(encoding="utf8"))["notebooks"]
            return ROOT / min(times, key=lambda name: times[name]["seconds"])
    return chapter_notebooks()[0]


def test_a_chapter_runs_from_the_unpacked_bundle(bundle: zipfile.ZipFile, tmp_path: Path) -> None:
    """The chapter executes top to bottom (no error) from the zip's folder, importing the zip's package."""
    bundle.extractall(tmp_path)
    root = tmp_path / FOLDER
    chapter = root / fastest_chapter().relative_to(ROOT)
    env = {**os.environ, "PYTHONPATH": str(root)}
    where = subprocess.run([sys.executable, "-c", "import kltutorial; print(kltutorial.__file__)"],
                           cwd=chapter.parent, env=env, capture_output=True, text=True, check=True)
    imported = where.stdout.strip()
    assert Path(imported).is_relative_to(root), f"imports {imported}, not the bundle's package"
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
         "--ExecutePreprocessor.kernel_name=python3", "--ExecutePreprocessor.timeout=180",
         "--output-dir", str(tmp_path / "executed"), str(chapter)],
        cwd=chapter.parent, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, f"{chapter.name} failed from the bundle:\n{run.stderr[-3000:]}"
    executed = nbformat.read(tmp_path / "executed" / chapter.name, as_version=4)
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"{chapter.name}: error outputs {errors[:1]}"
    print(f"{chapter.name} ran from the bundle in {time.monotonic() - started:.1f} s")


# ---------------------------------------------------------------------------------------------
# The status page


@pytest.fixture(scope="module")
def status() -> str:
    if not STATUS_PAGE.is_file():
        pytest.fail(f"no status page at {STATUS_PAGE}: build the book first")
    page = STATUS_PAGE.read_text(encoding="utf8")
    return page[page.index("<main"):page.index("</main>")]


def _section(status: str, ident: str) -> str:
    match = re.search(rf'<section id="{ident}">(.*?)</section>', status, re.DOTALL)
    assert match, f"the status page has no section {ident}"
    return match.group(1)


def test_status_lists_each_chapter_s_time_against_the_budget(status: str) -> None:
    times = _section(status, "status-times")
    runs = {label: json.loads((STATUS_DIR / name).read_text(encoding="utf8"))["notebooks"]
            for name, label in RUNS.items() if (STATUS_DIR / name).is_file()}
    if not runs:
        assert "No verified run" in _text(times), "no verified run recorded, and the page does not say so"
        assert not re.search(r"\d s</(p|td)>", times), "times on the page without a verified run"
        assert all(f"{reading_minutes(prose_stats(nb))} min" in _text(times) for nb in chapter_notebooks())
        return
    rows = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", times, re.DOTALL):
        link = re.search(r'href="([^"#]+)', row)
        if link:
            cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)
            rows[Path(link.group(1)).stem] = [_text(cell) for cell in cells]
    for notebook in chapter_notebooks():
        name = notebook.relative_to(ROOT).as_posix()
        assert notebook.stem in rows, f"{name} missing from the status page"
        cells = rows[notebook.stem]
        assert cells[1] == f"{reading_minutes(prose_stats(notebook))} min", (name, cells)
        shown = cells[2:-1]
        assert len(shown) == len(runs), cells
        for label, cell in zip(runs, shown, strict=True):
            recorded = runs[label].get(name)
            if recorded is None:
                assert cell == "not run", (name, label, cell)
            else:  # the run was of this notebook as it is now only if the recorded hash matches
                current = hashlib.sha256(notebook.read_bytes()).hexdigest() == recorded["sha256"]
                assert cell == (f"{recorded['seconds']:.1f} s" if current else "changed since"), (name, cell)
        worst = [runs[label][name]["seconds"] for label in runs if name in runs[label]]
        if worst and "changed since" not in shown:
            verdict = f"within {BUDGET_S} s" if max(worst) <= BUDGET_S else f"over {BUDGET_S} s"
            assert cells[-1] == verdict, (name, cells)
    assert f"{BUDGET_S} s a chapter" in _text(times)


def test_status_versions_are_the_installed_ones(status: str) -> None:
    versions = _section(status, "status-versions")
    rows = {cells[0]: cells[1:] for cells in (
        [_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", versions, re.DOTALL)) if cells}
    assert rows.get("Python", [None])[0] == sys.version.split()[0], rows.get("Python")
    for package in ("torch", "numpy", "jupyter-book", "myst-nb", "nbval"):
        assert package in rows, f"{package} missing from the status page's versions"
        assert rows[package][0] == importlib.metadata.version(package), (package, rows[package])


def test_status_lists_the_steps_of_make_test(status: str) -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf8")
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe, "the Makefile has no test recipe"
    steps = [target for line in recipe.group(1).splitlines()
             for match in [re.search(r"\$\(MAKE\)(?:\s+-\S+)*((?:\s+[\w-]+)+)\s*$", line)] if match
             for target in match.group(1).split()]
    items = [_text(item) for item in re.findall(r"<li>(.*?)</li>", _section(status, "status-ci"), re.DOTALL)]
    shown = [match.group(1) for match in (re.match(r"make ([\w-]+)\s*:", item) for item in items) if match]
    assert shown == steps, f"the page lists {shown}; make test runs {steps}"
    for step in ("nbval", "book-verified", "html-check", "pdf-check"):
        assert step in shown, step
