"""The book as one PDF, ``_build/pdf/book.pdf`` (``make pdf``: tools/book_pdf.py), read back.

Run by ``make test`` after ``make pdf`` (``pytest tests -m pdf``; ``pdf-check`` in the Makefile). What
the PDF must hold is read from the HTML build the browser checks have just read (``_build/html``):
every page of the table of contents, its title as the page shows it, in the order of ``_toc.yml``;
every figure's number and the start of its caption. The PDF's text (extracted with pypdfium2, pinned
in requirements.txt) must contain each, titles in order, and none of the MyST or TeX that a page
shows when its source was not rendered. Its links must stay inside it (a cross-reference is a jump to
a page of the PDF) or go to the web, never to a file of the build; its outline lists every chapter.
The pages ``tools/book_pdf.py`` leaves out (``LEFT_OUT``: the API reference) are not in it at all.
"""

from __future__ import annotations

import ctypes
import html
import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pypdfium2 as pdfium
import pypdfium2.raw as raw
import pytest
from test_book_downloads import toc_files

from tools.book_pdf import LEFT_OUT, leave_out

pytestmark = [pytest.mark.book, pytest.mark.pdf]

ROOT = Path(__file__).resolve().parents[1]
HTML_DIR = Path(os.environ.get("KLTUTORIAL_HTML_DIR", ROOT / "_build" / "html")).resolve()
PDF = HTML_DIR.parent / "pdf" / "book.pdf"

# What a page shows when MyST or TeX was left unrendered: a role with its backtick, a fence or a
# directive, a colon fence, display-math dollars, TeX commands, MathJax's own delimiters.
RAW = {
    "MyST role": re.compile(r"\{[a-z][\w:-]*\}`"),
    "code fence or directive": re.compile(r"```|^\s*\{[a-z][\w-]*\}\s", re.MULTILINE),
    "colon fence": re.compile(r"^\s*:::", re.MULTILINE),
    "display-math dollars": re.compile(r"\$\$"),
    "TeX command": re.compile(r"\\(frac|mathrm|mathbb|mathcal|beta|pi|sum|log|left|right|begin|end)\b"),
    "MathJax delimiter": re.compile(r"\\\(|\\\)|\\\[|\\\]"),
}


def _squash(text: str) -> str:
    """Text with every run of white space (and the PDF's line breaks) as one space."""
    return re.sub(r"\s+", " ", text.replace("\u00ad", "")).strip()


def _text_of(fragment: str) -> str:
    return _squash(html.unescape(re.sub(r"<[^>]+>", "", fragment)))


@pytest.fixture(scope="module")
def doc() -> Iterator[pdfium.PdfDocument]:
    if not PDF.is_file():
        pytest.fail(f"no PDF at {PDF}: run `make pdf` (after `make book-verified`) first")
    document = pdfium.PdfDocument(PDF)
    yield document
    document.close()


@pytest.fixture(scope="module")
def text(doc: pdfium.PdfDocument) -> str:
    """The whole PDF's text, white space squashed."""
    return _squash(" ".join(doc[i].get_textpage().get_text_range() for i in range(len(doc))))


@cache
def toc_pages() -> list[Path]:
    """The built page of every file of ``_toc.yml`` that the PDF holds, in reading order."""
    return [HTML_DIR / f"{name}.html" for name in toc_files() if name not in LEFT_OUT]


def test_the_pages_left_out_are_not_in_the_pdf(text: str) -> None:
    for name in LEFT_OUT:
        page = HTML_DIR / f"{name}.html"
        assert page.is_file(), f"{name}: not built, so nothing to leave out"
        # the page's first paragraph, as the HTML shows it
        first = re.search(r"<p>(.*?)</p>", page.read_text(encoding="utf8"), re.DOTALL)
        assert first, f"{page.name}: no paragraph"
        words = " ".join(_text_of(first.group(1)).split()[:8])
        assert words and words not in text, f"{page.name}: {words!r} is in the PDF"


def test_leave_out_removes_a_document_and_unwraps_the_links_into_it() -> None:
    page = ('<main><span id="document-book/a"></span><section id="a"><p>See '
            '<a class="reference internal" href="#x"><code>x()</code></a> and <a href="#a">A</a>.</p>'
            '</section><span id="document-book/api"></span><section id="api"><dt id="x">x</dt></section>'
            '<span id="document-book/status"></span><section id="status">S</section></main>')
    out = leave_out(page, ("book/api",))
    assert 'id="api"' not in out and 'id="x"' not in out and 'id="status"' in out
    assert "See <code>x()</code> and" in out and '<a href="#a">A</a>' in out  # the link to a kept place stays
    with pytest.raises(ValueError, match="documents"):
        leave_out(page, ("book/missing",))


