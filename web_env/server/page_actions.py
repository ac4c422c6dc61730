"""BrowserGym's actions run on a page, the common ones in a few round trips where Playwright takes about a dozen, with
the same outcome.

Click, dblclick, hover and fill of a plain element, a focus, and a select_option of one option are one call in the page
(ELEMENT_CHECK, FOCUS, scripts/select_option.js) that does Playwright's checks, then trusted input by Playwright's
page-level mouse or keyboard. The checks ask more than Playwright does, never less: wherever Playwright would have
waited, retried or refused, BrowserGym's own code runs, so waits, timeouts and error texts stay BrowserGym's
(tests/test_page_actions.py plays each refusal of each action type on both paths). On a page that may navigate, a
checked pointer action waits for the navigation it starts; a page where Playwright left a hit-target check behind is
marked (MARK_HIT_CHECK_LEFT). Why each of these, and what each saves: docs/environment.md, "The short path".
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
