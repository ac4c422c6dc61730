"""Record demonstrations: episodes played by the scripted experts (warm_start.experts), a weak start's mix of right
and wrong replies by the scripted plans (warm_start.plans), or a model's own sampled episodes (`--sampled_by`: filtered
behaviour cloning, the warm-up then learns its successes), written as a demonstrations file (warm_start.demonstrations)
with the episode settings they were played with in every row.

    python -m warm_start.record --config configs/warm_up/book_flight.yaml --tasks book-flight --episodes 500

The file's path is `demonstrations`, the tokenizer the episodes are rendered with is the policy's
(`model_name_or_path`): a warm-up file holds both, and warm_start.warm_up then reads the same file. Seeds start at
2,000,000, apart from training's and evaluation's.
"""

import contextlib
import logging
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from functools import partial

from transformers import AutoTokenizer

from browser_rl import episode_settings
from browser_rl.agent import load_agent
from browser_rl.command_line import parse_command_line, run_command
from browser_rl.command_options import RecordArguments
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.errors import MAX_ENV_FAILURES, ConfigError
from browser_rl.model_source import resolve_model
from browser_rl.options import EpisodeArguments, ModelOptions, ServerArguments, TaskArguments
from browser_rl.rollout import EpisodeRunner, Policy
from browser_rl.servers import ServerPool, open_server_pool
from browser_rl.tasks import TaskInstance
from env_client import LocalEnvServer
from warm_start.demonstrations import Demonstration, of_episode, save
from warm_start.experts import Expert, expert_policy, known_experts
from warm_start.plans import PLANS, REPLY_MIXES, ReplyMix, choosing, plan

log = logging.getLogger("record")

OPTIONS = (RecordArguments, TaskArguments, EpisodeArguments, ServerArguments, ModelOptions)
BATCH = 16  # episodes played at once


def record(
    runner: EpisodeRunner, instances: list[TaskInstance], policy_for_batch: Callable[[], Policy]
) -> list[Demonstration]:
    """Plays (task, seed) episodes on `runner`'s sessions, BATCH at a time, each batch with a policy
    `policy_for_batch` makes, and keeps each as a demonstration of the settings it was played with."""
    demonstrations = []
    for start in range(0, len(instances), BATCH):
        episodes = runner.run_until_played(instances[start : start + BATCH], policy_for_batch())
        demonstrations += [of_episode(episode, runner.settings) for episode in episodes]
        log.info("recorded %d of %d episodes", len(demonstrations), len(instances))
    return demonstrations


def record_experts(
    runner: EpisodeRunner, instances: list[TaskInstance], experts: dict[str, Expert]
) -> list[Demonstration]:
    """The episodes of `experts` (by task), each reading the page as the runner's prompt shows it to the policy."""
    return record(runner, instances, partial(expert_policy, runner.chat, experts))


def record_mix(
    servers: ServerPool,
    tokenizer,
    task: str,
    seeds: range,
    replies: ReplyMix,
    settings: EpisodeSettings,
    max_env_failures: int = MAX_ENV_FAILURES,
) -> list[Demonstration]:
    """Each seed's episodes in `replies`'s mix of right and wrong replies: the j-th writes the j-th reply at every
    step of the plan and ends there, whether it solved the instance or not (load them with keep_failed). An episode
    that ends there renders as one that ran out of turns: each is a demonstration under `settings`."""
    instances = [(task, seed) for seed in seeds]
    with closing(EpisodeRunner(servers, tokenizer, settings, True, max_env_failures)) as runner:
        right = record(runner, instances, partial(choosing, tokenizer, replies, 0))
    task_plan = plan(task, right[0].goal, right[0].turns[0].page)
    steps, count = len(task_plan.right), len(replies(task_plan, 0))
    if steps > settings.max_turns:
        raise ConfigError(f"max_turns: {task}'s plan takes {steps} actions, more than max_turns {settings.max_turns}")
    ending_there = replace(settings, max_turns=steps)
    with closing(EpisodeRunner(servers, tokenizer, ending_there, True, max_env_failures)) as runner:
        mixed = [record(runner, instances, partial(choosing, tokenizer, replies, j)) for j in range(1, count)]
    return right + [d.model_copy(update={"settings": settings}) for of_reply in mixed for d in of_reply]


def main(argv: list[str] | None = None) -> None:
    record_demonstrations(*parse_command_line(OPTIONS, argv))


def record_demonstrations(
    args: RecordArguments,
    tasks: TaskArguments,
    episodes: EpisodeArguments,
    servers: ServerArguments,
    model_args: ModelOptions,
    new_server: Callable = LocalEnvServer,
) -> None:
    """Plays and writes the demonstrations, on servers made by `new_server` (open_server_pool's; modal_app.py's are
    Modal sandboxes)."""
    scripted = PLANS if args.replies else known_experts(tasks.task_modules)
    if args.replies is not None and args.replies not in REPLY_MIXES:
        raise ConfigError(f"replies: {args.replies!r} is not one of {', '.join(sorted(REPLY_MIXES))}")
    missing = sorted(set(tasks.task_weights()) - set(scripted))
    if missing and not args.sampled_by:
        raise ConfigError(f"tasks: no {'scripted plan' if args.replies else 'expert'} for {', '.join(missing)}")
    if not model_args.model_name_or_path:
        raise ConfigError("model_name_or_path: the policy whose tokenizer renders the episodes")
    # A model's own episodes, each batch sampled as evaluate.py samples (a fresh turn cache a batch).
    own = load_agent(args.sampled_by, "sampled_by", args.temperature, args.max_new_tokens) if args.sampled_by else None
    made_with = own.made_with if own else None
    settings = episode_settings.resolve(episodes, made_with, args.sampled_by or args.demonstrations).settings
    policy = resolve_model(model_args.model_name_or_path, "model_name_or_path")  # a .gguf file: its checkpoint
    tokenizer = AutoTokenizer.from_pretrained(policy, revision=model_args.model_revision)
    seeds = range(args.first_seed, args.first_seed + args.episodes)
    log.info("recording with %s", settings.describe())
    with contextlib.ExitStack() as stack:
        pool = open_server_pool(stack, servers, BATCH, tasks.task_modules, new_server)
        if args.replies:
            mix = REPLY_MIXES[args.replies]
            demonstrations = [
                d
                for task in tasks.task_weights()
                for d in record_mix(pool, tokenizer, task, seeds, mix, settings, servers.max_env_failures)
            ]
        else:
            instances = [(task, seed) for task in tasks.task_weights() for seed in seeds]
            runner = stack.enter_context(
                closing(EpisodeRunner(pool, tokenizer, settings, max_env_failures=servers.max_env_failures))
            )
            if own is None:
                demonstrations = record_experts(runner, instances, scripted)
            else:
                demonstrations = record(runner, instances, own.policy)
    save(demonstrations, args.demonstrations)
    solved_count = sum(d.solved for d in demonstrations)
    print(f"{len(demonstrations)} episodes ({solved_count} solved) written to {args.demonstrations}")


if __name__ == "__main__":
    run_command("warm_start.record", main)
