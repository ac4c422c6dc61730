"""Episodes restarted in the page against fresh loads of the same seed, in this process: sessions of the server's
environment on browsers of their own, pages left in each state an episode can end in, pages aged by disruptive
actions, and episodes played with fixed actions and compared, page state included. tests/test_in_page_restart.py
checks the restart with it on a few tasks; `python bench/restarts.py` runs it over every task. It reads the page
through the session's own worker and page (`_worker`, `_page`, `_observation`), as the server's tests do."""

import contextlib
import itertools
import random
import re
from collections import Counter

from in_process_sessions import new_session
from warm_start.plans import PLANS, plan
from web_env.models import BrowserGymAction
from web_env.server.browsers import BrowserPool
from web_env.server.environment import TASK_CLASSES, BrowserTaskEnvironment

FIELDS = ["goal", "axtree_txt", "error"]
RESTARTED = "restarted in the page"
# The states the episode before a compared restart is left in.
BEFORE = ("untouched", "half done", "timed out", "played out", "roughed up")
ACTIONABLE = "button|link|checkbox|radio|textbox|searchbox|spinbutton|combobox|tab|menuitem|option|slider|treeitem"
# Pages that change by themselves, so that two loads of one seed differ too: only their goals are compared.
# BrowserGym marks four such tasks; stock-market redraws its price every 100 ms.
TIME_DEPENDENT = {"stock-market", *(task for task, cls in TASK_CLASSES.items() if cls.nondeterministic)}
# The page as the policy cannot see it in the tree, but a later episode could feel: where the page is, whether the
# document has the focus and which element does, the scroll offset of every box that shows something, and every form
# control's state. A box of no size shows nothing at any offset: a widget hides its original select in one
# (form-sequence-3's dropdown), and BrowserGym's refused click of that select leaves the box scrolled as far as
# Playwright's retries, each scrolling the select into view another way, got before the 500 ms deadline, which the
# machine's load decides.
PAGE_STATE = """() => ({
  url: location.href,
  focused: document.hasFocus(),
  active: document.activeElement && [document.activeElement.tagName, document.activeElement.id],
  scrolled: [...document.querySelectorAll("*")]
    .filter((e) => (e.scrollTop || e.scrollLeft) && e.clientWidth && e.clientHeight)
    .map((e) => [e.tagName, e.id, e.scrollTop, e.scrollLeft]).concat([["window", scrollX, scrollY]]),
  controls: [...document.querySelectorAll("input, select, textarea")]
    .map((e) => [e.tagName, e.type, e.id, e.value, e.checked, e.selectedIndex]),
})"""
# What a page does on a wall-clock timer after an action, on or off: jQuery's animations (off, as the -nodelay tasks
# run theirs), and jQuery UI's menu opening a hovered item's submenu 300 ms later (off: an own delay on the menu's
# instance longer than any episode; deleted, the prototype's 300 ms again).
TIMED_EFFECTS = """(on) => {
  if (!window.jQuery) return;
  jQuery.fx.off = !on;
  if (!jQuery.ui || !jQuery.ui.menu) return;
  jQuery(":ui-menu").each(function () {
    const menu = jQuery(this).menu("instance");
    if (on) delete menu.delay;
    else menu.delay = 2 ** 31 - 1;
  });
}"""
KEYS = [
    "Tab",
    "Shift+Tab",
    "Enter",
    "Escape",
    "Space",
    "ArrowDown",
    "ArrowUp",
    "ArrowRight",
    "PageDown",
    "End",
    "Home",
    "Backspace",
    "Control+a",
    "a",
    "7",
]


def elements(page: str) -> list[tuple[str, str, str]]:
    """(bid, role, name) of the tree's elements, in page order."""
    return re.findall(r"\[(\w+)\] (\w+)(?: '([^'\n]*)')?", page)


def fixed_actions(task: str, goal: str, page: str, right: bool) -> list[str]:
    """The scripted plan's actions (right, or with a wrong first one); else a focus of each of the page's first three
    controls (what a focus sets off shows state a widget keeps in itself: a list that opens, or does not), then a
    fill or click of the first two; else a click of its first element (an image, a heading, a drawing); else a noop
    that does not wait (noop() waits a second)."""
    if task in PLANS:
        steps = plan(task, goal, page)
        return steps.right if right else [steps.wrong[0], *steps.right[1:]]
    found = [(bid, role) for bid, role, _ in elements(page)]
    controls = [(bid, role) for bid, role in found if re.fullmatch(ACTIONABLE, role)]
    fills = ("textbox", "searchbox", "spinbutton")
    focus = [f"focus('{bid}')" for bid, _ in controls[:3]]
    chosen = controls[:2] or found[:1]
    acted = [f"fill('{bid}', 'hello')" if role in fills else f"click('{bid}')" for bid, role in chosen]
    return focus + acted or ["noop(0)"]


