"""Demonstrations: recorded episodes that a policy is fine-tuned on before RL (warm_start.warm_up), as data.

A demonstrations file is JSON lines, one episode per line, in format version 1:

    {"version": 1, "task": "enter-text", "seed": 2000000, "goal": "Enter \"Kay\" into the text field ...",
     "turns": [{"page": "<accessibility tree>", "reply": "fill('14', 'Kay')", "error": ""}, ...],
     "done": true, "reward": 1.0, "raw_reward": 1.0,
     "settings": {"max_turns": 10, "max_page_chars": 2000, "settle_ms": 0, "prompt_version": 2}}

Bad rows fail the load, each named by its line; each field's meaning: docs/guide.md, "The demonstrations format". For
fine-tuning, an episode is rendered by browser_rl.episode's own calls, token for token as a rollout renders it.
"""

import logging
from dataclasses import fields
from pathlib import Path
from typing import Literal

import torch
from datasets import Dataset
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from browser_rl.episode import Episode, add_outcome, add_reply, begin
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.errors import DemonstrationsError
from browser_rl.generation import Reply, reply_of_text
from browser_rl.prompts import ChatTurns
from browser_rl.tasks import known_tasks
from rewards import solved
from web_env.models import BrowserGymObservation

log = logging.getLogger("demonstrations")

FORMAT_VERSION = 1


# Episode settings added after files were recorded without them, and the value those files were played with.
SINCE_ADDED = {"action_reference": True}


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    page: str = Field(description="the page the policy was shown before replying: BrowserGym's axtree_txt")
    reply: str = Field(description="the reply, as written")
    error: str = Field(default="", description="the error the reply's action raised; empty if none")
    ended: bool = Field(default=True, description="false: the reply was cut off by the length limit (not acted on)")


class Demonstration(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1]
    task: str
    seed: int = Field(ge=0)
    goal: str
    turns: list[Turn] = Field(min_length=1)
    done: bool
    reward: float = Field(description="the environment server's reward at the end")
    raw_reward: float | None = Field(default=None, description="the page's own reward at the end (rewards.py)")
    settings: EpisodeSettings | None = Field(default=None, description="the episode settings it was played with")

    @field_validator("task")
    @classmethod
    def known_task(cls, task: str) -> str:
        if task not in known_tasks():
            raise ValueError(f"unknown task {task!r} (a task of your own? name its module in task_modules)")
        return task

    @field_validator("settings", mode="before")
    @classmethod
    def every_setting(cls, settings):
        """Settings are all given or not at all: a default filled in would be a guess about what the policy saw. A
        setting added since a file was written is what every episode was played with before it existed."""
        if isinstance(settings, dict):
            settings = SINCE_ADDED | settings
        missing = [f.name for f in fields(EpisodeSettings) if isinstance(settings, dict) and f.name not in settings]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        return settings

    @property
    def solved(self) -> bool:
        return solved(self.task, self.done, self.reward, self.raw_reward)


def of_episode(episode: Episode, settings: EpisodeSettings) -> Demonstration:
    """A played episode as a demonstration, with the settings it was played with."""
    return Demonstration(
        version=FORMAT_VERSION,
        task=episode.task_name,
        seed=episode.seed,
        goal=episode.first_observation.goal,
        turns=[
            Turn(page=page, reply=reply, error=error, ended=ended)
            for page, reply, error, ended in zip(episode.pages, episode.replies, episode.errors, episode.ended)
        ],
        done=episode.done,
        reward=episode.env_reward,
        raw_reward=episode.raw_reward,
        settings=settings,
    )


