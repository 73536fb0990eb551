"""The book's interactive figure (section 11), in headless Chromium, offline, from ``file://``.

Run with the other built-book checks (``pytest tests -m book`` after ``jupyter-book build``). The figure
is a plotly plot whose JavaScript comes from the build (``_static/plotly.min.js``, copied there by
``tools/plotly_offline.py``), not from a CDN. The test opens the page with the network cut and checks that

* plotly's script is the build's own copy and loaded, and no request leaves the build;
* the plot was drawn: an SVG with bars and with the two markers on the frontier;
* moving the slider (a click on its rail) changes what is shown: the bar heights, the markers' positions
  and the read-out line above the plot;
* nothing was logged at error level.

The browser, its offline flags and contexts, and the failure without Chromium are those of
``tests/test_book_html.py`` (pytest-playwright's fixtures, configured in tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, Request
from test_book_html import HTML_DIR, LOCAL_SCHEMES, PAGE_TIMEOUT_MS, _unavailable

pytestmark = pytest.mark.book

PAGE = HTML_DIR / "book" / "11-real-experiment.html"
PLOT = "#fig-optimum-slider-plot"
DESKTOP = {"width": 1400, "height": 900}
PHONE = {"width": 390, "height": 844}


# What the plot shows: the bar heights of pi*_beta (trace 1), the two markers' positions (traces 4
# and 5) and the title's read-out, read from the SVG that plotly drew.
STATE = """
(sel) => {
  const gd = document.querySelector(sel);
  const traces = [...gd.querySelectorAll('g.trace')];
  const bars = [...gd.querySelectorAll('g.trace.bars')];
  const scatters = [...gd.querySelectorAll('g.trace.scatter')];
  const points = scatters.flatMap(t => [...t.querySelectorAll('path.point')]);
  return {
    svg: gd.querySelectorAll('svg.main-svg').length,
    bars: bars.map(t => [...t.querySelectorAll('path')].map(p => p.getAttribute('d'))),
    points: points.map(p => p.getAttribute('transform')),
    title: (gd.querySelector('.gtitle') || {}).textContent || '',
    slider: gd.querySelectorAll('.slider-container').length,
    traces: traces.length,
  };
}
"""


def _open(context: BrowserContext) -> tuple[Page, dict]:
    """The page in a fresh offline context, the plot drawn; what it requested and logged."""
    if not PAGE.is_file():
        _unavailable(f"{PAGE} not built: run `make book` (or `make test`) first")
    report: dict = {"remote": [], "errors": [], "scripts": []}
    context.set_default_timeout(PAGE_TIMEOUT_MS)

    def on_request(request: Request) -> None:
        if not request.url.startswith(LOCAL_SCHEMES):
            report["remote"].append(request.url)
        elif "plotly" in request.url:
            report["scripts"].append(request.url)

    def on_console(message: ConsoleMessage) -> None:
        if message.type in ("error", "assert"):
            report["errors"].append(f"console.{message.type}: {message.text}")

    context.on("request", on_request)  # on the context: workers' requests count too
    page = context.new_page()
    page.on("pageerror", lambda exc: report["errors"].append(f"uncaught exception: {exc}"))
    page.on("console", on_console)
    page.goto(PAGE.as_uri(), wait_until="load")
    page.wait_for_selector(f"{PLOT} svg.main-svg", state="attached")
    page.locator(PLOT).scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    return page, report


@pytest.fixture(scope="module")
def plot(browser: Browser, browser_context_args: dict) -> Iterator[tuple[Page, dict]]:
    """The page at desktop width, shared by the module's tests (pytest-playwright's ``page`` is
    opened anew for each test)."""
    context = browser.new_context(**browser_context_args, viewport=DESKTOP)
    try:
        yield _open(context)
    finally:
        context.close()


def _state(page: Page) -> dict:
    return page.evaluate(STATE, PLOT)


def test_plotly_comes_from_the_build(plot: tuple[Page, dict]) -> None:
    pg, report = plot
    local = (HTML_DIR / "_static" / "plotly.min.js").resolve()
    assert local.is_file(), "the build has no _static/plotly.min.js (tools/plotly_offline.py)"
    assert [Path(pg.evaluate("u => new URL(u).pathname", url)) for url in report["scripts"]] == [local]
    assert pg.evaluate("() => typeof window.Plotly === 'object' && typeof Plotly.newPlot === 'function'")
    assert not report["remote"], f"requests leave the build: {report['remote']}"


def test_plot_is_drawn(plot: tuple[Page, dict]) -> None:
    pg, _ = plot
    state = _state(pg)
    assert state["svg"] >= 1 and state["slider"] == 1
    ref_bars, policy_bars = state["bars"]
    assert len(ref_bars) == len(policy_bars) == 6  # 0 to 5 "!"
    assert len(state["points"]) == 2 and all(state["points"])  # proxy and gold markers
    assert state["title"].startswith("β = ")


def test_slider_changes_what_is_shown(plot: tuple[Page, dict]) -> None:
    pg, report = plot
    before = _state(pg)
    rail = pg.locator(f"{PLOT} .slider-rail-touch-rect").first
    box = rail.bounding_box()
    assert box is not None, "no slider rail"
    # Click near the right end of the rail: the smallest beta, far from where the figure opens.
    pg.mouse.click(box["x"] + 0.97 * box["width"], box["y"] + box["height"] / 2)
    pg.wait_for_function(
        "([sel, title]) => (document.querySelector(sel + ' .gtitle') || {}).textContent !== title",
        arg=[PLOT, before["title"]], timeout=5_000,
    )
    after = _state(pg)
    assert after["title"] != before["title"] and after["title"].startswith("β = 0.02")
    assert after["bars"][0] == before["bars"][0]  # pi_ref does not move
    assert after["bars"][1] != before["bars"][1]  # pi*_beta does
    assert after["points"] != before["points"]  # both markers moved along the frontier
    # The data behind the plot changed too: the bars of pi*_beta, from plotly's own state.
    heights = pg.evaluate("sel => document.querySelector(sel).data[1].y", PLOT)
    assert heights[0] < 0.01 and sum(heights[2:]) > 0.9  # at beta = 0.02: almost all on two or more "!"
    assert not report["remote"], f"requests leave the build: {report['remote']}"
    assert not report["errors"], "\n".join(report["errors"])


def test_plot_fits_a_phone(new_context: Callable[..., BrowserContext]) -> None:
    """At 390 px the plot (responsive) is no wider than its column, and still drawn."""
    pg, report = _open(new_context(viewport=PHONE))  # pytest-playwright's: closed after the test
    widths = pg.evaluate("""sel => {
        const gd = document.querySelector(sel), svg = gd.querySelector('svg.main-svg');
        return {plot: svg.getBoundingClientRect().width,
                column: gd.parentElement.getBoundingClientRect().width,
                page: document.documentElement.scrollWidth};
    }""", PLOT)
    assert 0 < widths["plot"] <= widths["column"] + 1, widths
    assert widths["page"] <= PHONE["width"] + 1, widths
    assert len(_state(pg)["bars"][1]) == 6
    assert not report["remote"] and not report["errors"], report
