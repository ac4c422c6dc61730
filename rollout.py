"""The agent loop: how a language model plays MiniWoB episodes, and the token stream GRPO trains on.

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
import copy
import logging
from dataclasses import dataclass, field
from typing import Callable

import torch
from websockets.exceptions import ConnectionClosed

from actions import describe_actions, parse_action
from env_client import BrowserGymEnv
from env_protocol import MINIWOB_TASKS, BrowserGymAction, BrowserGymObservation
from rewards import solved

log = logging.getLogger("rollout")


@dataclass
class EnvArguments:
    """Which tasks episodes play, on which server, and what the policy sees of them: shared by train.py and
    evaluate.py."""

    task_name: str = field(default="click-test", metadata={"help": "MiniWoB task, e.g. click-test, enter-text"})
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
        for name in ("max_turns", "max_page_chars", "env_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


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
    """The environment failed, not the policy: the server is gone, did not answer in time, or answered with an
    error. The batch's episodes are incomplete and must not be scored."""


class EpisodeRunner:
    """Runs batches of episodes against one environment server, keeping a WebSocket session per slot.

    The sessions live on one private event loop, so they persist from batch to batch. With `screenshots`,
    every observation carries the page's pixels. If the environment fails, `run` drops the sessions (the
    next run opens new ones) and raises EnvironmentFailure. An episode whose context grows past
    `max_context_tokens` (the model's length less one reply) ends there, unsolved, and says so in the log: the
    engine would refuse it, and a shortened context is not what the trainer would score.
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
        max_context_tokens: int | None = None,
    ):
        self.base_url = base_url
        self.max_turns = max_turns
        self.max_context_tokens = max_context_tokens
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
            running = [i for i, ep in enumerate(episodes) if not (ep.done or self._end_if_out_of_context(ep))]
            if not running:
                break
            replies = generate([episodes[i].context() for i in running])
            texts = self.chat.tokenizer.batch_decode([r.ids for r in replies], skip_special_tokens=True)
            # A reply cut off by the length limit is not acted on, even if it began with an action: otherwise
            # the policy is rewarded for never ending its replies.
            actions = [parse_action(text) if reply.ended else None for text, reply in zip(texts, replies)]
            steps = await self._environment(
                *(
                    clients[i].step(BrowserGymAction(action_str=action))
                    for i, action in zip(running, actions)
                    if action is not None
                )
            )
            stepped = iter(steps)
            for i, reply, text, action in zip(running, replies, texts, actions):
                ep = episodes[i]
                ep.add_reply(reply.ids, reply.logprobs)
                ep.replies.append(text)
                ep.actions.append(action)
                if action is not None:
                    result = next(stepped)
                    ep.observation, ep.done = result.observation, result.done
                    ep.env_reward = float(result.reward or 0.0)
                if not ep.done and turn + 1 < self.max_turns:
                    outcome = feedback(turn, action, ep.observation, cut_off=not reply.ended)
                    ep.add_environment(self.chat.next_turn(reply.ids, f"{outcome}\n\n{self.chat.page(ep.observation)}"))
        return episodes

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

    async def _sessions(self, count: int) -> list[BrowserGymEnv]:
        while len(self._clients) < count:
            client = BrowserGymEnv(self.base_url, token=self.token, message_timeout_s=self.timeout_s)
            await self._environment(client.connect())
            self._clients.append(client)
        return self._clients[:count]


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


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    replies = [action for e in episodes for action in e.actions]
    return {
        "episodes/success_rate": sum(e.solved for e in episodes) / len(episodes),
        "episodes/turns": len(replies) / len(episodes),
        "episodes/unparsed_share": sum(a is None for a in replies) / max(len(replies), 1),
        "episodes/out_of_context_share": sum(e.out_of_context for e in episodes) / len(episodes),
    }
