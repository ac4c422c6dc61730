"""What a run reports: the figures of a batch of episodes, one line per GRPO step, every logged step in
metrics.jsonl, and the learning curve.

train.py logs through these; evaluate.py summarizes its episodes with them, and the benchmarks read
metrics.jsonl back with `logged_steps`.
"""

import json
import logging
import re
import time
import warnings
from pathlib import Path

import torch
from transformers import TrainerCallback

from browser_rl.progress import duration, time_left
from browser_rl.tasks import split_of

log = logging.getLogger("train")  # the step line is the training run's, whichever module writes it

METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "learning_curve.png"
MAX_TASK_LINES = 8  # more tasks than this, and the learning curve draws one line per split instead
SAY_PLAYED_AFTER_S = 60.0  # a step's play at least this long is said before its training (say_a_slow_play)


# Warnings of libraries that the project cannot act on, said once here instead of in every run (message start,
# category): TRL marks `rollout_func` experimental, and the recipe relies on it knowingly (the tests pin its
# contract); TRL 1.16 reads transformers 5's deprecated `is_gradient_checkpointing`, and with activation
# checkpointing on calls its deprecated `gradient_checkpointing_disable` and `_enable` around each generation.
THIRD_PARTY_WARNINGS = [
    ("You are using 'rollout_func'", UserWarning),
    ("`is_gradient_checkpointing` is deprecated", FutureWarning),
    ("`gradient_checkpointing_disable` is deprecated", FutureWarning),
    ("`gradient_checkpointing_enable` is deprecated", FutureWarning),
]


class WithoutCudaKernelAdvice(logging.Filter):
    """Without CUDA, transformers advises installing causal-conv1d for LFM2's convolutions, a CUDA-only kernel."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "falling back to its reference PyTorch implementation" not in record.getMessage()


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    for message, category in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category)
    if not torch.cuda.is_available():
        logging.getLogger("transformers.integrations.hub_kernels").addFilter(WithoutCudaKernelAdvice())


def with_training_time(logs: dict) -> dict:
    """The logged metrics, with the step's training time: TRL's step_time less the rollout's generation and
    environment time (TRL times the whole step, its rollout included)."""
    if not {"step_time", "time/generation_s", "time/environment_s"} <= logs.keys():
        return logs
    return logs | {"time/training_s": logs["step_time"] - logs["time/generation_s"] - logs["time/environment_s"]}


def grouped(items: list, key) -> dict[str, list]:
    """The items of each key(item), keys in the order they first appear."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups


def episodes_by_task(episodes: list) -> dict[str, list]:
    """The episodes (rollout.Episode) of each task, tasks in the order they first appear."""
    return grouped(episodes, lambda episode: episode.task_name)


def episode_metrics(episodes: list) -> dict[str, float]:
    """Success, turns, the share of replies without an action and of episodes cut at the engine's length, over a
    batch of episodes (rollout.Episode), and each task's success. Success is the policy's own: a guided episode's
    (browser_rl.guidance) is partly its guide's, so it counts in `guided/success_rate` only."""
    replies = [action for e in episodes for action in e.actions]
    episodes_alone = [e for e in episodes if not e.guide_turns]
    by_task = episodes_by_task(episodes_alone)
    per_task = {
        f"tasks/{task}/success_rate": sum(e.solved for e in of_task) / len(of_task) for task, of_task in by_task.items()
    }
    # With many tasks, success on each of BrowserGym's two splits (a run on browsergym-train has 62) reads at once.
    per_split = {}
    if len(by_task) > 1:
        by_split = grouped(episodes_alone, lambda e: split_of(e.task_name))
        for split, of_split in sorted(by_split.items()):
            per_split[f"splits/{split}/success_rate"] = sum(e.solved for e in of_split) / len(of_split)
    # A reset restarted in the page costs the environment a fraction of one that loads it (docs/environment.md).
    restarts = [e.restarted_in_page for e in episodes if e.restarted_in_page is not None]
    environment = {"environment/restarted_share": sum(restarts) / len(restarts)} if restarts else {}
    return (
        {
            "episodes/count": len(episodes),
            "episodes/success_rate": sum(e.solved for e in episodes_alone) / len(episodes_alone),
            "episodes/turns": len(replies) / len(episodes),
            "episodes/unparsed_share": sum(a is None for a in replies) / max(len(replies), 1),
            "episodes/out_of_context_share": sum(e.out_of_context for e in episodes) / len(episodes),
        }
        | environment
        | per_split
        | per_task
    )


def same_reward_share(groups: list, episodes: list) -> float:
    """The share of GRPO groups (`groups[i]` names episode i's) whose episodes all got the same reward: GRPO
    learns nothing from them."""
    rewards_of_group = {}
    for group, episode in zip(groups, episodes, strict=True):
        rewards_of_group.setdefault(group, set()).add(episode.solved)
    return sum(len(rewards) == 1 for rewards in rewards_of_group.values()) / len(rewards_of_group)


