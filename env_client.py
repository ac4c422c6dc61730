"""The client side of the environment: OpenEnv's WebSocket client for the environment server (web_env.server) and for
OpenEnv's public BrowserGym environment, the server as a child process for runs that start their own, and what a
client reads of a server besides episodes (whether it is up, its CPU). Plain values in and out: which servers a run
plays on is browser_rl/servers.py's."""

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import web_env  # noqa: F401  (first: it imports OpenEnv without OpenEnv's Gradio web interface; web_env/__init__.py)

# isort: split
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from web_env.models import TOKEN_VARIABLE, BrowserGymAction, BrowserGymObservation, BrowserGymState

log = logging.getLogger("env_client")


class CpuUnavailable(Exception):
    """A server's CPU reading cannot be had (a server without GET /cpu, or one that does not answer), and why."""


class ServerDidNotStart(Exception):
    """An environment server this process started exited, or did not answer, before it was up; the message names it
    and says which."""


class BrowserGymEnv(EnvClient[BrowserGymAction, BrowserGymObservation, BrowserGymState]):
    """OpenEnv client for the environment server, and for OpenEnv's public BrowserGym environment.

    `token` (default: $BROWSER_RL_ENV_TOKEN) is sent as `Authorization: Bearer TOKEN`, which a server
    listening beyond loopback requires.
    """

    def __init__(self, base_url: str, token: str | None = None, **kwargs: Any):
        token = client_token(token)
        if token:
            kwargs["headers"] = {**(kwargs.get("headers") or {}), "Authorization": f"Bearer {token}"}
        super().__init__(base_url, **kwargs)

    def _step_payload(self, action: BrowserGymAction) -> dict[str, Any]:
        return {"action_str": action.action_str, "metadata": action.metadata}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[BrowserGymObservation]:
        # Fields this client does not know (a newer server's) are left out rather than refused.
        fields = BrowserGymObservation.model_fields.keys()
        observation = BrowserGymObservation(
            **{k: v for k, v in payload.get("observation", {}).items() if k in fields},
            reward=payload.get("reward"),
            done=payload.get("done", False),
        )
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> BrowserGymState:
        return BrowserGymState(**{k: v for k, v in payload.items() if k in BrowserGymState.model_fields})


def client_token(token: str | None = None) -> str | None:
    """The token a client sends: the one given, else $BROWSER_RL_ENV_TOKEN. The client side reads the variable here
    alone."""
    return token or os.environ.get(TOKEN_VARIABLE) or None


class LocalEnvServer:
    """The environment server (`python -m web_env.server`) as a child process for the length of a `with` block; its
    browsers go with it. It serves `task_modules` (your own tasks' modules, names or .py paths, as the command that
    starts it was given them) beside MiniWoB. `server_args` go to the server as they are (e.g. ["--browsers", "2"]).

    Its sessions are this process's alone, so it never closes one as idle: the server's default timeout (600 s)
    would close an episode's session while this process's policy thinks longer than that between two actions, as a
    real model's turn on a CPU can."""

    def __init__(
        self,
        max_sessions: int = 16,
        task_modules: list[str] = (),
        server_args: list[str] = (),
        startup_timeout_s: float = 180.0,
    ):
        self.max_sessions = max_sessions
        self.task_modules = list(task_modules)
        self.server_args = list(server_args)
        self.startup_timeout_s = startup_timeout_s
        self.url = f"http://127.0.0.1:{free_port()}"
        self._process: subprocess.Popen | None = None
        self._turns = threading.Lock()  # a restart runs in a thread of its own (ServerPool); stop() may come meanwhile
        self._stopped = False  # by stop(): a restart under way ends without a server

    def __enter__(self) -> "LocalEnvServer":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        with self._turns:
            self._stopped = False
            self._launch()
        self._wait_until_started()

    def restart(self) -> None:
        """A fresh server at the same URL, whatever state the old one is in; none if stop() comes first or meanwhile,
        as when a run ends while a failed server restarts."""
        with self._turns:
            if self._stopped:
                return
            self._end()
            self._launch()
        self._wait_until_started()

    @property
    def pid(self) -> int:
        return self._process.pid

    def stop(self) -> None:
        with self._turns:
            self._stopped = True
            self._end()

    def _launch(self) -> None:
        command = [sys.executable, "-m", "web_env.server", "--port", self.url.rsplit(":", 1)[1]]
        command += ["--max_sessions", str(self.max_sessions), "--parent_pid", str(os.getpid())]
        command += ["--idle_timeout_s", "0", *self.server_args]
        if self.task_modules:
            command += ["--task_modules", *self.task_modules]
        # Its own process group, so that stopping it also stops the browsers it launched; and it watches
        # this process, so that it stops by itself if this one is killed.
        self._process = subprocess.Popen(command, start_new_session=True)
        log.info("starting a local environment server at %s (pid %d)", self.url, self._process.pid)

    def _wait_until_started(self) -> None:
        try:
            self._wait_until_healthy()
        except BaseException as error:
            if self._stopped and isinstance(error, Exception):  # stop() ended it on purpose while it started
                return
            self.stop()
            raise

    def _end(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)  # what it left behind: browsers
            return
        os.killpg(self._process.pid, signal.SIGTERM)
        os.killpg(self._process.pid, signal.SIGCONT)  # a stopped server, too, ends at once rather than after the wait
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        log.info("stopped the local environment server")

    def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        named = f"the environment server at {self.url} (pid {self._process.pid})"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ServerDidNotStart(f"{named} exited with status {self._process.returncode} as it started")
            if healthy(self.url):
                return
            time.sleep(0.25)
        raise ServerDidNotStart(f"{named} did not answer GET /health within {self.startup_timeout_s:.0f}s")


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a server's GET /health answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s):
            return True
    except OSError:
        return False


def cpu_reading(url: str, token: str | None = None, timeout_s: float = 5.0) -> tuple[float, int]:
    """(CPU seconds, episodes begun) so far of a server and its browsers, from its GET /cpu; CpuUnavailable from a
    server without one (OpenEnv's public BrowserGym server) or one that does not answer in time."""
    token = client_token(token)
    request = urllib.request.Request(f"{url}/cpu", headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            reading = json.load(response)
        return float(reading["cpu_s"]), int(reading["episodes"])
    except urllib.error.HTTPError as error:
        raise CpuUnavailable(f"GET /cpu answered HTTP {error.code} (a server other than web_env.server?)") from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CpuUnavailable(f"GET /cpu failed: {type(error).__name__}: {error}") from None


def cpu_s_per_episode(before: dict, after: dict) -> float | None:
    """The environment's CPU seconds per episode between two sets of readings {url: cpu_reading}, over the servers
    read both times; None where no episode began on them."""
    both = [url for url in after if before.get(url) and after[url]]
    episodes = sum(after[url][1] - before[url][1] for url in both)
    return sum(after[url][0] - before[url][0] for url in both) / episodes if episodes > 0 else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
