"""The environment behind the server (app.py): BrowserGym's tasks (MiniWoB++'s, and those of your task modules) on a
few long-lived browsers without network, one browser context per session, MiniWoB's episodes restarted in the page the
task already loaded, as an OpenEnv `Environment`.

The task, its goal, the actions, their execution and the observation are BrowserGym's own, and so is the page's score;
the reward sent is 1.0 only for the task solved (web_env.scoring), with BrowserGym's score beside it. What this module
changes is the browsers' lifecycle (see BrowserTaskEnvironment) and what an observation costs. Hosting it (the app,
the token, the process) is app.py's job.
"""

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit
from uuid import uuid4

from browsergym.core.action.utils import get_elem_by_bid
from browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE
from browsergym.core.observation import (
    MarkingError,
    _post_extract,
    _pre_extract,
    extract_dom_snapshot,
    extract_merged_axtree,
    extract_screenshot,
)
from browsergym.miniwob import ALL_MINIWOB_TASKS
from browsergym.miniwob.base import AbstractMiniwobTask
from browsergym.utils.obs import flatten_axtree_to_str, flatten_dom_to_str, prune_html
from openenv.core.env_server.interfaces import Environment
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

from web_env import task_modules
from web_env.actions import acted_on, action_code
from web_env.models import (
    DEFAULT_TASK,
    MAX_SEED,
    MAX_SETTLE_MS,
    BrowserGymAction,
    BrowserGymObservation,
    BrowserGymState,
)
from web_env.scoring import episode_reward
from web_env.server.page_actions import run_action
from web_env.server.scripts import page_script

CLEAR_STORAGE = page_script("clear_storage.js")
# The observation's fields a client can ask for at reset; screenshots come only with `screenshot=True`.
OBSERVATION_FIELDS = ("text", "url", "goal", "axtree_txt", "pruned_html", "error", "last_action_error")
RELOAD_EVERY = 100  # episodes restarted in one page before it is loaded afresh
# Episodes in one browser context before the session gets a new one, and with it a new renderer process: a page that
# lives for many episodes grows its renderer's memory by some kilobytes an episode, which a new document does not
# give back (bench/env_soak.py).
CONTEXT_EPISODES = 200
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

# BrowserGym's MiniWoB task classes by task name (click-test, enter-text, ...).
TASK_CLASSES = {task.get_task_id().removeprefix("miniwob."): task for task in ALL_MINIWOB_TASKS}
MAX_NAVIGATIONS_PER_READ = 5  # documents an observation waits through (a redirect is two) before it gives up
OWN_TASK_LOADS = "a task of a task module: every episode is a fresh load"
# Every request of a page goes through this proxy, which is no proxy (the port of the discard service, closed): a page
# reaches no network, loopback included (<-loopback>). MiniWoB's pages are files; a task module's app is answered
# inside the browser, before any proxy (web_env.task_app), so it is the only origin a task's page reaches.
NO_NETWORK = {"server": "http://127.0.0.1:9", "bypass": "<-loopback>"}
# A traced episode's pages, as JPEG: a MiniWoB page is some 4.5 KB at this quality (bench/trace_cost.py), legible.
TRACE_JPEG_QUALITY = 80


class TaskError(Exception):
    """A task's own code (its setup or validate) raised: an environment failure, never a reward."""


def task_maker(task_name: str):
    """The maker of `task_name`'s instances from a seed: MiniWoB's class, or what a task module registered."""
    return TASK_CLASSES.get(task_name) or task_modules.task_maker(task_name)


def known_task(task_name: str) -> bool:
    return task_name in TASK_CLASSES or task_name in task_modules.own_tasks()


