"""The browsers the sessions share: a few long-lived Chromiums without network, each driven from a thread of its own
(Playwright's sync objects work only on the thread that made them), the pool that spreads sessions over them, and the
pages closed sessions leave for the next session on the same browser (docs/environment.md)."""

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE
from playwright.sync_api import sync_playwright

# Every request of a page goes through this proxy, which is no proxy (the port of the discard service, closed): a page
# reaches no network, loopback included (<-loopback>). MiniWoB's pages are files; a task module's app is answered
# inside the browser, before any proxy (web_env.task_app), so it is the only origin a task's page reaches, unless
# origins are allowed (a module's ALLOWED_ORIGINS, the server's --allowed_origins): those alone bypass the proxy.
NO_NETWORK = {"server": "http://127.0.0.1:9", "bypass": "<-loopback>"}


def network_of(allowed_origins: tuple[str, ...]) -> dict:
    """The browsers' proxy setting: no network but the allowed origins (Chromium's bypass rules take an origin's
    scheme, host and port as they are)."""
    return {**NO_NETWORK, "bypass": ",".join([NO_NETWORK["bypass"], *allowed_origins])}


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
    `keep_s` (0: kept until taken), as an idle session does. Its pages reach no network but `allowed_origins`.
    A `windowed` worker's Chromium shows its window, for a person to watch.
    """

    def __init__(
        self, max_pages: int = 0, keep_s: float = 0, allowed_origins: tuple[str, ...] = (), windowed: bool = False
    ):
        self.sessions = 0
        self.allowed_origins = allowed_origins
        self.windowed = windowed
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
                headless=not self.windowed,
                proxy=network_of(self.allowed_origins),
                args=[
                    "--disable-features=OverlayScrollbars,ExtendedOverlayScrollbars,BackForwardCache,SpareRendererForSitePerProcess"
                ],
                ignore_default_args=["--hide-scrollbars"],
            )
        return self._browser.new_context(**options)


class BrowserPool:
    """A fixed set of browser workers; each new session joins the one with the fewest sessions (the first of
    those). It counts the sessions open and the episodes they begin. With `max_sessions`, a worker keeps closed
    sessions' pages while its pages stay within its share of the sessions, each for at most `keep_s`
    (BrowserWorker). Their pages reach no network but `allowed_origins`; `windowed` ones show their windows.
    """

    def __init__(
        self,
        size: int,
        max_sessions: int = 0,
        keep_s: float = 0,
        allowed_origins: tuple[str, ...] = (),
        windowed: bool = False,
    ):
        max_pages = -(-max_sessions // size)  # the most sessions a worker serves at once
        self.allowed_origins = allowed_origins
        self.workers = [BrowserWorker(max_pages, keep_s, allowed_origins, windowed) for _ in range(size)]
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

    @property
    def sessions(self) -> int:
        with self._lock:
            return sum(worker.sessions for worker in self.workers)

    def release(self, worker: BrowserWorker) -> None:
        with self._lock:
            worker.sessions -= 1
