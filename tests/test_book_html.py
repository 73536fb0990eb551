"""Read every page of the built book in headless Chromium, offline, as a reader would.

Run by ``make test`` after ``jupyter-book build`` (``pytest tests -m book``); the unit-test run
deselects it. Every HTML page is opened at desktop width (1400 x 900) and at phone width
(390 x 844, a touch screen), and each visit checks that

* no JavaScript exception is thrown and nothing is logged at error level;
* the page requests nothing from the network (only ``file:``/``data:``/``blob:``);
* MathJax, served from ``_static/mathjax`` rather than a CDN, has typeset every formula on the
  page, without a TeX error, and no raw ``\\(...\\)`` is left in the text;
* nothing in the article is wider than the viewport: the document does not scroll sideways, and
  no element sticks out of the page or is cut off by a clipping box, unless it sits inside a box
  that scrolls sideways (``overflow-x: auto/scroll``: code, tables, display equations); every such
  box whose content is wider than it shows a cue (kltutorial.js marks it ``kl-scroll-x`` and
  kltutorial.css fades its hidden edge) and can be focused to scroll with the keyboard;
* every image of the article is decoded (``naturalWidth > 0``), has alt text that describes it
  (not empty, not a file name), sits in a figure with a caption, and is a focusable link to its
  own file (a click opens it at full size);
* every internal link resolves: the file it points to exists, and its ``#anchor`` is an id on
  that page;
* the exercises at the end of a section are numbered by chapter ("Exercise 4.2", the chapter of the
  page) and labelled, each with a solution, and every solution is folded (sphinx-togglebutton's
  dropdown) behind a button that takes keyboard focus;
* the visible ☰ button works: on a phone it opens the contents (the primary sidebar dialog),
  on a desktop it collapses the sidebar;
* the download menu (desktop) opens on a click and offers the notebooks bundle, a link to
  ``_downloads/kltutorial-notebooks.zip`` (tools/notebooks_bundle.py);
* in dark mode (desktop; the reader's system asking for it, as the book follows it), every code
  block is dark, and no cell output carries a style sheet of its own;
* the numbers of the prose (``{eval}``) are set at the weight of the words around them, and every
  citation link has its reference beside it (``tools/cite_preview.py``);
* axe-core (bundled by axe-playwright-python, run in the page) finds no serious or critical
  accessibility violation (see :data:`AXE_THEME_ALLOWED` for the theme's own, and
  :func:`run_axe` for what each width checks);
* a screenshot is saved under ``_build/screenshots/`` (next to the HTML folder): ``desktop/``,
  ``phone/`` (one JPEG per page: its first screen; the whole page, up to 12,000 px, with
  ``KLTUTORIAL_FULL_SCREENSHOTS=1``, as ``make screenshots`` sets) and ``desktop-dark/`` (the top of
  each page).

More tests open a figure, and a solution that holds code, by click and by keyboard (Enter), show
a citation's reference by keyboard focus, hover and tap, and search the book for "KL".

One browser serves the whole session (pytest-playwright's ``browser``), with one offline context
per viewport, kept for the session; each page is loaded once per viewport (storage cleared first,
so it is a first visit) and every check above reads that one visit, so the cost grows with the
number of pages, not of checks.

The browser is Debian's Chromium, which pytest-playwright launches with the options of
:func:`chromium_launch_args` (``executable_path``: Playwright's own browser downloads are never
used; tests/conftest.py overrides ``browser_type_launch_args`` with them). Contexts take
:data:`BOOK_CONTEXT` (``browser_context_args``): offline, and host-name resolution is switched
off in the browser too, so anything that would fetch from the network fails and is reported.

Without Chromium (``$CHROMIUM`` if set, else ``/usr/bin/chromium``) the tests fail, they never
skip: ``make test`` installs it first where it is missing (``make chromium``).
``$KLTUTORIAL_HTML_DIR`` overrides the HTML folder (screenshots then go to its parent's
``screenshots/``).

To add a check on every page: have :meth:`Reader.visit` record what it needs on
:class:`PageReport` (a listener, or a field of :data:`READER_PROBE`), and assert it in a test
parametrised over ``VISITS`` (both widths) or ``PAGES`` (desktop).
"""

from __future__ import annotations

import functools
import html.parser
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from axe_playwright_python.base import AXE_SCRIPT
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, Request
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[1]
HTML_DIR = Path(os.environ.get("KLTUTORIAL_HTML_DIR", ROOT / "_build" / "html")).resolve()
SCREENSHOT_DIR = HTML_DIR.parent / "screenshots"
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
PAGE_TIMEOUT_MS = 30_000
STATE_TIMEOUT_MS = 3_000  # a sidebar opening, a theme switching
LATE_EVENTS_MS = 500  # a visit lasts at least this long after its probe: late errors still count
SCREENSHOT_MAX_PX = 12_000  # a JPEG holds at most 65,535 px; the API page is 100,000+ on a phone
# Whole pages only when asked: a full-page JPEG costs about 0.6 s of Chromium's time a page at desktop
# width, and make test reads every page's report, not its picture.
FULL_SCREENSHOTS = os.environ.get("KLTUTORIAL_FULL_SCREENSHOTS") == "1"
REDIRECT = re.compile(r"<meta[^>]+http-equiv=[\"']?refresh", re.IGNORECASE)

VIEWPORTS: dict[str, dict] = {
    "desktop": {"viewport": {"width": 1400, "height": 900}},
    "phone": {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True},
}
# The screenshot folders (under SCREENSHOT_DIR) a visit at each width writes: dark mode at desktop width.
SCREENSHOT_KINDS: dict[str, tuple[str, ...]] = {"desktop": ("desktop", "desktop-dark"), "phone": ("phone",)}

# Headless, as root on a machine without a GPU; no background traffic of Chromium's own.
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    # Offline: every host name fails to resolve (the context is also set offline).
    "--host-resolver-rules=MAP * ~NOTFOUND",
]
# Every context of the built-book checks (``browser_context_args``); a viewport is added per width.
BOOK_CONTEXT = {"offline": True, "color_scheme": "light", "device_scale_factor": 1}


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
VISITS = [pytest.param(page, width, id=f"{name}@{width}")
          for page, name in zip(PAGES, PAGE_IDS, strict=True) for width in VIEWPORTS]


def _name(page: Path) -> str:
    return page.relative_to(HTML_DIR).as_posix()


def _unavailable(reason: str) -> None:
    """Fail with the reason: a browser check that cannot run is a failure, never a skip (``make test``
    installs Chromium first where it is missing, see the Makefile's ``chromium`` target)."""
    pytest.fail(f"{reason}; a browser check that cannot run fails rather than skips")


