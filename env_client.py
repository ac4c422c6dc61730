"""The client side of the environment: OpenEnv's WebSocket client for env_server.py (and for OpenEnv's public
BrowserGym environment), and env_server.py as a child process for runs that start their own server."""

import asyncio
import contextlib
import json
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
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from env_protocol import TOKEN_VARIABLE, BrowserGymAction, BrowserGymObservation, BrowserGymState

log = logging.getLogger("env_client")


class BrowserGymEnv(EnvClient[BrowserGymAction, BrowserGymObservation, BrowserGymState]):
    """OpenEnv client for env_server.py, and for OpenEnv's public BrowserGym environment.

    `token` (default: $BROWSER_RL_ENV_TOKEN) is sent as `Authorization: Bearer TOKEN`, which a server
    listening beyond loopback requires.
    """

    def __init__(self, base_url: str, token: str | None = None, **kwargs: Any):
        super().__init__(base_url, **kwargs)
        self.token = token or os.environ.get(TOKEN_VARIABLE) or None

    async def connect(self) -> "BrowserGymEnv":
        if self._ws is None and self.token:
            try:
                self._ws = await ws_connect(
                    self._ws_url,
                    open_timeout=self._connect_timeout,
                    max_size=self._max_message_size,
                    additional_headers={"Authorization": f"Bearer {self.token}"},
                )
            except Exception as e:
                raise ConnectionError(f"Failed to connect to {self._ws_url}: {e}") from e
        return await super().connect()

    def _step_payload(self, action: BrowserGymAction) -> dict[str, Any]:
        return {"action_str": action.action_str, "metadata": action.metadata}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[BrowserGymObservation]:
        fields = BrowserGymObservation.model_fields.keys()
        observation = BrowserGymObservation(
            **{k: v for k, v in payload.get("observation", {}).items() if k in fields},
            reward=payload.get("reward"),
            done=payload.get("done", False),
        )
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> BrowserGymState:
        return BrowserGymState(**{k: v for k, v in payload.items() if k in BrowserGymState.model_fields})

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            await super()._send(message)
        except ConnectionClosed:
            # A server at capacity answers a new connection with its reason and closes it at once; the reason
            # is still queued here, and says more than "connection closed".
            with contextlib.suppress(ConnectionClosed, ValueError, asyncio.TimeoutError):
                refusal = json.loads(await asyncio.wait_for(self._ws.recv(), timeout=1))
                if refusal.get("type") == "error":
                    data = refusal.get("data", {})
                    raise RuntimeError(f"Server error: {data.get('message')} (code: {data.get('code')})") from None
            raise

    async def disconnect(self) -> None:
        """Ends the session and waits for the server to close the socket, which it does once the session's
        browser context is closed: the server's resources are released when this returns."""
        if self._ws is not None:
            try:
                await self._send({"type": "close"})
                await asyncio.wait_for(self._ws.wait_closed(), timeout=30)
            except (OSError, asyncio.TimeoutError, ConnectionClosed):
                pass  # the server is gone already
        await super().disconnect()


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
