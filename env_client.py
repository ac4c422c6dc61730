"""The client side of the environment: OpenEnv's WebSocket client for env_server.py (and for OpenEnv's public
BrowserGym environment), env_server.py as a child process for runs that start their own servers, and the pool of
servers a run spreads its sessions over."""

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from accelerate.utils import gather_object
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from arguments import EnvArguments
from web_env.models import TOKEN_VARIABLE, BrowserGymAction, BrowserGymObservation, BrowserGymState

log = logging.getLogger("env_client")

REMOTE_RECOVERY_WAIT_S = 30.0  # how long a run waits for a server it did not start to answer again


class BrowserGymEnv(EnvClient[BrowserGymAction, BrowserGymObservation, BrowserGymState]):
    """OpenEnv client for env_server.py, and for OpenEnv's public BrowserGym environment.

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
    browsers go with it. `server_args` go to the server as they are (e.g. ["--idle_timeout_s", "60"])."""

    def __init__(self, max_sessions: int = 16, server_args: list[str] = (), startup_timeout_s: float = 180.0):
        self.max_sessions = max_sessions
        self.server_args = list(server_args)
        self.startup_timeout_s = startup_timeout_s
        self.url = f"http://127.0.0.1:{free_port()}"
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> "LocalEnvServer":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        command = [sys.executable, "-m", "web_env.server", "--port", self.url.rsplit(":", 1)[1]]
        command += ["--max_sessions", str(self.max_sessions), "--parent_pid", str(os.getpid()), *self.server_args]
        # Its own process group, so that stopping it also stops the browsers it launched; and it watches
        # this process, so that it stops by itself if this one is killed.
        self._process = subprocess.Popen(command, start_new_session=True)
        log.info("starting a local environment server at %s (pid %d)", self.url, self._process.pid)
        try:
            self._wait_until_healthy()
        except BaseException:
            self.stop()
            raise

    def restart(self) -> None:
        """A fresh server at the same URL, whatever state the old one is in."""
        self.stop()
        self.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def stop(self) -> None:
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
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"the environment server exited with status {self._process.returncode}")
            if healthy(self.url):
                return
            time.sleep(0.25)
        raise TimeoutError(f"the environment server was not healthy after {self.startup_timeout_s:.0f}s")


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a server's GET /health answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s):
            return True
    except OSError:
        return False


class CpuUnavailable(Exception):
    """A server's CPU reading cannot be had, and why."""


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
        raise CpuUnavailable(f"GET /cpu answered HTTP {error.code} (a server other than env_server.py?)") from None
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


class ServerPool:
    """The environment servers a run spreads its sessions over, and which of them are up.

    `servers` are URLs, or servers this run started (anything with `url` and `restart()`, like LocalEnvServer).
    A server that fails is taken out of the rotation: the runner plays its batch again on the others. One this
    run started is restarted in the background; any server rejoins once its /health answers.
    """

    def __init__(self, servers: list, recovery_wait_s: float | None = None):
        if not servers:
            raise ValueError("a pool of environment servers needs at least one")
        self.servers = list(servers)
        self.recovery_wait_s = REMOTE_RECOVERY_WAIT_S if recovery_wait_s is None else recovery_wait_s
        self._out: dict[int, threading.Thread | None] = {}  # the servers out of the rotation, and their restarts
        self._cpu_unavailable: set[str] = set()  # servers whose CPU reading failed, said once

    @classmethod
    def started(cls, stack: contextlib.ExitStack, servers: list, recovery_wait_s: float) -> "ServerPool":
        """`servers` this run starts (anything with `start()` and `stop()` too), started side by side and stopped
        when `stack` closes."""
        for server in servers:
            stack.callback(server.stop)
        with ThreadPoolExecutor(max_workers=len(servers)) as starting:
            list(starting.map(lambda server: server.start(), servers))
        return cls(servers, recovery_wait_s)

    @property
    def urls(self) -> list[str]:
        return [server if isinstance(server, str) else server.url for server in self.servers]

    def up(self) -> list[str]:
        """The servers in the rotation; one that was out comes back once its restart is over and it answers."""
        urls = self.urls
        for index, restart in list(self._out.items()):
            if (restart is None or not restart.is_alive()) and healthy(urls[index]):
                del self._out[index]
                log.info("environment server %s answers again: back in the rotation", urls[index])
        return [url for index, url in enumerate(urls) if index not in self._out]

    def take_out(self, url: str) -> None:
        if url not in self.urls:  # already replaced by a restart
            return
        index = self.urls.index(url)
        if index in self._out:
            return
        server = self.servers[index]
        restart = None
        if not isinstance(server, str):
            restart = threading.Thread(target=server.restart, name=f"restart {url}", daemon=True)
            restart.start()
        self._out[index] = restart
        log.warning("environment server %s failed: out of the rotation%s", url, " while it restarts" if restart else "")

    def cpu_readings(self, token: str | None = None) -> dict[str, tuple[float, int] | None]:
        """Each server's cpu_reading; None for a server whose reading cannot be had, which the log says once."""
        readings = {}
        for url in self.urls:
            try:
                readings[url] = cpu_reading(url, token)
            except CpuUnavailable as why:
                readings[url] = None
                if url not in self._cpu_unavailable:
                    self._cpu_unavailable.add(url)
                    log.warning("the environment's CPU per episode leaves out %s: %s", url, why)
        return readings

    def wait_for_one(self) -> None:
        """Waits, at most recovery_wait_s, for a server to be up."""
        deadline = time.monotonic() + self.recovery_wait_s
        while not self.up() and time.monotonic() < deadline:
            time.sleep(0.5)


def open_server_pool(
    stack: contextlib.ExitStack,
    env: EnvArguments,
    max_sessions: int,
    new_server: Callable = LocalEnvServer,
    local_rank: int = 0,
    world_size: int = 1,
) -> ServerPool:
    """The servers a run plays on, decided here alone (train.py, evaluate.py, modal_app.py, warm_up.py and the
    benchmarks open theirs here): env.env_url's, or else env.env_servers servers that the run starts side by side and
    `stack` stops. `new_server(max_sessions)` makes one: an env_server.py process by default, a Modal sandbox in
    modal_app.py. Each can hold the whole batch, so that the others can take over a failed one's sessions.

    Under a launcher (world_size ranks, of which this is local_rank on its machine), the first rank of each machine
    starts that machine's servers and every rank of the machine plays on them too, each listing them from its own
    place on, so that ranks that open as many sessions as each other spread them evenly and their remainders on
    different servers. Every rank must call this, for the ranks exchange the servers' URLs."""

    def start() -> ServerPool:
        servers = [new_server(max_sessions) for _ in range(env.env_servers)]
        return ServerPool.started(stack, servers, recovery_wait_s=servers[0].startup_timeout_s)

    if world_size == 1:
        return ServerPool(env.env_url) if env.env_url else start()
    started = start() if local_rank == 0 and not env.env_url else None
    node = socket.gethostname()
    started_on = gather_object([(node, started.urls if started else [])])
    urls = env.env_url or [url for host, urls in started_on if host == node for url in urls]
    place = local_rank % len(urls)
    return started or ServerPool(urls[place:] + urls[:place])