def _find_chromium() -> str | None:
    """``$CHROMIUM`` when it is set (as in the Makefile's ``chromium`` target), else Debian's."""
    if os.environ.get("CHROMIUM"):
        candidates = [os.environ["CHROMIUM"]]
    else:
        candidates = ["/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def chromium_launch_args() -> dict:
    """pytest-playwright's launch options for Debian's Chromium, headless; fails without it."""
    executable = _find_chromium()
    if executable is None:
        _unavailable("Chromium not found (apt-get install chromium, or set $CHROMIUM)")
    return {"executable_path": executable, "headless": True, "args": CHROMIUM_FLAGS,
            "timeout": PAGE_TIMEOUT_MS}


@dataclass
class PageReport:
    """What one visit of one page at one width saw. Empty dicts mean the probe never ran."""

    url: str
    width: str = "desktop"
    errors: list[str] = field(default_factory=list)
    remote_requests: list[str] = field(default_factory=list)
    math: dict = field(default_factory=dict)
    reader: dict = field(default_factory=dict)  # READER_PROBE: layout, scroll boxes, images, links, ids
    toggle: dict = field(default_factory=dict)
    downloads: dict = field(default_factory=dict)
    dark: dict = field(default_factory=dict)
    axe: dict = field(default_factory=dict)  # AXE_PROBE: axe-core's violations
    screenshots: list[Path] = field(default_factory=list)

    def probed(self, part: str) -> dict:
        """The named probe's result; fails the test, with the visit's errors, if it never ran."""
        value = getattr(self, part)
        if not value:
            pytest.fail(f"{self.url} ({self.width}): the {part} probe did not run: {self.errors}")
        return value


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

# What a reader meets on the page, measured after MathJax (MATH_PROBE waits for it) and after
# kltutorial.js has marked the boxes it added (two animation frames).
#   overflow:   elements of <main> outside the page, or cut off by a clipping ancestor, that are
#               not inside a box that scrolls sideways (only the outermost of a nested run).
#   scrollBoxes: boxes of <main> whose content is wider than they are, with their cue.
#   images:     every content <img> of <main> (not the theme's icons): decoded, alt, figure caption, link.
#   links:      every a[href] of the page, absolute; ids: every id (and a[name]) on the page.
#   exercises:  each exercise's id and title; solutions: each solution's id, whether it is a dropdown,
#               folded (its body not shown), has a focusable button, holds a code cell; the chapter
#               number of the page's title.
#   evals:      how many numbers of the prose ({eval}: span.kl-eval) there are, and those whose font
#               weight differs from their parent's; strong: the weight of each **bold** of the prose.
#   citations:  every citation link, with the preview that describes it (aria-describedby).
READER_PROBE = r"""
async (width) => {
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const main = document.querySelector('main') || document.body;
  const vw = Math.min(document.documentElement.clientWidth, width);
  const styles = new Map();
  const style = el => {
    if (!styles.has(el)) styles.set(el, getComputedStyle(el));
    return styles.get(el);
  };
  const scrolls = el => ['auto', 'scroll'].includes(style(el).overflowX);
  const describe = el => {
    const cls = [...el.classList].filter(c => !c.startsWith('mjx-')).slice(0, 3).map(c => '.' + c).join('');
    const id = el.id ? '#' + el.id : '';
    const text = (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 50);
    return `<${el.tagName.toLowerCase()}${id}${cls}> "${text}"`;
  };
  const hidden = el => el.closest('mjx-assistive-mml, .visually-hidden, .sr-only, [hidden]')
      || style(el).visibility === 'hidden';
  const overflow = [];
  const offenders = new Set();
  for (const el of main.querySelectorAll('*')) {
    if (hidden(el)) continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    let clippedBy = null, inScrollBox = false;
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      if (scrolls(a)) { inScrollBox = true; break; }
      const ox = style(a).overflowX;
      if (ox === 'hidden' || ox === 'clip') {
        const ar = a.getBoundingClientRect();
        if (r.right > ar.right + 1 || r.left < ar.left - 1) { clippedBy = a; break; }
      }
    }
    if (inScrollBox) continue;
    if (clippedBy || r.right > vw + 1 || r.left < -1) {
      offenders.add(el);
      if (offenders.has(el.parentElement)) continue;
      overflow.push(`${describe(el)} spans x = ${Math.round(r.left)}..${Math.round(r.right)} px, `
          + (clippedBy ? `cut off by ${describe(clippedBy).slice(0, 60)}` : `outside the ${vw} px page`));
    }
  }
  // Out of sight in a box: a formula by what MathJax drew (its scrollWidth also counts the
  // invisible, absolutely positioned MathML copy for screen readers), anything else by scrollWidth.
  const outOfSight = el => {
    const math = el.matches('span.math, mjx-container') ? el.querySelector('mjx-math') : null;
    return (math ? Math.ceil(math.getBoundingClientRect().width) : el.scrollWidth) - el.clientWidth;
  };
  const scrollBoxes = [];
  for (const el of main.querySelectorAll('*')) {
    if (hidden(el) || !scrolls(el) || outOfSight(el) <= 1) continue;
    const s = style(el);
    const mask = s.maskImage || s.webkitMaskImage || 'none';
    scrollBoxes.push({
      box: describe(el), hiddenPx: outOfSight(el),
      cue: el.classList.contains('kl-scroll-x') && el.classList.contains('kl-more-right') && mask !== 'none',
      focusable: el.tabIndex >= 0,
    });
  }
  const images = [];
  // Content images: not the theme's own icons (_static/, e.g. the module index's +/- togglers).
  const content = [...main.querySelectorAll('img')].filter(img =>
      !img.classList.contains('toggler') && !/(^|\/)_static\//.test(img.getAttribute('src') || ''));
  for (const img of content) {
    if (!img.complete || img.naturalWidth === 0) {
      img.loading = 'eager';
      await Promise.race([img.decode().catch(() => null), new Promise(r => setTimeout(r, 5000))]);
    }
    const figure = img.closest('figure');
    const caption = figure && figure.querySelector('figcaption');
    const link = img.closest('a[href]');
    images.push({
      src: img.getAttribute('src'), url: img.src, alt: img.getAttribute('alt'),
      naturalWidth: img.naturalWidth, inFigure: Boolean(figure),
      caption: caption ? caption.textContent.trim().replace(/\s+/g, ' ') : '',
      link: link ? link.href : null, linkFocusable: Boolean(link) && link.tabIndex >= 0,
    });
  }
  const links = [...new Set([...document.querySelectorAll('a[href]')].map(a => a.href))];
  const ids = [...document.querySelectorAll('[id]')].map(e => e.id)
      .concat([...document.querySelectorAll('a[name]')].map(a => a.getAttribute('name')));
  // If the page itself scrolls sideways, what sticks out anywhere (hidden elements included).
  const scrollWidth = document.documentElement.scrollWidth;
  const wider = [];
  if (scrollWidth > vw + 1) {
    for (const el of document.body.querySelectorAll('*')) {
      const r = el.getBoundingClientRect();
      if (r.right <= vw + 1 || r.width === 0) continue;
      let a = el.parentElement;
      while (a && a !== document.body && style(a).overflowX === 'visible') a = a.parentElement;
      if (a && a !== document.body) continue;
      wider.push(`${describe(el)} spans x = ${Math.round(r.left)}..${Math.round(r.right)} px`);
      if (wider.length >= 5) break;
    }
  }
  const exercises = [...main.querySelectorAll('div.exercise.admonition')].map(box => ({
    id: box.id,
    title: (box.querySelector(':scope > .admonition-title') || box).textContent.replace(/\s+/g, ' ').trim(),
  }));
  const solutions = [...main.querySelectorAll('div.solution.admonition')].map(box => {
    const body = box.querySelector(':scope > section');
    const button = box.querySelector(':scope > .admonition-title button.toggle-button');
    const shown = Boolean(body) && body.getBoundingClientRect().height > 0
      && getComputedStyle(body).visibility !== 'hidden';
    return {
      id: box.id, dropdown: box.classList.contains('dropdown'),
      folded: box.classList.contains('toggle-hidden') && !shown,
      button: Boolean(button) && button.tabIndex >= 0,
      expanded: button ? button.getAttribute('aria-expanded') : null,
      hasCode: Boolean(body && body.querySelector('.cell')),
    };
  });
  const number = document.querySelector('main h1 .section-number');
  const chapter = number ? number.textContent.replace(/[.\s]+$/, '').trim() : null;
  const evals = [...main.querySelectorAll('span.kl-eval')];
  const heavier = evals.filter(s => style(s).fontWeight !== style(s.parentElement).fontWeight)
    .map(s => `${describe(s)} at weight ${style(s).fontWeight} in ${describe(s.parentElement)} `
      + `at ${style(s.parentElement).fontWeight}`);
  const strong = [...main.querySelectorAll('p strong, li strong')]
    .filter(s => !s.closest('.admonition-title, h1, h2, h3, h4')).map(s => Number(style(s).fontWeight));
  const citations = [...main.querySelectorAll('span.bibtex-citation a[href]')].map(a => {
    const id = a.getAttribute('aria-describedby');
    const box = id ? document.getElementById(id) : null;
    return {label: a.textContent.trim(), href: a.href, previewId: id,
            preview: Boolean(box && box.matches('span.kl-cite-preview')),
            key: box ? box.dataset.key : null, text: box ? box.textContent.replace(/\s+/g, ' ').trim() : ''};
  });
  return {viewport: vw, scrollWidth, wider, overflow, scrollBoxes, images, links, ids,
          exercises, solutions, chapter, evals: {count: evals.length, heavier}, strong, citations};
}
"""

VISIBLE = """(el) => { const r = el.getBoundingClientRect(), s = getComputedStyle(el);
  return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; }"""

# Dark mode: every visible code block of <main> with the luminance (0 black .. 1 white) of its
# background (its own or the nearest painted ancestor's) and of its text; style sheets in <main>.
DARK_PROBE = r"""
() => {
  const lum = (color) => {
    const m = color.match(/rgba?\(([^)]+)\)/);
    if (!m) return null;
    const [r, g, b, a = 1] = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number);
    if (a === 0) return null;
    const lin = c => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
  };
  const background = (el) => {
    for (let a = el; a; a = a.parentElement) {
      const l = lum(getComputedStyle(a).backgroundColor);
      if (l !== null) return l;
    }
    return 1;
  };
  const main = document.querySelector('main') || document.body;
  const blocks = [...main.querySelectorAll('pre')]
    .filter(pre => pre.getBoundingClientRect().height > 0)
    .map(pre => ({
      block: (pre.closest('[class*="highlight"], .output') || pre).className.slice(0, 60)
        + ' "' + pre.textContent.trim().slice(0, 40) + '"',
      background: background(pre), text: lum(getComputedStyle(pre).color),
    }));
  return {
    theme: document.documentElement.dataset.theme,
    blocks,
    styleSheets: [...main.querySelectorAll('style')].map(s => s.textContent.trim().slice(0, 80)),
  };
}
"""

# axe-core, the copy that axe-playwright-python bundles (evaluated into the page by run_axe:
# nothing is fetched), with its default rules: WCAG 2.0-2.2 A and AA, and its
# best practices. Only the violations are kept, each with its first nodes.
#
# The API page is read in part: its modules after the first AXE_API_MODULES (some 50 modules,
# 80,000 elements with their formulas, which took axe 30 s a width) are removed from the page
# first, with their entries in the page's contents. Every module is the same markup, written by
# autodoc from the docstrings; the visit's other checks have read the whole page by then.
AXE_API_MODULES = 3
AXE_PROBE = r"""
async ({context, options, keep}) => {
  const modules = [...document.querySelectorAll("main section[id^='module-']")]
    .filter(s => !s.querySelector("section[id^='module-']"));
  const leftOut = modules.slice(keep);
  leftOut.forEach(s => s.remove());
  if (leftOut.length) {
    for (const a of document.querySelectorAll("nav a[href^='#']")) {
      const id = decodeURIComponent(a.getAttribute('href').slice(1));
      if (id && !document.getElementById(id)) (a.closest('li') || a).remove();
    }
  }
  const result = await axe.run(context || document, options);
  return {
    version: axe.version, modules: modules.length, leftOut: leftOut.length,
    violations: result.violations.map(v => ({
      id: v.id, impact: v.impact, help: v.help, url: v.helpUrl, count: v.nodes.length,
      nodes: v.nodes.slice(0, 10).map(n => ({
        target: n.target.join(' '), summary: (n.failureSummary || '').replace(/\s+/g, ' ').slice(0, 240),
      })),
    })),
  };
}
"""


def watch(page: Page, reader: Reader) -> None:
    """Record uncaught exceptions and error-level console messages on the visit in progress.

    Playwright passes Chromium's own error log (a resource that failed to load, a blocked
    request) on as console messages of type ``error`` too.
    """

    def on_error(exc: PlaywrightError) -> None:
        reader.current.errors.append(f"uncaught exception: {exc.stack or exc}")

    def on_console(message: ConsoleMessage) -> None:
        if message.type in ("error", "assert"):
            where = message.location.get("url") or ""
            reader.current.errors.append(f"console.{message.type}: {message.text} {where}".rstrip())

    page.on("pageerror", on_error)
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


def run_axe(page: Page, width: str) -> dict:
    """axe-core's violations on the page as it stands (:data:`AXE_PROBE`).

    Each rule runs at the width where it can find something the other width would not, so that
    axe costs each page about half of what all its rules at both widths would:

    * the rules on colour (``color-contrast``, the slowest by far: it finds each text's background
      pixel by pixel; ``link-in-text-block``) at desktop width only, where more of the page is shown:
      the colours are those of the phone. There the code listings (``div.highlight``: hundreds of
      Pygments tokens a page, coloured by the theme's code style) are left out, which halves the
      time axe takes; the phone's visit checks them with the other rules;
    * ``target-size``, the size of what a finger must hit, at phone width only;
    * every other rule at both widths (what each shows and hides differs), but ``region`` (text
      outside the page's landmarks), whose violations are moderate at most: the test fails on
      serious and critical ones only.
    """
    page.evaluate(AXE_SCRIPT)  # defines window.axe
    off = ["region"] + (["target-size"] if width == "desktop"
                        else ["color-contrast", "link-in-text-block"])
    # No preload: axe would fetch every style sheet again with XMLHttpRequest, to read the CSS of one
    # rule (css-orientation-lock), and a page opened from disk may not (an error per style sheet).
    options = {"resultTypes": ["violations"], "preload": False,
               "rules": {rule: {"enabled": False} for rule in off}}
    context = {"exclude": [["div.highlight"]]} if width == "desktop" else None
    return page.evaluate(AXE_PROBE, {"context": context, "options": options, "keep": AXE_API_MODULES})


def screenshot_path(kind: str, page: Path) -> Path:
    return SCREENSHOT_DIR / kind / page.relative_to(HTML_DIR).with_suffix(".jpg")


class Reader:
    """One browser tab at one width, in ``context`` (opened at that width), which visits pages one
    after the other."""

    def __init__(self, context: BrowserContext, width: str) -> None:
        self.width = width
        self.size = VIEWPORTS[width]["viewport"]
        self.current = PageReport(url="about:blank", width=width)
        self.context = context
        context.set_default_timeout(PAGE_TIMEOUT_MS)

        def on_request(request: Request) -> None:
            if not request.url.startswith(LOCAL_SCHEMES):
                self.current.remote_requests.append(request.url)

        self.context.on("request", on_request)  # on the context: workers and pop-ups count too
        self.page = self.context.new_page()
        watch(self.page, self)

    def close(self) -> None:
        self.context.close()

    def visit(self, path: Path) -> PageReport:
        report = self.current = PageReport(url=path.as_uri(), width=self.width)
        page = self.page
        try:
            if page.url.startswith("file:"):  # a first visit: nothing stored by the page before
                page.evaluate("() => { localStorage.clear(); sessionStorage.clear(); }")
            try:
                page.goto(report.url, wait_until="load")
                if REDIRECT.search(path.read_text(encoding="utf8", errors="replace")):
                    # The root index.html only sends the reader on: check the page it lands on.
                    page.wait_for_url(lambda url: url != report.url, wait_until="load")
            except PlaywrightTimeoutError:
                report.errors.append(f"page not loaded within {PAGE_TIMEOUT_MS / 1000:.0f} s")
            report.math = probe_math(page)
            probed_at = time.monotonic()
            report.reader = page.evaluate(READER_PROBE, self.size["width"])
            self.screenshot(report, self.width, path, full_page=FULL_SCREENSHOTS)
            # Before dark mode: switching back to light, the theme's colours fade for a moment,
            # and axe would measure the contrast of colours half-way.
            report.axe = run_axe(page, self.width)
            if self.width == "desktop":
                report.dark = self.dark_mode(report, path)
            if self.width == "desktop":
                report.downloads = self.open_download_menu()
            report.toggle = self.try_primary_toggle()
            left = LATE_EVENTS_MS / 1000 - (time.monotonic() - probed_at)
            if left > 0:
                page.wait_for_timeout(left * 1000)
        except PlaywrightError as exc:  # report it against this visit only
            report.errors.append(f"browser: {exc}")
        return report

    def screenshot(self, report: PageReport, kind: str, path: Path, full_page: bool = True) -> None:
        target = screenshot_path(kind, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        height = self.size["height"]
        if full_page:  # the whole page, or its first SCREENSHOT_MAX_PX
            height = max(height, min(self.page.evaluate("document.documentElement.scrollHeight"),
                                     SCREENSHOT_MAX_PX))
        # A viewport as tall as the picture, rather than Playwright's full_page, which lays out
        # the whole page at once (10 s for the 100,000 px API page, where this takes 1 s).
        try:
            if height != self.size["height"]:
                self.page.set_viewport_size({"width": self.size["width"], "height": height})
            self.page.screenshot(path=target, type="jpeg", quality=70)
        finally:
            if height != self.size["height"]:
                self.page.set_viewport_size(self.size)
        report.screenshots.append(target)

    def dark_mode(self, report: PageReport, path: Path) -> dict:
        """Switch the reader's system to dark, probe and photograph the page, switch back."""
        page = self.page
        page.emulate_media(color_scheme="dark")
        try:
            page.wait_for_function("document.documentElement.dataset.theme === 'dark'",
                                   timeout=STATE_TIMEOUT_MS)
            dark = page.evaluate(DARK_PROBE)
            self.screenshot(report, "desktop-dark", path, full_page=False)  # the top is enough
        except PlaywrightTimeoutError:
            dark = {"theme": page.evaluate("document.documentElement.dataset.theme"),
                    "blocks": [], "styleSheets": []}
        finally:
            page.emulate_media(color_scheme="light")
        return dark

    def open_download_menu(self) -> dict:
        """Open the page's download menu (the article header's button) and list the links it shows."""
        page = self.page
        button = page.locator(".dropdown-download-buttons > button").filter(visible=True)
        result: dict = {"visible_buttons": button.count()}
        if result["visible_buttons"] != 1:
            return result
        button.click()
        result["opened"] = self._becomes(
            "() => document.querySelector('.dropdown-download-buttons .dropdown-menu.show')")
        result["links"] = page.evaluate(
            "() => [...document.querySelectorAll('.dropdown-download-buttons .dropdown-menu a[href]')]"
            f"  .filter(a => ({VISIBLE})(a)).map(a => ({{text: a.textContent.trim(), url: a.href}}))")
        page.keyboard.press("Escape")
        return result

    def try_primary_toggle(self) -> dict:
        """Click the visible ☰ and record what it did (then undo it).

        Phone: the contents open in the primary sidebar dialog (and Escape closes it).
        Desktop: the primary sidebar is hidden (the next visit reloads the page anyway).
        """
        page = self.page
        buttons = page.locator(".primary-toggle").filter(visible=True)
        result: dict = {"visible_buttons": buttons.count()}
        if result["visible_buttons"] != 1:
            return result
        if self.width == "phone":
            dialog = page.locator("dialog#pst-primary-sidebar-modal")
            buttons.click()
            result["opened"] = self._becomes(
                "() => { const d = document.querySelector('dialog#pst-primary-sidebar-modal');"
                f" return Boolean(d && d.open && ({VISIBLE})(d)"
                " && [...d.querySelectorAll('nav a[href]')]"
                "      .some(a => a.getBoundingClientRect().height > 0)); }")
            if dialog.count():
                page.keyboard.press("Escape")
                result["closed"] = self._becomes(
                    "() => !document.querySelector('dialog#pst-primary-sidebar-modal').open")
        else:
            sidebar = ("(() => { const s = document.querySelector('#pst-primary-sidebar');"
                       f" return s && ({VISIBLE})(s); }})()")
            result["shown_before"] = page.evaluate(sidebar)
            buttons.click()
            result["collapsed"] = self._becomes(f"() => !{sidebar}")
        return result

    def _becomes(self, predicate: str) -> bool:
        try:
            self.page.wait_for_function(predicate, timeout=STATE_TIMEOUT_MS)
            return True
        except PlaywrightTimeoutError:
            return False


@pytest.fixture(scope="session")
def visit(browser: Browser, browser_context_args: dict) -> Iterator[Callable[[Path, str], PageReport]]:
    """The report of a page at a width, visited on first use and kept for the session (so its
    contexts are the session's, not pytest-playwright's per-test ``context``)."""
    readers: dict[str, Reader] = {}

    @functools.cache
    def visit(page: Path, width: str = "desktop") -> PageReport:
        if width not in readers:
            # No screenshot of a page that is no longer built. Each width clears only its own folders:
            # make html-check visits the two widths in two worker processes (the xdist groups of
            # tests/conftest.py), and neither may remove what the other has written.
            for kind in SCREENSHOT_KINDS[width]:
                shutil.rmtree(SCREENSHOT_DIR / kind, ignore_errors=True)
            readers[width] = Reader(browser.new_context(**browser_context_args, **VIEWPORTS[width]), width)
        return readers[width].visit(page)

    yield visit
    for reader in readers.values():
        reader.close()


@pytest.fixture(scope="session")
def report_of(visit: Callable[[Path, str], PageReport]) -> Callable[[Path], PageReport]:
    """The desktop report of a page."""
    return lambda page: visit(page, "desktop")


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
        html_text = page.read_text(encoding="utf8", errors="replace")
        hits = [m.group(0) for m in remote.finditer(html_text)
                if "rel=\"preconnect\"" not in m.group(0)]
        if hits:
            offenders[_name(page)] = hits
    assert not offenders, f"pages that load remote resources: {offenders}"


@pytest.mark.parametrize(("page", "width"), VISITS)
def test_page_loads_offline_without_errors(page: Path, width: str,
                                           visit: Callable[[Path, str], PageReport]) -> None:
    report = visit(page, width)
    problems = report.errors + [f"request leaves the build: {url}" for url in report.remote_requests]
    assert not problems, f"{report.url} ({width}):\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_math_is_typeset_by_local_mathjax(page: Path, report_of: Callable[[Path], PageReport]) -> None:
    name = _name(page)
    math = report_of(page).probed("math")
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


@pytest.mark.parametrize(("page", "width"), VISITS)
def test_article_fits_the_viewport(page: Path, width: str,
                                   visit: Callable[[Path, str], PageReport]) -> None:
    """Nothing widens the page or is cut off; wide content scrolls inside its own box."""
    reader = visit(page, width).probed("reader")
    name, vw = _name(page), reader["viewport"]
    problems = []
    if reader["scrollWidth"] > vw + 1:
        problems.append(f"the page scrolls sideways ({reader['scrollWidth']} px wide in a {vw} px "
                        f"viewport); what sticks out: {reader['wider']}")
    if reader["overflow"]:
        problems.append(f"{len(reader['overflow'])} elements stick out of the page or are cut off "
                        "outside a scrolling box (give wide content a box with overflow-x: auto):")
        problems.extend(reader["overflow"][:8])
    assert not problems, f"{name} ({width}): " + "\n".join(problems)


@pytest.mark.parametrize(("page", "width"), VISITS)
def test_wide_boxes_show_that_they_scroll(page: Path, width: str,
                                          visit: Callable[[Path, str], PageReport]) -> None:
    """A box whose content is cut at its edge fades there (kltutorial.js/.css) and takes focus."""
    boxes = visit(page, width).probed("reader")["scrollBoxes"]
    silent = [f"{b['box']} hides {b['hiddenPx']} px" for b in boxes if not b["cue"]]
    assert not silent, (
        f"{_name(page)} ({width}): {len(silent)} boxes scroll sideways with no cue "
        "(no kl-scroll-x/kl-more-right class or no fade mask):\n" + "\n".join(silent[:8])
    )
    unfocusable = [b["box"] for b in boxes if not b["focusable"]]
    assert not unfocusable, (
        f"{_name(page)} ({width}): boxes a keyboard cannot scroll (no tabindex): {unfocusable[:5]}"
    )


# A file name or path in place of a description: one word with a slash, or an image file name.
# ("Reward/KL frontier for five values of β" is a description, a slash and all.)
FILE_LIKE = re.compile(r"\S*[/\\]\S*|\S+\.(png|jpe?g|svg|gif|webp)", re.IGNORECASE)


def _alt_problem(alt: str | None, src: str) -> str | None:
    if alt is None or not alt.strip():
        return "no alt text"
    text = alt.strip()
    base = src.rsplit("/", 1)[-1]
    if text == base or FILE_LIKE.fullmatch(text):
        return f"alt text is a file name: {text!r}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_images_are_decoded_described_and_captioned(
        page: Path, report_of: Callable[[Path], PageReport]) -> None:
    """Every image of the article: decoded, described, in a captioned figure, linked to itself."""
    problems = []
    for img in report_of(page).probed("reader")["images"]:
        src = img["src"]
        if img["naturalWidth"] <= 0:
            problems.append(f"{src}: not decoded (naturalWidth 0: missing or broken file)")
        if (alt := _alt_problem(img["alt"], src or "")) is not None:
            problems.append(f"{src}: {alt}")
        if not img["inFigure"]:
            problems.append(f"{src}: not in a figure (a cell output image: write it with "
                            "plotting.save_figure and place it with ```{figure}```, with :alt: "
                            "and a caption)")
        elif not img["caption"]:
            problems.append(f"{src}: its figure has no caption")
        if img["link"] != img["url"]:
            problems.append(f"{src}: not a link to its own file (links to {img['link']}): "
                            "a click should open it at full size")
        elif not img["linkFocusable"]:
            problems.append(f"{src}: its link cannot take keyboard focus")
    assert not problems, f"{_name(page)}:\n" + "\n".join(problems)


@functools.cache
def _ids_in(path: Path) -> frozenset[str]:
    """The ids (and <a name>) of a built HTML file, read from its source."""

    class Ids(html.parser.HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.ids: set[str] = set()

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            for key, value in attrs:
                if value and (key == "id" or (key == "name" and tag == "a")):
                    self.ids.add(value)

    parser = Ids()
    parser.feed(path.read_text(encoding="utf8", errors="replace"))
    return frozenset(parser.ids)


def link_problems(page: Path, links: list[str], page_ids: set[str]) -> list[str]:
    """Internal links of ``page`` that point to no built file, or to an id that is not there."""
    problems = []
    for href in links:
        parts = urlsplit(href)
        if parts.scheme != "file":
            continue  # http(s), mailto: a reference, not a part of the build
        target = Path(unquote(parts.path))
        anchor = unquote(parts.fragment)
        if target == page:
            if anchor and anchor not in page_ids:
                problems.append(f"#{anchor}: no element has this id on the page")
            continue
        if not target.is_file():
            problems.append(f"{href}: no such file in the build")
        elif target.suffix == ".html" and anchor and anchor not in _ids_in(target):
            problems.append(f"{href}: {target.name} has no element with id {anchor!r}")
        elif HTML_DIR not in target.parents:
            problems.append(f"{href}: outside the built book")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_internal_links_resolve(page: Path, report_of: Callable[[Path], PageReport]) -> None:
    report = report_of(page)
    reader = report.probed("reader")
    landed = Path(unquote(urlsplit(report.url).path))
    assert reader["links"], f"{_name(page)}: no link at all (not even the contents)"
    problems = link_problems(landed, reader["links"], set(reader["ids"]))
    assert not problems, f"{_name(page)}: {len(problems)} broken links:\n" + "\n".join(problems[:10])


@pytest.mark.parametrize(("page", "width"), VISITS)
def test_visible_menu_button_works(page: Path, width: str,
                                   visit: Callable[[Path, str], PageReport]) -> None:
    toggle = visit(page, width).probed("toggle")
    name = _name(page)
    assert toggle["visible_buttons"] == 1, (
        f"{name} ({width}): expected one visible ☰ (.primary-toggle), found {toggle['visible_buttons']}"
    )
    if width == "phone":
        assert toggle["opened"], f"{name} (phone): ☰ did not open the contents (primary sidebar dialog)"
        assert toggle.get("closed"), f"{name} (phone): Escape did not close the contents dialog"
    else:
        assert toggle["shown_before"], f"{name} (desktop): the primary sidebar is not shown at first"
        assert toggle["collapsed"], f"{name} (desktop): ☰ did not collapse the primary sidebar"


#: The notebooks bundle (tools/notebooks_bundle.py), which every page's download menu offers.
BUNDLE_PATH = HTML_DIR / "_downloads" / "kltutorial-notebooks.zip"
BOOK_PAGES = [p for p in PAGES if p.parent.name == "book"]  # the book's own pages, not the indices


@pytest.mark.parametrize("page", BOOK_PAGES, ids=[_name(p) for p in BOOK_PAGES])
def test_download_menu_offers_the_notebooks_bundle(page: Path,
                                                   report_of: Callable[[Path], PageReport]) -> None:
    """Opened by a click, the page's download menu shows the zip of every chapter (beside the page's
    own source), and the link leads to the bundle in the build."""
    name = _name(page)
    menu = report_of(page).probed("downloads")
    assert menu["visible_buttons"] == 1, f"{name}: {menu['visible_buttons']} visible download buttons"
    assert menu.get("opened"), f"{name}: the download menu did not open on a click"
    bundle = [link for link in menu["links"] if link["text"] == "notebooks (.zip)"]
    assert len(bundle) == 1, f"{name}: the open menu shows {menu['links']}"
    target = Path(unquote(urlsplit(bundle[0]["url"]).path))
    assert target == BUNDLE_PATH and target.is_file(), f"{name}: the bundle link leads to {target}"


DARK_BACKGROUND_MAX = 0.2  # relative luminance: pydata's dark surfaces are < 0.05, white is 1


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_dark_mode_code_is_dark(page: Path, report_of: Callable[[Path], PageReport]) -> None:
    """In dark mode every code block (listings, outputs) is dark, and no output styles the page."""
    dark = report_of(page).probed("dark")
    name = _name(page)
    assert dark["theme"] == "dark", f"{name}: the page did not follow the system's dark mode"
    bright = [f"{b['block']} (background luminance {b['background']:.2f})"
              for b in dark["blocks"] if b["background"] > DARK_BACKGROUND_MAX]
    assert not bright, f"{name}: bright code blocks in dark mode:\n" + "\n".join(bright[:8])
    unreadable = [b["block"] for b in dark["blocks"] if b["text"] is not None and b["text"] < 0.2]
    assert not unreadable, f"{name}: dark text on the dark code background: {unreadable[:5]}"
    assert not dark["styleSheets"], (
        f"{name}: a cell output carries its own style sheet, which ignores dark mode and restyles "
        f"the whole page: {dark['styleSheets'][:3]}"
    )


@pytest.mark.parametrize("width", VIEWPORTS)
def test_every_page_is_photographed(width: str, visit: Callable[[Path, str], PageReport]) -> None:
    """A JPEG of every page at both widths, and in dark mode at desktop width, for review."""
    if not PAGES:
        _unavailable(f"no built book in {HTML_DIR}")
    missing = []
    for page in PAGES:
        visit(page, width)
        for kind in SCREENSHOT_KINDS[width]:
            shot = screenshot_path(kind, page)
            if not shot.is_file() or shot.stat().st_size < 1000:
                missing.append(shot.relative_to(SCREENSHOT_DIR).as_posix())
    assert not missing, f"screenshots missing under {SCREENSHOT_DIR}: {missing}"


EXERCISE_TITLE = re.compile(r"Exercise (\d+)\.(\d+)\b")


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_exercises_are_numbered_by_chapter_and_each_has_a_solution(
        page: Path, report_of: Callable[[Path], PageReport]) -> None:
    reader = report_of(page).probed("reader")
    exercises, solutions = reader["exercises"], reader["solutions"]
    name = _name(page)
    numbers = [EXERCISE_TITLE.match(e["title"]) for e in exercises]
    assert all(numbers), f"{name}: exercise titles not numbered 'Exercise N.M': {exercises}"
    # A chapter's page (section number "11") numbers its exercises from 11.1; a child page ("11.10",
    # §11b) goes on counting its chapter's: sphinx-exercise numbers per chapter.
    chapter, _, child = (reader["chapter"] or "").partition(".")
    assert all(n.group(1) == chapter for n in numbers), (
        f"{name}: exercises not numbered by the chapter {chapter}: {[e['title'] for e in exercises]}")
    first = int(numbers[0].group(2)) if numbers else 1
    assert [int(n.group(2)) for n in numbers] == list(range(first, first + len(exercises))), exercises
    assert first == 1 or child, f"{name}: a chapter's own exercises start at {chapter}.1: {exercises}"
    assert all(e["id"].startswith("ex-") for e in exercises), (
        f"{name}: every exercise needs a :label: (ex-...), to be linked: {exercises}")
    assert len(solutions) == len(exercises), f"{name}: {len(exercises)} exercises, {len(solutions)} solutions"


@pytest.mark.parametrize(("page", "width"), VISITS)
def test_solutions_are_folded_behind_a_button(page: Path, width: str,
                                               visit: Callable[[Path, str], PageReport]) -> None:
    solutions = visit(page, width).probed("reader")["solutions"]
    name = _name(page)
    open_ = [s["id"] for s in solutions if not (s["dropdown"] and s["folded"] and s["expanded"] == "false")]
    assert not open_, f"{name} ({width}): solutions shown on arrival (give them :class: dropdown): {open_}"
    unreachable = [s["id"] for s in solutions if not s["button"]]
    assert not unreachable, f"{name} ({width}): solutions without a focusable toggle button: {unreachable}"


def test_some_page_has_exercises_with_code_in_a_solution(report_of: Callable[[Path], PageReport]) -> None:
    """Guard against a vacuous pass: the book has exercises, and gated solutions hold code cells."""
    _first_solution_with_code(report_of)


def _first_found(
    report_of: Callable[[Path], PageReport], kind: str, has: str, missing: str
) -> tuple[Path, dict]:
    """The first page (in reading order) with an item of ``kind`` (``"solutions"``, ``"citations"``) whose
    ``has`` is true, and that item; fails with ``missing`` if no page has one."""
    for page in PAGES:
        for item in report_of(page).reader.get(kind, []):
            if item[has]:
                return page, item
    pytest.fail(missing)


def _first_solution_with_code(report_of: Callable[[Path], PageReport]) -> tuple[Path, dict]:
    return _first_found(report_of, "solutions", "hasCode",
                        "no page has a solution holding a code cell (solution-start/solution-end around it)")


def test_a_solution_opens_by_click_and_by_keyboard(
        new_context: Callable[..., BrowserContext], report_of: Callable[[Path], PageReport]) -> None:
    """The solution's body, its code cell and the cell's output included, shows on a click on its title
    and on Enter on its button (reached by keyboard focus), and a second Enter folds it again."""
    page_path, solution = _first_solution_with_code(report_of)
    context = new_context(**VIEWPORTS["desktop"])  # pytest-playwright's: closed after the test
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    for how in ("click", "keyboard"):
        page.goto(page_path.as_uri(), wait_until="load")
        box = page.locator(f"[id='{solution['id']}']")
        body = box.locator(":scope > section")
        cell = body.locator(".cell").first
        button = box.locator(":scope > .admonition-title button.toggle-button")
        assert not body.is_visible() and not cell.is_visible(), f"{solution['id']}: not folded on arrival"
        if how == "click":
            box.locator(":scope > .admonition-title").click()
        else:
            button.focus()
            page.keyboard.press("Enter")
        body.wait_for(state="visible", timeout=STATE_TIMEOUT_MS)
        assert cell.is_visible() and button.get_attribute("aria-expanded") == "true", (
            f"{_name(page_path)}: {how} on {solution['id']} did not show its code cell")
        if how == "keyboard":
            page.keyboard.press("Enter")
            body.wait_for(state="hidden", timeout=STATE_TIMEOUT_MS)
    assert not errors, f"{_name(page_path)}: errors while opening a solution: {errors}"


def _first_figure(report_of: Callable[[Path], PageReport]) -> tuple[Path, dict]:
    for page in PAGES:
        for img in report_of(page).reader.get("images", []):
            if img["inFigure"] and img["naturalWidth"] > 0:
                return page, img
    pytest.fail("no page has a figure with a decoded image (the book's figures are {figure} directives)")


def test_a_figure_opens_full_size_by_click_and_by_keyboard(
        new_context: Callable[..., BrowserContext], report_of: Callable[[Path], PageReport]) -> None:
    page_path, img = _first_figure(report_of)
    context = new_context(**VIEWPORTS["desktop"])  # pytest-playwright's: closed after the test
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    for how in ("click", "keyboard"):
        page.goto(page_path.as_uri(), wait_until="load")
        image = page.locator(f"main img[src='{img['src']}']").first
        if how == "click":
            image.click()
        else:
            image.locator("xpath=ancestor::a[1]").focus()
            page.keyboard.press("Enter")
        page.wait_for_url(img["url"], timeout=STATE_TIMEOUT_MS)
        shown = page.evaluate("() => ({type: document.contentType, width: document.images.length"
                              " ? document.images[0].naturalWidth : 0})")
        assert shown["type"].startswith("image/") and shown["width"] == img["naturalWidth"], (
            f"{_name(page_path)}: {how} on {img['src']} opened {page.url}, showing {shown}"
        )


def test_search_finds_the_book_s_subject(new_context: Callable[..., BrowserContext]) -> None:
    search = HTML_DIR / "search.html"
    if not search.is_file():
        _unavailable(f"no search page in {HTML_DIR}")
    reader = Reader(new_context(**VIEWPORTS["desktop"]), "desktop")
    reader.current = report = PageReport(url=search.as_uri() + "?q=KL")
    reader.page.goto(report.url, wait_until="load")
    reader.page.wait_for_function(  # Sphinx sets this title when the search has finished
        "() => /Search Results/.test(document.querySelector('#search-results h2')?.textContent || '')",
        timeout=PAGE_TIMEOUT_MS)
    results = reader.page.locator("#search-results ul.search li a[href]")
    hits = results.count()
    summary = reader.page.locator("#search-results .search-summary").inner_text()
    first = results.first.get_attribute("href") if hits else None
    reader.page.wait_for_timeout(LATE_EVENTS_MS)
    reader.close()
    assert hits >= 1, f"searching the book for 'KL' found nothing ({report.url}): {summary}"
    assert first and (search.parent / first.split("#")[0]).is_file(), f"first result links nowhere: {first}"
    problems = report.errors + report.remote_requests
    assert not problems, f"search page: {problems}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_numbers_are_set_like_the_words_around_them(
        page: Path, report_of: Callable[[Path], PageReport]) -> None:
    """A number of the prose ({eval}) has its sentence's weight: myst-nb's bold ``pasted-text`` is
    not applied to it (tools/kltutorial_book_ext.py)."""
    evals = report_of(page).probed("reader")["evals"]
    assert not evals["heavier"], (
        f"{_name(page)}: {len(evals['heavier'])} of {evals['count']} numbers stand out from their "
        "sentence:\n" + "\n".join(evals["heavier"][:5]))


def test_the_prose_has_numbers_and_its_bold_stays_bold(report_of: Callable[[Path], PageReport]) -> None:
    """Guard against a vacuous pass: the book shows {eval} numbers (most on a page like §12), and
    the prose's own **bold** is still bold."""
    counts = {_name(p): report_of(p).probed("reader")["evals"]["count"] for p in PAGES}
    assert max(counts.values(), default=0) >= 20, f"numbers of the prose ({{eval}}) per page: {counts}"
    strong = [w for p in PAGES for w in report_of(p).probed("reader")["strong"]]
    assert strong, "no **bold** in the prose of any page"
    assert min(strong) >= 600, f"**bold** prose set at weight {min(strong)}: {sorted(set(strong))}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_citation_has_its_reference_beside_it(
        page: Path, report_of: Callable[[Path], PageReport]) -> None:
    """Each citation link is described (aria-describedby) by the preview of its entry
    (tools/cite_preview.py, book/_static/cite-preview.js), which names the entry's year."""
    citations = report_of(page).probed("reader")["citations"]
    missing = [c["label"] for c in citations if not c["preview"]]
    assert not missing, f"{_name(page)}: citations without a preview: {missing}"
    entries = bibliography()
    wrong = [c["label"] for c in citations if c["key"] not in entries
             or entries[c["key"]]["year"] not in c["text"]]
    assert not wrong, f"{_name(page)}: previews of no entry, or of another one: {wrong}"


