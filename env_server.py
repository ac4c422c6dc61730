"""Serves MiniWoB++ tasks from BrowserGym as an OpenEnv environment (FastAPI + WebSocket).

    python env_server.py --port 8000            # loopback only; GET /health answers when ready

Wire-compatible with OpenEnv's public BrowserGym environment: the action is {"action_str": "click('13')"},
and observations carry goal, axtree_txt, pruned_html, text, url, error, last_action_error, reward, done.
Each WebSocket session gets its own browser context on one of a few long-lived browsers (see
MiniWoBEnvironment); `reset` takes `task_name`, `seed`, and `screenshot=True` for a screenshot.
"""

import argparse
import functools
import hmac
import inspect
import logging
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional
from uuid import uuid4

import miniwob
import uvicorn
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
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import ConcurrencyConfig
from playwright._impl import _connection, _sync_base
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

from actions import action_code
from env_protocol import (
    DEFAULT_TASK,
    MAX_SEED,
    TOKEN_VARIABLE,
    BrowserGymAction,
    BrowserGymObservation,
    BrowserGymState,
)

log = logging.getLogger("env_server")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
SHUTDOWN_GRACE_S = 10.0
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
                args=["--disable-features=OverlayScrollbars,ExtendedOverlayScrollbars,BackForwardCache,SpareRendererForSitePerProcess"],
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

    def __init__(self, pool: BrowserPool, default_task: str = DEFAULT_TASK, screenshots: bool = False, settle_ms: int = 0):
        super().__init__()
        self._pool = pool
        self._worker: Optional[BrowserWorker] = pool.assign()
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
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        task_name: Optional[str] = None,
        screenshot: Optional[bool] = None,
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

    def step(self, action: BrowserGymAction, timeout_s: Optional[float] = None, **kwargs: Any) -> BrowserGymObservation:
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

    def _reset(self, seed: Optional[int], episode_id: Optional[str], task_name: str) -> BrowserGymObservation:
        if self._task is not None:
            self._task.teardown()
        self._task = TASK_CLASSES[task_name](seed=seed)
        goal, _info = self._task.setup(page=self._blank_page(self._task))  # loads the page, waits for it
        self._state = BrowserGymState(episode_id=episode_id or str(uuid4()), task_name=task_name, task_id=str(seed), goal=goal)
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


class _InspectWithoutSourceLines:
    """The `inspect` module as Playwright's call path sees it, except that `stack()` reads no source lines."""

    def __getattr__(self, name: str):
        return getattr(inspect, name)

    @staticmethod
    def stack(context: int = 1) -> list[inspect.FrameInfo]:
        return inspect.stack(0)


def record_playwright_stacks_cheaply() -> None:
    """Playwright 1.44 (BrowserGym's pin) records the caller's stack at every API call with `inspect.stack()`,
    which reads each frame's source line; a MiniWoB episode makes about 70 such calls. Playwright uses only
    the file names, line numbers and function names, which `inspect.stack(0)` gives without reading source
    (as later Playwright releases do)."""
    _sync_base.inspect = _connection.inspect = _InspectWithoutSourceLines()


def use_packaged_miniwob_pages() -> None:
    """Serve task pages straight from the `miniwob` package unless MINIWOB_URL points elsewhere."""
    pages = Path(miniwob.__file__).parent / "html" / "miniwob"
    os.environ.setdefault("MINIWOB_URL", pages.as_uri() + "/")


def ensure_chromium() -> None:
    """Point Playwright at the system Chromium when Playwright's own build is not installed.

    Playwright looks for its browser at a fixed path under PLAYWRIGHT_BROWSERS_PATH; a link there to the
    system Chromium serves every launch, including BrowserGym's, which take no executable option.
    """
    with sync_playwright() as pw:
        expected = Path(pw.chromium.executable_path)
    if expected.exists():
        return
    system_chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if system_chromium is None:
        raise SystemExit(
            f"No Chromium found: Playwright's build is missing ({expected}) and none is on PATH. "
            "Run `playwright install chromium` or install your system's chromium package."
        )
    browsers_root = next(p for p in expected.parents if p.name.startswith("chromium-")).parent
    linked_root = Path.home() / ".cache" / "browser-rl" / "playwright"
    link = linked_root / expected.relative_to(browsers_root)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(system_chromium)
    os.environ["PLAYWRIGHT_BROWSERS_PATH"] = str(linked_root)
    log.warning("Playwright's Chromium is not installed; using the system Chromium %s (linked at %s)", system_chromium, link)


