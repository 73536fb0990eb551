"""Checks on the committed notebooks in book/ that nbval itself does not make.

nbval re-executes each notebook and compares outputs, but it silently skips a code
cell that was never executed and happily compares a stored traceback or warning
with a new one. These tests read the stored notebooks (no kernel is started) and
fail when one of them is not in a publishable state:

* every non-empty code cell has been executed, top to bottom in one fresh kernel
  (execution counts 1, 2, 3, ...), as ``make notebooks`` leaves them;
* no stored output is an error or anything written to stderr (warnings included);
* the kernel is ``python3``, so nbval, nbconvert and the book build all find it;
* no tag switches a check off (``nbval-skip``, ``raises-exception``, ...);
* the page has a title, the setup cell is folded (``hide-input``), every ``{glue}`` reference in
  the prose names a value the notebook glues;
* the prose shows its numbers with ``{eval}`` over ``glued`` (never ``{glue:text}``, which
  JupyterLab cannot render), each glued before the prose that shows it, with ``user_expressions``
  up to date (tools/myst_eval.py);
* every figure is a ``{figure}`` of a PNG under book/images/figures/ that the notebook writes with
  ``plotting.save_figure``, and every PNG there belongs to a figure;
* the table of contents and book/ agree;
* every stored result under book/data/ is read by a notebook that says so, and the intro names it
  with the command that regenerates it (the promise of "A book that runs").
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import myst_eval  # noqa: E402

BOOK = ROOT / "book"
FIGURES = BOOK / "images" / "figures"
TOC = ROOT / "_toc.yml"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))

# Tags that would let a cell bypass execution or output checks.
FORBIDDEN_TAGS = {"nbval-skip", "skip-execution", "raises-exception", "nbval-raises-exception"}

# {glue}`key`, {glue:text}`key:.3f`, {glue:md}`key` ... in markdown cells.
GLUE_ROLE = re.compile(r"\{glue(?::[a-z]*)?\}`([^`]+)`")
# ```{glue:figure} key  /  :::{glue} key
GLUE_DIRECTIVE = re.compile(r"^(?:`{3,}|:{3,})\{glue(?::[a-z]*)?\}\s+(\S+)", re.MULTILINE)


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _code_cells(nb: nbformat.NotebookNode) -> list[tuple[int, nbformat.NotebookNode]]:
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def _toc_files(node: object) -> list[str]:
    """Every document named in the toc (``root`` and each ``file``), without suffix."""
    found: list[str] = []
    if isinstance(node, dict):
        for key in ("root", "file"):
            if isinstance(node.get(key), str):
                found.append(str(Path(node[key]).with_suffix("")))
        for value in node.values():
            found.extend(_toc_files(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_toc_files(item))
    return found


def test_book_has_notebooks() -> None:
    assert NOTEBOOKS, "book/ holds no notebooks: nbval would have nothing to check"


def test_toc_and_book_agree() -> None:
    toc = yaml.safe_load(TOC.read_text(encoding="utf8"))
    listed = _toc_files(toc)
    assert len(listed) == len(set(listed)), f"_toc.yml lists a document twice: {listed}"
    missing = [
        doc for doc in listed
        if not any((ROOT / f"{doc}{suffix}").exists() for suffix in (".md", ".ipynb"))
    ]
    assert not missing, f"_toc.yml lists documents that do not exist: {missing}"
    unlisted = [
        nb.relative_to(ROOT).with_suffix("").as_posix()
        for nb in NOTEBOOKS
        if nb.relative_to(ROOT).with_suffix("").as_posix() not in listed
    ]
    assert not unlisted, (
        f"notebooks in book/ that _toc.yml does not list (they would be tested but "
        f"never shown): {unlisted}"
    )


@pytest.fixture(params=NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def notebook(request: pytest.FixtureRequest) -> tuple[str, nbformat.NotebookNode]:
    path: Path = request.param
    nb = _read(path)
    nbformat.validate(nb)
    return path.name, nb


def test_kernel_is_python3(notebook: tuple[str, nbformat.NotebookNode]) -> None:
    name, nb = notebook
    spec = nb.metadata.get("kernelspec", {})
    assert spec.get("name") == "python3", (
        f"{name}: kernelspec name is {spec.get('name')!r}; use 'python3' so that nbval, "
        "nbconvert and jupyter-book find the kernel on every machine"
    )


def test_every_code_cell_executed_in_order(notebook: tuple[str, nbformat.NotebookNode]) -> None:
    name, nb = notebook
    counts = []
    for index, cell in _code_cells(nb):
        if not cell.source.strip():
            continue
        assert cell.execution_count is not None, (
            f"{name}: code cell {index} was never executed (nbval would skip it); "
            "run `make notebooks`"
        )
        counts.append(cell.execution_count)
    assert counts == list(range(1, len(counts) + 1)), (
        f"{name}: execution counts {counts} are not 1..{len(counts)}: run the notebook top "
        "to bottom in a fresh kernel (`make notebooks`)"
    )


def test_no_errors_or_stderr(notebook: tuple[str, nbformat.NotebookNode]) -> None:
    name, nb = notebook
    for index, cell in _code_cells(nb):
        for output in cell.get("outputs", []):
            assert output.output_type != "error", (
                f"{name}: code cell {index} stores an error: "
                f"{output.get('ename')}: {output.get('evalue')}"
            )
            if output.output_type == "stream":
                assert output.name != "stderr", (
                    f"{name}: code cell {index} wrote to stderr (a warning?): "
                    f"{output.text[:300]!r}"
                )


def test_no_check_disabling_tags(notebook: tuple[str, nbformat.NotebookNode]) -> None:
    name, nb = notebook
    for index, cell in enumerate(nb.cells):
        tags = set(cell.get("metadata", {}).get("tags", []))
        bad = tags & FORBIDDEN_TAGS
        assert not bad, f"{name}: cell {index} has tags {sorted(bad)} that bypass the checks"


def test_has_title_and_folded_setup(notebook: tuple[str, nbformat.NotebookNode]) -> None:
    name, nb = notebook
    first = nb.cells[0] if nb.cells else None
    assert first is not None and first.cell_type == "markdown", (
        f"{name}: the first cell must be markdown holding the page title"
    )
    assert first.source.lstrip().startswith("# "), (
        f"{name}: the first cell must start with a level-1 heading (the page title)"
    )
    code = _code_cells(nb)
    assert code, f"{name}: no code cells"
    tags = code[0][1].get("metadata", {}).get("tags", [])
    assert "hide-input" in tags and not {"remove-cell", "remove-input"} & set(tags), (
        f"{name}: the first code cell (imports, seeds, style) must be tagged hide-input: folded "
        "on the page but there, so that a reader can re-run what the page shows"
    )


def test_glue_references_resolve(notebook: tuple[str, nbformat.NotebookNode]) -> None:
    name, nb = notebook
    glued = {
        output.get("metadata", {}).get("scrapbook", {}).get("name")
        for _, cell in _code_cells(nb)
        for output in cell.get("outputs", [])
        if output.output_type in ("display_data", "execute_result")
    }
    glued.discard(None)
    referenced = set()
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for key in GLUE_ROLE.findall(cell.source) + GLUE_DIRECTIVE.findall(cell.source):
            if "::" in key:  # a value glued in another document
                continue
            referenced.add(key.split(":")[0])
    missing = sorted(referenced - glued)
    assert not missing, f"{name}: markdown refers to glue keys never glued: {missing}"


# numpy >= 2 and torch scalars repr as "np.float64(0.5)" / "tensor(0.5)": myst-nb cannot
# format those ({glue:text}`key:.3f` fails) and would print them verbatim in the prose.
WRAPPED_SCALAR = re.compile(r"^(?:np\.[a-z_]+\d*|tensor)\(")


def test_glued_values_are_plain(notebook: tuple[str, nbformat.NotebookNode]) -> None:
    name, nb = notebook
    bad = []
    for _, cell in _code_cells(nb):
        for output in cell.get("outputs", []):
            scrapbook = output.get("metadata", {}).get("scrapbook")
            if not scrapbook:
                continue
            text = output.get("data", {}).get(
                scrapbook.get("mime_prefix", "") + "text/plain", ""
            )
            if WRAPPED_SCALAR.match(str(text)):
                bad.append(f"{scrapbook.get('name')}={text}")
    assert not bad, (
        f"{name}: glue plain Python numbers (float(x), int(x), x.item()), not {bad}"
    )


# A number written with a glue role: myst-nb renders it, jupyterlab-myst shows the role's text.
GLUE_TEXT_ROLE = re.compile(r"\{glue(?::(?:text|md|any))?\}`")
FIGURE_DIRECTIVE = re.compile(r"^(`{3,}|:{3,})\{figure\}\s+(\S+)\s*\n((?::[a-z_-]+:.*\n)*)", re.MULTILINE)
SAVE_FIGURE = re.compile(r"plotting\.save_figure\([^\n]*?,\s*[\"']([^\"']+)[\"']\)")


def test_prose_numbers_are_eval_and_show_in_jupyterlab(notebook: tuple[str, nbformat.NotebookNode]) -> None:
    name, nb = notebook
    roles = [f"cell {i}: {m.group(0)}" for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
             for m in GLUE_TEXT_ROLE.finditer(cell.source)]
    assert not roles, (f"{name}: numbers written with a glue role, which JupyterLab shows as role text; "
                       f"write {{eval}}`f\"{{glued.name:.3f}}\"` instead: {roles[:5]}")
    found = myst_eval.problems(nb)
    assert not found, f"{name}: " + "\n".join(found[:10])


def test_figures_are_written_files_that_a_figure_directive_shows(
        notebook: tuple[str, nbformat.NotebookNode]) -> None:
    name, nb = notebook
    saved = {m.group(1) for _, cell in _code_cells(nb) for m in SAVE_FIGURE.finditer(cell.source)}
    shown = {}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for m in FIGURE_DIRECTIVE.finditer(cell.source):
                options = dict(re.findall(r"^:([a-z_-]+):\s*(.*)$", m.group(3), re.MULTILINE))
                shown[m.group(2)] = options
    for target, options in shown.items():
        path = (BOOK / target).resolve()
        assert path.is_file(), f"{name}: {{figure}} {target} does not exist (run `make notebooks`)"
        if path.parent == FIGURES.resolve():
            stem = path.stem
            assert stem in saved, f"{name}: {{figure}} {target} is not written by this notebook's code"
            assert options.get("name") == stem, f"{name}: {{figure}} {target} needs :name: {stem}"
        assert options.get("alt"), f"{name}: {{figure}} {target} has no :alt: text"
    missing = sorted(s for s in saved if f"images/figures/{s}.png" not in shown)
    assert not missing, f"{name}: figures written but never shown with {{figure}}: {missing}"


def test_no_stale_figure_files() -> None:
    written = {m.group(1) for path in NOTEBOOKS for _, cell in _code_cells(_read(path))
               for m in SAVE_FIGURE.finditer(cell.source)}
    stale = sorted(p.name for p in FIGURES.glob("*") if p.stem not in written or p.suffix != ".png")
    assert not stale, f"book/images/figures/ holds files no notebook writes: {stale}"


def test_each_value_is_glued_once(notebook: tuple[str, nbformat.NotebookNode]) -> None:
    """myst-nb keeps one value per key: a second glue of the same key is a build warning."""
    name, nb = notebook
    keys = [output.get("metadata", {}).get("scrapbook", {}).get("name")
            for _, cell in _code_cells(nb) for output in cell.get("outputs", [])]
    repeated = sorted({k for k in keys if k is not None and keys.count(k) > 1})
    assert not repeated, f"{name}: glued more than once: {repeated}"


def test_no_cell_shows_a_picture_of_its_own(notebook: tuple[str, nbformat.NotebookNode]) -> None:
    """A picture reaches the page only as a numbered {figure}: a cell's own image output would be an
    unnumbered, uncaptioned copy (the cell that draws a figure saves and closes it)."""
    name, nb = notebook
    images = [index for index, cell in _code_cells(nb) for output in cell.get("outputs", [])
              if not output.get("metadata", {}).get("scrapbook")
              and any(mime.startswith("image/") for mime in output.get("data", {}))]
    assert not images, f"{name}: code cells {images} show an image; save and close the figure instead"


# The book's code column shows about 88 characters at 1400 px; a longer line scrolls sideways.
# The code lines are ruff's to check (book/ruff.toml: line-length 88, every cell, as JupyterLab
# shows them all); what ruff cannot see is the printed output, checked here.
MAX_SHOWN_WIDTH = 88
HIDDEN_OUTPUT = {"remove-cell", "remove-output"}


def test_printed_lines_fit_the_column(notebook: tuple[str, nbformat.NotebookNode]) -> None:
    """Every line a cell prints, where the book shows it, fits the text column."""
    name, nb = notebook
    wide = []
    for index, cell in _code_cells(nb):
        if set(cell.get("metadata", {}).get("tags", [])) & HIDDEN_OUTPUT:
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                wide += [f"cell {index} output: {len(line)} chars: {line[:60]!r}"
                         for line in output.get("text", "").splitlines()
                         if len(line) > MAX_SHOWN_WIDTH]
    assert not wide, (f"{name}: printed lines wider than {MAX_SHOWN_WIDTH} characters scroll "
                      "sideways:\n" + "\n".join(wide))


# ---------------------------------------------------------------------------------------------------
# Exercises (CONTRIBUTING.md, "Adding a section"): at the end of a section, under "## Exercises", at
# least three, of the three kinds, each marked with its kind and difficulty and followed by its folded
# solution.

EXERCISE_DIRECTIVE = re.compile(r"^`{3,}\{exercise\}[^\n]*\n((?::[\w-]+:[^\n]*\n)*)", re.MULTILINE)
SOLUTION_DIRECTIVE = re.compile(r"^`{3,}\{(solution|solution-start)\}\s+(\S+)\s*\n((?::[\w-]+:[^\n]*\n)*)",
                                re.MULTILINE)
GATE = re.compile(r"^`{3,}\{solution-(start|end)\}", re.MULTILINE)
KIND_LINE = re.compile(r"^\*\*(Check|Code|Explore)\*\* · difficulty ([★☆]{3})$", re.MULTILINE)
CHECK_CALL = re.compile(r"^check\(\"(\w+)\", (\w+)\)$", re.MULTILINE)


def _options(block: str) -> dict[str, str]:
    return dict(re.findall(r"^:([\w-]+):\s*(.*)$", block, re.MULTILINE))


def _exercise_cells(nb: nbformat.NotebookNode) -> list[tuple[int, dict[str, str], str]]:
    """(cell index, options, kind line) of every exercise directive, in order."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for m in EXERCISE_DIRECTIVE.finditer(cell.source):
            kind = KIND_LINE.search(cell.source[m.end():])
            found.append((index, _options(m.group(1)), kind.group(0) if kind else ""))
    return found