class OneDevToolsSession:
    """A page as BrowserGym's extraction functions see it, except that the DevTools session each of them opens is the
    page's one session, which their `detach()` leaves open: opening and detaching one costs two round trips to the
    browser, and an observation opened three. And the frame tree, which BrowserGym asks for at every observation to
    find the frames whose accessibility trees it reads, is the main frame alone while the page has no other frame
    (Playwright knows its frames without asking): its id, the page's own for the page's life, is asked for once."""

    def __init__(self, page):
        self._page = page
        self._session = page.context.new_cdp_session(page)
        self._main_frame_id = None
        kept = SimpleNamespace(send=self.send, detach=lambda: None)
        self.context = SimpleNamespace(new_cdp_session=lambda page: kept)

    def send(self, method: str, params: dict | None = None) -> dict:
        if method != "Page.getFrameTree" or len(self._page.frames) > 1:
            return self._session.send(method, params)
        if self._main_frame_id is None:
            self._main_frame_id = self._session.send(method, params)["frameTree"]["frame"]["id"]
        return {"frameTree": {"frame": {"id": self._main_frame_id}}}

    def __getattr__(self, name: str):
        return getattr(self._page, name)


@dataclass(eq=False)  # kept pages are told apart by identity
class SessionPage:
    """A session's browser context, its page, and what the page holds: what a closed session leaves for the next."""

    context: Any
    page: Any
    read: OneDevToolsSession
    task: Any
    timeout: float
    episodes_in_page: int
    episodes_in_context: int


class BrowserWorker:
    """A thread that owns one Playwright instance and one Chromium, shared by the sessions assigned to it.

    Playwright's sync objects work only on the thread that created them, so every call on this browser,
    its contexts and their pages runs here; the sessions' own threads wait for the answer.

    The page of a closed session stays open here for the next session's first reset, which then restarts an episode
    in it or loads its task into it instead of making a context and a page (a renderer process): 0.13 s or 0.26 s
    instead of 1.10 on the browser's thread (docs/environment.md). What passes from one session to the next is what
    passes between two episodes of one session: the reset clears cookies and storage, and restarts or loads the page
    with its checks. Pages kept and pages in use together stay within `max_pages`, and a kept page closes after
    `keep_s` (0: kept until taken), as an idle session does.
    """

    def __init__(self, max_pages: int = 0, keep_s: float = 0):
        self.sessions = 0
        self._thread = ThreadPoolExecutor(max_workers=1)
        self._playwright = None
        self._browser = None
        self._max_pages = max_pages
        self._keep_s = keep_s
        self._kept: list[SessionPage] = []  # on this worker's thread only

    def call(self, function, *args):
        return self._thread.submit(function, *args).result()

    def keep(self, page: SessionPage) -> bool:
        """Keeps a closing session's page for the next session while the browser's pages, this one among them, are
        within `max_pages`; on this worker's thread only. (Pages, not sessions: sessions that close at once would
        each count the others as still open.)"""
        if len(self._browser.contexts) > self._max_pages:
            return False
        self._kept.append(page)
        if self._keep_s:
            expiry = threading.Timer(self._keep_s, self._thread.submit, args=(self._close_kept, page))
            expiry.daemon = True
            expiry.start()
        return True

    def take_kept(self, task_class) -> SessionPage | None:
        """A kept page, one holding `task_class`'s task if there is one; on this worker's thread only."""
        if not self._kept:
            return None
        page = next((kept for kept in self._kept if type(kept.task) is task_class), self._kept[0])
        self._kept.remove(page)
        return page

    def _close_kept(self, page: SessionPage) -> None:
        if page in self._kept:
            self._kept.remove(page)
            page.context.close()

    def new_context(self, **options):
        """A new browser context (its own cookies, storage and pages); on this worker's thread only."""
        if self._browser is None or not self._browser.is_connected():
            self._playwright = self._playwright or sync_playwright().start()
            # BrowserGym's actions find elements by their bid through Playwright's test-id selector.
            self._playwright.selectors.set_test_id_attribute(BROWSERGYM_ID_ATTRIBUTE)
            # BrowserGym's own launch options, so that pages render the same. One more: no spare renderer.
            # Chromium keeps one spare renderer process warm for the next page load, but for one context only;
            # with sessions in several contexts it was thrown away and relaunched at nearly every reset
            # (113 renderer processes for 96 episodes over 8 sessions; with this, one per session).
            self._browser = self._playwright.chromium.launch(
                headless=True,
                proxy=NO_NETWORK,
                args=[
                    "--disable-features=OverlayScrollbars,ExtendedOverlayScrollbars,BackForwardCache,SpareRendererForSitePerProcess"
                ],
                ignore_default_args=["--hide-scrollbars"],
            )
        return self._browser.new_context(**options)


