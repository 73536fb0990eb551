"""Fixtures shared by several test modules.

``house_style``: the book's figure style for one plotting test; ``_close_figures``: every figure a
plotting test (tests/test_plotting_*.py) opened is closed after it.

The browser checks of the built book (tests marked ``book``) take pytest-playwright's fixtures
(``browser``, one Chromium for the whole session; ``launch_browser``; ``new_context``), configured
here: its ``browser_type_launch_args`` launch Debian's Chromium (a check that cannot start fails,
never skips), its ``browser_context_args`` make every context offline, and ``--browser`` may name
only Chromium. ``make html-check`` runs them in two pytest processes side by side, one per width
(``-m "... and not phone"`` and ``-m "... and phone"``, :func:`pytest_collection_modifyitems`), so
that no page is visited twice and each process keeps one Chromium for all its pages. (pytest-xdist's
``--dist loadgroup`` would do the same in one command, but with pytest 9.2 and pytest-xdist 3.8 its
groups are ignored: it renames ``Item._nodeid``, which pytest 9.2 no longer reads.)
"""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib as mpl
import numpy as np
import pytest
import torch
from test_book_html import BOOK_CONTEXT, chromium_launch_args

from kltutorial import toyrlhf as toy
from kltutorial.plotting import use_style


@pytest.fixture
def house_style() -> Iterator[None]:
    """The book's rcParams (constrained layout above all) for one test, restored after it."""
    with mpl.rc_context():
        use_style()
        yield


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``phone`` the browser checks of html-check's second process: those of the pages at phone
    width (their ``width`` parameter), and the checks that visit no page at a width (search, citations,
    the interactive figure, the downloads), which balance the desktop's dark mode and download menus.
    The checks that read a page's desktop report (``report_of``) stay with the desktop visits, whatever
    their width: a process that visited the other width would clear its screenshots."""
    for item in items:
        if item.get_closest_marker("book") is None or item.get_closest_marker("pdf") is not None:
            continue
        callspec = getattr(item, "callspec", None)
        width = callspec.params.get("width") if callspec is not None else None
        if "report_of" not in item.fixturenames and width != "desktop":
            item.add_marker(pytest.mark.phone)


def pytest_configure(config: pytest.Config) -> None:
    others = sorted(set(getattr(config.option, "browser", None) or ()) - {"chromium"})
    if others:
        raise pytest.UsageError(f"--browser {' '.join(others)}: the browser checks run on Debian's "
                                "Chromium only (tests/test_book_html.py)")


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict) -> dict:
    """pytest-playwright launches Debian's Chromium, headless and offline; fails without it. Its own
    command-line options (``--headed``, ``--slowmo``) still apply."""
    return {**chromium_launch_args(), **browser_type_launch_args}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict) -> dict:
    """Every context pytest-playwright (or a test) opens for the built book: offline, light, 1x."""
    return {**browser_context_args, **BOOK_CONTEXT}


@pytest.fixture(autouse=True)
def _close_figures(request: pytest.FixtureRequest) -> Iterator[None]:
    """Close all matplotlib figures after each test of the plotting modules (tests/test_plotting_*.py)."""
    yield
    if request.path.name.startswith("test_plotting_"):
        import matplotlib.pyplot as plt

        plt.close("all")


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One torch thread for a module whose tensors are small (the toy task's): on a shared 2-core machine it
    is many times faster. The library never sets it; restored after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def toy_task():
    """The task of book sections 9 and 11 (seed 0, N = 100, data keyed by [seed, N, 0])."""
    config = toy.TaskConfig()
    return toy.make_task(config, rng=np.random.default_rng(0),
                         data_rng=np.random.default_rng([0, config.n_pairs, 0]))
