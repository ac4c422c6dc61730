"""The client side of the environment: OpenEnv's WebSocket client for env_server.py (and for OpenEnv's public
BrowserGym environment), and env_server.py as a child process for runs that start their own server."""

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from env_protocol import TOKEN_VARIABLE, BrowserGymAction, BrowserGymObservation, BrowserGymState

log = logging.getLogger("env_client")


class BrowserGymEnv(EnvClient[BrowserGymAction, BrowserGymObservation, BrowserGymState]):
    """OpenEnv client for env_server.py, and for OpenEnv's public BrowserGym environment.

    `token` (default: $BROWSER_RL_ENV_TOKEN) is sent as `Authorization: Bearer TOKEN`, which a server
    listening beyond loopback requires.
    """

    def __init__(self, base_url: str, token: str | None = None, **kwargs: Any):
        token = token or os.environ.get(TOKEN_VARIABLE)
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


class LocalEnvServer:
    """env_server.py as a child process for the length of a `with` block; its browsers go with it.
    `server_args` go to env_server.py as they are (e.g. ["--idle-timeout-s", "60"])."""

    def __init__(self, task: str, max_sessions: int, server_args: list[str] = (), startup_timeout_s: float = 180.0):
        self.task = task
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
        script = Path(__file__).with_name("env_server.py")
        command = [sys.executable, str(script), "--port", self.url.rsplit(":", 1)[1], "--task", self.task]
        command += ["--max-sessions", str(self.max_sessions), "--parent-pid", str(os.getpid()), *self.server_args]
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
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.25)
        raise TimeoutError(f"the environment server was not healthy after {self.startup_timeout_s:.0f}s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
