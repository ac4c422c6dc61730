"""The agent loop: how a policy plays episodes of web tasks (MiniWoB's, the workflows, a user's own) on the servers.

One episode: reset, then up to `max_turns` turns of observe -> prompt -> reply -> parse action -> step, kept as the
token stream GRPO trains on (browser_rl.episode). A batch of episodes runs concurrently, one server session each, and
each episode advances on its own: when its browser answers, it joins the next batch of episodes waiting for a reply
while the others are still in their browsers.
"""

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from websockets.exceptions import ConnectionClosed

from browser_rl.episode import Episode, add_outcome, add_reply, begin
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.errors import MAX_ENV_FAILURES, EnvironmentFailure, EnvironmentUnavailable
from browser_rl.generation import GenerateFn, Reply
from browser_rl.prompts import PROMPT_FIELDS, ChatTurns
from browser_rl.servers import ServerPool
from browser_rl.tasks import TaskInstance
from env_client import BrowserGymEnv
from web_env.models import BrowserGymAction

log = logging.getLogger("rollout")

# Outside lock step, a batch of episodes waiting for a reply goes this long after its first episode at most, so that
# an episode whose browser answered early joins the next generation without waiting for the slowest (ReplyBatcher).
BATCH_WAIT_S = 0.05


# The episodes waiting for a reply -> one reply each. A model's policy continues their token contexts
# (`model_policy`); a scripted one reads their observations (warm_start.plans).
Policy = Callable[[list[Episode]], list[Reply]]


def model_policy(generate: GenerateFn) -> Policy:
    """The policy of a model: `generate` continues each episode's token context."""
    return lambda episodes: generate([episode.context() for episode in episodes])


class ReplyBatcher:
    """Gathers the episodes waiting for a reply into batches, one policy call at a time.

    In lock step a batch waits for every running episode, so each turn's generation waits for the slowest browser
    of the turn before. Otherwise a batch goes as soon as every running episode waits, or `wait_s` after its first
    episode, whichever comes first: an episode whose browser answered early joins the next generation while others
    are still in their browsers. Either way a batch's episodes are in episode order, and the policy runs on a
    worker thread, so that the browsers' answers keep coming in meanwhile.
    """

    def __init__(self, policy: Policy, episodes: list[Episode], wait_s: float | None, executor: ThreadPoolExecutor):
        self.policy = policy
        self.episodes = episodes
        self.running = len(episodes)
        self.wait_s = wait_s  # None: lock step
        self.executor = executor
        self.waiting: dict[int, asyncio.Future] = {}
        self._changed = asyncio.Event()

    async def reply(self, index: int) -> Reply:
        future = asyncio.get_running_loop().create_future()
        self.waiting[index] = future
        self._changed.set()
        return await future

    def finished(self) -> None:
        self.running -= 1
        self._changed.set()

    def abandon(self) -> None:
        """An episode failed, and the run with it: what waits for a reply gets none, and the policy no batch (a
        generation started now would hold the failure back until it ended)."""
        self.running = 0
        self._changed.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.running:
            await self._batch_ready()
            if not self.running:  # every episode is over, or the run failed
                return
            batch, self.waiting = sorted(self.waiting.items()), {}
            work = loop.run_in_executor(self.executor, self.policy, [self.episodes[index] for index, _ in batch])
            try:
                replies = await asyncio.shield(work)
            except asyncio.CancelledError:
                await asyncio.wait([work])  # the episodes failed: let the generation in flight end first
                raise
            for (_, future), reply in zip(batch, replies, strict=True):
                future.set_result(reply)

    async def _batch_ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = None
        while self.running and len(self.waiting) < self.running:
            timeout = None
            if self.waiting and self.wait_s is not None:
                deadline = deadline or loop.time() + self.wait_s
                timeout = deadline - loop.time()
                if timeout <= 0:
                    return
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                return


