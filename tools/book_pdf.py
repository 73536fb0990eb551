"""Print the book to one PDF: ``python tools/book_pdf.py SINGLEHTML_DIR OUT.pdf`` (``make pdf``).

``make pdf`` first builds the book as one HTML page (Sphinx's ``singlehtml`` builder, from the doctrees
of the strict build and with notebook execution off, so it renders the outputs nbval verified and runs
nothing). This script opens that page in Debian's Chromium, headless and offline, through Playwright
(``executable_path``: Playwright's own browser downloads are never used), waits until MathJax has
typeset every formula, every image is decoded and the interactive figure of section 11 has drawn its
default state, and prints the page with Chromium's ``page.pdf()``: A4, a page number in the footer,
the PDF's outline (bookmarks) from the headings, and the single page's ``#anchor`` links as links
inside the PDF.

Why not LaTeX: Jupyter Book 1's ``pdflatex`` route needs a TeX installation of a few hundred MB, and
it would render the book a second way (the notebooks' HTML outputs, the interactive figure, the
exercises' folded solutions and the page styles all have to be re-done for LaTeX). Printing the HTML
reuses the build the browser checks read, and Chromium is already needed for those checks. Why not
Jupyter Book's own ``pdfhtml`` builder: it asks pyppeteer for a Chromium of its own, which is
downloaded at first use and cannot be here.

The print layout is ``tools/static/kltutorial-print.css`` (a ``media="print"`` style sheet of every
page, so a reader's "Print to PDF" of one page gets it too): no sidebars, header, buttons or
navigation; code and outputs wrapped at the margin instead of scrolling; tables shrunk to the text
width; a figure kept on one page with its caption. What only the script can do: unfold what the
screen folds (the solutions), since paper has no button, and unwrap the links that would lead out of
the PDF to a file of the build (a figure's link to its own image). The set-up cells, whose input the
screen folds, are left out (the notebooks bundle has them). So is the API reference
(:data:`LEFT_OUT`): half of the book's HTML and two fifths of its formulas, for a reader at a screen; the
links to it become plain text (:func:`leave_out`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path

#: Offline and headless, as the browser checks launch it (tests/test_book_html.py).
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--host-resolver-rules=MAP * ~NOTFOUND"]
LOAD_TIMEOUT_MS = 120_000
#: The theme's search script asks for the search index, which ``singlehtml`` does not write.
NO_SEARCH = "/searchindex.js"

# Resolves when the page is ready to print; returns what it waited for, so a failure names it.
READY = r"""
async () => {
  const mj = window.MathJax;
  if (mj && mj.startup && mj.startup.promise) { await mj.startup.promise; }
  const images = [...document.images];
  for (const img of images) {
    img.loading = 'eager';
    if (!img.complete || img.naturalWidth === 0) {
      await Promise.race([img.decode().catch(() => null), new Promise(r => setTimeout(r, 10000))]);
    }
  }
  // The interactive figure (plotly) draws after its script has loaded.
  const plots = [...document.querySelectorAll('.plotly-graph-div')];
  for (let i = 0; i < 100 && plots.some(p => !p.querySelector('.main-svg')); i++) {
    await new Promise(r => setTimeout(r, 100));
  }
  // Paper has no buttons: unfold the folded solutions (the set-up cells' folded input stays out,
  // kltutorial-print.css). A figure's link to its own image file would leave the PDF: unwrapped.
  for (const box of document.querySelectorAll('.toggle-hidden')) box.classList.remove('toggle-hidden');
  for (const a of document.querySelectorAll('a[href]')) {
    const href = a.getAttribute('href');
    if (/^(https?:|mailto:|#)/.test(href)) continue;
    a.replaceWith(...a.childNodes);
  }
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  return {
    formulas: document.querySelectorAll('.math').length,
    untypeset: [...document.querySelectorAll('.math')].filter(e => !e.querySelector('mjx-container'))
        .map(e => e.textContent.trim().slice(0, 60)),
    texErrors: document.querySelectorAll('mjx-merror').length,
    images: images.length,
    broken: images.filter(i => i.naturalWidth === 0).map(i => i.getAttribute('src')),
    plots: plots.length,
    undrawn: plots.filter(p => !p.querySelector('.main-svg')).map(p => p.id),
  };
}
"""

FOOTER = ('<div style="width: 100%; font-size: 8px; color: #555; text-align: center;">'
          '<span class="pageNumber"></span></div>')


def chromium() -> str:
    """``$CHROMIUM`` when set, else Debian's ``/usr/bin/chromium``."""
    executable = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(executable, os.X_OK):
        sys.exit(f"error: the PDF is printed by Chromium, not found at {executable}: "
                 "sudo apt-get install chromium (or set CHROMIUM=/path/to/chromium)")
    return executable


#: The pages the PDF leaves out (the HTML book has them): the API reference, generated from the
#: docstrings, half of the single page and two fifths of its formulas.
LEFT_OUT = ("book/api",)
_DOCUMENT = re.compile(r'<span id="document-([^"]+)"></span>')


def leave_out(text: str, documents: tuple[str, ...] = LEFT_OUT) -> str:
    """The single page without ``documents`` (each from its ``document-...`` marker to the next one),
    and every link to a place inside them unwrapped to its text, so that no link points nowhere."""
    ids: set[str] = set()
    for document in documents:
        start = text.find(f'<span id="document-{document}"></span>')
        if start < 0:
            raise ValueError(f"documents: {document!r} is not in the single page")
        following = _DOCUMENT.search(text, start + 1)
        end = following.start() if following else text.rfind("</main>")
        ids |= set(re.findall(r'\bid="([^"]+)"', text[start:end]))
        text = text[:start] + text[end:]
    return re.sub(r'<a\b[^>]*\bhref="#([^"]+)"[^>]*>(.*?)</a>',
                  lambda m: m.group(2) if m.group(1) in ids else m.group(0), text, flags=re.DOTALL)


#: The file the script prints, at the root of the singlehtml build (see :func:`root_page`).
PRINTED = "book.html"


def root_page(html_dir: Path) -> Path:
    """The single page, written at the build's root as :data:`PRINTED`, where its links resolve.

    ``singlehtml`` writes the page under the root document's name, ``book/intro.html``, but makes its
    links relative to the build's root, as if the page were there: ``_static/...``, ``_images/...``,
    and ``book/intro.html#anchor`` for a place in the book. At the root those resolve, and the last
    becomes ``#anchor``, a place on the same page (a link inside the PDF). The interactive figure's
    notebook output loads ``../_static/plotly.min.js``, relative to a chapter page in ``book/``; at the
    root it is ``_static/plotly.min.js``.
    """
    pages = [p for p in html_dir.rglob("*.html") if "_static" not in p.parts and p.parent != html_dir]
    if len(pages) != 1:
        sys.exit(f"error: expected one page in the singlehtml build {html_dir}, found {pages}")
    name = pages[0].relative_to(html_dir).as_posix()
    text = pages[0].read_text(encoding="utf8")
    text = text.replace(f'href="{name}#', 'href="#').replace(f'href="{name}"', 'href="#"')
    text = text.replace('src="../_static/plotly.min.js"', 'src="_static/plotly.min.js"')
    text = leave_out(text)
    target = html_dir / PRINTED
    target.write_text(text, encoding="utf8")
    return target


def print_pdf(html_dir: Path, out: Path) -> dict:
    """Print the single page in ``html_dir`` to ``out``; returns what the page reported once ready."""
    from playwright.sync_api import sync_playwright

    page_file = root_page(html_dir.resolve())
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(offline=True, color_scheme="light")
            page = context.new_page()
            page.on("pageerror", lambda exc: problems.append(f"JavaScript error: {exc}"))
            page.on("requestfailed", lambda req: None if req.url.endswith(NO_SEARCH)
                    else problems.append(f"request failed: {req.url}"))
            times = [time.monotonic()]
            page.goto(page_file.as_uri(), wait_until="load", timeout=LOAD_TIMEOUT_MS)
            times.append(time.monotonic())
            ready = page.evaluate(READY)
            times.append(time.monotonic())
            for key, what in (("untypeset", "formulas MathJax did not typeset"),
                              ("broken", "images not decoded"), ("undrawn", "plots not drawn")):
                if ready[key]:
                    problems.append(f"{what}: {ready[key][:5]}")
            if ready["texErrors"]:
                problems.append(f"{ready['texErrors']} TeX errors")
            if problems:
                sys.exit("error: the page is not ready to print:\n  " + "\n  ".join(problems))
            out.parent.mkdir(parents=True, exist_ok=True)
            page.pdf(path=str(out), format="A4", print_background=True, outline=True, tagged=True,
                     display_header_footer=True, header_template="<span></span>", footer_template=FOOTER,
                     margin={"top": "16mm", "bottom": "16mm", "left": "14mm", "right": "14mm"})
            times.append(time.monotonic())
            steps = [round(end - start) for start, end in zip(times, times[1:], strict=False)]
            ready["seconds"] = dict(zip(("load", "typeset", "print"), steps, strict=True))
        finally:
            browser.close()
    return ready


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html_dir", type=Path, help="the singlehtml build")
    parser.add_argument("out", type=Path, help="the PDF to write")
    args = parser.parse_args(argv)
    started = time.monotonic()
    ready = print_pdf(args.html_dir, args.out)
    print(f"{args.out}: {args.out.stat().st_size / 1e6:.1f} MB, {ready['formulas']} formulas, "
          f"{ready['images']} images, {ready['plots']} interactive figure(s), "
          f"{time.monotonic() - started:.0f} s ({ready['seconds']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
