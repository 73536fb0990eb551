"""How the browser checks start (tests/conftest.py over pytest-playwright's fixtures).

A browser check that cannot start Chromium fails, it is never skipped; and ``--browser`` may not
ask for another browser (the checks launch Debian's Chromium by its path). Each test runs pytest
on the browser checks in a subprocess; no browser is started, so these are unit tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pytest(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_browser_check_without_chromium_fails_rather_than_skips(tmp_path: Path) -> None:
    env = dict(os.environ, CHROMIUM=str(tmp_path / "no-chromium-here"))
    run = _pytest("tests/test_book_interactive.py", "-m", "book", env=env)
    summary = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 1, run.stdout[-2000:]
    assert "4 errors" in summary and "skipped" not in summary and "passed" not in summary, summary
    assert "Chromium not found" in run.stdout and "fails rather than skips" in run.stdout


def test_only_chromium_may_be_asked_for() -> None:
    run = _pytest("tests/test_book_interactive.py", "--collect-only", "--browser", "firefox")
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Chromium only" in run.stderr
