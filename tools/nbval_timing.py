"""How long each notebook took in an nbval run, for the book's status page (a pytest plugin).

Loaded by the repository's ``conftest.py``. With ``--nbval-times=PATH`` (the Makefile passes
``_build/status/nbval-native.json`` and, for the second kernel set, ``nbval-second-kernels.json``),
every test report of a notebook's cells adds its duration (set-up, call and tear-down: the kernel's
start with the first cell, its shutdown with the last) to that notebook's time, and when the whole run
has **passed** the times are written to ``PATH``, with each notebook's SHA-256 so that the status page
(``tools/status_page.py``) shows a time only for the notebook as it is now. The file is removed when
the run starts, so a run that fails leaves none behind: the page then says there is no verified run
rather than show a time from an older one.

Under pytest-xdist the reports reach the controlling process, which alone writes the file; a
notebook's cells run in order on one worker (``--dist loadfile``), so its time is that worker's.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--nbval-times", metavar="PATH", default=None,
                     help="write each notebook's execution time (s) to PATH when the run passes")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


class NotebookTimes:
    def __init__(self, path: Path, rootdir: Path) -> None:
        self.path = path
        self.rootdir = rootdir
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.path.unlink(missing_ok=True)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = report.nodeid.split("::", 1)[0]
        if name.endswith(".ipynb"):
            self.seconds[name] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus != 0 or not self.seconds:
            return
        notebooks = {
            name: {"seconds": round(seconds, 2),
                   "sha256": hashlib.sha256((self.rootdir / name).read_bytes()).hexdigest()}
            for name, seconds in sorted(self.seconds.items())
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"notebooks": notebooks}, indent=1) + "\n", encoding="utf8")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--nbval-times", None)
    if path and not _is_worker(config):
        config.pluginmanager.register(NotebookTimes(Path(path).resolve(), Path(config.rootpath)),
                                      "kltutorial-nbval-times")
