/* kltutorial book: page fixes that the themes do not ship (loaded by tools/kltutorial_book_ext.py).
 *
 * Sidebar buttons. pydata-sphinx-theme 0.17 and sphinx-book-theme 1.3 both render a ☰ button with the
 * class `primary-toggle` (and an "on this page" button with `secondary-toggle`): a hidden one in the
 * navbar and the visible one in the article header. Both themes bind their click handlers with
 * `document.querySelector`, which finds the hidden copy first, so the visible buttons do nothing:
 * below 992 px the contents cannot be opened, and on a desktop ☰ does not collapse the sidebar
 * (pydata-sphinx-theme #2451, sphinx-book-theme #988). Each visible copy forwards its click to the
 * first (bound) button, which then does what the themes intended at that width.
 */
(function () {
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
  function init() {
    forwardToggleClicks(".primary-toggle");
    forwardToggleClicks(".secondary-toggle");
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