def step_metrics(episodes: list, groups: list, seconds: float, generation_s: float, cpu_s: list[float]) -> dict:
    """The figures of a GRPO step: its episodes' (every rank's, `groups[i]` naming episode i's group), its speed,
    where its time went (generation and the browsers overlap; the environment's share is the time no generation was
    running), and what the environment servers and their browsers spent per episode begun on them (`cpu_s`: one
    reading per rank that had one)."""
    metrics = episode_metrics(episodes) | {
        "groups/same_reward_share": same_reward_share(groups, episodes),
        "episodes/per_second": len(episodes) / seconds,
        "time/generation_s": generation_s,
        "time/environment_s": seconds - generation_s,
    }
    if cpu_s:
        metrics["environment/cpu_s_per_episode"] = sum(cpu_s) / len(cpu_s)
    return metrics


def task_success_rates(row: dict) -> dict[str, float]:
    """{task: success rate} of a logged step's tasks."""
    return {
        key.split("/")[1]: value
        for key, value in row.items()
        if key.startswith("tasks/") and key.endswith("/success_rate")
    }


def weakest_task(logs: dict) -> str:
    """(weakest TASK RATE%) when the step played several tasks, else nothing."""
    success = task_success_rates(logs)
    if len(success) < 2:
        return ""
    task = min(success, key=success.get)
    return f" (weakest {task} {100 * success[task]:.0f}%)"


def skipped_training(logs: dict) -> str:
    """The step line's "(75% of micro-batches skipped: no advantage)": the share of the step's micro-batches that the
    trainer did not run forward and backward, their episodes' advantages all zero (browser_rl.trainer)."""
    skipped = logs.get("training/skipped_share")
    return f" ({100 * skipped:.0f}% of micro-batches skipped: no advantage)" if skipped else ""


def group_signal(logs: dict) -> str:
    """| groups 3/4 disagree, 7 played, 1 skipped, 2 guided episodes (50% solved): how many of the update's groups
    have an advantage, and what was played to find them (browser_rl.dynamic_sampling)."""
    if "groups/informative" not in logs:
        return ""
    skipped = f", {logs['groups/skipped']:.0f} skipped" if logs.get("groups/skipped") else ""
    guided = ""
    if logs.get("guided/episodes"):
        guided = f", {logs['guided/episodes']:.0f} guided episodes ({100 * logs['guided/success_rate']:.0f}% solved)"
    return (
        f" | groups {logs['groups/informative']:.0f}/{logs['groups/in_update']:.0f} disagree,"
        f" {logs['groups/played']:.0f} played{skipped}{guided}"
    )


def say_a_slow_play(step: int, max_steps: int, figures: dict) -> None:
    """ "step 3/10 played 48 episodes in 2m 56s, 31% solved | groups 4/4 disagree, 12 played; training", where the
    play took SAY_PLAYED_AFTER_S or more: such a step (a real model on a CPU) trains minutes more before its line."""
    play_s = figures["time/generation_s"] + figures["time/environment_s"]
    if play_s < SAY_PLAYED_AFTER_S:
        return
    log.info(
        "step %d/%d played %d episodes in %s, %.0f%% solved%s; training",
        *(step, max_steps, figures["episodes/count"], duration(play_s), 100 * figures["episodes/success_rate"]),
        group_signal(figures),
    )


def environment_cost(logs: dict) -> str:
    """| environment 0.05 CPU-s/episode, 96% restarted in the page: what the servers report of their CPU, and the
    share of resets that restarted in a loaded page."""
    parts = []
    if (cpu := logs.get("environment/cpu_s_per_episode")) is not None:
        parts.append(f"{cpu:.3f} CPU-s/episode")
    if (restarted := logs.get("environment/restarted_share")) is not None:
        parts.append(f"{100 * restarted:.0f}% restarted in the page")
    return f" | environment {', '.join(parts)}" if parts else ""


