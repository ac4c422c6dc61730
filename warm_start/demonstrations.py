"""Demonstrations: recorded episodes that a policy is fine-tuned on before RL (warm_up.py).

A demonstrations file is JSON lines, one episode per line, in format version 1:

    {"version": 1, "task": "enter-text", "seed": 2000000, "goal": "Enter \\"Kay\\" into the text field ...",
     "turns": [{"page": "<accessibility tree>", "reply": "fill('14', 'Kay')", "error": ""}, ...],
     "done": true, "reward": 0.87}

Each turn holds the page the policy was shown before replying (BrowserGym's `axtree_txt`, as the server sent it:
the prompt compacts and cuts it), the reply as written, the error its action raised ("" if none) and, optionally,
`"ended": false` for a reply the length limit cut off. `done` and
`reward` are the environment's at the end; an episode is a success when `rewards.solved` says so. Bad rows fail the
load, each named by its line.

For fine-tuning, an episode is rendered by rollout.py's own functions (`begin`, `add_reply`, `add_outcome`), so its
tokens are those the policy would have seen and written had it played the episode: one row per episode, the loss on
the replies only, each reply ended by the end-of-turn token.

    python demonstrations.py --tasks book-flight enter-text --episodes 100 --output demos.jsonl   # experts.py
    python demonstrations.py --tasks click-test --episodes 16 --replies one_right_of_eight --output weak.jsonl
"""

import argparse
import contextlib
import logging
from contextlib import closing
from pathlib import Path
from typing import Literal

from datasets import Dataset
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from arguments import EnvArguments
from env_client import ServerPool, open_server_pool
from experts import EXPERTS, expert_policy
from generation import Reply, written
from metrics import setup_logging
from prompts import ChatTurns
from rewards import solved
from rollout import Episode, EpisodeRunner, Policy, add_outcome, add_reply, begin
from scripted_policy import PLANS, REPLY_MIXES, Replies, choosing, plan
from tiny_lfm2 import build_tokenizer
from web_env.models import MINIWOB_TASKS, BrowserGymObservation

log = logging.getLogger("demonstrations")

FORMAT_VERSION = 1
# Seeds of recorded demonstrations start here: apart from training's (0 .. num_task_seeds - 1) and evaluation's
# (evaluate.py: from 1,000,000), so that no evaluated instance was ever demonstrated.
FIRST_SEED = 2_000_000
MAX_TURNS = 10  # an expert's episode ends before this


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
    reward: float

    @field_validator("task")
    @classmethod
    def known_task(cls, task: str) -> str:
        if task not in MINIWOB_TASKS:
            raise ValueError(f"unknown MiniWoB task {task!r}")
        return task

    @property
    def solved(self) -> bool:
        return solved(self.done, self.reward)


class DemonstrationsError(ValueError):
    """A demonstrations file that cannot be used, with every bad row named by its line."""


def of_episode(episode: Episode) -> Demonstration:
    """A played episode as a demonstration."""
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
    )


def save(demonstrations: list[Demonstration], path: str | Path) -> None:
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


def where(location: tuple) -> str:
    """A pydantic error location as a path (`turns[1].reply: `); empty for the row itself (a JSON error)."""
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location).lstrip(".")
    return f"{path}: " if path else ""


def replay(demonstration: Demonstration, chat: ChatTurns) -> Episode:
    """The demonstration as the episode rollout.py would have built had a policy played it: the same calls, the
    same tokens."""
    episode = Episode(demonstration.task, demonstration.seed)
    turns = demonstration.turns
    begin(episode, chat, BrowserGymObservation(goal=demonstration.goal, axtree_txt=turns[0].page))
    for number, turn in enumerate(turns):
        reply = written(chat.tokenizer, turn.reply)
        if not turn.ended:
            reply = Reply(reply.ids[:-1], reply.logprobs[:-1], ended=False)
        add_reply(episode, chat, reply)
        last = number + 1 == len(turns)
        page = turn.page if last else turns[number + 1].page
        after = BrowserGymObservation(goal=demonstration.goal, axtree_txt=page, error=turn.error)
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