def disruptive_actions(rng: random.Random):
    """An endless run of allowed actions, each kind in turn (and each key in turn), each on random elements of the
    page it is sent the tree of: `action = actions.send(page)`."""
    page = yield
    for n in itertools.count():
        bids = [bid for bid, _, _ in elements(page)] or ["1"]
        bid, other = rng.choice(bids), rng.choice(bids)
        options = [name for _, role, name in elements(page) if role == "option" and name] or ["x"]
        kinds = [
            f"press('{bid}', '{KEYS[n // 10 % len(KEYS)]}')",
            f"scroll({rng.choice([0, 50])}, {rng.choice([-200, 150, 400])})",
            f"dblclick('{bid}')",
            f"drag_and_drop('{bid}', '{other}')",
            f"hover('{bid}')",
            f"select_option('{bid}', {rng.choice(options)!r})",
            f"fill('{bid}', '{'long text ' * rng.randint(5, 30)}')",
            f"click('{bid}')",
            f"focus('{bid}')",
            f"clear('{bid}')",
        ]
        page = yield kinds[n % len(kinds)]


def step(session: BrowserTaskEnvironment, action: str):
    return session.step(BrowserGymAction(action_str=action))


def age(session: BrowserTaskEnvironment, task: str, episodes: int, actions: int) -> Counter:
    """Plays `episodes` episodes of random disruptive actions in the session's page: how many resets restarted in
    the page, and for the others why they loaded it afresh."""
    disruptive = disruptive_actions(random.Random(task))
    next(disruptive)
    outcomes = Counter()
    for seed in range(episodes):
        observation = session.reset(task_name=task, seed=seed, fields=FIELDS)
        outcomes[observation.metadata.get("loaded_because", RESTARTED)] += 1
        for _ in range(actions):
            observation = step(session, disruptive.send(observation.axtree_txt))
            if observation.done:
                break
    return outcomes


def leave(session: BrowserTaskEnvironment, task: str, seed: int, state: str, last_slowed: float = 1) -> None:
    """An episode of `task` left in `state`: untouched, half done (one action), timed out (MiniWoB's own end of a
    timed-out episode), played out, or roughed up (a scroll, a long fill of the first text box, and a Tab from the
    first element, which leaves the document without the focus where nothing after it takes one); its last action
    with the renderer `last_slowed` times slower."""
    observation = session.reset(task_name=task, seed=seed, fields=FIELDS)
    actions = fixed_actions(task, observation.goal, observation.axtree_txt, right=False)
    if state == "timed out":
        session._worker.call(session._page.evaluate, "core.endEpisode(-1, false, 'timed out')")
    if state == "roughed up":
        page = elements(observation.axtree_txt)
        first = page[0][0] if page else "1"
        box = next((bid for bid, role, _ in page if role == "textbox"), first)
        actions = ["scroll(0, 400)", f"fill('{box}', '{'long text ' * 20}')", f"press('{first}', 'Tab')"]
    played = actions[: {"half done": 1, "timed out": 0, "untouched": 0}.get(state, len(actions))]
    for n, action in enumerate(played, 1):
        with renderer_slowed(session, last_slowed if n == len(played) else 1):
            step(session, action)


@contextlib.contextmanager
def renderer_slowed(session: BrowserTaskEnvironment, rate: float):
    """The session's renderer `rate` times slower (DevTools' CPU throttling) for the length of a `with` block, as a
    busy machine slows it."""
    if rate == 1:
        yield
        return
    devtools = session._worker.call(lambda: session._page.context.new_cdp_session(session._page))
    session._worker.call(devtools.send, "Emulation.setCPUThrottlingRate", {"rate": rate})
    try:
        yield
    finally:
        session._worker.call(devtools.send, "Emulation.setCPUThrottlingRate", {"rate": 1})


def page_state(session: BrowserTaskEnvironment) -> dict:
    return session._worker.call(session._page.evaluate, PAGE_STATE)


def play(session: BrowserTaskEnvironment, task: str, seed: int, right: bool) -> tuple[dict, list]:
    """The reset's metadata (restarted_in_page, loaded_because), and the episode: goal, tree and page state, then
    each action's outcome and the page state after it.

    The episode runs with the page's timed effects off (TIMED_EFFECTS): an action or an observation taken while an
    accordion or a dialog is still moving sees how far it got, and one taken after a click on a menu item shows the
    submenu the click's hover opens 300 ms later or not, as the machine's load decides, not the restart. Every other
    episode (aging, and the one before a compared restart) keeps them on."""
    observation = session.reset(task_name=task, seed=seed, fields=FIELDS)
    timed_effects(session, on=False)
    try:
        trace = [(observation.goal, observation.axtree_txt, page_state(session))]
        for action in fixed_actions(task, observation.goal, observation.axtree_txt, right):
            result = step(session, action)
            # An error's first line says what failed; Playwright's call log after it says how far its retries got in
            # the time they had, which the machine's load decides, not the page.
            error = result.error.split("\n", 1)[0]
            trace.append((result.reward, result.done, error, result.axtree_txt, page_state(session)))
            if result.done:
                break
    finally:
        timed_effects(session, on=True)
    return observation.metadata, trace


