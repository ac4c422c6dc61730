"""Measuring a policy on web tasks against the real environment: what evaluate.py runs (its command line is there).

The model (browser_rl.model_source) plays with the episode settings it was trained with, on held-out seeds (from
1,000,000; training's are 0 .. num_task_seeds - 1), or on BrowserGym's MiniWoB benchmark as browsergym-experiments
defines it (`--benchmark`, `--split`; where this protocol differs, the report says so). Episodes are batched so that a
session keeps playing one task and restarts in its page; a batch the environment failed is played again, never
scored. Every episode is one JSON line, appended as it ends, so that a rerun plays only what is not yet recorded; the
summary, report and chart are browser_rl.evaluation_report's, the traces browser_rl.traces'. The log says after each
batch how many episodes are played and the time left, and within a batch at most once a minute which turns it is at.
"""

import contextlib
import importlib.metadata
import json
import logging
import subprocess
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from urllib.parse import urlparse

import torch
from tqdm import tqdm

from browser_rl import episode_settings
from browser_rl.agent import Agent, is_endpoint, load_agent
from browser_rl.command_options import EvalArguments
from browser_rl.episode import Episode
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.errors import ConfigError
from browser_rl.evaluation_report import (
    CHART_FILE,
    SUMMARY_FILE,
    plot_task_success,
    samples_per_seed,
    split_summaries,
    summarize,
)
from browser_rl.generation import Reply
from browser_rl.gguf import is_gguf
from browser_rl.metrics import grouped
from browser_rl.model_card import CARD_FILE, rewrite_model_card
from browser_rl.options import EpisodeArguments, ServerArguments, TaskArguments
from browser_rl.progress import on_a_terminal, time_left
from browser_rl.rollout import EpisodeRunner, Policy
from browser_rl.servers import open_server_pool
from browser_rl.tasks import TaskInstance, browsergym_benchmark
from browser_rl.traces import TRACES_DIR, episode_trace, traced_in_evaluation, write_trace, write_viewer
from env_client import LocalEnvServer, cpu_s_per_episode
from rewards import browsergym_solved
from web_env.models import miniwob_name

log = logging.getLogger("evaluate")

# BrowserGym's wait after each action before observing (BrowserEnv's pre_observation_delay, 0.5 s).
BROWSERGYM_SETTLE_MS = 500
# A batch of long episodes on a slow model plays for many minutes between the per-batch lines: how often it says
# where it is meanwhile.
PROGRESS_EVERY_S = 60.0
# Settings that change how episodes are run, not which ones or how they are played: a resumed evaluation may
# change them.
OPERATIONAL = {
    *("output_dir", "batch_size", "traces", "lockstep", "override_episode_settings"),
    *("max_env_failures", "env_url", "env_servers", "env_timeout_s"),
}
# Recorded with each evaluation: what its figures depend on besides the model.
PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "openenv",
    "browsergym-core",
    "browsergym-miniwob",
    "browsergym-experiments",
    "miniwob",
    "playwright",
)


def default_output_dir(model: str, benchmark: str | None, split: str | None, task_args: TaskArguments) -> str:
    tasks = task_args.tasks[0] if len(task_args.tasks) == 1 else "tasks" if task_args.tasks else task_args.task_name
    tasks = "-".join(filter(None, [benchmark, split])) or tasks
    if is_endpoint(model):  # the server's host and port
        return f"eval-{urlparse(model).netloc.replace(':', '-')}-{tasks}"
    if Path(model).is_dir():
        return str(Path(model) / f"eval-{tasks}")
    if is_gguf(model):  # beside the file
        return str(Path(model).with_name(f"{Path(model).stem}-eval-{tasks}"))
    return f"eval-{model.replace('/', '--')}-{tasks}"


