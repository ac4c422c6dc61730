"""A new episode in the page a MiniWoB task already loaded, as MiniWoB's own instances start one, in place of a fresh
load: which tasks never restart and why (LOADED_AFRESH), the script installed in every page that puts back at a
restart what the task's generator does not rebuild (EPISODE_TRACKER), and the restart itself, which says why the page
must be loaded afresh where it cannot give what a fresh load of the same seed gives. tests/test_in_page_restart.py and
bench/restarts.py compare restarts with fresh loads over every task, on young and on aged pages
(docs/environment.md)."""

from playwright.sync_api import Error as PlaywrightError

from web_env.server.scripts import page_script

RELOAD_EVERY = 100  # episodes restarted in one page before it is loaded afresh
# Tasks whose episodes are always loaded afresh, because a restart in the page gave another episode than a fresh load
# of the same seed (bench/restarts.py, docs/environment.md), each with its reason. Every other task restarts in the
# page (tests/test_in_page_restart.py asserts both), unless its last episode left something on screen outside the
# task's area (a widget left open: see EPISODE_TRACKER) or the page crashed or left the task's URL.
LABELLED_CONTROLS = (
    "Chromium leaves a label's text out of the accessibility tree when the task writes a label holding a control "
    "into a page it has laid out before"
)
LOADED_AFRESH = {
    **dict.fromkeys(
        [
            "click-checkboxes",
            "click-checkboxes-large",
            "click-checkboxes-soft",
            "click-checkboxes-transfer",
            "click-option",
            "click-widget",
        ],
        LABELLED_CONTROLS,
    ),
    **{
        task: (
            f"its generator makes jQuery UI's {widget} once and keeps it: a restart takes off the handlers the widget "
            "bound in its first episode, which the next episode's generator does not bind again"
        )
        for widget, tasks in {
            "autocomplete": ["book-flight", "book-flight-nodelay", "use-autocomplete", "use-autocomplete-nodelay"],
            "sortable": ["drag-items", "drag-items-grid", "drag-sort-numbers"],
            "slider": ["form-sequence", "use-slider", "use-slider-2"],
        }.items()
        for task in tasks
    },
    "stock-market": "the page changes by itself: the price is redrawn every 100 ms",
    "form-sequence-3": (
        "its dropdown (jquery.selectric) keeps whether its list is open in the plugin's object on the select, which "
        "outlives the episode and shows nowhere on the page: an episode that left the list open makes the next one's "
        "first focus or click close it instead of opening it"
    ),
    "social-media": (
        "a click on an action icon (reply, retweet, like) ends a restarted episode, but not the episode of a fresh "
        "load, where the icon's jQuery handler does not run on a real click (it does when triggered); cause not found"
    ),
}


# Installed in every page before the page's own scripts: puts back at each restart what MiniWoB's episode generator
# does not rebuild, and says when a restart cannot give the page a fresh load would (the file says how).
EPISODE_TRACKER = page_script("episode_tracker.js")

# A new episode in the page the task has loaded, as MiniWoB's own instances start one: [ready, goal], or why the page
# must be loaded afresh.
RESTART = page_script("restart.js")


def restarted(
    context, page, held_task, task, episodes_in_page: int, reload_every: int
) -> tuple[str | None, str | None]:
    """(the goal of `task`'s episode restarted in `page`, which holds `held_task` and has run `episodes_in_page`
    episodes, None), or (None, why it must be loaded afresh)."""
    if held_task is None or page is None or page.is_closed():
        return None, "the session has no page yet"
    if type(held_task) is not type(task):
        return None, "the page holds another task"
    if task.subdomain in LOADED_AFRESH:
        return None, f"listed in LOADED_AFRESH: {LOADED_AFRESH[task.subdomain]}"
    if episodes_in_page >= reload_every:
        return None, f"the page has run {episodes_in_page} episodes (--reload_every {reload_every})"
    if page.url != task.url:
        return None, f"the page left the task's URL for {page.url}"
    try:
        context.clear_cookies()
        # The pointer off the page, so that nothing is hovered, as in a newly loaded document until the pointer
        # moves: left over the last episode's element, it would hover what the restart builds there (jQuery UI's
        # menu opens the submenu under it).
        page.mouse.move(-1, -1)
        started = page.evaluate(RESTART, [task.random.randint(0, 1000000), task.episode_max_time])
        if isinstance(started, str):
            return None, started
        ready, goal = started
        if not ready:
            page.wait_for_function("() => WOB_TASK_READY")
            goal = page.evaluate("() => core.getUtterance()")
    except PlaywrightError as error:  # the page crashed: a fresh load replaces it
        return None, f"the restart failed: {str(error).splitlines()[0]}"
    task.page = page
    return (goal["utterance"] if isinstance(goal, dict) else goal), None
