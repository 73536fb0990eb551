"""Repository-wide pytest configuration.

* Registers the ``book`` marker. Tests marked ``book`` check the built HTML book, so
  ``make test`` runs them in a separate pytest invocation after ``jupyter-book build``
  (``pytest tests -m book``), while the unit-test run deselects them (``-m "not book"``).
* Loads ``tools/nbval_numeric.py``, which makes nbval compare numbers in notebook outputs
  as numbers (within one unit of the last printed digit) rather than as text, so that the
  stored outputs pass on CPUs whose vector kernels differ in the last bit.
"""

from __future__ import annotations

import pytest

pytest_plugins = ("tools.nbval_numeric",)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "book: checks the built HTML book in _build/html; run after `jupyter-book build`",
    )
