"""Open every page of the built book in headless Chromium, offline.

Run by ``make test`` after ``jupyter-book build`` (``pytest tests -m book``); the
unit-test run deselects it. For each HTML page it checks that

* no JavaScript exception is thrown and nothing is logged at error level;
* the page requests nothing from the network (only ``file:``/``data:``/``blob:``);
* MathJax, served from ``_static/mathjax`` rather than a CDN, has typeset every
  formula on the page, without a TeX error.

The browser is driven through the Chrome DevTools Protocol over
``--remote-debugging-pipe`` (no port, no extra Python package). Name resolution is
disabled, so anything that would fetch from the network fails and is reported.

Without Chromium (``/usr/bin/chromium`` or ``$CHROMIUM``) the tests skip locally
and fail when ``CI`` is set. ``$KLTUTORIAL_HTML_DIR`` overrides the HTML folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[1]
HTML_DIR = Path(os.environ.get("KLTUTORIAL_HTML_DIR", ROOT / "_build" / "html"))
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
PAGE_TIMEOUT_S = 30.0


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


def _unavailable(reason: str) -> None:
    """Fail in CI, where the check must run; skip with the reason elsewhere."""
    if IN_CI:
        pytest.fail(f"{reason} (CI is set, so this check may not be skipped)")
    pytest.skip(reason)


def _find_chromium() -> str | None:
    candidates = [os.environ.get("CHROMIUM"), "/usr/bin/chromium",
                  shutil.which("chromium"), shutil.which("chromium-browser")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


class Chromium:
    """A headless Chromium driven over the DevTools pipe (fd 3: commands in, fd 4: out)."""

    def __init__(self, executable: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="kltutorial-chromium-")
        self.log = open(Path(self.profile) / "stderr.log", "w+b")
        cmd_r, cmd_w = os.pipe()
        out_r, out_w = os.pipe()
        # Park the child's ends above fd 4 so the dup2 calls below cannot clobber them.
        child_in = fcntl.fcntl(cmd_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(out_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(cmd_r)
        os.close(out_w)

        def wire_pipes() -> None:
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        flags = [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--no-default-browser-check",
            "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-extensions", "--mute-audio",
            "--disable-features=Translate,MediaRouter,OptimizationHints",
            # Offline: every host name fails to resolve.
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
            "--window-size=1280,1600", "about:blank",
        ]
        self.proc = subprocess.Popen(
            [executable, *flags], stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=self.log, pass_fds=(3, 4), preexec_fn=wire_pipes,
        )
        os.close(child_in)
        os.close(child_out)
        self._wfd, self._rfd = cmd_w, out_r
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.call("Browser.getVersion", timeout=30.0)

    # -- protocol -----------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict | None:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self._rfd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self._rfd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium exited: {self.stderr_tail()}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = PAGE_TIMEOUT_S) -> dict:
        self._next_id += 1
        message: dict = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._wfd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply is None:
                raise TimeoutError(f"no reply to {method} within {timeout} s")
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method} failed: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float,
                 start: int = 0) -> bool:
        """Wait for an event matching ``predicate`` among ``events[start:]`` or new ones."""
        if any(predicate(e) for e in self.events[start:]):
            return True
        deadline = time.monotonic() + timeout
        while (message := self._read_message(deadline)) is not None:
            self.events.append(message)
            if predicate(message):
                return True
        return False

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (message := self._read_message(deadline)) is not None:
            self.events.append(message)

    def stderr_tail(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10.0)
        except Exception:  # the process is killed below anyway
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._wfd)
        os.close(self._rfd)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


@dataclass
class PageReport:
    url: str
    errors: list[str] = field(default_factory=list)
    remote_requests: list[str] = field(default_factory=list)
    math: dict = field(default_factory=dict)


# Waits for MathJax (if the page loads it) and reports how the formulas were rendered.
MATH_PROBE = """
(async () => {
  const mj = window.MathJax;
  if (mj && mj.startup && mj.startup.promise) { await mj.startup.promise; }
  const math = [...document.querySelectorAll('.math')];
  const mathjaxScripts = [...document.querySelectorAll('script[src]')]
      .map(s => s.getAttribute('src')).filter(src => /mathjax/i.test(src));
  return {
    formulas: math.length,
    unrendered: math.filter(e => !e.querySelector('mjx-container')).length,
    mjx: document.querySelectorAll('mjx-container').length,
    texErrors: document.querySelectorAll('mjx-merror').length,
    mathjaxLoaded: Boolean(mj && mj.version),
    mathjaxVersion: mj && mj.version ? mj.version : null,
    mathjaxScripts: mathjaxScripts,
    title: document.title,
  };
})()
"""


def load_page(browser: Chromium, path: Path) -> PageReport:
    report = PageReport(url=path.as_uri())
    # A fresh browser context per page: empty storage, so every page is a first visit.
    context = browser.call("Target.createBrowserContext")["browserContextId"]
    target = browser.call("Target.createTarget",
                          {"url": "about:blank", "browserContextId": context})["targetId"]
    session = browser.call("Target.attachToTarget",
                           {"targetId": target, "flatten": True})["sessionId"]
    browser.events.clear()
    for domain in ("Runtime", "Log", "Network", "Page"):
        browser.call(f"{domain}.enable", session=session)
    def loaded(event: dict) -> bool:
        return event.get("method") == "Page.loadEventFired" and event.get("sessionId") == session

    browser.call("Page.navigate", {"url": report.url}, session=session)
    if not browser.wait_for(loaded, PAGE_TIMEOUT_S):
        report.errors.append(f"load event not fired within {PAGE_TIMEOUT_S} s")
    # A redirect page (the root index.html) navigates again after its load event: then
    # the probe is cut off, and it is repeated on the page that was redirected to.
    for _ in range(3):
        mark = len(browser.events)
        try:
            probe = browser.call("Runtime.evaluate", {
                "expression": MATH_PROBE, "awaitPromise": True, "returnByValue": True,
            }, session=session)
        except RuntimeError as exc:
            if "navigated" not in str(exc):
                raise
            browser.wait_for(loaded, PAGE_TIMEOUT_S, start=mark)
            continue
        if "exceptionDetails" in probe:
            report.errors.append(f"math probe failed: {probe['exceptionDetails']}")
        else:
            report.math = probe["result"]["value"]
        break
    else:
        report.errors.append("the page kept navigating; math probe never completed")
    browser.drain(0.5)  # late errors (async scripts, fonts) still count
    browser.call("Target.closeTarget", {"targetId": target})
    browser.call("Target.disposeBrowserContext", {"browserContextId": context})

    for event in browser.events:
        if event.get("sessionId") != session:
            continue
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            report.errors.append(f"uncaught exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            report.errors.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            report.errors.append(f"log error: {entry.get('text')} {entry.get('url', '')}")
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith(LOCAL_SCHEMES):
                report.remote_requests.append(url)
    browser.events.clear()
    return report


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    executable = _find_chromium()
    if executable is None:
        _unavailable("Chromium not found (apt-get install chromium, or set $CHROMIUM)")
    chromium = Chromium(executable)
    try:
        yield chromium
    finally:
        chromium.close()


@pytest.fixture(scope="module")
def reports(browser: Chromium) -> dict[Path, PageReport]:
    results = {}
    for page in PAGES:
        try:
            results[page] = load_page(browser, page)
        except (RuntimeError, TimeoutError) as exc:  # report it against this page only
            results[page] = PageReport(url=page.as_uri(), errors=[f"browser: {exc}"])
    return results


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


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(HTML_DIR).as_posix() for p in PAGES])
def test_page_loads_offline_without_errors(page: Path, reports: dict[Path, PageReport]) -> None:
    report = reports[page]
    assert not report.errors, f"{report.url}:\n" + "\n".join(report.errors)
    assert not report.remote_requests, f"{report.url} requested: {report.remote_requests}"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(HTML_DIR).as_posix() for p in PAGES])
def test_math_is_typeset_by_local_mathjax(page: Path, reports: dict[Path, PageReport]) -> None:
    math = reports[page].math
    if not math.get("formulas"):
        return  # nothing to typeset on this page
    assert math["mathjaxLoaded"], f"{page.name}: has formulas but MathJax did not load"
    assert all(not re.match(r"(?:https?:)?//", s) for s in math["mathjaxScripts"]), (
        f"{page.name}: MathJax comes from the network: {math['mathjaxScripts']}"
    )
    assert math["unrendered"] == 0, f"{page.name}: {math['unrendered']} formulas not typeset"
    assert math["texErrors"] == 0, f"{page.name}: {math['texErrors']} TeX errors"


def test_some_page_has_typeset_math(reports: dict[Path, PageReport]) -> None:
    """Guard against a vacuous pass: the book has formulas, so some must be typeset."""
    typeset = {p.relative_to(HTML_DIR).as_posix(): r.math.get("mjx", 0)
               for p, r in reports.items()}
    assert sum(typeset.values()) > 0, f"no mjx-container on any page: {typeset}"
