/* The reference beside a citation: shows the preview that tools/cite_preview.py wrote after each
 * citation link (span.kl-cite-preview, hidden by cite-preview.css).
 *
 * Each citation link is described by its preview (aria-describedby: a screen reader reads the
 * reference with the link), and loses its title attribute, whose own tooltip would show the same
 * text a second time. The preview shows
 *   - while the mouse is over the link (or over the preview itself);
 *   - while the link has keyboard focus;
 *   - on a tap on a touch screen, which no longer follows the link: a second tap on the link hides
 *     the preview, a tap on the preview opens the entry in the references, a tap elsewhere hides it.
 * Escape hides it. It is placed below the link (above it when there is no room below), inside the
 * screen with an 8 px margin, and follows the link when the page scrolls.
 */
(function () {
  "use strict";

  const MARGIN = 8; // px kept free at the screen's edges
  const GAP = 4; // px between the link and the preview
  const TOUCH_MS = 1000; // a focus or click this soon after a touch comes from that touch
  let open = null; // {link, box}
  let hideTimer = null;
  let lastTouch = -Infinity;

  function place(link, box) {
    const vw = document.documentElement.clientWidth;
    const vh = document.documentElement.clientHeight;
    box.style.left = "0px";
    box.style.top = "0px";
    box.style.maxWidth = Math.min(448, vw - 2 * MARGIN) + "px";
    const r = link.getBoundingClientRect();
    const b = box.getBoundingClientRect();
    const left = Math.max(MARGIN, Math.min(r.left, vw - MARGIN - b.width));
    let top = r.bottom + GAP;
    if (top + b.height > vh - MARGIN && r.top - GAP - b.height >= MARGIN) {
      top = r.top - GAP - b.height;
    }
    box.style.left = Math.round(left) + "px";
    box.style.top = Math.round(top) + "px";
  }

  function show(link, box) {
    clearTimeout(hideTimer);
    if (open && open.box !== box) hide();
    open = { link: link, box: box };
    box.classList.add("kl-open");
    place(link, box);
  }

  function hide() {
    clearTimeout(hideTimer);
    if (!open) return;
    open.box.classList.remove("kl-open");
    open = null;
  }

  function hideSoon() {
    clearTimeout(hideTimer);
    hideTimer = setTimeout(hide, 200);
  }

  function bind(link, box) {
    link.setAttribute("aria-describedby", box.id);
    if (link.title) {
      link.dataset.klTitle = link.title;
      link.removeAttribute("title");
    }
    const mouse = (event) => event.pointerType !== "touch";
    link.addEventListener("pointerenter", (event) => { if (mouse(event)) show(link, box); });
    link.addEventListener("pointerleave", (event) => {
      if (mouse(event) && document.activeElement !== link) hideSoon();
    });
    box.addEventListener("pointerenter", (event) => { if (mouse(event)) clearTimeout(hideTimer); });
    box.addEventListener("pointerleave", (event) => {
      if (mouse(event) && document.activeElement !== link) hideSoon();
    });
    link.addEventListener("focus", () => {
      if (performance.now() - lastTouch > TOUCH_MS) show(link, box);
    });
    link.addEventListener("blur", () => { if (open && open.link === link) hideSoon(); });
    link.addEventListener("click", (event) => {
      if (performance.now() - lastTouch > TOUCH_MS) return; // mouse or keyboard: follow the link
      event.preventDefault();
      if (open && open.link === link) hide();
      else show(link, box);
    });
    box.addEventListener("click", (event) => {
      event.preventDefault();
      window.location.href = link.href;
    });
  }

  function init() {
    for (const box of document.querySelectorAll("span.kl-cite-preview[id]")) {
      const link = box.previousElementSibling;
      if (link && link.matches("a[href]")) bind(link, box);
    }
    document.addEventListener("pointerdown", (event) => {
      if (event.pointerType === "touch") lastTouch = performance.now();
      if (open && !open.link.contains(event.target) && !open.box.contains(event.target)) hide();
    }, true);
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && open) hide();
    });
    const follow = () => { if (open) place(open.link, open.box); };
    window.addEventListener("scroll", follow, { passive: true, capture: true });
    window.addEventListener("resize", follow);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
