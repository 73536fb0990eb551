"""Fixtures shared by the browser checks of the built book (tests marked ``book``).

One Chromium for the whole session: Playwright's sync API cannot start a second instance while
one is running, so every browser test module takes this fixture rather than launching its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser
from test_book_html import launch_browser


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    yield from launch_browser()
