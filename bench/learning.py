"""Proves that the recipe learns, on the CPU: a weak tiny LFM2, then GRPO alone, evaluated before and after.

    python bench/learning.py            # the benchmark: six page-reading tasks, curriculum against uniform, LoRA
    python bench/learning.py --start outputs/copying/model   # the same from an existing bench/copying.py model
    python bench/learning.py --quick    # the short version CI runs: click-test; fails unless success went up
    python bench/learning.py --quick --seed 1 --output_dir outputs/learning-1   # the same with another GRPO seed

1. A starting policy that is weak but not hopeless, built honestly (warm_start/weak_starts.py, through the warm-up
   of warm_start): a tiny LFM2 (warm_start/tiny_lfm2.py) is
   fine-tuned with TRL's SFTTrainer on real episodes of the tasks, played by their scripted plans: every turn's
   context is paired with the right action and valid wrong ones, in a mix that solves each task about a third
   of the time. The right action depends on the goal or the page (which button, which tab, which option, which
   box, what text), so the policy must read them. The full benchmark's tiny LFM2 is first taught to copy on
   synthetic text that holds no page (bench/copying.py, 30 minutes; `--start` reuses its model), as a real
   model arrives able to from pretraining; the quick one's is randomly initialised.
2. evaluate.py measures it on held-out seeds, the same for every task, sampling at temperature 1 (the
   distribution GRPO trains).
3. train.py trains it with GRPO against the real environment, one multi-task run per setting (tasks drawn
   uniformly, or by the curriculum; full fine-tune, or LoRA), all from the same starting policy; the only
   reward is task success.
4. evaluate.py measures each. The per-task table, the steps and minutes each run took to reach the target, and
   the wall times are printed; results.json and the learning curves are written to the output directory.

Training and evaluation play in lock step, so that a rerun samples the same replies however busy the machine is
(without it, a turn's batch holds the episodes whose pages are back, which depends on the browsers' timing).
"""

import argparse
import contextlib
import json
import logging
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import matplotlib

from browser_rl import episode_settings
from browser_rl.command_line import parse_command_line
from browser_rl.command_options import EvalArguments
from browser_rl.evaluation import evaluate
from browser_rl.metrics import METRICS_FILE, logged_steps, setup_logging, task_success_rates
from browser_rl.options import EpisodeArguments, ServerArguments, TaskArguments
from browser_rl.servers import open_server_pool
from browser_rl.tasks import PRESETS
from warm_start.plans import ReplyMix, a_third_right, one_right_of_eight
from warm_start.tiny_lfm2 import build_tiny_lfm2
from warm_start.weak_starts import weak_start

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

log = logging.getLogger("learning")

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.8  # mean success over tasks that a run must reach
RUNNING_WINDOW = 3  # a task's running success: the mean of its last 3 logged steps


@dataclass
class Benchmark:
    tasks: list[str]
    width: int | None  # of a randomly initialised tiny LFM2; None: bench/copying.py's model (256 wide, 4 layers)
    replies: ReplyMix  # of the warm-up
    warm_up_seeds: int  # task instances per task the warm-up learns from
    warm_up_steps: int
    grpo_config: Path
    runs: dict[str, list[str]]  # name -> train.py arguments beyond the config
    episodes: int  # evaluated per task


FULL = Benchmark(
    tasks=PRESETS["page-reading"],
    # The model copies the goal's text into a fill only when it was taught to copy first (bench/copying.py;
    # docs/page-reading-experiments.md).
    width=None,
    replies=a_third_right,
    warm_up_seeds=64,
    warm_up_steps=200,
    grpo_config=ROOT / "configs" / "learning_page_reading.yaml",
    runs={
        "full, uniform": [],
        "full, curriculum": ["--curriculum", "true"],
        "LoRA, curriculum": ["--curriculum", "true", "--use_peft", "--learning_rate", "2e-3"],
    },
    episodes=50,
)
# CI's version: click-test with the tests' 64-wide model (its warm-up takes a minute), a full fine-tune only.
QUICK = Benchmark(
    tasks=["click-test"],
    width=64,
    replies=one_right_of_eight,
    warm_up_seeds=16,
    warm_up_steps=150,
    grpo_config=ROOT / "configs" / "learning_click_test.yaml",
    # At 1e-3 and 15 steps a run could collapse into replies without an action (docs/learning.md).
    runs={"GRPO, full": ["--learning_rate", "5e-4", "--max_steps", "20"]},
    episodes=48,
)


