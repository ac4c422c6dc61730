"""The environment behind the server (app.py): BrowserGym's tasks (MiniWoB++'s, and those of your task modules) on a
few long-lived browsers without network, one browser context per session, MiniWoB's episodes restarted in the page the
task already loaded, as an OpenEnv `Environment`.

The task, its goal, the actions, their execution and the observation are BrowserGym's own, and so is the page's score;
the reward sent is 1.0 only for the task solved (web_env.scoring), with BrowserGym's score beside it. This module is
the session; the browsers it runs on are browsers.py's, the restart in the page in_page_restart.py's, reading the
page page_reading.py's, the actions page_actions.py's, and hosting it (the app, the token, the process) app.py's.
"""

from typing import Any
from uuid import uuid4

from browsergym.core.observation import extract_screenshot
from browsergym.miniwob import ALL_MINIWOB_TASKS
from browsergym.miniwob.base import AbstractMiniwobTask
from browsergym.utils.obs import flatten_axtree_to_str, flatten_dom_to_str, prune_html
from openenv.core.env_server.interfaces import Environment

from web_env import task_modules
from web_env.models import (
    DEFAULT_TASK,
    MAX_SEED,
    MAX_SETTLE_MS,
    BrowserGymAction,
    BrowserGymObservation,
    BrowserGymState,
    miniwob_name,
)
from web_env.scoring import episode_reward
from web_env.server import page_reading
from web_env.server.browsers import BrowserPool, BrowserWorker, OneDevToolsSession, SessionPage
from web_env.server.in_page_restart import EPISODE_TRACKER, RELOAD_EVERY, restarted
from web_env.server.page_actions import run_action
from web_env.server.scripts import page_script

CLEAR_STORAGE = page_script("clear_storage.js")
# The observation's fields a client can ask for at reset; screenshots come only with `screenshot=True`.
OBSERVATION_FIELDS = ("text", "url", "goal", "axtree_txt", "pruned_html", "error", "last_action_error")
# Episodes in one browser context before the session gets a new one, and with it a new renderer process: a page that
# lives for many episodes grows its renderer's memory by some kilobytes an episode, which a new document does not
# give back (bench/env_soak.py).
CONTEXT_EPISODES = 200
# BrowserGym's MiniWoB task classes by task name (click-test, enter-text, ...).
TASK_CLASSES = {miniwob_name(task.get_task_id()): task for task in ALL_MINIWOB_TASKS}
OWN_TASK_LOADS = "a task of a task module: every episode is a fresh load"


class TaskError(Exception):
    """A task's own code (its setup or validate) raised: an environment failure, never a reward."""


def task_maker(task_name: str):
    """The maker of `task_name`'s instances from a seed: MiniWoB's class, or what a task module registered."""
    return TASK_CLASSES.get(task_name) or task_modules.task_maker(task_name)


def known_task(task_name: str) -> bool:
    return task_name in TASK_CLASSES or task_name in task_modules.own_tasks()


class BrowserTaskEnvironment(Environment[BrowserGymAction, BrowserGymObservation, BrowserGymState]):
    """One session: a browser context, and a page that holds the task of the last reset.

    A reset to the task the page already holds restarts the episode in that page (in_page_restart.py), else loads the
    task's page afresh and says why (`loaded_because` in the observation's metadata); every CONTEXT_EPISODES episodes
    it does so in a new browser context. A session's first reset takes the page a closed session left on its browser
    where there is one (browsers.BrowserWorker). The observation has the fields a client asked for at reset, taken
    after `settle_ms`; the task, its goal, the actions, the observation and the page's score are BrowserGym's own, and
    the reward is 1.0 only for the task solved (web_env.scoring). A task of a task module loads afresh at every reset
    and its actions run BrowserGym's own code; its setup or validate raising is a TaskError, never a reward.
    docs/environment.md tells the whole design and its measurements.
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
        idle_timeout_s: float = 0,
    ):
        super().__init__()
        self._pool = pool
        self._idle_timeout_s = idle_timeout_s  # the server closes the session after this long without an action
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
            raise RuntimeError(
                f"this session was closed: idle past the server's --idle_timeout_s of {self._idle_timeout_s:g} s. "
                "Connect again; a client that thinks longer between actions needs a server started with a longer "
                "--idle_timeout_s (0: never)"
            )

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
            task = TASK_CLASSES[task_name](seed=seed)
            goal, loaded_because = restarted(
                self._context, self._page, self._task, task, self._episodes_in_page, self._reload_every
            )
            if not loaded_because:
                self._task = task
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
        if self._pool.allowed_origins:  # what the pages may reach beyond their own
            metadata["allowed_origins"] = list(self._pool.allowed_origins)
        return self._observation(error="", reward=0.0, done=False, raw_reward=0.0, extra_metadata=metadata)

    def _step(self, action_str: str) -> BrowserGymObservation:
        # A task module's app navigates (a form posted, a link followed), MiniWoB's pages never do.
        may_navigate = not isinstance(self._task, AbstractMiniwobTask)
        box = page_reading.element_box(self._page, action_str) if self._trace else None
        return self._step_with(lambda: run_action(self._page, action_str, self._short_path, may_navigate), box)

    def _step_with(self, act, action_box: list[float] | None = None) -> BrowserGymObservation:
        try:
            act()
            error = ""
        except Exception as e:  # the action failed, not the server: the model reads why and tries again
            error = f"{type(e).__name__}: {e}"
        if self._settle_ms:
            self._page.wait_for_timeout(self._settle_ms)
        # A document the action led to is read once parsed, however long a busy machine takes to (page_actions.py's
        # docstring: no deadline on what a task's own app answers).
        self._page.wait_for_load_state("domcontentloaded", timeout=0)
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
            origin = task_modules.origin_of(self._page.url)
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
        dom, axtree = page_reading.dom_and_axtree(
            self._page, self._read, dom="pruned_html" in fields, axtree=bool({"axtree_txt", "text"} & fields)
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
            page_image=page_reading.page_image(self._read) if self._trace else None,
            action_box=action_box,
            reward=reward,
            done=done,
            metadata=metadata,
        )
