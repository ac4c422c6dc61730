"""The MiniWoB++ environment behind env_server.py: BrowserGym's tasks on a few long-lived browsers, one browser
context per session, as an OpenEnv `Environment`.

The task, its goal, the actions, their execution, the observation and the reward are BrowserGym's own; what this
module changes is the browsers' lifecycle (see MiniWoBEnvironment). Hosting it (the app, the token, the
process) is env_server.py's job.
"""

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import uuid4

from browsergym.core.action.base import execute_python_code
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
from browsergym.utils.obs import flatten_axtree_to_str, flatten_dom_to_str, prune_html
from openenv.core.env_server.interfaces import Environment
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

from actions import action_code
from env_protocol import DEFAULT_TASK, MAX_SEED, BrowserGymAction, BrowserGymObservation, BrowserGymState

CLEAR_STORAGE = "() => { try { localStorage.clear(); sessionStorage.clear(); } catch (e) {} }"

# BrowserGym's MiniWoB task classes by task name (click-test, enter-text, ...).
TASK_CLASSES = {task.get_task_id().removeprefix("miniwob."): task for task in ALL_MINIWOB_TASKS}


class BrowserWorker:
    """A thread that owns one Playwright instance and one Chromium, shared by the sessions assigned to it.

    Playwright's sync objects work only on the thread that created them, so every call on this browser,
    its contexts and their pages runs here; the sessions' own threads wait for the answer.
    """

    def __init__(self):
        self.sessions = 0
        self._thread = ThreadPoolExecutor(max_workers=1)
        self._playwright = None
        self._browser = None

    def call(self, function, *args):
        return self._thread.submit(function, *args).result()

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
                args=[
                    "--disable-features=OverlayScrollbars,ExtendedOverlayScrollbars,BackForwardCache,SpareRendererForSitePerProcess"
                ],
                ignore_default_args=["--hide-scrollbars"],
            )
        return self._browser.new_context(**options)


class BrowserPool:
    """A fixed set of browser workers; each new session joins the one with the fewest sessions."""

    def __init__(self, size: int):
        self.workers = [BrowserWorker() for _ in range(size)]
        self._lock = threading.Lock()

    def assign(self) -> BrowserWorker:
        with self._lock:
            worker = min(self.workers, key=lambda w: w.sessions)
            worker.sessions += 1
            return worker

    def release(self, worker: BrowserWorker) -> None:
        with self._lock:
            worker.sessions -= 1


class MiniWoBEnvironment(Environment[BrowserGymAction, BrowserGymObservation, BrowserGymState]):
    """One session: a browser context and a page that each episode loads its task into anew.

    Stock BrowserGym launches two browsers at every reset (the page's and a chat window's) and sleeps half a
    second before each observation. Here a few long-lived browsers serve all sessions, each session has its
    own context (cookies, storage, pages), and each reset loads the task's page into the session's page as a
    new document, with cookies and storage cleared: no state crosses episodes, and Chromium keeps its
    renderer process. There is no chat window, and an observation is taken once the page has loaded (after
    `settle_ms`, 0 by default, for tasks that animate). The task, its goal, the actions, their execution,
    the observation and the reward are BrowserGym's own.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self, pool: BrowserPool, default_task: str = DEFAULT_TASK, screenshots: bool = False, settle_ms: int = 0
    ):
        super().__init__()
        self._pool = pool
        self._worker: BrowserWorker | None = pool.assign()
        self._default_task = default_task
        self._screenshots = screenshots
        self._settle_ms = settle_ms
        self._context = None
        self._timeout = None
        self._page = None
        self._task = None
        self._state = BrowserGymState()

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_name: str | None = None,
        screenshot: bool | None = None,
    ) -> BrowserGymObservation:
        self._check_open()
        task_name = task_name or self._default_task
        if seed is not None and (type(seed) is not int or not 0 <= seed <= MAX_SEED):
            raise ValueError(f"seed must be an integer from 0 to {MAX_SEED}, got {seed!r}")
        if task_name not in TASK_CLASSES:
            examples = ", ".join(sorted(TASK_CLASSES)[:5])
            raise ValueError(f"unknown MiniWoB task {task_name!r} (known tasks include {examples}, ...)")
        if screenshot is not None:
            self._screenshots = screenshot
        return self._worker.call(self._reset, seed, episode_id, task_name)

    def step(self, action: BrowserGymAction, timeout_s: float | None = None, **kwargs: Any) -> BrowserGymObservation:
        self._check_open()
        if self._task is None:
            raise RuntimeError("call reset before step")
        return self._worker.call(self._step, action.action_str)

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
            worker.call(self._end_session)
            self._pool.release(worker)

    def _reset(self, seed: int | None, episode_id: str | None, task_name: str) -> BrowserGymObservation:
        if self._task is not None:
            self._task.teardown()
        self._task = TASK_CLASSES[task_name](seed=seed)
        goal, _info = self._task.setup(page=self._blank_page(self._task))  # loads the page, waits for it
        self._state = BrowserGymState(
            episode_id=episode_id or str(uuid4()), task_name=task_name, task_id=str(seed), goal=goal
        )
        return self._observation(error="", reward=0.0, done=False)

    def _step(self, action_str: str) -> BrowserGymObservation:
        try:
            code = action_code(action_str)
            execute_python_code(code, self._page, send_message_to_user=None, report_infeasible_instructions=None)
            error = ""
        except Exception as e:  # the action failed, not the server: the model reads why and tries again
            error = f"{type(e).__name__}: {e}"
        if self._settle_ms:
            self._page.wait_for_timeout(self._settle_ms)
        self._page.wait_for_load_state("domcontentloaded")
        reward, done, _message, _info = self._task.validate(self._page, [])
        self._state.step_count += 1
        self._state.cum_reward += float(reward)
        return self._observation(error=error, reward=float(reward), done=bool(done))

    def _blank_page(self, task):
        """The session's page, ready for the task to load itself into; a closed or crashed page is replaced."""
        if self._page is None or self._page.is_closed():
            self._close_context()
            self._context = self._worker.new_context(viewport=task.viewport)
            self._context.set_default_timeout(task.timeout)
            self._timeout = task.timeout
            self._page = self._context.new_page()
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
        self._page = self._context = None

    def _end_session(self) -> None:
        if self._task is not None:
            self._task.teardown()
            self._task = None
        self._close_context()

    def _observation(self, error: str, reward: float, done: bool) -> BrowserGymObservation:
        dom, axtree = self._extract_dom_and_axtree()
        axtree_txt = flatten_axtree_to_str(axtree)
        self._state.current_url = self._page.url
        return BrowserGymObservation(
            text=axtree_txt,
            url=self._page.url,
            screenshot=extract_screenshot(self._page).tolist() if self._screenshots else None,
            goal=self._state.goal,
            axtree_txt=axtree_txt,
            pruned_html=prune_html(flatten_dom_to_str(dom)),
            error=error,
            last_action_error=bool(error),
            reward=reward,
            done=done,
            metadata={"task_name": self._state.task_name, "step": self._state.step_count},
        )

    def _extract_dom_and_axtree(self):
        # As BrowserGym does: mark every element with its bid, read the DOM and the accessibility tree,
        # unmark; a page still changing under the marking gets one lenient second try.
        for lenient in (False, True):
            try:
                _pre_extract(self._page, tags_to_mark="standard_html", lenient=lenient)
                dom, axtree = extract_dom_snapshot(self._page), extract_merged_axtree(self._page)
                break
            except (PlaywrightError, MarkingError):
                _post_extract(self._page)
                if lenient:
                    raise
        _post_extract(self._page)
        return dom, axtree