def grpo(start_model: str, bench: Benchmark, output_dir: Path, env_url: str, *overrides: str) -> float:
    """`python train.py` on the benchmark's config, from scratch; returns the wall time in seconds."""
    shutil.rmtree(output_dir, ignore_errors=True)  # train.py would resume from an earlier run's checkpoints
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "--config",
        str(bench.grpo_config),
        "--model_name_or_path",
        start_model,
        "--env_url",
        env_url,
        "--output_dir",
        str(output_dir),
        "--lockstep",
        "true",
        *overrides,
    ]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def base_model(bench: Benchmark, out: Path, start: str | None) -> str:
    """The model the warm-up fine-tunes: `start`, or bench/copying.py's (30 minutes), or a random tiny LFM2."""
    if bench.width is not None:
        return str(build_tiny_lfm2(out / "tiny-lfm2", bench.width))
    if start is None:
        subprocess.run(
            [sys.executable, str(ROOT / "bench" / "copying.py"), "--output_dir", str(out / "copying")], check=True
        )
        start = str(out / "copying" / "model")
    return start


def measure(model: str, bench: Benchmark, env_url: str) -> dict:
    """The model on held-out seeds, sampled at temperature 1, with the episode settings it was trained with."""
    return evaluate(
        EvalArguments(model=model, episodes=bench.episodes, temperature=1.0),
        TaskArguments(task_name=bench.tasks[0], tasks=bench.tasks),
        EpisodeArguments(lockstep=True),
        ServerArguments(env_url=[env_url]),
    )


def running_mean_success(rows: dict[int, dict], tasks: list[str]) -> dict[int, float]:
    """Each step's mean over tasks of each task's running success (the mean of its last logged steps; a task
    not yet played counts as 0), so that a sampler playing some tasks more often is not favoured."""
    history: dict[str, list[float]] = {task: [] for task in tasks}
    means = {}
    for step in sorted(rows):
        for task, rate in task_success_rates(rows[step]).items():
            history[task].append(rate)
        running = [sum(h[-RUNNING_WINDOW:]) / len(h[-RUNNING_WINDOW:]) if h else 0.0 for h in history.values()]
        means[step] = sum(running) / len(running)
    return means


def training_minutes(rows: dict[int, dict]) -> dict[int, float]:
    """Minutes of training up to the end of each step (TRL's step times, summed)."""
    steps = sorted(rows)
    return dict(zip(steps, accumulate(rows[s].get("step_time", 0.0) / 60 for s in steps)))


def to_target(rows: dict[int, dict], tasks: list[str]) -> dict | None:
    """The step, and the minutes of training, at which the running mean success over tasks first reached TARGET."""
    minutes = training_minutes(rows)
    for step, mean in running_mean_success(rows, tasks).items():
        if mean >= TARGET:
            return {"step": step, "minutes": minutes[step]}
    return None


def table(results: dict, tasks: list[str]) -> str:
    names = list(results)
    width = max(18, *map(len, names))
    lines = [f"{'':<16}" + "".join(f"{name:>{width + 2}}" for name in names)]

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"{label:<16}" + "".join(f"{cell:>{width + 2}}" for cell in cells))

    def rate(t: dict) -> str:
        low, high = t["ci95"]
        return f"{100 * t['success_rate']:.0f}% ({100 * low:.0f}-{100 * high:.0f})"

    for task in tasks:
        row(task, [rate(r["tasks"][task]) for r in results.values()])
    row("mean over tasks", [f"{100 * r['mean_success_rate']:.0f}%" for r in results.values()])
    row("no action", [f"{100 * r['unparsed_share']:.0f}%" for r in results.values()])
    row("GRPO wall", [f"{r['grpo_seconds'] / 60:.1f} min" if "grpo_seconds" in r else "-" for r in results.values()])

    def reached(r: dict) -> str:
        if "to_target" not in r:
            return "-"
        return "not reached" if r["to_target"] is None else "step {step}, {minutes:.1f} min".format(**r["to_target"])

    row(f"to {100 * TARGET:.0f}% (train)", [reached(r) for r in results.values()])
    return "\n".join(lines)