class BrowserPool:
    """A fixed set of browser workers; each new session joins the one with the fewest sessions. It counts the
    episodes its sessions begin. With `max_sessions`, a worker keeps closed sessions' pages while its pages stay
    within its share of the sessions, each for at most `keep_s` (BrowserWorker)."""

    def __init__(self, size: int, max_sessions: int = 0, keep_s: float = 0):
        max_pages = -(-max_sessions // size)  # the most sessions a worker serves at once
        self.workers = [BrowserWorker(max_pages, keep_s) for _ in range(size)]
        self.episodes = 0
        self._lock = threading.Lock()

    def count_episode(self) -> None:
        with self._lock:
            self.episodes += 1

    def assign(self) -> BrowserWorker:
        with self._lock:
            worker = min(self.workers, key=lambda w: w.sessions)
            worker.sessions += 1
            return worker

    def release(self, worker: BrowserWorker) -> None:
        with self._lock:
            worker.sessions -= 1


# Installed in every page before the page's own scripts: puts back at each restart what MiniWoB's episode generator
# does not rebuild, and says when a restart cannot give the page a fresh load would (the file says how).
EPISODE_TRACKER = page_script("episode_tracker.js")

# A new episode in the page the task has loaded, as MiniWoB's own instances start one: [ready, goal], or why the page
# must be loaded afresh.
RESTART = page_script("restart.js")


class BrowserTaskEnvironment(Environment[BrowserGymAction, BrowserGymObservation, BrowserGymState]):
    """One session: a browser context, and a page that holds the task of the last reset.

    Stock BrowserGym launches two browsers at every reset (the page's and a chat window's), loads the task's page
    and sleeps half a second before each observation. Here a few long-lived browsers serve all sessions, each
    session has its own context (cookies, storage, pages), and a reset to the task the page already holds restarts
    the episode in that page, as MiniWoB's own instances do: no page load, no new document. The restart puts back
    what the task's generator does not rebuild (EPISODE_TRACKER: the episode's listeners, jQuery handlers, timers
    and animation frames; form controls, scroll offsets, focus; BrowserGym's element ids; cookies and storage) and
    checks what it cannot put back (a widget left open outside the task's area, a kept widget's handlers). A reset
    to another task, a page that crashed or navigated away, a page the checks find unlike the fresh load, a task in
    LOADED_AFRESH, or every `reload_every` episodes loads the task's page afresh, with cookies and storage cleared,
    and says why (`loaded_because` in the observation's metadata); every CONTEXT_EPISODES episodes it does so in a
    new browser context, so that no renderer lives for long. A session's first reset takes the page a closed session
    left on its browser where there is one (BrowserWorker; `page_of_a_closed_session` in the metadata).
    tests/test_in_page_restart.py and bench/restarts.py compare restarts with fresh loads of the same seed over every
    task, on young and on aged pages. The observation is taken once the page is ready (after `settle_ms`, 0 by
    default, for tasks that animate; a client may pick its own at reset), with the fields a client asked for at reset
    (all by default). The task, its goal, the actions, their execution, the observation and the page's score are
    BrowserGym's own, the reward is 1.0 only for the task solved (web_env.scoring); the common actions run in fewer
    round trips with the same outcome (page_actions.py), or with BrowserGym's code alone where `browsergym_actions`
    is set.

    A task of a task module (web_env.task_modules) is loaded afresh at every reset, in the same page emptied of all
    its origin stored; its actions always run with BrowserGym's own code, and a setup or validate that raises is a
    TaskError, never a reward (docs/your_own_task.md).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        pool: BrowserPool,
        default_task: str = DEFAULT_TASK,
        screenshots: bool = False,
        settle_ms: int = 0,
        reload_every: int = RELOAD_EVERY,
        browsergym_actions: bool = False,
    ):
        super().__init__()
        self._pool = pool
        self._worker: BrowserWorker | None = pool.assign()
        self._default_task = default_task
        self._screenshots = screenshots
        self._trace = False
        self._default_settle_ms = self._settle_ms = settle_ms
        self._reload_every = reload_every
        self._short_path = not browsergym_actions
        self._fields = frozenset(OBSERVATION_FIELDS)
        self._context = None
        self._timeout = None
        self._page = None
        self._read = None  # the page as BrowserGym's extraction reads it, through the page's one DevTools session
        self._task = None
        self._episode_label = ""  # the task and seed of the session's episode, for a TaskError
        self._episodes_in_page = self._episodes_in_context = 0
        self._state = BrowserGymState()

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_name: str | None = None,
        screenshot: bool | None = None,
        fields: list[str] | None = None,
        settle_ms: int | None = None,
        trace: bool = False,
    ) -> BrowserGymObservation:
        """A new episode of `task_name` (default: the server's task) on `seed`. `fields` names the observation's
        fields to fill for this episode (default: all); `screenshot=True` adds the page's pixels; `settle_ms` is
        this episode's wait after each action before observing (default: the server's; BrowserGym waits 500);
        `trace=True` adds to each of the episode's observations the page as a JPEG (page_image) and, after an action
        on an element, where the element was (action_box), for a trace of the episode; untraced, neither is made."""
        self._check_open()
        task_name = task_name or self._default_task
        if seed is not None and (type(seed) is not int or not 0 <= seed <= MAX_SEED):
            raise ValueError(f"seed must be an integer from 0 to {MAX_SEED}, got {seed!r}")
        if not known_task(task_name):
            own = ", ".join(task_modules.own_tasks()) or "none: it was started without --task_modules"
            raise ValueError(
                f"unknown task {task_name!r}: this server has MiniWoB's tasks and those of its task modules ({own})"
            )
        if fields is not None and not (isinstance(fields, list) and set(fields) <= set(OBSERVATION_FIELDS)):
            raise ValueError(f"fields must be a list of observation fields ({', '.join(OBSERVATION_FIELDS)})")
        if settle_ms is not None and (type(settle_ms) is not int or not 0 <= settle_ms <= MAX_SETTLE_MS):
            raise ValueError(f"settle_ms must be an integer from 0 to {MAX_SETTLE_MS}, got {settle_ms!r}")
        if type(trace) is not bool:
            raise ValueError(f"trace must be true or false, got {trace!r}")
        if screenshot is not None:
            self._screenshots = screenshot
        self._trace = trace
        self._settle_ms = self._default_settle_ms if settle_ms is None else settle_ms
        self._fields = frozenset(OBSERVATION_FIELDS if fields is None else fields)
        return self._worker.call(self._reset, seed, episode_id, task_name)

    def step(self, action: BrowserGymAction, timeout_s: float | None = None, **kwargs: Any) -> BrowserGymObservation:
        self._check_open()
        if self._task is None:
            raise RuntimeError("call reset before step")
        return self._worker.call(self._step, action.action_str)

    def act_with(self, act) -> BrowserGymObservation:
        """A step whose action is `act(task, page)` on the session's page, not one of the policy's: how the task
        checker (check_tasks.py) plays a task's cheat and its wrong endings. What `act` raises is the step's error."""
        self._check_open()
        if self._task is None:
            raise RuntimeError("call reset before act_with")
        return self._worker.call(self._step_with, lambda: act(self._task, self._page))

    @property
    def state(self) -> BrowserGymState:
        return self._state

    def _check_open(self) -> None:
        if self._worker is None:
            raise RuntimeError("this session was closed (idle past the server's timeout); connect again")

    def close(self) -> None:
        # Marked closed before the browser context goes, so a step that arrives meanwhile is told why.
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.call(self._end_session, worker)
            self._pool.release(worker)

    def _reset(self, seed: int | None, episode_id: str | None, task_name: str) -> BrowserGymObservation:
        miniwob = task_name in TASK_CLASSES
        self._episode_label = f"task {task_name!r} (seed {seed})"
        adopted = self._page is None and miniwob and self._adopt_kept_page(TASK_CLASSES[task_name])
        if self._episodes_in_context >= CONTEXT_EPISODES:
            self._close_context()
            goal, loaded_because = None, f"a new browser context every {CONTEXT_EPISODES} episodes"
        elif not miniwob:
            goal, loaded_because = None, OWN_TASK_LOADS
        else:
            goal, loaded_because = self._restart(TASK_CLASSES[task_name](seed=seed))
        if loaded_because:
            self._end_task()
            task = task_maker(task_name)(seed=seed)  # afresh: the restart drew from the task's generator
            page = self._blank_page(task)
            self._task = task
            goal, _info = self._run_task_code(task.setup, page)  # loads the page, waits for it
            if miniwob:
                self._page.evaluate("window.__episode.noteFreshLoad()")
            self._episodes_in_page = 0
        self._episodes_in_page += 1
        self._episodes_in_context += 1
        self._pool.count_episode()
        self._state = BrowserGymState(
            episode_id=episode_id or str(uuid4()), task_name=task_name, task_id=str(seed), goal=goal
        )
        metadata = {"restarted_in_page": not loaded_because, "browsergym_reward": 0.0}
        if loaded_because:
            metadata["loaded_because"] = loaded_because
        if adopted:
            metadata["page_of_a_closed_session"] = True
        return self._observation(error="", reward=0.0, done=False, raw_reward=0.0, extra_metadata=metadata)

    def _restart(self, task) -> tuple[str | None, str | None]:
        """(the goal of `task`'s episode restarted in the session's page, None), or (None, why it must be loaded
        afresh)."""
        if self._task is None or self._page is None or self._page.is_closed():
            return None, "the session has no page yet"
        if type(self._task) is not type(task):
            return None, "the page holds another task"
        if task.subdomain in LOADED_AFRESH:
            return None, f"listed in LOADED_AFRESH: {LOADED_AFRESH[task.subdomain]}"
        if self._episodes_in_page >= self._reload_every:
            return None, f"the page has run {self._episodes_in_page} episodes (--reload_every {self._reload_every})"
        if self._page.url != task.url:
            return None, f"the page left the task's URL for {self._page.url}"
        try:
            self._context.clear_cookies()
            # The pointer off the page, so that nothing is hovered, as in a newly loaded document until the pointer
            # moves: left over the last episode's element, it would hover what the restart builds there (jQuery UI's
            # menu opens the submenu under it).
            self._page.mouse.move(-1, -1)
            started = self._page.evaluate(RESTART, [task.random.randint(0, 1000000), task.episode_max_time])
            if isinstance(started, str):
                return None, started
            ready, goal = started
            if not ready:
                self._page.wait_for_function("() => WOB_TASK_READY")
                goal = self._page.evaluate("() => core.getUtterance()")
        except PlaywrightError as error:  # the page crashed: a fresh load replaces it
            return None, f"the restart failed: {str(error).splitlines()[0]}"
        task.page, self._task = self._page, task
        return (goal["utterance"] if isinstance(goal, dict) else goal), None

    def _step(self, action_str: str) -> BrowserGymObservation:
        # A task module's app navigates (a form posted, a link followed): BrowserGym's own code acts through
        # Playwright's element actions, which wait for the navigation an action starts, so that `validate` sees what
        # the app recorded; page_actions.py's shorter path serves MiniWoB's pages, which never navigate.
        short_path = self._short_path and isinstance(self._task, AbstractMiniwobTask)
        box = self._element_box(action_str) if self._trace else None
        return self._step_with(lambda: run_action(self._page, action_str, short_path), action_box=box)

    def _element_box(self, action_str: str) -> list[float] | None:
        """[x, y, width, height] of the element an action is about to act on, for the trace; None for an action that
        is not allowed (refused unparsed: it is the model's), on no element, or on no element of the page."""
        try:
            action_code(action_str)
            bid = acted_on(action_str)
            element = get_elem_by_bid(self._page, bid) if bid is not None else None
            box = element.bounding_box() if element is not None and element.count() == 1 else None
        except (ValueError, PlaywrightError):
            return None
        return None if box is None else [box["x"], box["y"], box["width"], box["height"]]

    def _step_with(self, act, action_box: list[float] | None = None) -> BrowserGymObservation:
        try:
            act()
            error = ""
        except Exception as e:  # the action failed, not the server: the model reads why and tries again
            error = f"{type(e).__name__}: {e}"
        if self._settle_ms:
            self._page.wait_for_timeout(self._settle_ms)
        self._page.wait_for_load_state("domcontentloaded")
        browsergym_reward, done, _message, info = self._run_task_code(self._task.validate, self._page, [])
        # BrowserGym's reward is float(raw > 0), which pays some pages' partial credit for a wrong ending: the reward
        # sent is 1.0 only for the page paying in full (web_env.scoring, docs/reward_audit.md), for every client; the
        # page's raw reward and BrowserGym's score go beside it in the metadata. A task module's raw reward is its own.
        raw = float(info.get("RAW_REWARD_GLOBAL", browsergym_reward))
        reward = episode_reward(self._state.task_name, bool(done), raw)
        self._state.step_count += 1
        self._state.cum_reward += reward
        return self._observation(
            error=error,
            reward=reward,
            done=bool(done),
            raw_reward=raw,
            extra_metadata={"browsergym_reward": float(browsergym_reward)},
            action_box=action_box,
        )

    def _run_task_code(self, function, *args):
        """The task's setup or validate, whose exception is a TaskError naming the task and its seed."""
        try:
            return function(*args)
        except Exception as error:
            raise TaskError(
                f"{self._episode_label}: {function.__name__} raised {type(error).__name__}: {error}"
            ) from error

    def _end_task(self) -> None:
        if self._task is not None:
            self._task.teardown()
            self._task = None

    def _blank_page(self, task):
        """The session's page, ready for the task to load itself into: a new one in a new context the first time and
        after a crash, else the same page emptied of what the last episode left (cookies, storage; for a task module's
        app, everything its origin stored)."""
        if self._page is not None and not self._page.is_closed() and self._page.url.startswith("http"):
            origin = "{0.scheme}://{0.netloc}".format(urlsplit(self._page.url))
            self._page.goto("about:blank")  # the app's scripts stop before its data goes
            self._read.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})
            self._context.unroute_all(behavior="ignoreErrors")  # and its backend: the next task serves its own
        if self._page is None or self._page.is_closed():
            self._close_context()
            self._context = self._worker.new_context(
                viewport=task.viewport, locale=task.locale, timezone_id=task.timezone_id, service_workers="block"
            )
            self._context.add_init_script(EPISODE_TRACKER)
            self._context.set_default_timeout(task.timeout)
            self._timeout = task.timeout
            self._page = self._context.new_page()
            self._read = OneDevToolsSession(self._page)
            self._episodes_in_context = 0
        else:
            self._context.clear_cookies()
            self._page.evaluate(CLEAR_STORAGE)
            if self._page.viewport_size != task.viewport:
                self._page.set_viewport_size(task.viewport)
            if self._timeout != task.timeout:
                self._context.set_default_timeout(task.timeout)
                self._timeout = task.timeout
        return self._page

    def _close_context(self) -> None:
        if self._context is not None:
            self._context.close()
        self._page = self._context = self._read = None

    def _adopt_kept_page(self, task_class) -> bool:
        kept = self._worker.take_kept(task_class)
        if kept is None:
            return False
        self._context, self._page, self._read, self._task = kept.context, kept.page, kept.read, kept.task
        self._timeout, self._episodes_in_page = kept.timeout, kept.episodes_in_page
        self._episodes_in_context = kept.episodes_in_context
        return True

    def _end_session(self, worker: BrowserWorker) -> None:
        """Leaves the session's page to the next session on its browser where the browser has room (BrowserWorker),
        else closes the session's context."""
        # A task module's pages are not kept: its task ends here.
        miniwob = isinstance(self._task, AbstractMiniwobTask)
        page_open = self._page is not None and not self._page.is_closed()
        if miniwob and page_open and self._episodes_in_context < CONTEXT_EPISODES:
            kept = SessionPage(
                self._context,
                self._page,
                self._read,
                self._task,
                self._timeout,
                self._episodes_in_page,
                self._episodes_in_context,
            )
            if worker.keep(kept):
                self._page = self._context = self._read = None
        self._end_task()
        self._close_context()

    def _observation(
        self,
        error: str,
        reward: float,
        done: bool,
        raw_reward: float,
        extra_metadata: dict | None = None,
        action_box: list[float] | None = None,
    ) -> BrowserGymObservation:
        fields = self._fields
        dom, axtree = self._extract_dom_and_axtree(
            dom="pruned_html" in fields, axtree=bool({"axtree_txt", "text"} & fields)
        )
        axtree_txt = flatten_axtree_to_str(axtree) if axtree else ""
        self._state.current_url = self._page.url
        metadata = {
            "task_name": self._state.task_name,
            "step": self._state.step_count,
            "raw_reward": raw_reward,
            **(extra_metadata or {}),
        }
        values = {
            "text": axtree_txt,
            "url": self._page.url,
            "goal": self._state.goal,
            "axtree_txt": axtree_txt,
            "pruned_html": prune_html(flatten_dom_to_str(dom)) if dom else "",
            "error": error,
            "last_action_error": bool(error),
        }
        return BrowserGymObservation(
            **{name: value for name, value in values.items() if name in fields},
            screenshot=extract_screenshot(self._read).tolist() if self._screenshots else None,
            page_image=self._page_image() if self._trace else None,
            action_box=action_box,
            reward=reward,
            done=done,
            metadata=metadata,
        )

    def _page_image(self) -> str:
        """The page's viewport as a base64 JPEG, as Chromium encodes it (no pixels pass through Python)."""
        shot = self._read.send("Page.captureScreenshot", {"format": "jpeg", "quality": TRACE_JPEG_QUALITY})
        return shot["data"]

    def _extract_dom_and_axtree(self, dom: bool, axtree: bool):
        # As BrowserGym does: mark every element with its bid (which the actions find elements by), read the DOM and
        # the accessibility tree, unmark; a page still changing under the marking gets one lenient second try, and a
        # page that navigated meanwhile (a task module's app) is read again once its new document is loaded.
        lenient, navigations = False, 0
        while True:
            try:
                _pre_extract(self._page, tags_to_mark="standard_html", lenient=lenient)
                snapshot = extract_dom_snapshot(self._read) if dom else None
                tree = extract_merged_axtree(self._read) if axtree else None
                break
            except (PlaywrightError, MarkingError) as error:
                if "Execution context was destroyed" in str(error) and navigations < MAX_NAVIGATIONS_PER_READ:
                    navigations += 1
                    self._page.wait_for_load_state("domcontentloaded")
                    continue
                _post_extract(self._page)
                if lenient:
                    raise
                lenient = True
        _post_extract(self._page)
        return snapshot, tree
