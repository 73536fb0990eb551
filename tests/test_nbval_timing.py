"""The per-notebook times that nbval's passes record for the status page (tools/nbval_timing.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

from tools.nbval_timing import NotebookTimes


def _run(tmp_path: Path, exitstatus: int) -> Path:
    (tmp_path / "book").mkdir()
    for name in ("a.ipynb", "b.ipynb"):
        (tmp_path / "book" / name).write_text(f"{{\"{name}\": 1}}")
    out = tmp_path / "status" / "times.json"
    out.parent.mkdir()
    out.write_text("an older run's times")
    times = NotebookTimes(out, tmp_path)
    times.pytest_sessionstart(session=None)
    assert not out.exists(), "an older run's file outlives the start of a new run"
    for nodeid, duration in [("book/a.ipynb::Cell 0", 1.5), ("book/a.ipynb::Cell 1", 0.25),
                             ("book/b.ipynb::Cell 0", 2.0), ("tests/test_x.py::test_y", 9.0)]:
        for _phase in ("setup", "call", "teardown"):
            times.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=duration / 3))
    times.pytest_sessionfinish(session=None, exitstatus=exitstatus)
    return out


def test_a_passing_run_records_each_notebook_s_time_and_hash(tmp_path: Path) -> None:
    record = json.loads(_run(tmp_path, exitstatus=0).read_text())["notebooks"]
    assert sorted(record) == ["book/a.ipynb", "book/b.ipynb"]  # not the Python test
    assert record["book/a.ipynb"]["seconds"] == 1.75  # every cell, every phase
    assert record["book/b.ipynb"]["seconds"] == 2.0
    digest = hashlib.sha256((tmp_path / "book" / "a.ipynb").read_bytes()).hexdigest()
    assert record["book/a.ipynb"]["sha256"] == digest


def test_a_failing_run_leaves_no_times(tmp_path: Path) -> None:
    assert not _run(tmp_path, exitstatus=1).exists()