def page_title(page: Path) -> str:
    match = re.search(r"<h1>(.*?)</h1>", page.read_text(encoding="utf8"), re.DOTALL)
    assert match, f"{page} has no <h1>"
    return _text_of(match.group(1))


def captions() -> list[tuple[str, str]]:
    """(number, first words) of every figure caption of the book, as the HTML pages show them."""
    found = []
    for page in toc_pages():
        for fig in re.findall(r"<figcaption>(.*?)</figcaption>", page.read_text(encoding="utf8"), re.DOTALL):
            number = re.search(r'<span class="caption-number">(.*?)</span>', fig, re.DOTALL)
            text = re.search(r'<span class="caption-text">(.*?)</span>\s*<a', fig, re.DOTALL)
            assert number and text, f"{page.name}: a caption without number or text: {fig[:200]}"
            words = _text_of(text.group(1)).split("\\(")[0].split()[:6]  # the words before any maths
            found.append((_text_of(number.group(1)), " ".join(words)))
    return found


def test_page_count_is_sane(doc: pdfium.PdfDocument) -> None:
    pages = len(doc)
    chapters = len(toc_pages())
    # Every page of the table of contents starts a new sheet; a layout that sets a word per line, or a
    # page per code line, would run to thousands.
    assert chapters <= pages <= 1000, f"{pages} pages for {chapters} pages of the book"


def test_every_page_title_in_the_order_of_the_toc(text: str) -> None:
    at = 0
    for page in toc_pages():
        title = page_title(page)
        found = text.find(title, at)
        assert found >= 0, f"{page.name}: title {title!r} missing from the PDF after character {at}"
        at = found + len(title)


def test_every_figure_number_and_caption(text: str) -> None:
    figures = captions()
    assert len(figures) >= len(toc_pages()) // 2, f"only {len(figures)} figure captions in the HTML build"
    missing = [f"{number} {words}" for number, words in figures if f"{number} {words}" not in text]
    assert not missing, f"figure captions missing from the PDF: {missing}"


def test_no_raw_myst_or_tex(text: str) -> None:
    problems = []
    for what, pattern in RAW.items():
        for match in pattern.finditer(text):
            problems.append(f"{what}: ...{text[max(0, match.start() - 60):match.end() + 30]}...")
    assert not problems, "\n".join(problems[:20])


def _links(doc: pdfium.PdfDocument) -> tuple[list[int], list[str]]:
    """(destination page of each link inside the PDF, address of each link out of it)."""
    inside, outside = [], []
    for index in range(len(doc)):
        page = doc[index]
        pos = ctypes.c_int(0)
        link = raw.FPDF_LINK()
        while raw.FPDFLink_Enumerate(page.raw, ctypes.byref(pos), ctypes.byref(link)):
            dest = raw.FPDFLink_GetDest(doc.raw, link)
            action = raw.FPDFLink_GetAction(link)
            if not dest and action and raw.FPDFAction_GetType(action) == raw.PDFACTION_GOTO:
                dest = raw.FPDFAction_GetDest(doc.raw, action)
            if dest:
                inside.append(raw.FPDFDest_GetDestPageIndex(doc.raw, dest))
            elif action:
                size = raw.FPDFAction_GetURIPath(doc.raw, action, None, 0)
                buffer = ctypes.create_string_buffer(size)
                raw.FPDFAction_GetURIPath(doc.raw, action, buffer, size)
                outside.append(buffer.value.decode("utf8", "replace"))
    return inside, outside


def test_links_stay_inside_or_go_to_the_web(doc: pdfium.PdfDocument) -> None:
    inside, outside = _links(doc)
    # The contents table of the intro alone links to every chapter.
    assert len(inside) >= len(toc_pages()), f"only {len(inside)} links inside the PDF"
    assert all(0 <= page < len(doc) for page in inside), "a link to a page the PDF does not have"
    leaving = sorted({url for url in outside if not url.startswith(("https://", "http://", "mailto:"))})
    assert not leaving, f"links out of the PDF to files: {leaving[:10]}"


def test_outline_lists_every_chapter(doc: pdfium.PdfDocument) -> None:
    # Chromium drops the space at a heading's line break ("samplesbuy"): compared without spaces.
    titles = [re.sub(r"\s", "", item.get_title()) for item in doc.get_toc()]
    missing = [page_title(p) for p in toc_pages()
               if not any(re.sub(r"\s", "", page_title(p)) in t for t in titles)]
    assert not missing, f"chapters missing from the PDF's outline: {missing}"
