"""Measures a policy on MiniWoB tasks against the real environment.

    python evaluate.py --model outputs/lfm2-350m-click-test --episodes 50           # greedy
    python evaluate.py --model outputs/smoke --temperature 1.0 --screenshots true   # as sampled in training
    python evaluate.py --model outputs/multi --tasks page-reading                   # a suite: a per-task table

`--model` is a model directory or hub id, a checkpoint, or a LoRA adapter directory as `train.py --use_peft`
saves it. For each task (`--task_name`, or `--tasks` with names and presets as in training) it prints the
success rate with its 95% confidence interval, the mean number of turns of the solved episodes, and the share
of replies that held no valid action; for several tasks, as a table with the mean over tasks, and a chart
(success.png). Writes one JSON line per episode, a summary, and with --screenshots each episode's first and
last page as PNG, to --output_dir.

The seeds start at 1,000,000 by default, away from the seeds training uses (0 .. num_task_seeds - 1).
"""

import contextlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import HfArgumentParser

from arguments import EnvArguments
from env_client import ServerPool, open_server_pool
from generation import ModelUnavailable, load_policy, missing_model, model_generate
from metrics import episode_metrics, episodes_by_task, setup_logging
from rollout import Episode, EpisodeRunner, sampling

log = logging.getLogger("evaluate")

CHART_FILE = "success.png"


@dataclass
class EvalArguments:
    """What to evaluate and how; the task, server, turns and page length are EnvArguments', as in training."""

    model: str = field(metadata={"help": "model directory, hub id, checkpoint, or LoRA adapter directory"})
    episodes: int = field(default=50, metadata={"help": "episodes to run per task, one seed each"})
    first_seed: int = field(default=1_000_000, metadata={"help": "seed of the first episode; the rest follow"})
    temperature: float = field(default=0.0, metadata={"help": "0 for greedy decoding, else sampling temperature"})
    max_new_tokens: int = field(default=32, metadata={"help": "tokens per reply"})
    batch_size: int = field(default=16, metadata={"help": "episodes run at once"})
    output_dir: str | None = field(
        default=None, metadata={"help": "default: MODEL/eval-TASKS, or eval-NAME-TASKS (TASKS: the task or preset)"}
    )
    screenshots: bool = field(default=False, metadata={"help": "save each episode's first and last page as PNG"})
    seed: int = field(default=0, metadata={"help": "sampling seed"})


def default_output_dir(model: str, env: EnvArguments) -> str:
    tasks = env.tasks[0] if len(env.tasks) == 1 else "tasks" if env.tasks else env.task_name
    if Path(model).is_dir():
        return str(Path(model) / f"eval-{tasks}")
    return f"eval-{model.replace('/', '--')}-{tasks}"


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% confidence interval of a success rate; unlike p +- 1.96 sd it stays inside [0, 1] near 0% and 100%."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(episodes: list[Episode]) -> dict:
    solved = [e for e in episodes if e.solved]
    low, high = wilson_interval(len(solved), len(episodes))
    metrics = episode_metrics(episodes)
    return {
        "episodes": len(episodes),
        "solved": len(solved),
        "success_rate": metrics["episodes/success_rate"],
        "ci95": [low, high],
        "mean_turns_to_success": sum(e.turns for e in solved) / len(solved) if solved else None,
        "unparsed_share": metrics["episodes/unparsed_share"],
    }


def episode_record(index: int, episode: Episode) -> dict:
    return {
        "episode": index,
        "task_name": episode.task_name,
        "seed": episode.seed,
        "success": episode.solved,
        "reward": episode.env_reward,
        "turns": episode.turns,
        "replies": episode.replies,
        "actions": episode.actions,
        "last_error": episode.observation.error if episode.observation else "",
    }


def save_screenshots(index: int, episode: Episode, directory: Path) -> None:
    for name, observation in (("first", episode.first_observation), ("last", episode.observation)):
        if observation is not None and observation.screenshot is not None:
            pixels = np.asarray(observation.screenshot, dtype=np.uint8)
            Image.fromarray(pixels).save(directory / f"episode-{index:04d}-{name}.png")


def run_episodes(args: EvalArguments, env: EnvArguments, servers: ServerPool, model, tokenizer) -> list[Episode]:
    """args.episodes episodes of each task, on the same held-out seeds, in batches that mix tasks."""
    policy = sampling(model_generate(model, tokenizer, args.temperature, args.max_new_tokens))
    max_context_tokens = model.config.max_position_embeddings - args.max_new_tokens
    runner = EpisodeRunner(servers, tokenizer, env, screenshots=args.screenshots)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    episodes = []
    try:
        with open(output_dir / "episodes.jsonl", "w") as records:
            seeds = range(args.first_seed, args.first_seed + args.episodes)
            instances = [(task, seed) for task in env.task_weights() for seed in seeds]
            for start in range(0, len(instances), args.batch_size):
                for episode in runner.run(instances[start : start + args.batch_size], policy, max_context_tokens):
                    records.write(json.dumps(episode_record(len(episodes), episode)) + "\n")
                    if args.screenshots:
                        save_screenshots(len(episodes), episode, output_dir)
                    episode.first_observation = episode.observation = None  # screenshots are large
                    episodes.append(episode)
                records.flush()
                solved = sum(e.solved for e in episodes)
                log.info("%d/%d episodes, %d solved", len(episodes), len(instances), solved)
    finally:
        runner.close()
    return episodes


