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
sends, and the mouse's position kept where Playwright keeps it. An element not wholly in view is first scrolled by
Playwright's own call, as its pointer actions do before they measure (scrolled_into_view). The check asks more than
Playwright does, never less: wherever Playwright would have waited, retried or refused (not exactly one element, not
visible, possibly disabled or read-only, moving, still cut by a scroller after the scroll, covered at its centre, a box
in several pieces, an input typed some other way), or the action is another one or has options, BrowserGym's own code
runs, so waits, timeouts and error texts stay BrowserGym's. tests/test_page_actions.py plays each refusal of each
action type on both paths.

On a page that may navigate (a task module's app posts forms, follows links), the checked click, double click or
hover is put in by Playwright's element call forced past the checks, which waits for a navigation the input starts as
BrowserGym's call does, with no deadline: the wait is for the task's own app to answer, which a busy machine stretches
past any fixed time (a CI run's bill payment went past the task's 5 s, its click done and its answer on the way), and an
app that never answers is a hung server, which the client finds by its `env_timeout_s`.

Playwright (1.44) can leave the hit-target check of a pointer action it gave up on in the page: a timeout after the
check was set up disposes the check's handle before the call that would take the check off is made, and the check stays
in Playwright's own script world (out of the page's reach, and of a restart's), stopping every later click whose first
event lands off the element it was set up for, until Playwright's next pointer action replaces it. BrowserGym's code
acts through Playwright's element calls alone, so a left check never meets it; the short path's input did (a click of
an accordion's header, after a timed-out click on one still moving, did nothing on a busy machine). So once a pointer
action by Playwright's element calls has failed in a page, the page is marked (MARK_HIT_CHECK_LEFT), and there a short
path's input of which no event reached the check's listener (the left check listens before it) is followed by
Playwright's element call, as a missed hit is: it replaces the left check and acts.

A focus of one element is one call in the page too (FOCUS): Playwright checks nothing before a focus, so BrowserGym's
500 ms covered only the page's own focus handlers, which a busy machine made pass with the element focused
(scripts/focus.js). So is a select_option of one option by its value or label (scripts/select_option.js): a busy
machine ran BrowserGym's call out of its 500 ms before the select was looked at.
"""

import contextlib

from browsergym.core.action.base import execute_python_code
from browsergym.core.action.parsers import highlevel_action_parser
from browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE
from playwright.sync_api import Error as PlaywrightError

from web_env.actions import action_code
from web_env.server.scripts import page_script

# Playwright's checks of an element in one call in the page: the point to act at, true for a fill made ready, or null
# where BrowserGym's code must run (the file says which checks, and where each comes from).
ELEMENT_CHECK = page_script("element_check.js")
HIT_VERDICT = page_script("hit_verdict.js")
FOCUS = page_script("focus.js")
SELECT_OPTION = page_script("select_option.js")
# The actions whose BrowserGym code puts input in through Playwright's element calls, each with a hit-target check.
CHECKED_POINTER_ACTIONS = {"click", "dblclick", "hover", "drag_and_drop"}
MARK_HIT_CHECK_LEFT = "() => { window.__hitCheckLeftByPlaywright = true; }"

# BrowserGym's deadline for each of its waits for an element (browsergym.core.action.functions), which Playwright's
# retry of a missed hit below keeps.
BROWSERGYM_TIMEOUT_MS = 500
# The pointer actions the check serves: the events whose first landing is checked (Playwright's
# kMouseHitTargetInterceptorEvents and kHoverHitTargetInterceptorEvents), the input, and the locator call
# BrowserGym's function makes (browsergym.core.action.functions), for Playwright's retry.
MOUSE_EVENTS = ["mousedown", "mouseup", "pointerdown", "pointerup", "click", "auxclick", "dblclick", "contextmenu"]
POINTER_ACTIONS = {
    "click": (
        MOUSE_EVENTS,
        lambda mouse, x, y: mouse.click(x, y),
        lambda element: element.click(button="left", modifiers=[], force=False, timeout=BROWSERGYM_TIMEOUT_MS),
    ),
    "dblclick": (
        MOUSE_EVENTS,
        lambda mouse, x, y: mouse.dblclick(x, y),
        lambda element: element.dblclick(button="left", modifiers=[], force=False, timeout=BROWSERGYM_TIMEOUT_MS),
    ),
    "hover": (
        ["mousemove"],
        lambda mouse, x, y: mouse.move(x, y),
        lambda element: element.hover(force=False, timeout=BROWSERGYM_TIMEOUT_MS),
    ),
}


def run_action(page, action_str: str, short_path: bool = True, may_navigate: bool = False) -> None:
    """Run one action of the allowlist on `page` as BrowserGym does (`short_path=False`: always with BrowserGym's own
    code; `may_navigate`: the page's app may navigate, and a pointer action waits for what it starts); raises what
    BrowserGym raises, and ValueError for an action the allowlist refuses (actions.action_code)."""
    code = action_code(action_str)
    ((name, args),) = highlevel_action_parser.parse_string(action_str).as_list()
    try:
        if not (short_path and acted_in_few_round_trips(page, name, args, may_navigate)):
            execute_python_code(code, page, send_message_to_user=None, report_infeasible_instructions=None)
    except PlaywrightError:  # not BrowserGym's ValueError for a missing element: Playwright was never called
        if name in CHECKED_POINTER_ACTIONS:
            mark_hit_check_left(page)
        raise


def mark_hit_check_left(page) -> None:
    """Marks the page as one where Playwright may have left a pointer action's hit-target check (the module's
    docstring); a page that no longer answers needs no mark, and its own error is the one to report."""
    with contextlib.suppress(PlaywrightError):
        page.evaluate(MARK_HIT_CHECK_LEFT)


def acted_in_few_round_trips(page, name: str, args: list, may_navigate: bool = False) -> bool:
    """Whether the action was one the check serves and vouched for, and is done; False, with nothing done (or the
    action's events stopped, as Playwright stops them), for BrowserGym's code to run."""
    # Only the plain call on an element of the main frame; options, or a frame's element, go BrowserGym's way.
    if not args or not all(type(arg) is str for arg in args) or not args[0].isdigit():
        return False
    if name in POINTER_ACTIONS and len(args) == 1:
        return pointed(page, name, args[0], may_navigate)
    if name == "fill" and len(args) == 2:
        return filled(page, *args)
    if name == "focus" and len(args) == 1:
        return page.evaluate(FOCUS, args[0])
    if name == "select_option" and len(args) == 2:
        return page.evaluate(SELECT_OPTION, args)
    return False


def pointed(page, name: str, bid: str, may_navigate: bool) -> bool:
    events, pointer_input, locator_action = POINTER_ACTIONS[name]
    point = page.evaluate(ELEMENT_CHECK, [bid, name, events, False])
    if point == "scroll" and scrolled_into_view(page, bid):
        point = page.evaluate(ELEMENT_CHECK, [bid, name, events, True])
    if not isinstance(point, list):
        return False
    if may_navigate:
        # Playwright's element call, forced past the checks just made, puts in the same input and waits, as
        # BrowserGym's call does, for a navigation it starts (a form posted, a link followed), so that the task's
        # validate sees what the app recorded. Without a deadline (the module's docstring): forced, on the element
        # itself rather than a locator that would wait for it to come back, the call waits for nothing but that answer.
        element = page.query_selector(f"[{BROWSERGYM_ID_ATTRIBUTE}='{bid}']")
        if element is None:  # gone since the check: BrowserGym's code says so
            return False
        getattr(element, name)(force=True, timeout=0)
    else:
        pointer_input(page.mouse, *point)
    # The page changed under the pointer, or a check Playwright left stopped the events: Playwright retries, as here.
    if not page.evaluate(HIT_VERDICT):
        locator_action(page.get_by_test_id(bid))
    return True


def scrolled_into_view(page, bid: str) -> bool:
    """Playwright's scroll of an element not wholly in view, the one its pointer actions make before they measure the
    element: DevTools' DOM.scrollIntoViewIfNeeded once the element is stable. Under the task's deadline, not the 500 ms
    that BrowserGym gives the whole action (a dozen round trips for an element out of view), which a busy machine ran
    out of with the click done; False, having failed, for BrowserGym's code to run."""
    try:
        page.get_by_test_id(bid).scroll_into_view_if_needed()
    except PlaywrightError:
        return False
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
