"""Serves BrowserGym's tasks (MiniWoB++'s, and your own) as an OpenEnv environment (FastAPI + WebSocket).

    python -m web_env.server --port 8000        # loopback only; GET /health answers when ready
    python -m web_env.server --task_modules tests/own_tasks/coffee/coffee_task.py     # your tasks beside MiniWoB's

Wire-compatible with OpenEnv's public BrowserGym environment: the action is {"action_str": "click('13')"},
and observations carry goal, axtree_txt, pruned_html, text, url, error, last_action_error, reward, done.
`reset` takes `task_name`, `seed`, `screenshot=True` for the page's pixels, and `trace=True` for a traced episode.
This module is the hosting: the app and its token, the command line, and stopping with the process that started it;
the environment itself is environment.py's, the browser set-up browser_setup.py's.
"""

import argparse
import contextlib
import functools
import hmac
import logging
import os
import signal
import threading
import time

import psutil
import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.types import ConcurrencyConfig

from web_env import task_modules
from web_env.display import missing_display
from web_env.models import DEFAULT_TASK, TOKEN_VARIABLE, BrowserGymAction, BrowserGymObservation, BrowserGymState
from web_env.server import browser_setup
from web_env.server.browsers import BrowserPool
from web_env.server.environment import BrowserTaskEnvironment, known_task
from web_env.server.in_page_restart import RELOAD_EVERY

log = logging.getLogger("env_server")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
SHUTDOWN_GRACE_S = 10.0


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
                    await send(
                        {"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]}
                    )
                    await send({"type": "http.response.body", "body": b"missing or wrong token\n"})
                return
        await self.app(scope, receive, send)


def build_app(args: argparse.Namespace, token: str | None):
    """The OpenEnv app of the command line's settings: sessions of BrowserTaskEnvironment on a pool of browsers, and
    GET /cpu."""
    allowed_origins = tuple(dict.fromkeys([*args.allowed_origins, *task_modules.allowed_origins()]))
    pool = BrowserPool(
        args.browsers, args.max_sessions, args.idle_timeout_s, allowed_origins=allowed_origins, windowed=args.headed
    )
    environment = functools.partial(
        BrowserTaskEnvironment,
        pool=pool,
        default_task=args.task,
        screenshots=args.screenshots,
        settle_ms=args.settle_ms,
        reload_every=args.reload_every,
        browsergym_actions=args.browsergym_actions,
        idle_timeout_s=args.idle_timeout_s,
    )
    # Beyond max_sessions a new session gets a "capacity reached" error; an idle one is closed.
    sessions = ConcurrencyConfig(max_concurrent_envs=args.max_sessions, session_timeout=args.idle_timeout_s or None)
    app = create_app(
        environment,
        BrowserGymAction,
        BrowserGymObservation,
        env_name="browsergym_miniwob",
        state_cls=BrowserGymState,
        concurrency_config=sessions,
    )

    @app.get("/cpu")
    def cpu() -> dict:
        """The CPU seconds this server and its browsers have spent, and the episodes its sessions have begun: two
        readings give a client the environment's CPU-seconds per episode between them. Also the sessions open now
        (a session a client closed is open until the server has ended it, which it does after the client returns)."""
        return {"cpu_s": process_tree_cpu_s(), "episodes": pool.episodes, "sessions": pool.sessions}

    app.state.allowed_origins = allowed_origins
    if token:
        app.add_middleware(RequireToken, token=token)
    return app


def process_tree_cpu_s() -> float:
    """CPU seconds of this process and its descendants, the browsers included; each process's own and those of
    its children that have exited (Chromium's renderers come and go)."""
    total = 0.0
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


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
    parser.add_argument("--max_sessions", type=int, default=16, help="concurrent WebSocket sessions")
    parser.add_argument(
        "--browsers", type=int, default=min(4, os.cpu_count() or 1), help="Chromium processes shared by the sessions"
    )
    parser.add_argument(
        "--task_modules",
        nargs="*",
        default=[],
        help="Python modules (names importable from the current directory, or .py paths) that register your own "
        "BrowserGym tasks, served beside MiniWoB's (docs/your_own_task.md)",
    )
    parser.add_argument(
        "--allowed_origins",
        nargs="*",
        default=[],
        help="origins (http(s)://host[:port]) the pages may reach, such as your app's staging host, beside a task "
        "module's ALLOWED_ORIGINS; everything else stays out of reach",
    )
    parser.add_argument("--screenshots", action="store_true", help="include screenshots in every observation")
    parser.add_argument(
        "--headed", action="store_true", help="show the browsers' windows (needs a display and the full Chromium)"
    )
    parser.add_argument("--parent_pid", type=int, help="stop when this process is gone (set by LocalEnvServer)")
    parser.add_argument(
        "--settle_ms", type=int, default=0, help="wait after each action before observing, for tasks that animate"
    )
    parser.add_argument(
        "--idle_timeout_s",
        type=float,
        default=600.0,
        help="close a session idle this long, and a closed session's page kept for the next this long (0: never)",
    )
    parser.add_argument(
        "--reload_every",
        type=int,
        default=RELOAD_EVERY,
        help="load a task's page afresh every N episodes, restarting the episodes between in the page (1: every time)",
    )
    parser.add_argument(
        "--browsergym_actions",
        action="store_true",
        help="run every action with BrowserGym's own code, not page_actions.py's shorter path (slower; to compare)",
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
    try:
        own_tasks = task_modules.load(args.task_modules)
        args.allowed_origins = [task_modules.as_origin(url) for url in args.allowed_origins]
    except ValueError as error:
        parser.error(str(error))
    if not known_task(args.task):
        parser.error(f"unknown task {args.task!r}: neither MiniWoB's nor one of --task_modules'")
    if args.headed and (no_window := missing_display()):
        parser.error(f"--headed: {no_window}")
    if args.parent_pid:
        exit_with_parent(args.parent_pid)
    browser_setup.prepare(windowed=args.headed)
    if args.reload_every < 1:
        parser.error(f"--reload_every must be at least 1, got {args.reload_every}")
    app = build_app(args, token)
    log.info(
        "serving MiniWoB%s (default task %s) on http://%s:%d, %s; up to %d sessions on %d browsers, %s",
        f" and {len(own_tasks)} task(s) of task modules ({', '.join(own_tasks)})" if own_tasks else "",
        args.task,
        args.host,
        args.port,
        reach,
        args.max_sessions,
        args.browsers,
        f"idle ones closed after {args.idle_timeout_s:g}s" if args.idle_timeout_s else "idle ones never closed",
    )
    if origins := app.state.allowed_origins:
        log.info("pages may reach %s; every other origin stays out of reach", ", ".join(origins))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
