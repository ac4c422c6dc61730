"""BrowserGym's actions run on a page, the common ones in a few round trips where Playwright takes about a dozen, with
the same outcome.

BrowserGym runs `click('12')` as Playwright's `get_by_test_id('12').count()` and `.click(timeout=500)`. The click
goes from Python to Playwright's Node driver, which asks Chromium in turn: find the element, wait until it is visible,
enabled and stable over two animation frames, scroll it into view, measure its box and the viewport, check the element
is what the pointer would hit at the box's centre, set up a listener that checks that again as the events land,
move, press and release the mouse, read back the listener's verdict and release the handles: each a round trip of a
few milliseconds of CPU across the three processes (bench/action_profile.py counts them for every action type).

For click, dblclick and hover on an element of the main frame, and fill of a text input, one call in the page
(ELEMENT_CHECK) does Playwright's checks and returns the point, and Playwright's page-level mouse or keyboard puts the
input in: trusted events, the same pipelined move, press and release (or inserted text) the element's own path
sends, and the mouse's position kept where Playwright keeps it. The check asks more than Playwright does, never less:
wherever Playwright would have waited, retried, scrolled or refused (not exactly one element, not visible, possibly
disabled or read-only, moving, not wholly in view, covered at its centre, a box in several pieces, an input typed
some other way), or the action is another one or has options, BrowserGym's own code runs, so waits, timeouts and
error texts stay BrowserGym's. tests/test_page_actions.py plays each refusal of each action type on both paths.
"""

from browsergym.core.action.base import execute_python_code
from browsergym.core.action.parsers import highlevel_action_parser

from actions import action_code

# The page's answer: for a pointer action, the point at which Playwright would act on the element; for a fill, true,
# with the element's text selected and the element focused, as Playwright's fill leaves it before it types; or null
# where the check cannot vouch for the same outcome. As Playwright's checks (its injected script's retarget,
# checkElementStates, _clickablePoint, expectHitTarget and fill): visible is the element's own style and box; enabled
# is refused at any disabled or aria-disabled attribute on the element, the control it stands for (a label's) or their
# ancestors; stable is the same box in two consecutive animation frames; the point is the centre of the element's one
# box, nudged off half pixels and cut to hundredths; the element (or the button or link it is in) must be what the
# page hits there; in view means no scrolling at all: the box lies inside the viewport and every clipping ancestor,
# where DOM.scrollIntoViewIfNeeded moves nothing. Like Playwright, it leaves a listener that checks the hit again when
# the first of the action's events lands and, if the page changed in between, stops every event of the action
# (HIT_VERDICT reads it). A fill takes a text input or text area that is neither disabled nor read-only; Playwright
# checks no stability and no hit for it.
ELEMENT_CHECK = """async ([bid, action, events]) => {
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
  // inline box around other boxes (a label around its checkbox gives one quad each) and no SVG shape.
  if (element instanceof SVGElement || (style.display === "inline" && element.children.length)) return null;
  const rects = element.getClientRects();
  if (rects.length !== 1 || rects[0].width * rects[0].height <= 0.99) return null;
  const r = rects[0], view = document.documentElement;
  if (r.left < 0 || r.top < 0 || r.right > view.clientWidth || r.bottom > view.clientHeight) return null;
  for (let a = element.parentElement; a && a !== document.body && a !== view; a = a.parentElement) {
    const s = getComputedStyle(a);
    if (s.overflowX === "visible" && s.overflowY === "visible") continue;
    const c = a.getBoundingClientRect(), left = c.left + a.clientLeft, top = c.top + a.clientTop;
    if (r.left < left || r.top < top || r.right > left + a.clientWidth || r.bottom > top + a.clientHeight) return null;
  }
  const nudge = (v) => { const f = v - Math.floor(v); return f > 0.49 && f < 0.51 ? v - 0.02 : v; };
  const x = ((nudge((r.left + r.right) / 2) * 100) | 0) / 100, y = ((nudge((r.top + r.bottom) / 2) * 100) | 0) / 100;
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
    return verdict !== false;
  };
  return [x, y];
}"""
HIT_VERDICT = """() => {
  const verdict = window.__pointerActionVerdict;
  delete window.__pointerActionVerdict;
  return verdict ? verdict() : true;  // gone with the document the action left
}"""

# The pointer actions the check serves: the events whose first landing is checked (Playwright's
# kMouseHitTargetInterceptorEvents and kHoverHitTargetInterceptorEvents), the input, and the locator call
# BrowserGym's function makes (browsergym.core.action.functions), for Playwright's retry.
MOUSE_EVENTS = ["mousedown", "mouseup", "pointerdown", "pointerup", "click", "auxclick", "dblclick", "contextmenu"]
POINTER_ACTIONS = {
    "click": (
        MOUSE_EVENTS,
        lambda mouse, x, y: mouse.click(x, y),
        lambda element: element.click(button="left", modifiers=[], force=False, timeout=500),
    ),
    "dblclick": (
        MOUSE_EVENTS,
        lambda mouse, x, y: mouse.dblclick(x, y),
        lambda element: element.dblclick(button="left", modifiers=[], force=False, timeout=500),
    ),
    "hover": (
        ["mousemove"],
        lambda mouse, x, y: mouse.move(x, y),
        lambda element: element.hover(force=False, timeout=500),
    ),
}


def run_action(page, action_str: str, short_path: bool = True) -> None:
    """Run one action of the allowlist on `page` as BrowserGym does (`short_path=False`: always with BrowserGym's own
    code); raises what BrowserGym raises, and ValueError for an action the allowlist refuses (actions.action_code)."""
    code = action_code(action_str)
    if not (short_path and acted_in_few_round_trips(page, action_str)):
        execute_python_code(code, page, send_message_to_user=None, report_infeasible_instructions=None)


def acted_in_few_round_trips(page, action_str: str) -> bool:
    """Whether the action was one the check serves and vouched for, and is done; False, with nothing done (or the
    action's events stopped, as Playwright stops them), for BrowserGym's code to run."""
    ((name, args),) = highlevel_action_parser.parse_string(action_str).as_list()
    # Only the plain call on an element of the main frame; options, or a frame's element, go BrowserGym's way.
    if not args or not all(type(arg) is str for arg in args) or not args[0].isdigit():
        return False
    if name in POINTER_ACTIONS and len(args) == 1:
        return pointed(page, name, args[0])
    if name == "fill" and len(args) == 2:
        return filled(page, *args)
    return False


def pointed(page, name: str, bid: str) -> bool:
    events, pointer_input, locator_action = POINTER_ACTIONS[name]
    point = page.evaluate(ELEMENT_CHECK, [bid, name, events])
    if point is None:
        return False
    pointer_input(page.mouse, *point)
    if not page.evaluate(HIT_VERDICT):  # the page changed under the pointer: Playwright retries, as here
        locator_action(page.get_by_test_id(bid))
    return True


def filled(page, bid: str, value: str) -> bool:
    """Playwright's fill of a text input or area: the check selects its text and focuses it, and the value replaces
    the selection as inserted text (Input.insertText), or a Delete key empties it."""
    if not page.evaluate(ELEMENT_CHECK, [bid, "fill", []]):
        return False
    if value:
        page.keyboard.insert_text(value)
    else:
        page.keyboard.press("Delete")
    return True