class EpisodeRunner:
    """Runs batches of episodes on a pool of environment servers with the episode settings given (turns, page length,
    wait; browser_rl.episode_settings), keeping a WebSocket session per slot, spread over the servers up by how many
    sessions each holds.

    Each episode advances on its own (see ReplyBatcher). The sessions live on one private event loop, so they
    persist from batch to batch. A traced run's episodes keep each page's image and each action's element box
    (browser_rl.traces); an untraced one's cost the server nothing of the kind. If a server
    fails, `run` drops the sessions (the next run opens new ones), takes the server out of the pool's rotation
    and raises EnvironmentFailure.
    """

    def __init__(
        self,
        servers: ServerPool,
        tokenizer,
        settings: EpisodeSettings,
        lockstep: bool = False,
        max_env_failures: int = MAX_ENV_FAILURES,
    ):
        self.servers = servers
        self.settings = settings
        self.lockstep = lockstep
        self.max_env_failures = max_env_failures
        self.chat = ChatTurns(tokenizer, settings.max_page_chars, settings.action_reference)
        self._loop = asyncio.new_event_loop()
        self._policy_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy")
        self._sessions: list[tuple[BrowserGymEnv, str]] = []  # each session's client and server
        self._page_task: dict[BrowserGymEnv, str] = {}  # the task each session's page holds

    def run(
        self,
        instances: list[TaskInstance],
        policy: Policy,
        max_context_tokens: int | None = None,
        traced: bool = False,
        guide_turns: list[int] | None = None,
    ) -> list[Episode]:
        """Plays one episode per (task_name, seed) and returns them in the same order. An episode whose context
        grows past `max_context_tokens` (the engine's length less one reply) ends there, unsolved, and says so in
        the log: the engine would refuse it, and a shortened context is not what the trainer would score. Traced,
        the episodes keep their pages' images and their actions' boxes. `guide_turns`: each episode's first turns that
        the policy's guide plays (browser_rl.guidance), none by default."""
        turns = guide_turns or [0] * len(instances)
        episodes = [Episode(task, seed, guide_turns=k) for (task, seed), k in zip(instances, turns, strict=True)]
        try:
            return self._loop.run_until_complete(self._run(episodes, policy, max_context_tokens, traced))
        except EnvironmentFailure as failure:
            if failure.server is not None:  # first: restarting a server of this run ends its sockets, hung ones too,
                self.servers.take_out(failure.server)  # so that closing them does not wait out a handshake
            self._loop.run_until_complete(self._drop_sessions())
            raise

    def run_until_played(
        self,
        instances: list[TaskInstance],
        policy: Policy,
        max_context_tokens: int | None = None,
        traced: bool = False,
        guide_turns: list[int] | None = None,
    ) -> list[Episode]:
        """`run`, again from the start each time the environment fails, on the servers still up (or, with none up,
        once one is back): an episode the environment cut short says nothing about the policy, so it is never
        scored. After `max_env_failures` failures in a row, EnvironmentUnavailable."""
        for failure in itertools.count(1):
            try:
                return self.run(instances, policy, max_context_tokens, traced, guide_turns)
            except EnvironmentFailure as error:
                if failure > self.max_env_failures:
                    raise EnvironmentUnavailable(
                        f"the environment failed {failure}x in a row, last with {error}"
                    ) from error
                up = self.servers.up()
                log.warning(
                    "environment failure %d of at most %d (%s): running the batch's %d episodes again on %s",
                    failure,
                    self.max_env_failures,
                    error,
                    len(instances),
                    f"the {len(up)} server(s) still up" if up else "the servers once one answers",
                )
                if not up:
                    self.servers.wait_for_one()

    def sessions_per_server(self) -> dict[str, int]:
        return {url: sum(server == url for _, server in self._sessions) for url in self.servers.urls}

    def close(self) -> None:
        self._loop.run_until_complete(self._drop_sessions())
        self._loop.close()
        self._policy_thread.shutdown()

    async def _drop_sessions(self) -> None:
        sessions, self._sessions, self._page_task = self._sessions, [], {}

        async def drop(client: BrowserGymEnv) -> None:
            with contextlib.suppress(Exception):  # a dead or hung server cannot answer; the socket closes anyway
                await asyncio.wait_for(client.close(), timeout=10)

        await asyncio.gather(*(drop(client) for client, _ in sessions))

    async def _environment(self, call, server: str):
        """Awaits a call to a server; any failure of it is the environment's."""
        try:
            return await call
        except (ConnectionError, ConnectionClosed, OSError, RuntimeError) as e:  # TimeoutError is an OSError
            raise EnvironmentFailure(f"{type(e).__name__}: {e}".strip() + f" (server {server})", server) from e

    async def _run(self, episodes: list[Episode], policy: Policy, max_context_tokens: int | None, traced: bool):
        await self._open_sessions(len(episodes))
        sessions = self._sessions_for([episode.task_name for episode in episodes])
        batcher = ReplyBatcher(policy, episodes, None if self.lockstep else BATCH_WAIT_S, self._policy_thread)
        try:
            async with asyncio.TaskGroup() as episodes_in_flight:
                episodes_in_flight.create_task(batcher.run())
                for index, session in enumerate(sessions):
                    play = self._play(index, batcher, *session, max_context_tokens, traced)
                    episodes_in_flight.create_task(play)
        except* EnvironmentFailure as failures:
            raise failures.exceptions[0] from None
        return episodes

    async def _play(
        self,
        index: int,
        batcher: ReplyBatcher,
        client: BrowserGymEnv,
        server: str,
        max_context_tokens: int | None,
        traced: bool,
    ) -> None:
        episode = batcher.episodes[index]
        try:
            options = {"trace": True} if traced else {}
            reset = client.reset(
                task_name=episode.task_name,
                seed=episode.seed,
                fields=PROMPT_FIELDS,
                settle_ms=self.settings.settle_ms,
                **options,
            )
            begin(episode, self.chat, (await self._environment(reset, server)).observation)
            episode.restarted_in_page = episode.observation.metadata.get("restarted_in_page")
            self._page_task[client] = episode.task_name
            for turn in range(self.settings.max_turns):
                if episode.done or self._end_if_out_of_context(episode, max_context_tokens):
                    break
                reply = await batcher.reply(index)
                await self._take_turn(episode, turn, reply, client, server)
        except BaseException:  # its failure, or its cancellation by another episode's
            batcher.abandon()
            raise
        batcher.finished()

    async def _take_turn(self, episode: Episode, turn: int, reply: Reply, client: BrowserGymEnv, server: str) -> None:
        action = add_reply(episode, self.chat, reply)
        observation, done, reward = episode.observation, False, 0.0
        if action is not None:
            result = await self._environment(client.step(BrowserGymAction(action_str=action)), server)
            observation, done, reward = result.observation, result.done, float(result.reward or 0.0)
        add_outcome(episode, self.chat, reply, observation, done, reward, more_turns=turn + 1 < self.settings.max_turns)

    def _end_if_out_of_context(self, episode: Episode, max_context_tokens: int | None) -> bool:
        if max_context_tokens is None or len(episode.context()) <= max_context_tokens:
            return False
        log.warning(
            "%s seed %d ends unsolved after %d turns: its context of %d tokens leaves no room for a reply "
            "(at most %d: the model's context, or vLLM's vllm_max_model_length, less one reply; lower max_turns or "
            "max_page_chars)",
            episode.task_name,
            episode.seed,
            episode.turns,
            len(episode.context()),
            max_context_tokens,
        )
        episode.end_out_of_context()
        return True

    def _sessions_for(self, tasks: list[str]) -> list[tuple[BrowserGymEnv, str]]:
        """A session for each episode's task, preferring one whose page holds that task already: the server
        restarts an episode in the page it has loaded, at a fraction of the cost of loading one."""
        free, chosen = list(self._sessions), {}
        for index, task in enumerate(tasks):
            holding = next((session for session in free if self._page_task.get(session[0]) == task), None)
            if holding is not None:
                free.remove(holding)
                chosen[index] = holding
        return [chosen[index] if index in chosen else free.pop(0) for index in range(len(tasks))]

    async def _open_sessions(self, count: int) -> None:
        """At least `count` sessions, opening what is missing on the servers up (all of them if none answers) that
        hold the fewest sessions."""
        if len(self._sessions) >= count:
            return
        up = self.servers.up() or self.servers.urls
        while len(self._sessions) < count:
            server = min(up, key=lambda url: sum(url == held for _, held in self._sessions))
            client = self.servers.client(server)
            await self._environment(client.connect(), server)
            self._sessions.append((client, server))
        spread = ", ".join(f"{url} x{n}" for url, n in self.sessions_per_server().items() if n)
        log.info("%d sessions on %d of %d environment servers: %s", count, len(up), len(self.servers.urls), spread)