def _stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def test_exercises_follow_the_section_rules(notebook: tuple[str, nbformat.NotebookNode]) -> None:
    name, nb = notebook
    exercises = _exercise_cells(nb)
    # every section §1-§12 (NN-slug.ipynb) has them; a child page (09a, 11a) may
    assert exercises or not re.match(r"\d\d-", name), f"{name}: a section ends with its exercises"
    if not exercises:
        return
    headings = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                for line in c.source.splitlines() if line.startswith("## ")]
    start = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                  and c.source.startswith("## Exercises")), None)
    assert start is not None and start == headings[-1], (
        f"{name}: exercises go at the end of the section, under the last heading '## Exercises'")
    assert all(index > start for index, _, _ in exercises), f"{name}: an exercise before '## Exercises'"
    assert len(exercises) >= 3, f"{name}: at least three exercises, found {len(exercises)}"
    kinds = [KIND_LINE.match(kind) for _, _, kind in exercises]
    assert all(kinds), (f"{name}: every exercise opens with its kind and difficulty, e.g. "
                        f"'**Check** · difficulty ★☆☆': {[k for _, _, k in exercises]}")
    assert {k.group(1) for k in kinds} == {"Check", "Code", "Explore"}, f"{name}: one of each kind"
    assert any(k.group(2) == "★☆☆" for k in kinds), f"{name}: at least one exercise of five minutes (★☆☆)"
    labels = [options.get("label", "") for _, options, _ in exercises]
    assert all(label.startswith("ex-") for label in labels), f"{name}: label every exercise ex-...: {labels}"
    # each exercise's solution comes after it, before the next exercise, folded
    solutions = [(i, m.group(2), _options(m.group(3))) for i, c in enumerate(nb.cells)
                 if c.cell_type == "markdown" for m in SOLUTION_DIRECTIVE.finditer(c.source)]
    bounds = [index for index, _, _ in exercises] + [len(nb.cells)]
    for (index, _, _), label, after in zip(exercises, labels, bounds[1:], strict=True):
        mine = [s for s in solutions if s[1] == label]
        assert len(mine) == 1 and index <= mine[0][0] < after, (
            f"{name}: {label} needs one solution between it and the next exercise")
        assert "dropdown" in mine[0][2].get("class", "").split(), (
            f"{name}: {label}'s solution needs :class: dropdown (folded)")
        assert mine[0][2].get("label", "").startswith("sol-"), f"{name}: label {label}'s solution sol-..."