@functools.cache
def bibliography() -> dict[str, dict[str, str]]:
    """Each entry of book/references.bib: its first author's last name, title and year, as text."""
    from pybtex.database import parse_file
    from pybtex.richtext import Text

    def text(latex: str) -> str:
        return " ".join(Text.from_latex(latex).render_as("text").split())

    entries = {}
    for key, entry in parse_file(ROOT / "book" / "references.bib").entries.items():
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        last = text(" ".join(people[0].last_names)) if people else ""
        entries[key] = {"author": last, "title": text(entry.fields.get("title", "")),
                        "year": entry.fields.get("year", "")}
    return entries


def _first_citation(report_of: Callable[[Path], PageReport]) -> tuple[Path, dict]:
    return _first_found(report_of, "citations", "preview",
                        "no page has a citation with its preview ({cite} and tools/cite_preview.py)")


# The preview as a reader sees it: shown, inside the screen, its text and colours.
PREVIEW_PROBE = r"""
(id) => {
  const box = document.getElementById(id);
  const r = box.getBoundingClientRect(), s = getComputedStyle(box);
  const rgb = c => c.match(/[\d.]+/g).slice(0, 3).map(Number);
  const lum = c => {
    const lin = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    const [r, g, b] = rgb(c);
    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
  };
  const bg = lum(s.backgroundColor);
  const contrast = [...box.querySelectorAll('span')].map(line => {
    const fg = lum(getComputedStyle(line).color);
    return (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
  });
  return {
    shown: r.width > 0 && r.height > 0 && s.display !== 'none' && s.visibility !== 'hidden',
    left: r.left, right: r.right, top: r.top, bottom: r.bottom,
    viewport: [document.documentElement.clientWidth, document.documentElement.clientHeight],
    scrollWidth: document.documentElement.scrollWidth,
    text: box.innerText.replace(/\s+/g, ' ').trim(),
    minContrast: Math.min(...contrast), opaque: !/rgba\(.*, 0\)$/.test(s.backgroundColor),
  };
}
"""


