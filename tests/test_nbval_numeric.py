"""The numeric output comparison that `make nbval` uses (tools/nbval_numeric.py).

Two layers: `compare_text` on pairs of strings, and nbval itself run on a fixture notebook whose
stored outputs were edited after execution (tests/fixtures/numeric_outputs.ipynb; each code cell's
comment says how its stored output differs and whether nbval must pass it). The second layer goes
through exactly the path `make test` uses: pytest, nbval, a kernel, the plugin loaded by conftest.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest

from tools.nbval_numeric import compare_text

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "numeric_outputs.ipynb"


@pytest.mark.parametrize(
    ("stored", "now"),
    [
        ("45.57647697760837", "45.57647697760838"),  # a glued float, one ulp apart
        ("0.0672553643081848", "0.06725536430818124"),  # repr lengths differ, values 4e-15 apart
        ("KL sum 1.784\n", "KL sum 1.783\n"),  # a value at 1.7835 rounded either way
        ("k3: 1.42e-03", "k3: 1.43e-03"),  # one unit of the last digit in scientific notation
        ("-0.000", "0.000"),  # the sign of a rounded zero
        ("array([0.1234, 0.5   ])", "array([0.1234, 0.5 ])"),  # padding that follows a number's width
        ("loss nan, max inf", "loss nan, max inf"),
        ("float32 v0.11 step 3", "float32 v0.11 step 3"),
    ],
)
def test_matches(stored: str, now: str) -> None:
    assert compare_text(stored, now) is None


@pytest.mark.parametrize(
    ("stored", "now", "message"),
    [
        ("reward 2.500", "reward 2.525", r"number 1 on line 1 differs: stored 2\.500, got 2\.525"),
        ("KL sum 1.784", "KL sum 1.786", r"stored 1\.784, got 1\.786"),  # two units
        ("a\nb 3.0 c 0.25\n", "a\nb 3.0 c 0.28\n", r"number 2 on line 2"),
        ("n = 2048 samples", "n = 2049 samples", r"integers must be equal"),
        ("0.06725536430818124", "0.06725537103371768", r"relative difference 1e-07 is more than 1e-09"),
        ("KL = 0.25 nats", "KL = 0.25 bits", r"text around the numbers differs"),
        ("a 1.0\n", "a 1.0\nb 2.0\n", r"2 numbers where the stored one has 1; 2 lines stored, 3 lines now"),
        ("done\n", "done\nagain\n", r"text around the numbers differs"),
        ("x 1.0", "x -1.0", r"stored 1\.0, got -1\.0"),
        ("loss nan", "loss 0.5", r"1 numbers where the stored one has 0"),
    ],
)
def test_differs(stored: str, now: str, message: str) -> None:
    mismatch = compare_text(stored, now)
    assert mismatch is not None
    assert re.search(message, str(mismatch)), str(mismatch)


def _run_nbval(tmp_path: Path, *extra: str) -> dict[int, ET.Element]:
    """Run nbval (with the repository's conftest and plugin) on the fixture; results by cell number."""
    report = tmp_path / "report.xml"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-p", "no:cacheprovider",
         f"--junitxml={report}", "-q", *extra, str(FIXTURE)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert report.exists(), f"nbval did not run:\n{proc.stdout}\n{proc.stderr}"
    cases = {}
    for case in ET.parse(report).iter("testcase"):
        cases[int(re.search(r"Cell (\d+)", case.get("name")).group(1))] = case
    return cases


def _expectations() -> list[tuple[str, bool]]:
    nb = nbformat.read(FIXTURE, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    return [(c.metadata["case"], "Expected: pass" in c.source) for c in code]


def test_fixture_through_nbval(tmp_path: Path) -> None:
    expected = _expectations()
    cases = _run_nbval(tmp_path)
    assert sorted(cases) == list(range(len(expected)))
    messages = {
        "one-percent": "stored 2.525, got 2.500",
        "word": "text around the numbers differs",
        "extra-line": "2 lines stored, 3 lines now",
        "missing-output": "Missing output fields from running code: ['stdout']",
        "integer": "stored 2049, got 2048 (integers must be equal)",
        "full-precision-far": "stored 0.06725537103371768, got 0.06725536430818124",
    }
    for cell, (case, should_pass) in enumerate(expected):
        failure = cases[cell].find("failure")
        if should_pass:
            detail = failure.text if failure is not None else ""
            assert failure is None, f"Cell {cell} ({case}) should pass:\n{detail}"
        else:
            assert failure is not None, f"Cell {cell} ({case}) should fail, and nbval passed it"
            text = failure.text or ""
            assert f"Cell {cell}: Cell outputs differ" in text, text
            assert messages[case] in text, text


def test_exact_text_mode_is_what_the_plugin_relaxes(tmp_path: Path) -> None:
    """With nbval's own text comparison the one-ulp and last-digit cells fail: the plugin matters."""
    expected = _expectations()
    cases = _run_nbval(tmp_path, "--nbval-exact-text")
    relaxed = {case for case, should_pass in expected if should_pass}
    for cell, (case, _) in enumerate(expected):
        if case in relaxed:
            assert cases[cell].find("failure") is not None, f"{case} passes even as exact text"


def test_json_outputs_are_compared_item_by_item() -> None:
    from tools.nbval_numeric import _compare_values

    stored = {"data": [{"x": [0.1, 0.30000000000000004], "name": "beta"}], "n": 3}
    one_ulp = {"data": [{"x": [0.1, 0.3000000000000001], "name": "beta"}], "n": 3}
    assert _compare_values(stored, one_ulp) is None
    changed = {"data": [{"x": [0.1, 0.303], "name": "beta"}], "n": 3}
    where = "['data'] [0] ['x'] [1] stored 0.30000000000000004, got 0.303"
    assert where in str(_compare_values(stored, changed))
    assert "stored 3, got 4" in str(_compare_values(stored, {**stored, "n": 4}))
    assert "stored 3, got 3.0" in str(_compare_values(stored, {**stored, "n": 3.0}))
    assert "keys" in str(_compare_values(stored, {"data": stored["data"]}))