def instances_to_play(args: EvalArguments, tasks: TaskArguments) -> tuple[list[TaskInstance], int | None]:
    """(task, seed) of every episode to play, and the benchmark's step limit: its own, as BrowserGym's objects give
    them (a task may hold a seed twice: BrowserGym draws five of 34 per task); or args.episodes seeds from
    args.first_seed for each of the tasks, and no limit of its own."""
    if args.benchmark is None:
        seeds = range(args.first_seed, args.first_seed + args.episodes)
        return [(task, seed) for task in tasks.task_weights() for seed in seeds for _ in range(args.samples)], None
    benchmark = browsergym_benchmark(args.benchmark, args.split)
    (max_steps,) = {env_args.max_steps for env_args in benchmark.env_args_list}
    return [(miniwob_name(a.task_name), a.task_seed) for a in benchmark.env_args_list], max_steps


def settings_to_play(agent: Agent, given: EpisodeArguments, benchmark_steps: int | None) -> episode_settings.Resolved:
    """The episode settings the agent is played with: those it was trained with, unless given otherwise on purpose;
    under a benchmark, its step limit, which the report then names beside the model's own."""
    resolved = episode_settings.resolve(given, agent.made_with, agent.name)
    if benchmark_steps is None or benchmark_steps == resolved.settings.max_turns:
        return resolved
    protocol = f"max_turns {benchmark_steps}, the benchmark's, not the {resolved.settings.max_turns} of the settings"
    return episode_settings.Resolved(
        replace(resolved.settings, max_turns=benchmark_steps), (*resolved.overridden, protocol)
    )


