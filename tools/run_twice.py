"""Run a pytest selection twice in one process, as mutation tools and ``pytest --count`` do.

A test that changes what it shares (a parametrize list it pops from, a module-level cache, a global
random state) can pass on its own and fail the second time round. ``make unit-tests-twice`` runs the
unit tests through this script, serially (pytest-xdist's workers are new processes each time, so they
would hide exactly this); a maintainer's check, not part of ``make test``::

    python tools/run_twice.py [pytest arguments ...]

It prints each round's outcome and exits with the first non-zero exit status of the two rounds.
"""

from __future__ import annotations

import sys
import time

import pytest


def main(argv: list[str]) -> int:
    codes = []
    for round_ in (1, 2):
        start = time.monotonic()
        code = int(pytest.main(list(argv)))
        codes.append(code)
        print(f"== round {round_} of 2 in one process: exit status {code} "
              f"({time.monotonic() - start:.0f} s)", flush=True)
    return next((code for code in codes if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