def save(demonstrations: list[Demonstration], path: str | Path) -> None:
    """Writes the demonstrations as JSON lines, making the file's folder (outputs/demonstrations/ in a fresh clone)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as file:
        file.writelines(demonstration.model_dump_json() + "\n" for demonstration in demonstrations)


def load(path: str | Path, keep_failed: bool = False) -> list[Demonstration]:
    """The demonstrations in a file, the successful ones only unless `keep_failed`. Every bad row is reported."""
    demonstrations, errors = [], []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise DemonstrationsError(f"{path}: {error.strerror or error}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            demonstrations.append(Demonstration.model_validate_json(line))
        except ValidationError as error:
            errors += [f"{path} line {number}: {where(e['loc'])}{e['msg']}" for e in error.errors()]
    if errors:
        shown = "\n  ".join(errors[:20]) + (f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else "")
        raise DemonstrationsError(f"{len(errors)} error(s) in the demonstrations (format version 1):\n  {shown}")
    kept = [d for d in demonstrations if keep_failed or d.solved]
    if not kept:
        raise DemonstrationsError(f"{path}: no {'' if keep_failed else 'successful '}episode to learn from")
    log.info(
        "%d demonstrations from %s (%d unsuccessful ones left out)", len(kept), path, len(demonstrations) - len(kept)
    )
    return kept


def made_with(demonstrations: list[Demonstration], path: str | Path) -> EpisodeSettings | None:
    """The episode settings a file's episodes were played with; None where the file does not say."""
    said = {demonstration.settings for demonstration in demonstrations}
    if len(said) > 1:
        described = "; ".join("none said" if s is None else s.describe() for s in said)
        raise DemonstrationsError(f"{path}: its episodes were played with different episode settings ({described})")
    return said.pop() if said else None


def where(location: tuple) -> str:
    """A pydantic error location as a path (`turns[1].reply: `); empty for the row itself (a JSON error)."""
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location).lstrip(".")
    return f"{path}: " if path else ""


def replay(demonstration: Demonstration, chat: ChatTurns) -> Episode:
    """The demonstration as the episode browser_rl.rollout would have built had a policy played it: the same calls, the
    same tokens."""
    episode = Episode(demonstration.task, demonstration.seed)
    turns = demonstration.turns
    begin(episode, chat, BrowserGymObservation(goal=demonstration.goal, axtree_txt=turns[0].page))
    for number, turn in enumerate(turns):
        reply = reply_of_text(chat.tokenizer, turn.reply)
        if not turn.ended:
            reply = Reply(reply.ids[:-1], reply.logprobs[:-1], ended=False)
        add_reply(episode, chat, reply)
        last = number + 1 == len(turns)
        page = turn.page if last else turns[number + 1].page
        after = BrowserGymObservation(
            goal=demonstration.goal,
            axtree_txt=page,
            error=turn.error,
            metadata={"raw_reward": demonstration.raw_reward},
        )
        done, reward = (demonstration.done, demonstration.reward) if last else (False, 0.0)
        add_outcome(episode, chat, reply, after, done, reward, more_turns=not last)
    return episode


def sft_dataset(demonstrations: list[Demonstration], chat: ChatTurns, max_length: int) -> Dataset:
    """One row per episode (`input_ids`, and `completion_mask` on the replies), for TRL's SFTTrainer. An episode
    longer than `max_length` tokens is an error, not cut: a cut episode teaches replies to pages it never shows."""
    rows = {"input_ids": [], "completion_mask": []}
    too_long = []
    for demonstration in demonstrations:
        episode = replay(demonstration, chat)
        ids = episode.context()
        if len(ids) > max_length:
            too_long.append(f"{demonstration.task} seed {demonstration.seed}: {len(ids)} tokens")
        rows["input_ids"].append(ids)
        rows["completion_mask"].append(episode.reply_mask())
    if too_long:
        raise DemonstrationsError(
            f"{len(too_long)} episode(s) longer than {max_length} tokens (lower max_page_chars or raise max_length): "
            + "; ".join(too_long[:5])
        )
    return Dataset.from_dict(rows)


def reply_spans(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of reply tokens in an episode's mask."""
    spans, start = [], None
    for position, in_reply in enumerate([*mask, 0]):
        if in_reply and start is None:
            start = position
        elif not in_reply and start is not None:
            spans.append((start, position))
            start = None
    return spans


@torch.no_grad()
def reply_probabilities(model, chat: ChatTurns, demonstration: Demonstration) -> list[tuple[float, float]]:
    """(the whole reply's probability, its first token's) for each turn of the demonstration, as `model` gives them
    reading the demonstration as the warm-up trains on it: how far training moved a policy from its demonstrations
    (bench/drift.py)."""
    episode = replay(demonstration, chat)
    ids = torch.tensor([episode.context()])
    logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    targets = logprobs.gather(1, ids[0, 1:, None])[:, 0]  # position p predicts token p + 1
    return [
        (targets[start - 1 : end - 1].sum().exp().item(), targets[start - 1].exp().item())
        for start, end in reply_spans(episode.reply_mask())
    ]
