"""Fixtures shared by several test modules.

``house_style``: the book's figure style for one plotting test. ``browser``, for the browser checks
of the built book (tests marked ``book``): one Chromium for the whole session, since Playwright's
sync API cannot start a second instance while one is running, so every browser test module takes
this fixture rather than launching its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib as mpl
import numpy as np
import pytest
import torch
from playwright.sync_api import Browser
from test_book_html import launch_browser

from kltutorial import toyrlhf as toy
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