def timed_effects(session: BrowserTaskEnvironment, on: bool) -> None:
    session._worker.call(session._page.evaluate, TIMED_EFFECTS, on)


def first_difference(episode: list, reference: list) -> str:
    """Where two traces part: the turn, and the first differing line of the tree or key of the page state."""
    for turn, (ours, theirs) in enumerate(zip(episode, reference)):
        for a, b in zip(ours, theirs):
            if a == b:
                continue
            if isinstance(a, dict):
                key = next(k for k in a if a[k] != b.get(k))
                return f"turn {turn}, page {key}: {str(a[key])[:200]} against {str(b[key])[:200]}"
            if isinstance(a, str):
                lines = [(x, y) for x, y in zip(a.splitlines() + [""], b.splitlines() + [""]) if x != y]
                return f"turn {turn}: {lines[0][0].strip()[:150]!r} against {lines[0][1].strip()[:150]!r}"
            return f"turn {turn}: {a!r} against {b!r}"
    return f"{len(episode)} turns against {len(reference)}"


def play_compared(session: BrowserTaskEnvironment, task: str, seed: int, right: bool) -> tuple[dict, list]:
    """`play`, with the episode cut to what a comparison can hold equal: for a page that changes by itself
    (TIME_DEPENDENT), its goal alone."""
    metadata, trace = play(session, task, seed, right)
    return metadata, [trace[0][0]] if task in TIME_DEPENDENT else trace


def restarted_and_loaded(
    restarting: BrowserTaskEnvironment, loading: BrowserTaskEnvironment, task: str, seed: int, before: str, right: bool
) -> tuple[dict, list, list]:
    """Leaves an episode of `task` in state `before` in the restarting session, then plays `seed` there and in the
    loading session: the restarting reset's metadata, and the two episodes."""
    leave(restarting, task, seed + 1000, before)
    metadata, episode = play_compared(restarting, task, seed, right)
    return metadata, episode, play_compared(loading, task, seed, right)[1]


def compare(aged: BrowserTaskEnvironment, fresh: BrowserTaskEnvironment, task: str, seeds: int) -> dict:
    """Each compared restart that differs from a fresh load while a second fresh load agrees with the first, as
    `state seed (restarted or loaded): where`; the comparisons whose two fresh loads differ (the page's timing, not
    the restart: the comparison shows nothing there); and how many compared resets restarted in the page."""
    differences, timing, restarted = [], [], 0
    for n, seed in enumerate(range(11, 11 + seeds)):
        for before in BEFORE:
            metadata, episode, reference = restarted_and_loaded(aged, fresh, task, seed, before, right=n % 2 == 0)
            restarted += metadata["restarted_in_page"]
            if episode != reference:
                how = "restarted" if metadata["restarted_in_page"] else "loaded"
                again = play_compared(fresh, task, seed, right=n % 2 == 0)[1]
                found = differences if again == reference else timing
                found.append(f"{before} {seed} ({how}): {first_difference(episode, reference)}")
    return {"compared_restarts": restarted, "differences": differences, "fresh_loads_differ": timing}


def aging(pool: BrowserPool, task: str, episodes: int, actions: int, seeds: int) -> dict:
    """A new page of `task` aged by `episodes` episodes, then compared with fresh loads: the aging resets' outcomes
    (restarted, or why loaded afresh), and `compare`'s."""
    with new_session(pool, reload_every=10**9) as aged, new_session(pool, reload_every=1) as fresh:
        outcomes = age(aged, task, episodes, actions)
        return {"aging_resets": dict(outcomes)} | compare(aged, fresh, task, seeds)


def settling(session: BrowserTaskEnvironment, task: str, timed_effects_on: bool) -> list[str]:
    """Where seed 11's compared episode of `task` changed in the second after the reset or an action: "reset" or the
    action, with the first difference between what was observed and what the page showed a second later."""

    def a_second_later():
        session._worker.call(session._page.evaluate, "() => new Promise(done => setTimeout(done, 1000))")
        return session._worker.call(session._observation, "", 0.0, False, 0.0).axtree_txt, page_state(session)

    observation = session.reset(task_name=task, seed=11, fields=FIELDS)
    timed_effects(session, on=timed_effects_on)
    try:
        changed = []
        for action in ["reset", *fixed_actions(task, observation.goal, observation.axtree_txt, right=True)]:
            result = observation if action == "reset" else step(session, action)
            observed = (result.axtree_txt, page_state(session))
            later = a_second_later()
            if later != observed:
                changed.append(f"{action}: {first_difference([observed], [later])}")
            if result.done:
                break
        return changed
    finally:
        timed_effects(session, on=True)
