"""The agent loop: how a language model plays MiniWoB episodes, and the token stream GRPO trains on.

One episode: reset, then up to `max_turns` turns of observe -> prompt -> generate -> parse action -> step.
A batch of episodes runs concurrently, one server session each, and each episode advances on its own: when its
browser answers, its next context joins the next batched generation while the others are still in their browsers.

An episode is kept as one token sequence, exactly as the policy saw and wrote it: the first prompt, then
for each turn the sampled reply followed by the environment's next message, rendered with the chat
template and never re-tokenized. `env_mask` marks the sampled tokens (1) apart from the environment's (0),
so a trainer scores every reply against the very context it was sampled from.
"""

import asyncio
import contextlib
import copy
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch
from websockets.exceptions import ConnectionClosed

from actions import describe_actions, parse_action
from env_client import BrowserGymEnv, ServerPool
from env_protocol import MINIWOB_TASKS, BrowserGymAction, BrowserGymObservation
from rewards import solved
from tasks import parse_tasks

log = logging.getLogger("rollout")


@dataclass
class EnvArguments:
    """Which tasks episodes play, on which server, and what the policy sees of them: shared by train.py and
    evaluate.py."""

    task_name: str = field(default="click-test", metadata={"help": "MiniWoB task, e.g. click-test, enter-text"})
    tasks: list[str] = field(
        default_factory=list,
        metadata={"help": "several tasks: names, name:weight, or presets (page-reading, all); empty: task_name"},
    )
    env_url: str | None = field(
        default=None, metadata={"help": "URL of an OpenEnv BrowserGym server; unset starts env_server.py locally"}
    )
    max_turns: int = field(default=10, metadata={"help": "actions per episode before it ends unsolved"})
    max_page_chars: int = field(default=2000, metadata={"help": "accessibility-tree characters shown per turn"})
    env_token: str | None = field(
        default=None, metadata={"help": "token of a server beyond loopback; default $BROWSER_RL_ENV_TOKEN"}
    )
    env_timeout_s: float = field(default=120.0, metadata={"help": "longest wait for one answer of the server"})

    def __post_init__(self):
        if self.task_name not in MINIWOB_TASKS:
            raise ValueError(f"task_name: unknown MiniWoB task {self.task_name!r}")
        self.task_weights()  # a mistake in the list fails here
        for name in ("max_turns", "max_page_chars", "env_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


    def task_weights(self) -> dict[str, float]:
        """{task: relative weight} of the tasks to play: `tasks`, or `task_name` alone."""
        return parse_tasks(self.tasks or [self.task_name])


SYSTEM_PROMPT = (
    "You control a web browser to complete a task. Each turn you get the page as an accessibility tree, "
    "where [N] is the id (bid) of an element. Reply with exactly one action.\n\n" + describe_actions()
)

@dataclass
class Reply:
    """One sampled reply: its tokens up to and including the first end-of-turn token, their log-probabilities,
    and whether it ended with that token rather than being cut off by the length limit."""

    ids: list[int]
    logprobs: list[float]
    ended: bool


# Token ids of the contexts to continue -> one sampled reply per context.
GenerateFn = Callable[[list[list[int]]], list[Reply]]


def until_end_of_turn(sampled: list[list[int]], logprobs: list[list[float]], eos_token_ids: list[int]) -> list[Reply]:
    """Each sample up to and including its first end-of-turn token. `eos_token_ids` are the ids generation
    stops on (TRL's `trainer.eos_token_ids`), so the same rule holds whichever engine sampled."""
    replies = []
    for ids, lps in zip(sampled, logprobs):
        end = next((i + 1 for i, token in enumerate(ids) if token in eos_token_ids), None)
        replies.append(Reply(ids[:end], lps[:end], ended=end is not None))
    return replies


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
            {"role": "user", "content": self.observation_message(observation)},
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

    def observation_message(self, observation: BrowserGymObservation, outcome: str | None = None) -> str:
        """A user message: what became of the last action, if any, then the page, then the goal. The goal comes
        last, every turn, so that the text a reply copies or matches from it sits just before the reply rather
        than behind one or more pages (a small model copies near text long before it learns to reach far)."""
        parts = [outcome] if outcome else []
        return "\n\n".join(parts + [self.page(observation), f"Goal: {observation.goal}"])

    def page(self, observation: BrowserGymObservation) -> str:
        text = compact_page(observation.axtree_txt or observation.text)
        if len(text) > self.max_page_chars:
            text = text[: self.max_page_chars] + "\n[... page truncated]"
        return f"Page:\n{text}"

    def _render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


# An InlineTextBox line repeats the text of the element above it, and a url property names the server's copy of
# the page (a file path on a local server): neither says anything the policy can act on, and together they were
# nearly half of a page's tokens. BrowserGym drops repeated StaticText the same way.
_REPEATED_TEXT = re.compile(r"^[ \t]*InlineTextBox '.*'\n?", re.MULTILINE)
_URL_PROPERTY = re.compile(r", url='[^'\n]*'")


def compact_page(axtree_txt: str) -> str:
    """The accessibility tree without its InlineTextBox lines and url properties."""
    return _URL_PROPERTY.sub("", _REPEATED_TEXT.sub("", axtree_txt)).rstrip("\n")


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
    out_of_context: bool = False  # ended because its context left no room for another reply
    first_observation: BrowserGymObservation | None = None
    observation: BrowserGymObservation | None = None

    @property
    def turns(self) -> int:
        return len(self.actions)

    @property
    def solved(self) -> bool:
        return solved(self.done, self.env_reward)

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

    def end_out_of_context(self) -> None:
        """Ends the episode unsolved, without the environment's message that no reply will answer."""
        while self.env_mask and self.env_mask[-1] == 0:
            self.completion_ids.pop()
            self.env_mask.pop()
            self.logprobs.pop()
        self.out_of_context = True


class EnvironmentFailure(Exception):
    """The environment failed, not the policy: a server is gone, did not answer in time, or answered with an
    error. The batch's episodes are incomplete and must not be scored."""

    def __init__(self, message: str, server: str | None = None):
        super().__init__(message)
        self.server = server


class ReplyBatcher:
    """Gathers the contexts of the episodes waiting for a reply into batches, one `generate` call at a time.

    In lock step a batch waits for every running episode, so each turn's generation waits for the slowest browser
    of the turn before. Otherwise a batch goes as soon as every running episode waits, or `wait_s` after its first
    context, whichever comes first: an episode whose browser answered early joins the next generation while others
    are still in their browsers. Either way a batch's contexts are in episode order, and generation runs on a
    worker thread, so that the browsers' answers keep coming in meanwhile.
    """

    def __init__(self, generate: GenerateFn, episodes: int, wait_s: float | None, executor: ThreadPoolExecutor):
        self.generate = generate
        self.running = episodes
        self.wait_s = wait_s  # None: lock step
        self.executor = executor
        self.waiting: dict[int, tuple[list[int], asyncio.Future]] = {}
        self._changed = asyncio.Event()

    async def reply(self, episode: int, context: list[int]) -> Reply:
        future = asyncio.get_running_loop().create_future()
        self.waiting[episode] = (context, future)
        self._changed.set()
        return await future

    def finished(self) -> None:
        self.running -= 1
        self._changed.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.running:
            await self._batch_ready()
            batch, self.waiting = sorted(self.waiting.items()), {}
            if not batch:
                continue
            work = loop.run_in_executor(self.executor, self.generate, [context for _, (context, _) in batch])
            try:
                replies = await asyncio.shield(work)
            except asyncio.CancelledError:
                await asyncio.wait([work])  # the episodes failed: let the generation in flight end first
                raise
            for (_, (_, future)), reply in zip(batch, replies, strict=True):
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
    """Runs batches of episodes on a pool of environment servers, keeping a WebSocket session per slot, spread
    over the servers up by how many sessions each holds.

    Each episode advances on its own (see ReplyBatcher; `lockstep` makes every turn wait for the whole batch).
    The sessions live on one private event loop, so they persist from batch to batch. With `screenshots`, every
    observation carries the page's pixels. If a server fails, `run` drops the sessions (the next run opens new
    ones), takes the server out of the pool's rotation and raises EnvironmentFailure. An episode whose context
    grows past `max_context_tokens` (the model's length less one reply) ends there, unsolved, and says so in the
    log: the engine would refuse it, and a shortened context is not what the trainer would score.
    """

    def __init__(
        self,
        servers: ServerPool,
        tokenizer,
        max_turns: int = 10,
        max_page_chars: int = 2000,
        screenshots: bool = False,
        token: str | None = None,
        timeout_s: float = 120.0,
        max_context_tokens: int | None = None,
        lockstep: bool = False,
        batch_wait_s: float = 0.05,
    ):
        self.servers = servers
        self.max_turns = max_turns
        self.max_context_tokens = max_context_tokens
        self.screenshots = screenshots
        self.token = token
        self.timeout_s = timeout_s
        self.batch_wait_s = None if lockstep else batch_wait_s
        self.chat = ChatTurns(tokenizer, max_page_chars)
        self._loop = asyncio.new_event_loop()
        self._generator = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
        self._sessions: list[tuple[BrowserGymEnv, str]] = []  # each session's client and server

    def run(self, specs: list[tuple[str, int]], generate: GenerateFn) -> list[Episode]:
        """Plays one episode per (task_name, seed) and returns them in the same order."""
        try:
            return self._loop.run_until_complete(self._run(specs, generate))
        except EnvironmentFailure as failure:
            self._loop.run_until_complete(self._drop_sessions())
            if failure.server is not None:
                self.servers.take_out(failure.server)
            raise

    def sessions_per_server(self) -> dict[str, int]:
        return {url: sum(server == url for _, server in self._sessions) for url in self.servers.urls}

    def close(self) -> None:
        self._loop.run_until_complete(self._drop_sessions())
        self._loop.close()
        self._generator.shutdown()

    async def _drop_sessions(self) -> None:
        sessions, self._sessions = self._sessions, []

        async def drop(client: BrowserGymEnv) -> None:
            with contextlib.suppress(Exception):  # a dead or hung server cannot answer; the socket closes anyway
                await asyncio.wait_for(client.close(), timeout=10)

        await asyncio.gather(*(drop(client) for client, _ in sessions))

    async def _environment(self, call, server: str):
        """Awaits a call to a server; any failure of it is the environment's."""
        try:
            return await call
        except (ConnectionError, ConnectionClosed, OSError, RuntimeError) as e:  # TimeoutError is an OSError
            raise EnvironmentFailure(f"{type(e).__name__}: {e}".strip(), server) from e

    async def _run(self, specs: list[tuple[str, int]], generate: GenerateFn) -> list[Episode]:
        sessions = await self._open_sessions(len(specs))
        episodes = [Episode(task_name, seed) for task_name, seed in specs]
        batcher = ReplyBatcher(generate, len(episodes), self.batch_wait_s, self._generator)
        try:
            async with asyncio.TaskGroup() as episodes_in_flight:
                episodes_in_flight.create_task(batcher.run())
                for index, (session, episode) in enumerate(zip(sessions, episodes)):
                    episodes_in_flight.create_task(self._play(index, episode, *session, batcher))
        except* EnvironmentFailure as failures:
            raise failures.exceptions[0] from None
        return episodes

    async def _play(self, index: int, episode: Episode, client: BrowserGymEnv, server: str, batcher) -> None:
        try:
            options = {"screenshot": True} if self.screenshots else {}
            reset = client.reset(task_name=episode.task_name, seed=episode.seed, **options)
            episode.first_observation = episode.observation = (await self._environment(reset, server)).observation
            episode.prompt_ids = self.chat.first_prompt(episode.observation)
            for turn in range(self.max_turns):
                if episode.done or self._end_if_out_of_context(episode):
                    break
                reply = await batcher.reply(index, episode.context())
                await self._take_turn(episode, turn, reply, client, server)
        finally:
            batcher.finished()

    async def _take_turn(self, episode: Episode, turn: int, reply: Reply, client: BrowserGymEnv, server: str) -> None:
        text = self.chat.tokenizer.decode(reply.ids, skip_special_tokens=True)
        # A reply cut off by the length limit is not acted on, even if it began with an action: otherwise the policy
        # is rewarded for never ending its replies.
        action = parse_action(text) if reply.ended else None
        episode.add_reply(reply.ids, reply.logprobs)
        episode.replies.append(text)
        episode.actions.append(action)
        if action is not None:
            result = await self._environment(client.step(BrowserGymAction(action_str=action)), server)
            episode.observation, episode.done = result.observation, result.done
            episode.env_reward = float(result.reward or 0.0)
        if not episode.done and turn + 1 < self.max_turns:
            outcome = feedback(turn, action, episode.observation, cut_off=not reply.ended)
            message = self.chat.observation_message(episode.observation, outcome)
            episode.add_environment(self.chat.next_turn(reply.ids, message))

    def _end_if_out_of_context(self, episode: Episode) -> bool:
        if self.max_context_tokens is None or len(episode.context()) <= self.max_context_tokens:
            return False
        log.warning(
            "%s seed %d ends unsolved after %d turns: its context of %d tokens leaves no room for a reply "
            "(at most %d; raise vllm_max_model_length or lower max_turns or max_page_chars)",
            episode.task_name, episode.seed, episode.turns, len(episode.context()), self.max_context_tokens,
        )  # fmt: skip
        episode.end_out_of_context()
        return True

    async def _open_sessions(self, count: int) -> list[tuple[BrowserGymEnv, str]]:
        """`count` sessions, opening what is missing on the servers up (all of them if none answers) that hold
        the fewest sessions."""
        if len(self._sessions) >= count:
            return self._sessions[:count]
        up = self.servers.up() or self.servers.urls
        while len(self._sessions) < count:
            server = min(up, key=lambda url: sum(url == held for _, held in self._sessions))
            client = BrowserGymEnv(server, token=self.token, message_timeout_s=self.timeout_s)
            await self._environment(client.connect(), server)
            self._sessions.append((client, server))
        spread = ", ".join(f"{url} x{n}" for url, n in self.sessions_per_server().items() if n)
        log.info("%d sessions on %d of %d environment servers: %s", count, len(up), len(self.servers.urls), spread)
        return self._sessions[:count]


def sample_replies(
    model, contexts: list[list[int]], generation_config, pad_token_id: int, eos_token_ids: list[int], temperature: float
) -> list[Reply]:
    """One batched `generate` over left-padded contexts, with each sampled token's log-probability under
    log_softmax(logits / temperature), the distribution the trainer scores (greedy decoding when temperature is
    0: log-probs at temperature 1)."""
    width = max(map(len, contexts))
    input_ids = torch.tensor([[pad_token_id] * (width - len(c)) + c for c in contexts], device=model.device)
    attention_mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=model.device)
    generation_config = copy.deepcopy(generation_config)
    generation_config.update(output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config)
    sampled = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1).float() / (temperature or 1.0)
    logprobs = logits.log_softmax(-1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    return until_end_of_turn(sampled.tolist(), logprobs.tolist(), eos_token_ids)


def episodes_by_task(episodes: list[Episode]) -> dict[str, list[Episode]]:
    """The episodes of each task, tasks in the order they first appear."""
    by_task: dict[str, list[Episode]] = {}
    for episode in episodes:
        by_task.setdefault(episode.task_name, []).append(episode)
    return by_task


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    replies = [action for e in episodes for action in e.actions]
    return {
        "episodes/success_rate": sum(e.solved for e in episodes) / len(episodes),
        "episodes/turns": len(replies) / len(episodes),
        "episodes/unparsed_share": sum(a is None for a in replies) / max(len(replies), 1),
        "episodes/out_of_context_share": sum(e.out_of_context for e in episodes) / len(episodes),
    } | {f"tasks/{task}/success_rate": sum(e.solved for e in of_task) / len(of_task) for task, of_task in episodes_by_task(episodes).items()}
