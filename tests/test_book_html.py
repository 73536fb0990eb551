"""Open every page of the built book in headless Chromium, offline.

Run by ``make test`` after ``jupyter-book build`` (``pytest tests -m book``); the
unit-test run deselects it. For each HTML page it checks that

* no JavaScript exception is thrown and nothing is logged at error level;
* the page requests nothing from the network (only ``file:``/``data:``/``blob:``);
* MathJax, served from ``_static/mathjax`` rather than a CDN, has typeset every
  formula on the page, without a TeX error, and no raw ``\\(...\\)`` is left in the text.

The browser is Debian's Chromium driven by Playwright's sync API (``executable_path``;
Playwright's own browser downloads are never used). Every page is opened in a fresh
browser context that Playwright keeps offline, and host-name resolution is switched off
in the browser too, so anything that would fetch from the network fails and is reported.

Without Chromium (``/usr/bin/chromium`` or ``$CHROMIUM``) the tests skip locally
and fail when ``CI`` is set. ``$KLTUTORIAL_HTML_DIR`` overrides the HTML folder.

To add a check on every page: have :func:`load_page` record what it needs (a listener or
a probe) on :class:`PageReport`, and assert it in a test parametrised over ``PAGES``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, sync_playwright
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[1]
HTML_DIR = Path(os.environ.get("KLTUTORIAL_HTML_DIR", ROOT / "_build" / "html")).resolve()
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
PAGE_TIMEOUT_MS = 30_000
LATE_EVENTS_MS = 500  # after the probe, wait this long: late errors (async scripts, fonts) still count
DESKTOP = {"width": 1280, "height": 1600}
REDIRECT = re.compile(r"<meta[^>]+http-equiv=[\"']?refresh", re.IGNORECASE)

# Headless, as root on a machine without a GPU; no background traffic of Chromium's own.
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    # Offline: every host name fails to resolve (the context is also set offline).
    "--host-resolver-rules=MAP * ~NOTFOUND",
]


def _pages() -> list[Path]:
    if not HTML_DIR.is_dir():
        return []
    skip = {"_static", "_sources", "_images"}
    return sorted(
        p for p in HTML_DIR.rglob("*.html")
        if not skip.intersection(p.relative_to(HTML_DIR).parts)
        and not any(part.startswith(".") for part in p.relative_to(HTML_DIR).parts)
    )


PAGES = _pages()
PAGE_IDS = [p.relative_to(HTML_DIR).as_posix() for p in PAGES]


def _unavailable(reason: str) -> None:
    """Fail in CI, where the check must run; skip with the reason elsewhere."""
    if IN_CI:
        pytest.fail(f"{reason} (CI is set, so this check may not be skipped)")
    pytest.skip(reason)


def _find_chromium() -> str | None:
    candidates = [os.environ.get("CHROMIUM"), "/usr/bin/chromium",
                  shutil.which("chromium"), shutil.which("chromium-browser")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@dataclass
class PageReport:
    url: str
    errors: list[str] = field(default_factory=list)
    remote_requests: list[str] = field(default_factory=list)
    math: dict = field(default_factory=dict)


# Waits for MathJax (if the page loads it) and reports how the formulas were rendered.
# `rawTex` is TeX still between \( \) or \[ \] in the visible text, outside code and
# outside what MathJax rendered: a formula that was never handed to MathJax at all.
MATH_PROBE = r"""
async () => {
  const mj = window.MathJax;
  if (mj && mj.startup && mj.startup.promise) { await mj.startup.promise; }
  const math = [...document.querySelectorAll('.math')];
  const unrendered = math.filter(e => !e.querySelector('mjx-container'));
  const mathjaxScripts = [...document.querySelectorAll('script[src]')]
      .map(s => s.getAttribute('src')).filter(src => /mathjax/i.test(src));
  const skip = 'script, style, pre, code, textarea, mjx-container';
  const walker = document.createTreeWalker(document.body || document.documentElement, NodeFilter.SHOW_TEXT);
  const rawTex = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.parentElement.closest(skip)) continue;
    for (const m of node.textContent.matchAll(/\\\([\s\S]*?\\\)|\\\[[\s\S]*?\\\]|\$\$[\s\S]*?\$\$/g)) {
      rawTex.push(m[0].slice(0, 80));
    }
  }
  return {
    formulas: math.length,
    unrendered: unrendered.map(e => e.textContent.trim().slice(0, 80)),
    rawTex: rawTex,
    mjx: document.querySelectorAll('mjx-container').length,
    texErrors: [...document.querySelectorAll('mjx-merror')].map(e => e.textContent.slice(0, 80)),
    mathjaxLoaded: Boolean(mj && mj.version),
    mathjaxVersion: mj && mj.version ? mj.version : null,
    mathjaxScripts: mathjaxScripts,
    title: document.title,
  };
}
"""


def watch(page: Page, report: PageReport) -> None:
    """Record the page's uncaught exceptions and error-level console messages in ``report``.

    Playwright passes Chromium's own error log (a resource that failed to load, a blocked
    request) on as console messages of type ``error`` too.
    """
    page.on("pageerror", lambda exc: report.errors.append(f"uncaught exception: {exc.stack or exc}"))

    def on_console(message: ConsoleMessage) -> None:
        if message.type in ("error", "assert"):
            where = message.location.get("url") or ""
            report.errors.append(f"console.{message.type}: {message.text} {where}".rstrip())

    page.on("console", on_console)


def probe_math(page: Page) -> dict:
    """Run :data:`MATH_PROBE`; if a navigation cuts it off, run it again on the new page."""
    for _ in range(3):
        try:
            return page.evaluate(MATH_PROBE)
        except PlaywrightError as exc:
            if "navigat" not in str(exc) and "context was destroyed" not in str(exc):
                raise
            page.wait_for_load_state("load")
    raise PlaywrightError("the page kept navigating; the math probe never completed")


def load_page(browser: Browser, path: Path, viewport: dict | None = None) -> PageReport:
    """Open ``path`` in a fresh, offline browser context and report what happened."""
    report = PageReport(url=path.as_uri())
    # A fresh context per page: empty storage, so every page is a first visit.
    context = browser.new_context(offline=True, viewport=viewport or DESKTOP)
    context.set_default_timeout(PAGE_TIMEOUT_MS)

    def on_request(request: Request) -> None:
        if not request.url.startswith(LOCAL_SCHEMES):
            report.remote_requests.append(request.url)

    context.on("request", on_request)  # on the context: requests of workers and pop-ups count too
    try:
        page = context.new_page()
        watch(page, report)
        try:
            page.goto(report.url, wait_until="load")
            if REDIRECT.search(path.read_text(encoding="utf8", errors="replace")):
                # The root index.html only sends the reader on: check the page it lands on.
                page.wait_for_url(lambda url: url != report.url, wait_until="load")
        except PlaywrightTimeoutError:
            report.errors.append(f"page not loaded within {PAGE_TIMEOUT_MS / 1000:.0f} s")
        try:
            report.math = probe_math(page)
        except PlaywrightError as exc:
            report.errors.append(f"math probe failed: {exc}")
        page.wait_for_timeout(LATE_EVENTS_MS)
    finally:
        context.close()
    return report


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    executable = _find_chromium()
    if executable is None:
        _unavailable("Chromium not found (apt-get install chromium, or set $CHROMIUM)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_FLAGS, timeout=PAGE_TIMEOUT_MS,
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="session")
def report_of(browser: Browser) -> Callable[[Path], PageReport]:
    """The desktop report of a page, loaded on first use and kept for the session."""

    @functools.cache
    def report_of(page: Path) -> PageReport:
        try:
            return load_page(browser, page)
        except PlaywrightError as exc:  # report it against this page only
            return PageReport(url=page.as_uri(), errors=[f"browser: {exc}"])

    return report_of


def test_book_was_built() -> None:
    if not (HTML_DIR / "index.html").is_file():
        _unavailable(f"no built book in {HTML_DIR}: run `make book` (or `make test`) first")
    assert PAGES, f"{HTML_DIR} holds no HTML pages"


def test_html_references_nothing_remote() -> None:
    """Scripts, stylesheets and fonts are all served from the build itself."""
    if not PAGES:
        _unavailable(f"no built book in {HTML_DIR}")
    remote = re.compile(r"<(?:script|link|img|iframe)\b[^>]*?\b(?:src|href)=\"(?:https?:)?//",
                        re.IGNORECASE)
    offenders = {}
    for page in PAGES:
        html = page.read_text(encoding="utf8", errors="replace")
        hits = [m.group(0) for m in remote.finditer(html)
                if "rel=\"preconnect\"" not in m.group(0)]
        if hits:
            offenders[page.relative_to(HTML_DIR).as_posix()] = hits
    assert not offenders, f"pages that load remote resources: {offenders}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_page_loads_offline_without_errors(page: Path, report_of: Callable[[Path], PageReport]) -> None:
    report = report_of(page)
    problems = report.errors + [f"request leaves the build: {url}" for url in report.remote_requests]
    assert not problems, f"{report.url}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_math_is_typeset_by_local_mathjax(page: Path, report_of: Callable[[Path], PageReport]) -> None:
    name = page.relative_to(HTML_DIR).as_posix()
    math = report_of(page).math
    if math.get("formulas"):
        assert math["mathjaxLoaded"], f"{name}: has formulas but MathJax did not load"
        assert all(not re.match(r"(?:https?:)?//", s) for s in math["mathjaxScripts"]), (
            f"{name}: MathJax comes from the network: {math['mathjaxScripts']}"
        )
        unrendered = math["unrendered"]
        assert not unrendered, f"{name}: {len(unrendered)} formulas not typeset, e.g. {unrendered[:3]}"
        errors = math["texErrors"]
        assert not errors, f"{name}: {len(errors)} TeX errors, e.g. {errors[:3]}"
    raw = math.get("rawTex")
    assert not raw, f"{name}: TeX left in the text that MathJax never saw, e.g. {raw[:3]}"


def test_some_page_has_typeset_math(report_of: Callable[[Path], PageReport]) -> None:
    """Guard against a vacuous pass: the book has formulas, so some must be typeset."""
    typeset = {name: report_of(page).math.get("mjx", 0) for name, page in zip(PAGE_IDS, PAGES, strict=True)}
    assert sum(typeset.values()) > 0, f"no mjx-container on any page: {typeset}"