def record(runner: EpisodeRunner, specs: list[tuple[str, int]], policy: Policy, batch: int = 16) -> list[Demonstration]:
    """Plays (task, seed) episodes with `policy` on `runner`'s sessions, `batch` at a time, and keeps each as a
    demonstration."""
    demonstrations = []
    for start in range(0, len(specs), batch):
        episodes = runner.run_until_played(specs[start : start + batch], policy, None, max_failures=3)
        demonstrations += [of_episode(episode) for episode in episodes]
        log.info("recorded %d of %d episodes", len(demonstrations), len(specs))
    return demonstrations


def record_mix(servers: ServerPool, tokenizer, task: str, seeds: range, replies: Replies) -> list[Demonstration]:
    """Each seed's episodes in `replies`'s mix of right and wrong replies: the j-th writes the j-th reply at every
    step of the plan and ends there, whether it solved the instance or not (load them with keep_failed)."""
    specs = [(task, seed) for seed in seeds]
    with closing(EpisodeRunner(servers, tokenizer, EnvArguments(max_turns=MAX_TURNS, lockstep=True))) as runner:
        right = record(runner, specs, choosing(tokenizer, replies, 0))
    task_plan = plan(task, right[0].goal, right[0].turns[0].page)
    steps, count = len(task_plan.right), len(replies(task_plan, 0))
    with closing(EpisodeRunner(servers, tokenizer, EnvArguments(max_turns=steps, lockstep=True))) as runner:
        mixed = [record(runner, specs, choosing(tokenizer, replies, j)) for j in range(1, count)]
    return right + [demonstration for of_reply in mixed for demonstration in of_reply]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Record demonstrations of MiniWoB tasks by the scripted experts.")
    parser.add_argument(
        "--tasks", nargs="+", required=True, choices=sorted({*EXPERTS, *PLANS}), metavar="TASK", help="MiniWoB tasks"
    )
    parser.add_argument("--episodes", type=int, default=100, help="seeds per task")
    parser.add_argument("--first_seed", type=int, default=FIRST_SEED)
    parser.add_argument("--max_turns", type=int, default=MAX_TURNS)
    parser.add_argument("--max_page_chars", type=int, default=2000, help="the page the experts read, as training's")
    parser.add_argument("--settle_ms", type=int, help="wait after each action before observing; default: the server's")
    parser.add_argument(
        "--replies",
        choices=sorted(REPLY_MIXES),
        help="a weak start's mix of right and wrong replies by the scripted plans, every episode kept",
    )
    parser.add_argument("--env_url", nargs="*", default=[], help="environment servers to use; none: start one")
    parser.add_argument("--output", required=True, help="the JSON-lines file to write")
    args = parser.parse_args(argv)
    scripted = PLANS if args.replies else EXPERTS
    if missing := sorted(set(args.tasks) - set(scripted)):
        parser.error(f"no {'scripted plan' if args.replies else 'expert'} for {', '.join(missing)}")
    return args


def main() -> None:
    setup_logging()
    args = parse_args()
    # The experts write text and the file keeps text: any tokenizer carries the replies through the episode loop.
    tokenizer = build_tokenizer()
    seeds = range(args.first_seed, args.first_seed + args.episodes)
    env = EnvArguments(max_turns=args.max_turns, max_page_chars=args.max_page_chars, settle_ms=args.settle_ms)
    with contextlib.ExitStack() as stack:
        servers = open_server_pool(stack, EnvArguments(env_url=args.env_url, env_servers=1), max_sessions=16)
        if args.replies:
            mix = REPLY_MIXES[args.replies]
            demonstrations = [d for task in args.tasks for d in record_mix(servers, tokenizer, task, seeds, mix)]
        else:
            specs = [(task, seed) for task in args.tasks for seed in seeds]
            runner = stack.enter_context(closing(EpisodeRunner(servers, tokenizer, env)))
            demonstrations = record(runner, specs, expert_policy(ChatTurns(tokenizer, env.max_page_chars)))
    save(demonstrations, args.output)
    solved_count = sum(d.solved for d in demonstrations)
    print(f"{len(demonstrations)} episodes ({solved_count} solved) written to {args.output}")


if __name__ == "__main__":
    main()
