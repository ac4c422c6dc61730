"""Reading a session's page: its DOM and accessibility tree as BrowserGym reads them for an observation, and for a
traced episode the page's pixels and where an action's element was."""

from browsergym.core.action.utils import get_elem_by_bid
from browsergym.core.observation import (
    MarkingError,
    _post_extract,
    _pre_extract,
    extract_dom_snapshot,
    extract_merged_axtree,
)
from playwright.sync_api import Error as PlaywrightError

from web_env.actions import acted_on, action_code

MAX_NAVIGATIONS_PER_READ = 5  # documents an observation waits through (a redirect is two) before it gives up
# A traced episode's pages, as JPEG: a MiniWoB page is some 4.5 KB at this quality (bench/trace_cost.py), legible.
TRACE_JPEG_QUALITY = 80


def dom_and_axtree(page, read, dom: bool, axtree: bool):
    """The page's DOM snapshot and merged accessibility tree (each None where not asked for), read through `read`, the
    page's one DevTools session (browsers.OneDevToolsSession).

    As BrowserGym does: mark every element with its bid (which the actions find elements by), read the DOM and the
    accessibility tree, unmark; a page still changing under the marking gets one lenient second try, and a page that
    navigated meanwhile (a task module's app) is read again once its new document is loaded."""
    lenient, navigations = False, 0
    while True:
        try:
            _pre_extract(page, tags_to_mark="standard_html", lenient=lenient)
            snapshot = extract_dom_snapshot(read) if dom else None
            tree = extract_merged_axtree(read) if axtree else None
            break
        except (PlaywrightError, MarkingError) as error:
            if "Execution context was destroyed" in str(error) and navigations < MAX_NAVIGATIONS_PER_READ:
                navigations += 1
                page.wait_for_load_state("domcontentloaded")
                continue
            _post_extract(page)
            if lenient:
                raise
            lenient = True
    _post_extract(page)
    return snapshot, tree


def page_image(read) -> str:
    """The page's viewport as a base64 JPEG, as Chromium encodes it (no pixels pass through Python)."""
    return read.send("Page.captureScreenshot", {"format": "jpeg", "quality": TRACE_JPEG_QUALITY})["data"]


def element_box(page, action_str: str) -> list[float] | None:
    """[x, y, width, height] of the element an action is about to act on, for the trace; None for an action that is
    not allowed (refused unparsed: it is the model's), on no element, or on no element of the page."""
    try:
        action_code(action_str)
        bid = acted_on(action_str)
        element = get_elem_by_bid(page, bid) if bid is not None else None
        box = element.bounding_box() if element is not None and element.count() == 1 else None
    except (ValueError, PlaywrightError):
        return None
    return None if box is None else [box["x"], box["y"], box["width"], box["height"]]
