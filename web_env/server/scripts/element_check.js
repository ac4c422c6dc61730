/*
 * The page's answer: for a pointer action, the point at which Playwright would act on the element; for a fill, true,
 * with the element's text selected and the element focused, as Playwright's fill leaves it before it types; or null
 * where the check cannot vouch for the same outcome. As Playwright's checks (its injected script's retarget,
 * checkElementStates, _clickablePoint, expectHitTarget and fill): visible is the element's own style and box; enabled
 * is refused at any disabled or aria-disabled attribute on the element, the control it stands for (a label's) or their
 * ancestors; stable is the same box in two consecutive animation frames; the point is the centre of the element's one
 * box, nudged off half pixels and cut to hundredths; the element (or the button or link it is in) must be what the
 * page hits there. An element not wholly inside the viewport and every clipping ancestor gets "scroll": Playwright
 * scrolls it (DOM.scrollIntoViewIfNeeded) before it measures, and page_actions.pointed makes the same call and asks
 * again with `scrolled`; then a box still past the viewport (one larger than it) is aimed at the centre of its part
 * inside it, as Playwright clips its quad, whatever a scroller still cuts of it. Like Playwright, it
 * leaves a listener that checks the hit again when the first of the action's events lands and, if the page changed in
 * between, stops every event of the action (hit_verdict.js reads it). A fill takes a text input or text area that is
 * neither disabled nor read-only; Playwright checks no stability and no hit for it.
 */
async ([bid, action, events, scrolled]) => {
  const found = document.querySelectorAll(`[bid="${CSS.escape(bid)}"]`);
  if (found.length !== 1) return null;
  const element = found[0], editable = element.matches("input, textarea, select") || element.isContentEditable;
  const style = getComputedStyle(element);
  if (style.display === "contents" || style.visibility !== "visible") return null;
  if (!element.checkVisibility({ checkOpacity: false, checkVisibilityCSS: false })) return null;
  if (action === "fill") {
    const box = element.getBoundingClientRect(), text = ["", "email", "password", "search", "tel", "text", "url"];
    const typedInto = element.nodeName === "TEXTAREA" || (element.nodeName === "INPUT" && text.includes(element.type));
    if (!typedInto) return null;
    if (box.width <= 0 || box.height <= 0) return null;
    if (element.closest("[disabled], [aria-disabled], [readonly], [aria-readonly]")) return null;
    if (element.nodeName === "INPUT") element.select();
    else [element.selectionStart, element.selectionEnd] = [0, element.value.length];
    element.focus();
    return true;
  }
  if (action !== "hover") {
    const widget = "button, [role=button], [role=checkbox], [role=radio]";
    let control = editable ? element : element.closest(widget) || element;
    const isControl = `input, textarea, select, ${widget}`;
    if (!control.matches(isControl) && !control.isContentEditable) control = control.closest("label") || control;
    if (control.nodeName === "LABEL") control = control.control || control;
    if (element.closest("[disabled], [aria-disabled]") || control.closest("[disabled], [aria-disabled]")) return null;
  }
  const box = () => { const r = element.getBoundingClientRect(); return [r.top, r.left, r.width, r.height].join(); };
  const frame = () => new Promise((resolve) => requestAnimationFrame(resolve));
  await frame();
  const first = box();
  await frame();
  if (!element.isConnected || box() !== first) return null;
  // Playwright aims at the first of DevTools' content quads, which are the element's one box only where it is no
  // inline box around other boxes (a label around its checkbox gives one quad each) and no SVG shape. A drawing (an
  // outermost svg element) is one box, replaced as an image is, whatever shapes it holds; BrowserGym gives ids to
  // drawings, not to the shapes in them.
  const drawing = element instanceof SVGSVGElement && element.ownerSVGElement === null;
  if (!drawing && (element instanceof SVGElement || (style.display === "inline" && element.children.length))) {
    return null;
  }
  const rects = element.getClientRects();
  if (rects.length !== 1 || rects[0].width * rects[0].height <= 0.99) return null;
  const r = rects[0], view = document.documentElement;
  let clipped = false;
  for (let a = element.parentElement; a && a !== document.body && a !== view; a = a.parentElement) {
    const s = getComputedStyle(a);
    if (s.overflowX === "visible" && s.overflowY === "visible") continue;
    const c = a.getBoundingClientRect(), left = c.left + a.clientLeft, top = c.top + a.clientTop;
    clipped ||= r.left < left || r.top < top || r.right > left + a.clientWidth || r.bottom > top + a.clientHeight;
  }
  const inViewport = r.left >= 0 && r.top >= 0 && r.right <= view.clientWidth && r.bottom <= view.clientHeight;
  if (!scrolled && (clipped || !inViewport)) return "scroll";
  // Playwright's point: the centre of the box's part inside the viewport (the whole box, for one in view), which
  // the hit check below refuses where a scroller still hides it.
  const left = Math.max(r.left, 0), right = Math.min(r.right, innerWidth);
  const top = Math.max(r.top, 0), bottom = Math.min(r.bottom, innerHeight);
  if ((right - left) * (bottom - top) <= 0.99) return null;
  const nudge = (v) => { const f = v - Math.floor(v); return f > 0.49 && f < 0.51 ? v - 0.02 : v; };
  const x = ((nudge((left + right) / 2) * 100) | 0) / 100, y = ((nudge((top + bottom) / 2) * 100) | 0) / 100;
  const target = editable ? element : element.closest("button, [role=button], a, [role=link]") || element;
  const hits = (px, py) => {
    const hit = document.elementFromPoint(px, py);
    return hit !== null && target.contains(hit);
  };
  if (!hits(x, y)) return null;
  if (window.__pointerActionVerdict) window.__pointerActionVerdict();  // an action whose verdict was never read
  let verdict;
  const listener = (event) => {
    if (!events.includes(event.type) || !event.isTrusted) return;
    if (verdict === undefined) verdict = hits(event.clientX, event.clientY);
    if (!verdict) { event.preventDefault(); event.stopPropagation(); event.stopImmediatePropagation(); }
  };
  for (const type of events) window.addEventListener(type, listener, { capture: true, passive: false });
  window.__pointerActionVerdict = () => {
    for (const type of events) window.removeEventListener(type, listener, { capture: true });
    return verdict;  // undefined where no event of the action reached the listener
  };
  return [x, y];
}