def evaluate(args: EvalArguments, env: EnvArguments) -> dict:
    """Runs the episodes (on env.env_url, else on local servers of its own) and returns the summary."""
    torch.manual_seed(args.seed)
    args.output_dir = args.output_dir or default_output_dir(args.model, env)
    model, tokenizer = load_policy(args.model)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        servers = open_server_pool(stack, env, max_sessions=args.batch_size)
        episodes = run_episodes(args, env, servers, model, tokenizer)
    settings = asdict(args) | {k: v for k, v in asdict(env).items() if k != "env_token"}  # the token is a secret
    tasks = {task: summarize(of_task) for task, of_task in episodes_by_task(episodes).items()}
    summary = summarize(episodes) | {
        "tasks": tasks,
        "mean_success_rate": sum(t["success_rate"] for t in tasks.values()) / len(tasks),
        "seconds": time.perf_counter() - start,
        "arguments": settings,
    }
    Path(args.output_dir, "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if len(tasks) > 1:
        plot_task_success(summary, Path(args.output_dir) / CHART_FILE)
    return summary


def plot_task_success(summary: dict, image_file: Path) -> Path:
    """One bar per task: its success rate with the 95% interval; the mean over tasks as a line."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    tasks = summary["tasks"]
    names = list(tasks)
    rates = [100 * tasks[t]["success_rate"] for t in names]
    below = [rate - 100 * tasks[t]["ci95"][0] for rate, t in zip(rates, names)]
    above = [100 * tasks[t]["ci95"][1] - rate for rate, t in zip(rates, names)]
    fig, axis = plt.subplots(figsize=(7, 0.4 * len(names) + 1.2))
    axis.barh(names, rates, xerr=[below, above], capsize=3, color="tab:blue", alpha=0.8)
    axis.axvline(100 * summary["mean_success_rate"], color="tab:red", lw=1, label="mean over tasks")
    axis.invert_yaxis()  # the table's order, top to bottom
    axis.set_xlim(0, 100)
    axis.set_xlabel(f"success rate, % (95% CI; {tasks[names[0]]['episodes']} episodes per task)")
    axis.set_title(summary["arguments"]["model"], fontsize="small")
    axis.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(image_file, dpi=100)
    plt.close(fig)
    return image_file


def task_table(summary: dict) -> str:
    rows = [f"  {'task':<24} {'success':>8}  {'95% CI':>11}  {'turns':>5}  {'no action':>9}"]
    for task, t in summary["tasks"].items():
        low, high = t["ci95"]
        turns = "-" if t["mean_turns_to_success"] is None else f"{t['mean_turns_to_success']:.2f}"
        rows.append(
            f"  {task:<24} {100 * t['success_rate']:7.1f}%  {100 * low:5.1f}-{100 * high:4.1f}%  "
            f"{turns:>5}  {100 * t['unparsed_share']:8.1f}%"
        )
    rows.append(f"  {'mean over tasks':<24} {100 * summary['mean_success_rate']:7.1f}%")
    return "\n".join(rows)


def report(summary: dict) -> str:
    args = summary["arguments"]
    decoding = f"temperature {args['temperature']}" if args["temperature"] else "greedy"
    if len(summary["tasks"]) > 1:
        return (
            f"{args['model']} on {len(summary['tasks'])} tasks ({args['episodes']} episodes each, {decoding}):\n"
            f"{task_table(summary)}\n  episodes, summary and chart ({CHART_FILE}) in {args['output_dir']}"
        )
    (task,) = summary["tasks"]
    low, high = summary["ci95"]
    turns = summary["mean_turns_to_success"]
    return (
        f"{args['model']} on {task} ({summary['episodes']} episodes, {decoding}):\n"
        f"  success rate  {100 * summary['success_rate']:.1f}% ({summary['solved']}/{summary['episodes']}),"
        f" 95% CI {100 * low:.1f}-{100 * high:.1f}%\n"
        f"  turns to success (mean)  {'-' if turns is None else f'{turns:.2f}'}\n"
        f"  replies without a valid action  {100 * summary['unparsed_share']:.1f}%\n"
        f"  episodes and summary in {args['output_dir']}"
    )


if __name__ == "__main__":
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.exit("evaluate.py runs as one process: start it with python, not torchrun or accelerate launch")
    setup_logging()
    eval_args, env_args = HfArgumentParser((EvalArguments, EnvArguments)).parse_args_into_dataclasses()
    if missing := missing_model(eval_args.model):
        sys.exit(f"evaluate.py: --model: {missing}")
    try:
        print(report(evaluate(eval_args, env_args)))
    except ModelUnavailable as error:
        sys.exit(f"evaluate.py: --model {error}")