def exit_with_parent(parent_pid: int) -> None:
    """Stops this server and its browsers once the process that started it is gone, even by SIGKILL,
    which leaves it no chance to stop them itself. A shutdown that hangs (a browser call that never
    returns keeps uvicorn waiting for its session) ends with SIGKILL after SHUTDOWN_GRACE_S."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        log.warning("process %d, which started this server, is gone: stopping", parent_pid)
        os.killpg(os.getpgrp(), signal.SIGTERM)  # the server leads its own process group, browsers included
        time.sleep(SHUTDOWN_GRACE_S)
        log.warning("still running %.0fs after SIGTERM: killing", SHUTDOWN_GRACE_S)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


class RequireToken:
    """ASGI middleware: every HTTP request and WebSocket handshake must carry `Authorization: Bearer TOKEN`,
    except GET /health, which says only that the server is up. Refused: HTTP 401, WebSocket closed (403)."""

    def __init__(self, app, token: str):
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and scope["path"] != "/health":
            supplied = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(supplied, self.expected):
                log.warning("refused a %s request without the right token from %s", scope["type"], scope.get("client"))
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                else:
                    await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
                    await send({"type": "http.response.body", "body": b"missing or wrong token\n"})
                return
        await self.app(scope, receive, send)


def build_app(
    default_task: str = DEFAULT_TASK,
    max_sessions: int = 16,
    browsers: int = 2,
    screenshots: bool = False,
    settle_ms: int = 0,
    idle_timeout_s: float | None = 600.0,
    token: str | None = None,
):
    pool = BrowserPool(browsers)
    app = create_app(
        functools.partial(
            MiniWoBEnvironment, pool=pool, default_task=default_task, screenshots=screenshots, settle_ms=settle_ms
        ),
        BrowserGymAction,
        BrowserGymObservation,
        env_name="browsergym_miniwob",
        state_cls=BrowserGymState,
        # Beyond max_sessions a new session gets a "capacity reached" error; an idle one is closed.
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=idle_timeout_s or None),
    )
    if token:
        app.add_middleware(RequireToken, token=token)
    return app


def exposure(host: str, token: str | None) -> str | None:
    """How the server can be reached, for the startup log; None if the combination is refused."""
    if host in LOOPBACK_HOSTS:
        return "loopback only: reachable from this machine" + (", with the token" if token else "")
    if token:
        return f"reachable from the network on {host}; every request except GET /health must carry the token"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--task", default=os.environ.get("BROWSERGYM_TASK_NAME", DEFAULT_TASK), help="default task")
    parser.add_argument("--max-sessions", type=int, default=16, help="concurrent WebSocket sessions")
    parser.add_argument(
        "--browsers", type=int, default=min(4, os.cpu_count() or 1), help="Chromium processes shared by the sessions"
    )
    parser.add_argument("--screenshots", action="store_true", help="include screenshots in every observation")
    parser.add_argument("--parent-pid", type=int, help="stop when this process is gone (set by LocalEnvServer)")
    parser.add_argument(
        "--settle-ms", type=int, default=0, help="wait after each action before observing, for tasks that animate"
    )
    parser.add_argument(
        "--idle-timeout-s", type=float, default=600.0, help="close a session idle this long (0: never)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    # The token comes from the environment, not the command line, which other users of the machine can read.
    token = os.environ.get(TOKEN_VARIABLE) or None
    reach = exposure(args.host, token)
    if reach is None:
        parser.error(
            f"refusing to listen on {args.host} without a token: anyone who reaches the port could drive the "
            f"browsers. Set {TOKEN_VARIABLE} (clients send it too), or keep the default loopback --host."
        )
    if args.task not in TASK_CLASSES:
        parser.error(f"unknown MiniWoB task {args.task!r}")
    if args.parent_pid:
        exit_with_parent(args.parent_pid)
    use_packaged_miniwob_pages()
    ensure_chromium()
    record_playwright_stacks_cheaply()
    app = build_app(
        args.task, args.max_sessions, args.browsers, args.screenshots, args.settle_ms, args.idle_timeout_s, token
    )
    log.info(
        "serving MiniWoB (default task %s) on http://%s:%d, %s; up to %d sessions on %d browsers, idle ones closed after %.0fs",
        args.task, args.host, args.port, reach, args.max_sessions, args.browsers, args.idle_timeout_s,
    )  # fmt: skip
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