def plot(results: dict, run_dirs: dict[str, Path], tasks: list[str], image_file: Path) -> None:
    """The running mean success over tasks of each run's training episodes, against steps and against minutes,
    with the target and the evaluated rates before and after."""
    fig, (by_step, by_minute) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    before = results["starting policy"]["mean_success_rate"]
    for axis in (by_step, by_minute):
        axis.axhline(before, color="grey", linestyle=":", label=f"starting policy, evaluated ({100 * before:.0f}%)")
        axis.axhline(TARGET, color="black", linewidth=0.8, linestyle="--", label=f"target ({100 * TARGET:.0f}%)")
    for (name, run_dir), color in zip(run_dirs.items(), ["tab:blue", "tab:orange", "tab:green"]):
        rows = logged_steps(run_dir / METRICS_FILE)
        means, minutes = running_mean_success(rows, tasks), training_minutes(rows)
        steps = sorted(means)
        after = results[name]["mean_success_rate"]
        by_step.plot(
            steps, [means[s] for s in steps], color=color, label=f"{name} (evaluated after: {100 * after:.0f}%)"
        )
        by_minute.plot([minutes[s] for s in steps], [means[s] for s in steps], color=color)
        by_step.plot([steps[-1]], [after], "o", color=color)
    by_step.set_xlabel("GRPO step")
    by_minute.set_xlabel("minutes of GRPO")
    by_step.set_ylabel(f"mean over {len(tasks)} task(s) of training success\n(each task's last {RUNNING_WINDOW} steps)")
    by_step.set_ylim(0, 1.05)
    by_step.legend(loc="lower right", fontsize=7)
    fig.suptitle(f"GRPO on MiniWoB {', '.join(tasks)}: tiny LFM2 on 2 CPU cores", fontsize=9)
    fig.tight_layout()
    fig.savefig(image_file, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI's version: click-test, a 64-wide model, 20 steps")
    parser.add_argument("--start", help="the full benchmark's copy-pretrained model; default: run bench/copying.py")
    parser.add_argument("--output_dir", default="outputs/learning")
    parser.add_argument("--seed", type=int, help="the GRPO runs' seed (train.py's --seed); default: their config's")
    args = parser.parse_args()
    bench, out = (QUICK if args.quick else FULL), Path(args.output_dir)
    run_dirs = {name: out / name.replace(", ", "-").lower() for name in bench.runs}
    (episodes,) = parse_command_line((EpisodeArguments,), ["--config", str(bench.grpo_config)])
    settings = episode_settings.resolve(episodes, None, str(bench.grpo_config)).settings  # the GRPO runs'

    base = base_model(bench, out, args.start)
    with contextlib.ExitStack() as stack:
        (url,) = open_server_pool(stack, ServerArguments(env_servers=1), max_sessions=32).urls
        start = time.perf_counter()
        starting_policy = weak_start(
            base,
            out / "warm-up",
            url,
            bench.tasks,
            bench.replies,
            settings,
            steps=bench.warm_up_steps,
            seeds=bench.warm_up_seeds,
        )
        log.info("warm-up done in %.0fs", time.perf_counter() - start)
        results = {"starting policy": measure(starting_policy, bench, url)}
        log.info("starting policy:\n%s", table(results, bench.tasks))
        for name, extra in bench.runs.items():
            run_dir = run_dirs[name]
            seeded = ["--seed", str(args.seed)] if args.seed is not None else []
            seconds = grpo(starting_policy, bench, run_dir, url, *extra, *seeded)
            results[name] = measure(str(run_dir), bench, url) | {
                "grpo_seconds": seconds,
                "to_target": to_target(logged_steps(run_dir / METRICS_FILE), bench.tasks),
            }
            log.info("after %s:\n%s", name, table(results, bench.tasks))
            (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")  # each run's, as it ends

    plot(results, run_dirs, bench.tasks, out / "learning_curves.png")
    print(f"\n{bench.episodes} held-out episodes per task, sampled at temperature 1, up to {settings.max_turns} turns:")
    print(table(results, bench.tasks))
    print(f"results.json and learning_curves.png in {out}")
    before = results["starting policy"]["success_rate"]
    if args.quick and not results["GRPO, full"]["success_rate"] >= before + 0.1:
        sys.exit(
            f"GRPO did not raise the success rate: {100 * before:.0f}% before, "
            f"{100 * results['GRPO, full']['success_rate']:.0f}% after"
        )


if __name__ == "__main__":
    setup_logging()
    main()