def test_gated_solutions_are_paired_and_hide_their_code_in_jupyterlab(
        notebook: tuple[str, nbformat.NotebookNode]) -> None:
    """solution-start and solution-end alternate (sphinx-exercise fails on anything else), and a code cell
    between them keeps its source folded in JupyterLab (jupyter.source_hidden), where the gated
    solution's box cannot hold it."""
    name, nb = notebook
    inside, opened_at = False, None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for m in GATE.finditer(cell.source):
                assert (m.group(1) == "start") != inside, (
                    f"{name}: cell {index}: solution-{m.group(1)} out of turn")
                inside, opened_at = m.group(1) == "start", index
        elif inside:
            assert cell.metadata.get("jupyter", {}).get("source_hidden") is True, (
                f"{name}: code cell {index} of the solution opened in cell {opened_at} needs "
                "metadata jupyter.source_hidden: true (JupyterLab would show the answer)")
    assert not inside, f"{name}: solution-start in cell {opened_at} has no solution-end"


def test_code_exercises_ship_a_stub_and_a_checked_solution(
        notebook: tuple[str, nbformat.NotebookNode]) -> None:
    """Every check(...) output stored is "correct" or, for the stub, "not implemented yet", never an error
    or a wrong answer; each checker used has both, in that order, and is registered for this section."""
    from kltutorial.exercises import CHECKERS

    name, nb = notebook
    seen: dict[str, list[str]] = {}
    for index, cell in _code_cells(nb):
        for checker, _ in CHECK_CALL.findall(cell.source):
            printed = _stdout(cell)
            status = ("correct" if printed.startswith(f"{checker}: correct") else
                      "stub" if printed.startswith(f"{checker}: not implemented yet") else printed[:200])
            assert status in ("correct", "stub"), (
                f"{name}: cell {index}: check({checker!r}) printed {status!r}")
            seen.setdefault(checker, []).append(status)
    for checker, statuses in seen.items():
        assert checker in CHECKERS and CHECKERS[checker].section == Path(name).stem, (
            f"{name}: checker {checker!r} is not registered for this section")
        assert statuses == ["stub", "correct"], f"{name}: {checker}: stub then solution, got {statuses}"
    if any(KIND_LINE.match(k) and k.startswith("**Code**") for _, _, k in _exercise_cells(nb)):
        assert seen, f"{name}: a code exercise without a check(...) call"


