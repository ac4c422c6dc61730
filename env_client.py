"""Talks to the environment server and runs episodes on it.

One episode: reset, then up to `max_turns` turns of observe -> prompt -> generate -> parse action -> step.
A batch of episodes runs concurrently, one server session each, and each turn's generation is one batched
call over the episodes still running.

An episode is kept as one token sequence, exactly as the policy saw and wrote it: the first prompt, then
for each turn the sampled reply followed by the environment's next message, rendered with the chat
template and never re-tokenized. `env_mask` marks the sampled tokens (1) apart from the environment's (0),
so a trainer scores every reply against the very context it was sampled from.
"""

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from actions import describe_actions, parse_action
from env_server import TOKEN_VARIABLE, BrowserGymAction, BrowserGymObservation, BrowserGymState
from rewards import task_success

log = logging.getLogger("env_client")

SYSTEM_PROMPT = (
    "You control a web browser to complete a task. Each turn you get the page as an accessibility tree, "
    "where [N] is the id (bid) of an element. Reply with exactly one action.\n\n" + describe_actions()
)

# Token ids of the contexts to continue -> (sampled token ids, their log-probabilities), one per context.
GenerateFn = Callable[[list[list[int]]], tuple[list[list[int]], list[list[float]]]]


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


class ChatTurns:
    """Renders the conversation of an episode into token ids with the model's own chat template."""

    def __init__(self, tokenizer, max_page_chars: int = 2000):
        self.tokenizer = tokenizer
        self.max_page_chars = max_page_chars
        # What the template writes after an assistant reply ends, found by rendering one: with the reply's
        # end-of-turn token already sampled by the model, only the rest of it is the environment's.
        reply = "\x00reply\x00"
        self._probe = [{"role": "user", "content": "goal"}, {"role": "assistant", "content": reply}]
        self._rendered_probe = self._render(self._probe)
        self._after_reply = self._rendered_probe[self._rendered_probe.rindex(reply) + len(reply) :]

    def first_prompt(self, observation: BrowserGymObservation) -> list[int]:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Goal: {observation.goal}\n\n{self.page(observation)}"},
        ]
        return self._encode(self._render(messages, add_generation_prompt=True))

    def next_turn(self, reply_ids: list[int], user_text: str) -> list[int]:
        """The tokens between one sampled reply and the next: end of the reply, user message, reply header."""
        with_user = self._render(self._probe + [{"role": "user", "content": user_text}], add_generation_prompt=True)
        opening = with_user[len(self._rendered_probe) :]
        closing = self._after_reply
        eos = self.tokenizer.eos_token
        if reply_ids and reply_ids[-1] == self.tokenizer.eos_token_id and closing.startswith(eos):
            closing = closing[len(eos) :]
        return self._encode(closing + opening)

    def page(self, observation: BrowserGymObservation) -> str:
        text = observation.axtree_txt or observation.text
        if len(text) > self.max_page_chars:
            text = text[: self.max_page_chars] + "\n[... page truncated]"
        return f"Page:\n{text}"

    def _render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def feedback(turn: int, action: str | None, observation: BrowserGymObservation, cut_off: bool = False) -> str:
    """What became of the turn's action, which opens the next user message (the page follows it)."""
    if cut_off:
        outcome = "Your reply was cut off before it ended, so nothing was done. Reply with one short action."
    elif action is None:
        outcome = "Your reply contained no valid action. Reply with exactly one action, for example click('12')."
    elif observation.error:
        outcome = f"Action {action} failed: {observation.error.strip()[:500]}"
    else:
        outcome = f"Action {action} done."
    return f"Step {turn + 1}. {outcome}"


@dataclass
class Episode:
    task_name: str
    seed: int
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    actions: list[str | None] = field(default_factory=list)
    done: bool = False
    env_reward: float = 0.0
    first_observation: BrowserGymObservation | None = None
    observation: BrowserGymObservation | None = None

    @property
    def turns(self) -> int:
        return len(self.actions)

    @property
    def solved(self) -> bool:
        return task_success(None, [self.done], [self.env_reward]) == [1.0]

    def context(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    def add_reply(self, ids: list[int], logprobs: list[float]) -> None:
        self.completion_ids += ids
        self.env_mask += [1] * len(ids)
        self.logprobs += logprobs

    def add_environment(self, ids: list[int]) -> None:
        self.completion_ids += ids
        self.env_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)


class EnvironmentFailure(Exception):
    """The environment failed, not the policy: the server is gone, did not answer in time, or answered with an
    error. The batch's episodes are incomplete and must not be scored."""


