"""Tests for tools/myst_eval.py and the book's ``{eval}`` role (tools/kltutorial_book_ext.py).

The fixture ``tests/fixtures/myst_lab.ipynb`` writes its numbers as ``{eval}`` over glued values,
with its ``user_expressions`` stored by ``python tools/myst_eval.py``. Here: the expression
grammar, the checks that keep the book and JupyterLab in step, the metadata in jupyterlab-myst's
format, and a real Sphinx build of the fixture (execution off, warnings as errors) that shows the
numbers. ``tests/test_jupyterlab.py`` shows the same numbers in JupyterLab.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import myst_eval  # noqa: E402
from myst_eval import EvalError, evaluate, fill, glued_values, problems  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "myst_lab.ipynb"
# What the fixture's third cell reads like, in the book and in JupyterLab.
FIXTURE_SENTENCE = "The mean of the 4 log-ratios is 2.00 nats, and a quarter of it is 50.0% of a nat."


def _fixture() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf8"))


def _glue_output(name: str, text: str) -> dict:
    prefix = myst_eval.GLUE_PREFIX
    return {"output_type": "display_data", "data": {prefix + "text/plain": text},
            "metadata": {"scrapbook": {"name": name, "mime_prefix": prefix}}}


def _notebook(code: str, outputs: list[dict], markdown: str) -> dict:
    return {"cells": [{"cell_type": "code", "source": code, "metadata": {}, "outputs": outputs},
                      {"cell_type": "markdown", "source": markdown, "metadata": {}}]}


VALUES = {"kl": 0.1234, "n": 12, "label": "k3", "fig": EvalError("the glued value of 'fig' is a figure")}


@pytest.mark.parametrize(("expression", "shown"), [
    ("kl", 0.1234),
    ("n", 12),
    ('f"{kl:.2f}"', "0.12"),
    ('f"{kl:.1%} of {n} samples"', "12.3% of 12 samples"),
    ("round(kl * 100, 1)", 12.3),
    ("-kl / 2", -0.0617),
    ('f"{max(kl, 1):+.1f}"', "+1.0"),
    ("label", "k3"),
    ('f"{glued.kl:.2f}"', "0.12"),
    ('f"{glued.kl:.1%} of {glued.n} samples"', "12.3% of 12 samples"),
    ("glued.n * 2", 24),
])
def test_expressions_are_evaluated_over_glued_values(expression: str, shown: object) -> None:
    assert evaluate(expression, VALUES) == shown


@pytest.mark.parametrize(("expression", "message"), [
    ("missing", "'missing' is not glued in this notebook"),
    ("kl.real", "the only attribute access allowed is glued.<name>"),
    ("glued.kl.real", "the only attribute access allowed is glued.<name>"),
    ("glued.missing", "'missing' is not glued in this notebook"),
    ("glued.fig", "is a figure"),
    ("__import__('os')", "only round, abs, int, float, min, max and format may be called"),
    ("round(kl, ndigits=2)", "with positional arguments"),
    ("[kl]", "List is not allowed"),
    ("kl +", "is not a Python expression"),
    ('f"{kl:.2q}"', "ValueError"),
    ("fig", "is a figure"),
])
def test_anything_else_is_refused_with_a_reason(expression: str, message: str) -> None:
    with pytest.raises(EvalError, match=re.escape(message)):
        evaluate(expression, VALUES)


def test_glued_values_are_read_back_as_literals() -> None:
    notebook = _notebook("", [_glue_output("kl", "0.5"), _glue_output("s", "'k1'"),
                              _glue_output("x", "np.float64(0.5)")], "")
    values = glued_values(notebook)
    assert values["kl"] == 0.5 and values["s"] == "k1"
    with pytest.raises(EvalError, match="not a plain number or string"):
        evaluate("x", values)


def test_the_fixture_is_consistent_and_its_metadata_is_what_jupyterlab_myst_stores() -> None:
    notebook = _fixture()
    assert problems(notebook) == []
    stored = notebook["cells"][2]["metadata"]["user_expressions"]
    # The format jupyterlab-myst 2.7 writes after running a Markdown cell.
    assert stored[1] == {"expression": 'f"{mean_kl:.2f}"',
                         "result": {"data": {"text/plain": "'2.00'"}, "metadata": {}, "status": "ok"}}
    assert [myst_eval.shown_text(evaluate(e["expression"], glued_values(notebook))) for e in stored] == [
        "4", "2.00", "50.0%"]
    assert fill(copy.deepcopy(notebook)) is False  # already up to date


def test_stale_metadata_is_reported_and_refreshed() -> None:
    notebook = _fixture()
    output = next(o for o in notebook["cells"][1]["outputs"] if o.get("metadata", {}).get("scrapbook"))
    output["data"][myst_eval.GLUE_PREFIX + "text/plain"] = "5"  # n_samples re-executed as 5
    found = problems(notebook)
    assert len(found) == 1 and "stored user_expressions differ from the glued values" in found[0]
    assert fill(notebook) is True and problems(notebook) == []


def test_a_name_glued_under_another_expression_is_reported() -> None:
    notebook = _notebook("kl = 0.5\nglue('kl', round(kl, 1), display=False)",
                         [_glue_output("kl", "0.5")], "KL is {eval}`kl`.")
    fill(notebook)
    (problem,) = problems(notebook)
    assert "glued as glue('kl', round(kl, 1))" in problem and "glue it under its own name" in problem


def test_glued_attribute_names_need_no_variable_of_their_own() -> None:
    # kltutorial.book.glue keeps the value on `glued`, so the code's own `kl` may differ.
    notebook = _notebook("kl = 0.5123\nglue('kl', round(kl, 1), display=False)",
                         [_glue_output("kl", "0.5")], 'KL is {eval}`f"{glued.kl:.1f}"`.')
    assert fill(notebook) is True and problems(notebook) == []
    assert notebook["cells"][1]["metadata"]["user_expressions"][0]["result"]["data"] == {
        "text/plain": "'0.5'"}


def test_a_name_glued_after_the_prose_that_shows_it_is_reported() -> None:
    notebook = _notebook("", [_glue_output("kl", "0.5")], 'KL is {eval}`f"{glued.kl:.1f}"`.')
    notebook["cells"].reverse()  # the prose now comes first
    fill(notebook)
    (problem,) = problems(notebook)
    assert "glued only in the later cell 1" in problem and "nothing glued yet" in problem


def test_command_line_checks_and_writes(tmp_path: Path) -> None:
    notebook = _fixture()
    del notebook["cells"][2]["metadata"]["user_expressions"]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(notebook), encoding="utf8")
    tool = [sys.executable, str(ROOT / "tools" / "myst_eval.py")]
    check = subprocess.run([*tool, "--check", str(path)], capture_output=True, text=True)
    assert check.returncode == 1 and "stored user_expressions differ" in check.stderr
    write = subprocess.run([*tool, str(path)], capture_output=True, text=True)
    assert write.returncode == 0, write.stderr
    assert json.loads(path.read_text())["cells"][2]["metadata"] == _fixture()["cells"][2]["metadata"]


CONF = """
extensions = ["myst_nb", "kltutorial_book_ext"]
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath"]
exclude_patterns = ["_build"]
"""


def _build(tmp_path: Path, notebook: dict) -> subprocess.CompletedProcess:
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(CONF, encoding="utf8")
    (src / "index.ipynb").write_text(json.dumps(notebook), encoding="utf8")
    env = {"PYTHONPATH": str(ROOT / "tools"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", str(src),
         str(tmp_path / "html")], capture_output=True, text=True, env=env, timeout=120)


def test_the_book_shows_the_numbers_without_a_kernel(tmp_path: Path) -> None:
    result = _build(tmp_path, _fixture())
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "html" / "index.html").read_text(encoding="utf8")
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page))
    assert FIXTURE_SENTENCE in text
    assert "{eval}" not in text and 'f"{mean_kl' not in text


def test_the_strict_build_fails_on_stale_metadata(tmp_path: Path) -> None:
    notebook = _fixture()
    notebook["cells"][2]["metadata"]["user_expressions"][0]["result"]["data"]["text/plain"] = "5"
    result = _build(tmp_path, notebook)
    assert result.returncode != 0
    assert "stored user_expressions differ from the glued values" in result.stderr