def test_every_checker_is_used_in_its_section() -> None:
    from kltutorial.exercises import CHECKERS

    for checker in CHECKERS.values():
        path = BOOK / f"{checker.section}.ipynb"
        assert path.is_file(), f"checker {checker.name!r}: no notebook {path.name}"
        calls = [m for _, c in _code_cells(_read(path)) for m in CHECK_CALL.findall(c.source)]
        assert any(m[0] == checker.name for m in calls), f"checker {checker.name!r} unused in {path.name}"


# The intro's promise ("A book that runs") names every stored result, with the command of the
# package that regenerates it; a notebook that reads one says so in its prose.
DATA = BOOK / "data"
INTRO = BOOK / "intro.md"
# a path under book/data/ in a notebook's code: "data/x.json" (run from book/) or "book/data/x.json"
DATA_READ = re.compile(r"""["'](?:\./)?(?:book/)?data/([\w.\-]+)["']""")


def stored_result_problems(intro: str, data_files: list[str],
                           notebooks: dict[str, tuple[str, str]]) -> list[str]:
    """What breaks the promise about stored results: a file of ``book/data/`` that ``intro`` does not
    name with a regenerating ``python -m kltutorial...`` command in one code span ending at it, or
    that no notebook's code (``notebooks[name] = (code, markdown)``) reads; a file that a notebook
    reads but that does not exist, or that its prose does not mention."""
    problems = []
    for name in data_files:
        command = re.compile(r"`python -m kltutorial(?:\.\w+)*\s[^`]*\bbook/data/" + re.escape(name) + "`")
        if not command.search(intro):
            problems.append(f"book/data/{name}: not named in the intro with the command that regenerates "
                            f"it (`python -m kltutorial.... --json book/data/{name}`)")
    read = {name for code, _ in notebooks.values() for name in DATA_READ.findall(code)}
    problems += [f"book/data/{name}: no notebook reads it" for name in data_files if name not in read]
    for nb_name, (code, markdown) in notebooks.items():
        for name in sorted(set(DATA_READ.findall(code))):
            if name not in data_files:
                problems.append(f"{nb_name}: reads data/{name}, which book/data/ does not hold")
            if f"data/{name}" not in markdown:
                problems.append(f"{nb_name}: reads data/{name} without saying so in its prose")
    return problems


