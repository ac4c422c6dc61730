"""Which environment servers a run plays on: the URLs it was given, or servers it starts (local processes, or Modal
sandboxes), shared by a machine's ranks; and the pool that spreads a run's sessions over them, takes a failed server
out of the rotation, restarts the ones it started and reads their CPU."""

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from accelerate.utils import gather_object

from browser_rl.options import ServerArguments
from env_client import BrowserGymEnv, CpuUnavailable, LocalEnvServer, cpu_reading, healthy

log = logging.getLogger("servers")

REMOTE_RECOVERY_WAIT_S = 30.0  # how long a run waits for a server it did not start to answer again


class ServerPool:
    """The environment servers a run spreads its sessions over, and which of them are up.

    `servers` are URLs, or servers this run started (anything with `url` and `restart()`, like LocalEnvServer).
    A server that fails is taken out of the rotation: the runner plays its batch again on the others. One this
    run started is restarted in the background; any server rejoins once its /health answers.
    """

    def __init__(
        self,
        servers: list,
        token: str | None = None,
        timeout_s: float = 120.0,
        recovery_wait_s: float | None = None,
    ):
        if not servers:
            raise ValueError("a pool of environment servers needs at least one")
        self.servers = list(servers)
        self.token = token
        self.timeout_s = timeout_s
        self.recovery_wait_s = REMOTE_RECOVERY_WAIT_S if recovery_wait_s is None else recovery_wait_s
        self._out: dict[int, threading.Thread | None] = {}  # the servers out of the rotation, and their restarts
        self._cpu_unavailable: set[str] = set()  # servers whose CPU reading failed, said once

    @classmethod
    def started(cls, stack: contextlib.ExitStack, servers: list, **reach) -> "ServerPool":
        """`servers` this run starts (anything with `start()`, `stop()` and `startup_timeout_s` too), started side by
        side and stopped when `stack` closes; one that fails is waited for as long as a start may take."""
        for server in servers:
            stack.callback(server.stop)
        with ThreadPoolExecutor(max_workers=len(servers)) as starting:
            list(starting.map(lambda server: server.start(), servers))
        return cls(servers, recovery_wait_s=servers[0].startup_timeout_s, **reach)

    def client(self, url: str) -> BrowserGymEnv:
        """A new session's client for one of the servers, with the pool's token and timeout."""
        return BrowserGymEnv(url, token=self.token, message_timeout_s=self.timeout_s)

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

    def cpu_readings(self) -> dict[str, tuple[float, int] | None]:
        """Each server's cpu_reading; None for a server whose reading cannot be had, which the log says once."""
        readings = {}
        for url in self.urls:
            try:
                readings[url] = cpu_reading(url, self.token)
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
    servers: ServerArguments,
    max_sessions: int,
    task_modules: list[str] = (),
    new_server: Callable = LocalEnvServer,
    local_rank: int = 0,
    world_size: int = 1,
) -> ServerPool:
    """The servers a command plays on, decided here alone (train.py, evaluate.py, modal_app.py, the recorder and the
    benchmarks open theirs here): servers.env_url's, or else servers.env_servers servers that the command starts side
    by side and `stack` stops. `new_server(max_sessions, task_modules)` makes one, serving the command's own task
    modules beside MiniWoB: a web_env.server process by default, a Modal sandbox in modal_app.py. Each can hold the
    whole batch, so that the others can take over a failed one's sessions.

    Under a launcher (world_size ranks, of which this is local_rank on its machine), the first rank of each machine
    starts that machine's servers and every rank of the machine plays on them too, each listing them from its own
    place on, so that ranks that open as many sessions as each other spread them evenly and their remainders on
    different servers. Every rank must call this, for the ranks exchange the servers' URLs."""

    reach = {"token": servers.env_token, "timeout_s": servers.env_timeout_s}

    def start() -> ServerPool:
        started = [new_server(max_sessions, task_modules) for _ in range(servers.env_servers)]
        return ServerPool.started(stack, started, **reach)

    if world_size == 1:
        return ServerPool(servers.env_url, **reach) if servers.env_url else start()
    started = start() if local_rank == 0 and not servers.env_url else None
    node = socket.gethostname()
    started_on = gather_object([(node, started.urls if started else [])])
    urls = servers.env_url or [url for host, urls in started_on if host == node for url in urls]
    place = local_rank % len(urls)
    return started or ServerPool(urls[place:] + urls[:place], **reach)