def batches_keeping_tasks(instances: list[TaskInstance], batch_size: int) -> list[list[TaskInstance]]:
    """The instances in batches of at most batch_size, each batch taking one episode from each of batch_size
    lanes; a lane holds one task's episodes, so that from batch to batch a session keeps its page's task and
    restarts in it (EpisodeRunner gives an episode the session whose page holds its task). A lane that runs dry
    takes the next task, or, with none left, half of the longest lane."""
    waiting = deque(deque(of_task) for of_task in grouped(instances, lambda i: i[0]).values())
    lanes: list[deque] = []
    batches = []
    while lanes or waiting:
        while len(lanes) < batch_size and waiting:
            lanes.append(waiting.popleft())
        while len(lanes) < batch_size and len(longest := max(lanes, key=len)) > 1:
            lanes.append(deque(reversed([longest.pop() for _ in range(len(longest) // 2)])))
        batches.append([lane.popleft() for lane in lanes])
        lanes = [lane for lane in lanes if lane]
    return batches


def batches_of_samples(instances: list[TaskInstance], batch_size: int, samples: int) -> list[list[TaskInstance]]:
    """batches_keeping_tasks, a seed's samples in one batch, so that they prefill their first page once
    (browser_rl.generation.TurnCachedGeneration)."""
    if samples == 1:
        return batches_keeping_tasks(instances, batch_size)
    repeats = Counter(instances)
    units = batches_keeping_tasks(list(repeats), max(1, batch_size // samples))
    return [[instance for instance in unit for _ in range(repeats[instance])] for unit in units]


def episode_record(episode: Episode) -> dict:
    return {
        "task_name": episode.task_name,
        "seed": episode.seed,
        "success": episode.solved,
        "browsergym_success": browsergym_solved(episode.done, episode.browsergym_reward),
        "reward": episode.env_reward,
        "raw_reward": episode.raw_reward,
        "turns": episode.turns,
        "replies": episode.replies,
        "actions": episode.actions,
        "last_error": episode.observation.error if episode.observation else "",
    }


def keep_trace(traces: str | None, output_dir: Path, index: int, episode: Episode, max_page_chars: int) -> None:
    """The episode's trace in OUTPUT_DIR/traces/TASK/, if --traces asks for it."""
    of_task = output_dir / TRACES_DIR / episode.task_name
    if traced_in_evaluation(traces, episode.solved, len(list(of_task.glob("*.json")))):
        trace = episode_trace(episode, max_page_chars, f"episode {index}")
        write_trace(trace, of_task / f"episode-{index:05d}-seed-{episode.seed}.json")


def recorded_episodes(output_dir: Path, settings: dict) -> list[dict]:
    """The episodes an earlier run of these settings recorded in output_dir, to resume after; a line cut off by
    a crash is dropped. Another evaluation's directory is refused rather than mixed in."""
    settings_file, episodes_file = output_dir / "settings.json", output_dir / "episodes.jsonl"
    earlier = json.loads(settings_file.read_text()) if settings_file.exists() else None
    if earlier and (differing := settings_not_resumable(earlier, settings)):
        raise ConfigError(
            f"{output_dir} holds an evaluation with other settings ({', '.join(differing)}):"
            " choose another --output_dir"
        )
    output_dir.mkdir(parents=True, exist_ok=True)
    settings_file.write_text(json.dumps(settings, indent=2) + "\n")
    records = []
    if episodes_file.exists():
        for line in episodes_file.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
        episodes_file.write_text("".join(json.dumps(record) + "\n" for record in records))
    return records


def settings_not_resumable(earlier: dict, settings: dict) -> list[str]:
    """The settings an evaluation recorded with `earlier` cannot go on with. More --episodes can: each task's
    seeds run on from --first_seed, so the episodes recorded are the first of the new run's."""
    differing = [k for k in settings if k not in OPERATIONAL and earlier.get(k) != settings[k]]
    if "episodes" in differing and settings["episodes"] > earlier["episodes"]:
        differing.remove("episodes")
    return differing


def model_files(model: str) -> list:
    """The files of a model directory, with their sizes and times: a model trained further in place is another
    model, whose evaluation must not resume an earlier one's. Its card is left out: every evaluation beside the model
    writes it again."""
    if not Path(model).is_dir():
        return []
    files = [f for f in sorted(Path(model).iterdir()) if f.is_file() and f.name != CARD_FILE]
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def still_to_play(instances: list[TaskInstance], records: list[dict]) -> list[TaskInstance]:
    played = Counter((r["task_name"], r["seed"]) for r in records)
    remaining = []
    for instance in instances:
        if played[instance]:
            played[instance] -= 1
        else:
            remaining.append(instance)
    return remaining


def reporting_progress(policy: Policy, recorded: int, total: int, batch_size: int, max_turns: int) -> Policy:
    """The policy, saying at most every PROGRESS_EVERY_S which turns the batch's episodes waiting for it are at."""
    last = time.monotonic()

    def policy_reporting(episodes: list[Episode]) -> list[Reply]:
        nonlocal last
        if time.monotonic() - last >= PROGRESS_EVERY_S:
            last = time.monotonic()
            first, furthest = min(e.turns for e in episodes) + 1, max(e.turns for e in episodes) + 1
            turns = f"{first}" if first == furthest else f"{first}-{furthest}"
            log.info(
                "%d/%d episodes; in the batch of %d, replying to %d at turn %s of at most %d",
                *(recorded, total, batch_size, len(episodes), turns, max_turns),
            )
        return policy(episodes)

    return policy_reporting


def run_episodes(
    args: EvalArguments,
    output_dir: Path,
    runner: EpisodeRunner,
    instances: list,
    records: list[dict],
    agent: Agent,
) -> None:
    """Plays the instances not yet in records, batch after batch, appending each played episode to records and
    to episodes.jsonl."""
    if records:
        log.info("resuming: %d of %d episodes recorded in %s", len(records), len(instances), output_dir)
    start, recorded_before = time.monotonic(), len(records)
    bar = tqdm(total=len(instances), initial=len(records), unit="episode", disable=not on_a_terminal())
    with open(output_dir / "episodes.jsonl", "a") as episodes_file, bar:
        for batch in batches_of_samples(still_to_play(instances, records), args.batch_size, args.samples):
            traced = args.traces is not None
            # A batch's episodes keep their caches from turn to turn, and drop them with the batch.
            policy = reporting_progress(
                agent.policy(), len(records), len(instances), len(batch), runner.settings.max_turns
            )
            for episode in runner.run_until_played(batch, policy, agent.max_context_tokens, traced):
                if traced:
                    keep_trace(args.traces, output_dir, len(records), episode, runner.settings.max_page_chars)
                records.append(episode_record(episode))
                episodes_file.write(json.dumps(records[-1]) + "\n")
            episodes_file.flush()
            if traced:
                write_viewer(output_dir, f"{args.model}: evaluation")
            bar.update(len(batch))
            solved = sum(r["success"] for r in records)
            played, to_play = len(records) - recorded_before, len(instances) - recorded_before
            elapsed = time_left(time.monotonic() - start, played, to_play)
            log.info("%d/%d episodes, %d solved; %s", len(records), len(instances), solved, elapsed)


def provenance() -> dict:
    """The commit of this checkout (with "+changes" if it has uncommitted ones) and the versions of the packages
    the figures depend on."""
    git = ["git", "-C", str(Path(__file__).parent)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    versions = {}
    for package in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return {"commit": (commit + "+changes" * bool(changed.stdout.strip())) or None, "packages": versions}


def protocol_differences(settings: EpisodeSettings) -> list[str]:
    """Where these episodes differ from BrowserGym's MiniWoB protocol."""
    waits = []
    if settings.settle_ms != BROWSERGYM_SETTLE_MS:
        waits = [f"a wait of {settings.settle_ms} ms before observing, where BrowserGym's is {BROWSERGYM_SETTLE_MS} ms"]
    return waits + [
        "a strict action parser, no retry with force (BrowserGym: strict=False, retry_with_force=True)",
        "a reply without a valid action uses up a step",
        f"the page as the compacted accessibility tree, cut at {settings.max_page_chars} characters (max_page_chars)",
        "bid actions only: no coordinate mouse actions",
    ]


def evaluate(
    args: EvalArguments,
    tasks: TaskArguments,
    episodes: EpisodeArguments,
    servers: ServerArguments,
    new_server: Callable = LocalEnvServer,
) -> dict:
    """Runs the episodes (on servers.env_url, else on servers of its own that `new_server` makes: local processes, or
    modal_app.py's sandboxes) and returns the summary."""
    if args.benchmark and tasks.tasks:
        raise ConfigError("--benchmark plays the benchmark's own tasks: leave --tasks out (--split keeps one split)")
    torch.manual_seed(args.seed)
    instances, benchmark_steps = instances_to_play(args, tasks)
    agent = load_agent(args.model, "--model", args.temperature, args.max_new_tokens, args.tokenizer)
    play = settings_to_play(agent, episodes, benchmark_steps)
    output_dir = Path(args.output_dir or default_output_dir(args.model, args.benchmark, args.split, tasks))
    settings = (
        asdict(args)
        | {"output_dir": str(output_dir)}
        | asdict(tasks)
        | asdict(episodes)
        | asdict(play.settings)
        | {k: v for k, v in asdict(servers).items() if k != "env_token"}  # the token is a secret
    )
    records = recorded_episodes(output_dir, settings | {"model_files": model_files(agent.source)})
    checkout = provenance()  # the code this run plays with: the checkout may move on during an hour's run
    start, played_before = time.perf_counter(), len(records)
    with contextlib.ExitStack() as stack:
        pool = open_server_pool(stack, servers, args.batch_size, tasks.task_modules, new_server)
        runner = EpisodeRunner(pool, agent.tokenizer, play.settings, episodes.lockstep, servers.max_env_failures)
        stack.callback(runner.close)
        cpu_before = pool.cpu_readings()
        run_episodes(args, output_dir, runner, instances, records, agent)
        cpu = cpu_s_per_episode(cpu_before, pool.cpu_readings())
    seconds = time.perf_counter() - start
    tasks = {task: summarize(of_task) for task, of_task in grouped(records, lambda r: r["task_name"]).items()}
    summary = (
        summarize(records)
        | {
            "splits": split_summaries(records),
            "tasks": tasks,
            "mean_success_rate": sum(t["success_rate"] for t in tasks.values()) / len(tasks),
            "seconds": seconds,
            "episodes_per_second": (len(records) - played_before) / seconds,
            "environment_cpu_s_per_episode": cpu,
            "protocol_differences": protocol_differences(play.settings) if args.benchmark else [],
            "episode_settings": asdict(play.settings),
            "overridden_settings": list(play.overridden),
            "headroom": samples_per_seed(records, args.samples),
            "seeds": [list(instance) for instance in instances],
            "arguments": settings,
        }
        | checkout
    )
    (output_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    if output_dir.parent == Path(args.model):  # beside the model: its card says so (browser_rl.model_card)
        rewrite_model_card(args.model)
    if len(tasks) > 1:
        plot_task_success(summary, output_dir / CHART_FILE)
    return summary