class EpisodeRunner:
    """Runs batches of episodes against one environment server, keeping a WebSocket session per slot.

    The sessions live on one private event loop, so they persist from batch to batch. With `screenshots`,
    every observation carries the page's pixels. If the environment fails, `run` drops the sessions (the
    next run opens new ones) and raises EnvironmentFailure.
    """

    def __init__(
        self,
        base_url: str,
        tokenizer,
        max_turns: int = 10,
        max_page_chars: int = 2000,
        screenshots: bool = False,
        token: str | None = None,
        timeout_s: float = 120.0,
    ):
        self.base_url = base_url
        self.max_turns = max_turns
        self.screenshots = screenshots
        self.token = token
        self.timeout_s = timeout_s
        self.chat = ChatTurns(tokenizer, max_page_chars)
        self._loop = asyncio.new_event_loop()
        self._clients: list[BrowserGymEnv] = []

    def run(self, specs: list[tuple[str, int]], generate: GenerateFn) -> list[Episode]:
        """Plays one episode per (task_name, seed) and returns them in the same order."""
        try:
            return self._loop.run_until_complete(self._run(specs, generate))
        except EnvironmentFailure:
            self._loop.run_until_complete(self._drop_sessions())
            raise

    def close(self) -> None:
        self._loop.run_until_complete(self._drop_sessions())
        self._loop.close()

    async def _drop_sessions(self) -> None:
        clients, self._clients = self._clients, []

        async def drop(client: BrowserGymEnv) -> None:
            with contextlib.suppress(Exception):  # a dead or hung server cannot answer; the socket closes anyway
                await asyncio.wait_for(client.close(), timeout=10)

        await asyncio.gather(*(drop(client) for client in clients))

    async def _environment(self, *calls):
        """Awaits calls to the server together; any failure of theirs is the environment's."""
        try:
            return await asyncio.gather(*calls)
        except (ConnectionError, ConnectionClosed, OSError, RuntimeError) as e:  # TimeoutError is an OSError
            raise EnvironmentFailure(f"{type(e).__name__}: {e}".strip()) from e

    async def _run(self, specs: list[tuple[str, int]], generate: GenerateFn) -> list[Episode]:
        clients = await self._sessions(len(specs))
        episodes = [Episode(task_name, seed) for task_name, seed in specs]
        options = {"screenshot": True} if self.screenshots else {}
        results = await self._environment(
            *(client.reset(task_name=ep.task_name, seed=ep.seed, **options) for client, ep in zip(clients, episodes))
        )
        for ep, result in zip(episodes, results):
            ep.first_observation = ep.observation = result.observation
            ep.prompt_ids = self.chat.first_prompt(result.observation)

        for turn in range(self.max_turns):
            running = [i for i, ep in enumerate(episodes) if not ep.done]
            if not running:
                break
            reply_ids, reply_logprobs = generate([episodes[i].context() for i in running])
            replies = self.chat.tokenizer.batch_decode(reply_ids, skip_special_tokens=True)
            # A reply cut off by the length limit is not acted on, even if it began with an action: otherwise
            # the policy is rewarded for never ending its replies.
            cut_off = [not ids or ids[-1] != self.chat.tokenizer.eos_token_id for ids in reply_ids]
            actions = [None if cut else parse_action(text) for text, cut in zip(replies, cut_off)]
            steps = await self._environment(
                *(
                    clients[i].step(BrowserGymAction(action_str=action))
                    for i, action in zip(running, actions)
                    if action is not None
                )
            )
            stepped = iter(steps)
            for i, ids, logprobs, text, action, cut in zip(running, reply_ids, reply_logprobs, replies, actions, cut_off):
                ep = episodes[i]
                ep.add_reply(ids, logprobs)
                ep.replies.append(text)
                ep.actions.append(action)
                if action is not None:
                    result = next(stepped)
                    ep.observation, ep.done = result.observation, result.done
                    ep.env_reward = float(result.reward or 0.0)
                if not ep.done and turn + 1 < self.max_turns:
                    message = f"{feedback(turn, action, ep.observation, cut)}\n\n{self.chat.page(ep.observation)}"
                    ep.add_environment(self.chat.next_turn(ids, message))
        return episodes

    async def _sessions(self, count: int) -> list[BrowserGymEnv]:
        while len(self._clients) < count:
            client = BrowserGymEnv(self.base_url, token=self.token, message_timeout_s=self.timeout_s)
            await self._environment(client.connect())
            self._clients.append(client)
        return self._clients[:count]