class StepPrinter(TrainerCallback):
    """One line per logged step, with the numbers worth watching, where the step's time went, and the run's time
    so far and left; from the first rank alone, whose figures are every rank's."""

    def on_train_begin(self, args, state, control, **kwargs):
        self.start, self.first_step = time.monotonic(), state.global_step  # a resumed run's pace is its own

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "reward" not in logs and "sft_phase/loss" in logs:  # a step of an SFT phase (browser_rl/sft_phases.py)
            log.info(
                "step %d/%d | SFT phase %d on %d successful episodes | loss %.4f | entropy %.3f | lr %.2e",
                state.global_step,
                state.max_steps,
                logs["sft_phase/number"],
                logs["sft_phase/buffer"],
                logs["sft_phase/loss"],
                logs["sft_phase/entropy"],
                logs.get("learning_rate", 0.0),
            )
        if "reward" not in logs:
            return
        logs = with_training_time(logs)
        log.info(
            "step %d/%d | success %.1f%%%s | reward %.3f (std %.3f) | turns %.1f | no action %.0f%% | loss %.4f"
            " | entropy %.3f | lr %.2e%s | %.1f episodes/s | generation %.1fs, environment %.1fs, training %.1fs%s%s"
            " | %s",
            state.global_step,
            state.max_steps,
            100 * logs.get("episodes/success_rate", float("nan")),
            weakest_task(logs),
            logs["reward"],
            logs.get("reward_std", 0.0),
            logs.get("episodes/turns", float("nan")),
            100 * logs.get("episodes/unparsed_share", float("nan")),
            logs.get("loss", float("nan")),
            logs.get("entropy", float("nan")),
            logs.get("learning_rate", 0.0),
            group_signal(logs),
            logs.get("episodes/per_second", 0.0),
            logs.get("time/generation_s", float("nan")),
            logs.get("time/environment_s", float("nan")),
            logs.get("time/training_s", float("nan")),
            skipped_training(logs),
            environment_cost(logs),
            time_left(
                time.monotonic() - self.start, state.global_step - self.first_step, state.max_steps - self.first_step
            ),
        )


class MetricsLog(TrainerCallback):
    """Appends every logged step to OUTPUT_DIR/metrics.jsonl as it happens (a crash loses nothing, a resumed
    run continues the file) and draws OUTPUT_DIR/learning_curve.png from it when training ends."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            Path(args.output_dir).mkdir(parents=True, exist_ok=True)
            with open(Path(args.output_dir) / METRICS_FILE, "a") as f:
                f.write(json.dumps({"step": state.global_step, **with_training_time(logs)}) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        metrics_file = Path(args.output_dir) / METRICS_FILE
        if state.is_world_process_zero and metrics_file.exists():
            path = plot_learning_curve(metrics_file, Path(args.output_dir) / CURVE_FILE)
            log.info("%s; learning curve: %s", success_trend(logged_steps(metrics_file)), path)


def read_metrics(metrics_file: Path) -> list[dict]:
    """Every row of a metrics.jsonl, in the order they were logged."""
    return [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]


def logged_steps(metrics_file: Path) -> dict[int, dict]:
    """The training steps of a metrics.jsonl, by step number; a resumed run may log a step twice, the later wins."""
    return {r["step"]: r for r in read_metrics(metrics_file) if "episodes/success_rate" in r}


def success_trend(rows: dict[int, dict]) -> str:
    """Where the run's success started and where it ended: averages over its first and last steps (up to 3)."""
    steps = sorted(rows)
    n = max(1, min(3, len(steps) // 2))
    first, last = ([rows[s]["episodes/success_rate"] for s in part] for part in (steps[:n], steps[-n:]))
    return (
        f"success {100 * sum(first) / n:.0f}% over the first {n} step(s), {100 * sum(last) / n:.0f}% over the last {n}"
    )


def moving_average(values: list[float], window: int) -> list[float]:
    return [sum(values[max(0, i + 1 - window) : i + 1]) / min(i + 1, window) for i in range(len(values))]


def breakdown(rows: dict[int, dict]) -> list[tuple[str, str]]:
    """The curve's lines beside the overall success, as (label, metric): one per task for a few tasks, one per
    BrowserGym split for more, none for one task."""
    tasks = sorted({task for row in rows.values() for task in task_success_rates(row)})
    if len(tasks) > MAX_TASK_LINES:
        splits = sorted({key for row in rows.values() for key in row if key.startswith("splits/")})
        return [(f"{key.split('/')[1]} split", key) for key in splits]
    return [(task, f"tasks/{task}/success_rate") for task in tasks] if len(tasks) > 1 else []


def plot_learning_curve(metrics_file: Path, image_file: Path) -> Path:
    """Success rate per step (with a moving average) and episode length, from a metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    rows = logged_steps(metrics_file)
    steps = sorted(rows)
    success = [rows[s]["episodes/success_rate"] for s in steps]
    window = max(1, len(steps) // 10)
    smooth = moving_average(success, window)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True, height_ratios=[2, 1])
    top.plot(steps, success, ".", alpha=0.4, label="per step")
    top.plot(steps, smooth, "-", label=f"moving average ({window} steps)")
    for label, key in breakdown(rows):  # each a moving average over the steps that played it
        played = [s for s in steps if key in rows[s]]
        top.plot(played, moving_average([rows[s][key] for s in played], window), "-", lw=1, label=label)
    top.set_ylabel("success rate (training episodes)")
    top.set_ylim(-0.05, 1.05)
    top.legend(loc="lower right", fontsize="small")
    bottom.plot(steps, [rows[s]["episodes/turns"] for s in steps], "-")
    bottom.set_ylabel("turns per episode")
    bottom.set_xlabel("GRPO step")
    top.set_title(metrics_file.parent.name)
    fig.tight_layout()
    fig.savefig(image_file, dpi=100)
    plt.close(fig)
    return image_file
