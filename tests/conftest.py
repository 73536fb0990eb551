"""Fixtures shared by several test modules.

``house_style``: the book's figure style for one plotting test. ``browser``, for the browser checks
of the built book (tests marked ``book``): one Chromium for the whole session, since Playwright's
sync API cannot start a second instance while one is running, so every browser test module takes
this fixture rather than launching its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib as mpl
import pytest
from playwright.sync_api import Browser
from test_book_html import launch_browser

from kltutorial.plotting import use_style


@pytest.fixture
def house_style() -> Iterator[None]:
    """The book's rcParams (constrained layout above all) for one test, restored after it."""
    with mpl.rc_context():
        use_style()
        yield


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    yield from launch_browser()
