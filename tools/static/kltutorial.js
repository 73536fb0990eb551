/* kltutorial book: page fixes that the themes do not ship (loaded by tools/kltutorial_book_ext.py).
 *
 * Sidebar buttons. pydata-sphinx-theme 0.17 and sphinx-book-theme 1.3 both render a ☰ button with the
 * class `primary-toggle` (and an "on this page" button with `secondary-toggle`): a hidden one in the
 * navbar and the visible one in the article header. Both themes bind their click handlers with
 * `document.querySelector`, which finds the hidden copy first, so the visible buttons do nothing:
 * below 992 px the contents cannot be opened, and on a desktop ☰ does not collapse the sidebar
 * (pydata-sphinx-theme #2451, sphinx-book-theme #988). Each visible copy forwards its click to the
 * first (bound) button, which then does what the themes intended at that width.
 *
 * Wide content. Code blocks, tables and display equations wider than the text column scroll inside
 * their own box (the themes already set `overflow: auto` on them), but phones and macOS draw no
 * scrollbar until one scrolls, so the cut-off columns gave no sign of being there. Every such box
 * that overflows gets the class `kl-scroll-x`, plus `kl-more-right` / `kl-more-left` while content is
 * hidden on that side: kltutorial.css fades that edge and keeps a thin scrollbar visible. The box is
 * also made focusable (tabindex 0), so a keyboard can scroll it. Boxes are re-measured when their
 * size changes, when they scroll, and when MathJax adds its formulas.
 *
 * Figures. Each image of the article (figures and cell outputs) becomes a link to its own file,
 * so a click, or Enter on the focused link, opens the image at full size.
 *
 * Contents buttons. pydata-sphinx-theme 0.17 draws the button that folds a chapter's sub-pages in the
 * contents as a <summary> holding only a chevron icon (role="presentation", its toctree.py): a
 * screen reader announces an unnamed button, and axe-core reports it (rule summary-name, serious;
 * the same markup is patched in pytorch_sphinx_theme #234). Each such button is named after its
 * chapter: "Sections of KL in reward or loss".
 *
 * Search from disk. Sphinx's search page fetches every result page to show a summary under it; a
 * book opened from disk (file:) may not fetch (the browser blocks it), so each result logged an
 * error and showed no summary. There the summaries are switched off: the results are listed as
 * they were, without the failing requests.
 */
(function () {
  "use strict";

  // documentation_options.js declares it with `const`: a global binding, not a property of window.
  if (window.location.protocol === "file:" && typeof DOCUMENTATION_OPTIONS === "object") {
    DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false; // eslint-disable-line no-undef
  }

  function forwardToggleClicks(selector) {
    const buttons = document.querySelectorAll(selector);
    if (buttons.length < 2) return;
    const bound = buttons[0];
    buttons.forEach((button, i) => {
      if (i === 0) return;
      button.addEventListener("click", (event) => {
        event.preventDefault();
        event.stopImmediatePropagation();
        bound.click();
      });
    });
  }

  // Boxes that scroll sideways when their content is wider than the column.
  const SCROLL_BOXES = [
    "pre",
    ".pst-scrollable-table-container",
    ".table-wrapper",
    "div.math mjx-container",
    "span.math",
    "mjx-container[display='true']",
    ".cell_output .output",
  ].join(", ");

  // How much of the box's content is out of sight. A formula is measured by what MathJax drew
  // (mjx-math): its scrollWidth also counts the invisible MathML copy that MathJax positions
  // absolutely for screen readers, which is wider than the drawing (a lone β "overflowed" by
  // 3 px, y = (y_1, ..., y_T) by 20 px, and faded for nothing).
  function hiddenWidth(box) {
    const math = box.matches("span.math, mjx-container") ? box.querySelector("mjx-math") : null;
    if (math) return Math.ceil(math.getBoundingClientRect().width) - box.clientWidth;
    return box.scrollWidth - box.clientWidth;
  }

  function markScrollBox(box) {
    const hidden = hiddenWidth(box);
    const overflows = hidden > 1;
    box.classList.toggle("kl-scroll-x", overflows);
    box.classList.toggle("kl-more-left", overflows && box.scrollLeft > 1);
    box.classList.toggle("kl-more-right", overflows && box.scrollLeft < hidden - 1);
    if (overflows && !box.hasAttribute("tabindex")) {
      box.setAttribute("tabindex", "0");
      box.dataset.klFocusable = "";
    } else if (!overflows && "klFocusable" in box.dataset) {
      box.removeAttribute("tabindex");
      delete box.dataset.klFocusable;
    }
  }

  const watched = new WeakSet();
  const resizes = "ResizeObserver" in window
    ? new ResizeObserver((entries) => entries.forEach((entry) => markScrollBox(entry.target)))
    : null;

  function watchScrollBoxes(root) {
    for (const box of root.querySelectorAll(SCROLL_BOXES)) {
      if (watched.has(box)) continue;
      watched.add(box);
      box.addEventListener("scroll", () => markScrollBox(box), { passive: true });
      if (resizes) resizes.observe(box);
      markScrollBox(box);
    }
  }

  function linkImages(root) {
    for (const img of root.querySelectorAll("figure img, .cell_output img")) {
      const src = img.getAttribute("src");
      if (!src || img.closest("a[href]")) continue;
      const link = document.createElement("a");
      link.href = src;
      link.className = "kl-image-link";
      link.title = "Open the image at full size";
      img.replaceWith(link);
      link.appendChild(img);
    }
  }

  function nameContentsToggles() {
    for (const summary of document.querySelectorAll("nav li.has-children > details > summary")) {
      if (summary.textContent.trim() || summary.hasAttribute("aria-label")) continue;
      const link = summary.closest("li").querySelector(":scope > a");
      const title = link ? link.textContent.trim().replace(/\s+/g, " ") : "";
      summary.setAttribute("aria-label", title ? "Sections of " + title : "Sections");
    }
  }

  function init() {
    forwardToggleClicks(".primary-toggle");
    forwardToggleClicks(".secondary-toggle");
    nameContentsToggles();
    const article = document.querySelector("main") || document.body;
    linkImages(article);
    watchScrollBoxes(article);
    // MathJax typesets after this script has run: watch for the boxes it adds.
    let pending = false;
    new MutationObserver(() => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        watchScrollBoxes(article);
      });
    }).observe(article, { childList: true, subtree: true });
    if (!resizes) window.addEventListener("resize", () => article.querySelectorAll(".kl-scroll-x, " + SCROLL_BOXES).forEach(markScrollBox));
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
