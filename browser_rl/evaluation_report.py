"""What an evaluation's episodes add up to: the summary evaluate.py writes (success with its 95% interval, as the
recipe and as BrowserGym score it, per task and per split), the report it prints, and its chart of success per task.
"""

import json
import math
from pathlib import Path

from browser_rl.episode_settings import EpisodeSettings
from browser_rl.headroom import seed_statistics
from browser_rl.metrics import grouped
from browser_rl.tasks import split_of
from browser_rl.traces import VIEWER_FILE

CHART_FILE = "success.png"
SUMMARY_FILE = "summary.json"


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% confidence interval of a success rate; unlike p +- 1.96 sd it stays inside [0, 1] near 0% and 100%."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(records: list[dict]) -> dict:
    """Success as the recipe scores it (rewards.solved), with its interval, and as BrowserGym scores it (which pays
    some pages' partial credit: docs/reward_audit.md), turns to success and replies without an action."""
    solved = [r for r in records if r["success"]]
    replies = [action for r in records for action in r["actions"]]
    low, high = wilson_interval(len(solved), len(records))
    browsergym = sum(r["browsergym_success"] for r in records)
    return {
        "episodes": len(records),
        "solved": len(solved),
        "success_rate": len(solved) / len(records),
        "browsergym_solved": browsergym,
        "browsergym_success_rate": browsergym / len(records),
        "ci95": [low, high],
        "mean_turns_to_success": sum(r["turns"] for r in solved) / len(solved) if solved else None,
        "unparsed_share": sum(action is None for action in replies) / max(len(replies), 1),
    }


def samples_per_seed(records: list[dict], samples: int) -> dict | None:
    """With several samples of each seed, what they say of each task and of all (browser_rl.headroom)."""
    if samples == 1:
        return None
    by_task = grouped(records, lambda r: r["task_name"])
    return {task: seed_statistics(of_task, samples) for task, of_task in by_task.items()} | {
        "all": seed_statistics(records, samples)
    }


def split_summaries(records: list[dict]) -> dict:
    """The summary of each BrowserGym split that the records reach into."""
    return {
        split: summarize(of_split)
        for split, of_split in sorted(grouped(records, lambda r: split_of(r["task_name"])).items())
    }


def measured_success(output_dir: str) -> tuple[dict[str, float], float, str]:
    """What an evaluation in output_dir measured: each task's success rate, the temperature it sampled at (0:
    greedy), and the model it played."""
    summary = json.loads(Path(output_dir, SUMMARY_FILE).read_text())
    rates = {task: of_task["success_rate"] for task, of_task in summary["tasks"].items()}
    return rates, summary["arguments"]["temperature"], summary["arguments"]["model"]


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


def success_line(name: str, summary: dict) -> str:
    low, high = summary["ci95"]
    browsergym = 100 * summary["browsergym_success_rate"]
    return (
        f"  {name:<24} {100 * summary['success_rate']:7.1f}% ({summary['solved']}/{summary['episodes']}),"
        f" 95% CI {100 * low:.1f}-{100 * high:.1f}%; as BrowserGym scores it {browsergym:.1f}%"
    )


def settings_lines(summary: dict) -> list[str]:
    """The episode settings played with, and those played otherwise than the model was trained with, on purpose."""
    played = EpisodeSettings(**summary["episode_settings"]).describe()
    return [f"  episodes played with {played}"] + [
        f"  not as the model was trained, on purpose: {overridden}" for overridden in summary["overridden_settings"]
    ]


def samples_lines(summary: dict) -> list[str]:
    """With several samples of each seed: pass@1 against pass@k, and the seeds never, sometimes and always solved."""
    if not summary.get("headroom"):
        return []
    k = summary["arguments"]["samples"]
    h = summary["headroom"]["all"]
    return [
        f"  {k} samples of each of {h['seeds']} seeds: pass@1 {100 * h['pass@1']:.1f}%, pass@{k}"
        f" {100 * h[f'pass@{k}']:.1f}%; seeds solved never {100 * h['never']:.0f}%, sometimes"
        f" {100 * h['sometimes']:.0f}%, always {100 * h['always']:.0f}%"
    ]


def report(summary: dict) -> str:
    args = summary["arguments"]
    decoding = f"temperature {args['temperature']}" if args["temperature"] else "greedy"
    output = f"  episodes and summary in {args['output_dir']}"
    if args["traces"] is not None:
        output += f", traces ({args['traces']}) shown by {Path(args['output_dir']) / VIEWER_FILE}"
    if len(summary["tasks"]) == 1:
        (task,) = summary["tasks"]
        turns, (low, high) = summary["mean_turns_to_success"], summary["ci95"]
        return "\n".join(
            [
                f"{args['model']} on {task} ({summary['episodes']} episodes, {decoding}):",
                f"  success rate  {100 * summary['success_rate']:.1f}% ({summary['solved']}/{summary['episodes']}),"
                f" 95% CI {100 * low:.1f}-{100 * high:.1f}%",
                f"  as BrowserGym scores it (partial credit paid)  {100 * summary['browsergym_success_rate']:.1f}%"
                f" ({summary['browsergym_solved']}/{summary['episodes']})",
                f"  turns to success (mean)  {'-' if turns is None else f'{turns:.2f}'}",
                f"  replies without a valid action  {100 * summary['unparsed_share']:.1f}%",
                *samples_lines(summary),
                *settings_lines(summary),
                output,
            ]
        )
    if args["benchmark"]:
        split = f", its {args['split']} split" if args["split"] else ""
        played = f"BrowserGym's {args['benchmark']}{split}: {summary['episodes']} episodes of {args['max_turns']} steps"
    else:
        played = f"{args['episodes']} episodes each"
    cpu = summary["environment_cpu_s_per_episode"]
    lines = [
        f"{args['model']} on {len(summary['tasks'])} tasks ({played}, {decoding}):",
        success_line("all episodes", summary),
        *(success_line(f"{split} split", s) for split, s in summary["splits"].items()),
        task_table(summary),
        *samples_lines(summary),
        f"  {summary['episodes_per_second']:.2f} episodes/s"
        + ("" if cpu is None else f", environment {cpu:.3f} CPU-s/episode"),
        *settings_lines(summary),
        *(["  differences from BrowserGym's protocol:"] if summary["protocol_differences"] else []),
        *(f"    - {difference}" for difference in summary["protocol_differences"]),
        f"{output}; chart in {CHART_FILE}",
    ]
    return "\n".join(lines)
