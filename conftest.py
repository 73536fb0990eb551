"""Repository-wide pytest configuration.

* Registers the ``book`` marker. Tests marked ``book`` check the built HTML book, so
  ``make test`` runs them in a separate pytest invocation after ``jupyter-book build``
  (``pytest tests -m "book and not pdf"``), while the unit-test run deselects them (``-m "not book"``).
* Registers the ``pdf`` marker: the PDF's checks (also marked ``book``), run after ``make pdf``.
* Loads ``tools/nbval_numeric.py``, which makes nbval compare numbers in notebook outputs
  as numbers (within one unit of the last printed digit) rather than as text, so that the
  stored outputs pass on CPUs whose vector kernels differ in the last bit.
* Loads ``tools/nbval_timing.py``: with ``--nbval-times=PATH`` (``make test``'s nbval passes), each
  notebook's execution time is written to PATH for the book's status page.
"""

from __future__ import annotations

import pytest

pytest_plugins = ("tools.nbval_numeric", "tools.nbval_timing", "tools.nbval_kernels")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "book: checks the built HTML book in _build/html; run after `jupyter-book build`",
    )
    config.addinivalue_line(
        "markers", "pdf: checks _build/pdf/book.pdf (also marked book); run after `make pdf`",
    )
    config.addinivalue_line(
        "markers", "phone: a browser check of make html-check's second process (tests/conftest.py): the "
        "pages at phone width, and the checks that visit no page at a width",
    )