@pytest.mark.parametrize("width", list(VIEWPORTS))
def test_a_citation_shows_its_reference_by_keyboard_hover_and_tap(
        width: str, new_context: Callable[..., BrowserContext],
        report_of: Callable[[Path], PageReport]) -> None:
    """Focus (keyboard), hover (desktop) and tap (phone, a touch screen) show the citation's
    reference beside it: the right entry's author, title and year, inside the screen, legible in
    light and dark mode; Escape hides it, and so does a second tap."""
    page_path, citation = _first_citation(report_of)
    entry = bibliography()[citation["key"]]
    # The entry the link leads to, on the references page, is the one the preview shows.
    target = urlsplit(citation["href"])
    listed = re.search(rf'id="{re.escape(unquote(target.fragment))}"[^>]*>(.*?)</div>',
                       Path(unquote(target.path)).read_text(encoding="utf8"), re.DOTALL)
    assert listed, f"{citation['href']}: no such entry on the references page"
    listed_text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", listed.group(1))).split())
    assert entry["title"].casefold() in listed_text.casefold(), (
        f"[{citation['label']}] links to {listed_text[:120]!r}, its preview shows {citation['key']}")
    context = new_context(**VIEWPORTS[width])  # pytest-playwright's: closed after the test
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(page_path.as_uri(), wait_until="load")
    link = page.locator(f"main a[aria-describedby='{citation['previewId']}']")
    where = f"{_name(page_path)} ({width}), [{citation['label']}]"

    def preview(how: str, shown: bool = True) -> dict:
        state = page.evaluate(PREVIEW_PROBE, citation["previewId"])
        assert state["shown"] is shown, (
            f"{where}: after {how}, the preview is {'hidden' if shown else 'shown'}")
        if shown:
            vw, vh = state["viewport"]
            inside = (state["left"] >= 0 and state["right"] <= vw
                      and state["top"] >= 0 and state["bottom"] <= vh)
            assert inside, (
                f"{where}: after {how}, the preview spans x {state['left']:.0f}..{state['right']:.0f}, "
                f"y {state['top']:.0f}..{state['bottom']:.0f} in a {vw} x {vh} screen")
            assert state["scrollWidth"] <= vw, (
                f"{where}: the preview widens the page to {state['scrollWidth']} px")
            for part in ("author", "title", "year"):
                assert entry[part].casefold() in state["text"].casefold(), (
                    f"{where}: after {how}, the preview lacks the {part} {entry[part]!r}: {state['text']!r}")
            assert state["opaque"] and state["minContrast"] >= 4.5, (
                f"{where}: after {how}, the preview is hard to read (contrast {state['minContrast']:.2f})")
        return state

    preview("loading", shown=False)
    link.focus()
    preview("keyboard focus")
    page.keyboard.press("Escape")
    preview("Escape", shown=False)
    if width == "desktop":
        page.mouse.move(1, 1)
        link.hover()
        preview("hover")
        page.keyboard.press("Escape")
        preview("Escape", shown=False)
        page.emulate_media(color_scheme="dark")
        page.wait_for_function("document.documentElement.dataset.theme === 'dark'", timeout=STATE_TIMEOUT_MS)
        link.blur()
        link.focus()
        preview("keyboard focus, dark mode")
    else:
        url = page.url
        link.tap()
        preview("a tap")
        assert page.url == url, f"{where}: a tap on the citation left the page for {page.url}"
        link.tap()
        preview("a second tap", shown=False)
    assert not errors, f"{where}: errors: {errors}"