def test_stored_results_are_named_with_their_command() -> None:
    data_files = sorted(p.name for p in DATA.iterdir() if p.is_file()) if DATA.is_dir() else []
    notebooks = {}
    for path in NOTEBOOKS:
        nb = _read(path)
        notebooks[path.name] = (
            "\n".join(c.source for c in nb.cells if c.cell_type == "code"),
            "\n".join(c.source for c in nb.cells if c.cell_type == "markdown"),
        )
    problems = stored_result_problems(INTRO.read_text(encoding="utf8"), data_files, notebooks)
    assert not problems, "\n".join(problems)


def test_stored_result_problems_finds_each_break() -> None:
    good_intro = "stored: `python -m kltutorial.studies.bench --linear --json book/data/a.json` regenerates"
    code = 'results = bench.read_linear_results("data/a.json")'
    prose = "it reads what the command stored, `data/a.json`."
    assert stored_result_problems(good_intro, ["a.json"], {"x.ipynb": (code, prose)}) == []
    # a stored file that no notebook reads
    assert stored_result_problems(good_intro, ["a.json"], {"x.ipynb": ("", prose)})
    # a stored file the intro does not name, or names without a command of the package
    assert stored_result_problems("nothing here", ["a.json"], {})
    assert stored_result_problems("`book/data/a.json`", ["a.json"], {})
    assert stored_result_problems("`python -m other --json book/data/a.json`", ["a.json"], {})
    # a command for another file does not count
    assert stored_result_problems(good_intro, ["a.json", "b.json"], {})
    # a notebook that reads a file that is not there, or says nothing of it
    assert stored_result_problems(good_intro, ["a.json"], {"x.ipynb": ('open("data/c.json")', prose)})
    assert stored_result_problems(good_intro, ["a.json"], {"x.ipynb": (code, "no word of it")})