AXE_BLOCKING = ("serious", "critical")
# Serious or critical violations that are the themes' own and that the book leaves to them: the
# rule, a pattern of the offending nodes' selectors, and the upstream issue. The book fixes the
# others where it can: the unnamed contents buttons of pydata-sphinx-theme get a name from
# kltutorial.js, the bibliography's deprecated role is replaced in tools/bib_backrefs.py.
AXE_THEME_ALLOWED: list[tuple[str, re.Pattern[str], str]] = []


def _blocking(violations: list[dict]) -> list[str]:
    """The serious and critical violations, less the themes' own, one line per offending node."""
    found = []
    for v in violations:
        if v["impact"] not in AXE_BLOCKING:
            continue
        for node in v["nodes"]:
            if any(rule == v["id"] and where.search(node["target"]) for rule, where, _ in AXE_THEME_ALLOWED):
                continue
            found.append(f"{v['id']} ({v['impact']}: {v['help']}) at {node['target']}: {node['summary']}")
    return found


@pytest.mark.parametrize(("page", "width"), VISITS)
def test_no_serious_accessibility_violations(page: Path, width: str,
                                             visit: Callable[[Path, str], PageReport]) -> None:
    """axe-core finds no serious or critical violation, but the themes' own (AXE_THEME_ALLOWED)."""
    axe = visit(page, width).probed("axe")
    found = _blocking(axe["violations"])
    assert not found, (f"{_name(page)} ({width}): axe-core {axe['version']} finds {len(found)} serious or "
                       "critical accessibility problems:\n" + "\n".join(found[:10]))


def test_axe_reports_what_it_should(new_context: Callable[..., BrowserContext]) -> None:
    """Guard against a vacuous pass: on a page with an unnamed button, an image without alt text
    and grey-on-white text, the probe reports them as serious or critical."""
    context = new_context(**VIEWPORTS["desktop"])  # pytest-playwright's: closed after the test
    page = context.new_page()
    page.set_content('<html lang="en"><head><title>t</title></head><body><main><h1>t</h1>'
                     '<button></button><img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">'
                     '<p style="color:#bbb">faint</p></main></body></html>')
    found = {line.split(" ", 1)[0] for line in _blocking(run_axe(page, "desktop")["violations"])}
    assert {"button-name", "image-alt", "color-contrast"} <= found, found
