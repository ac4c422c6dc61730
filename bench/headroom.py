"""How much on-policy RL can move a start model: each task instance sampled k times, on training and held-out seeds.

    python bench/headroom.py --model outputs/real/warm-up-full --tasks page-reading --seeds 50 --samples 8 \\
        --temperatures 1.0 1.5

For each temperature and each set of seeds (training's, from 0, and held-out ones, from 1,000,000), evaluate.py plays
every seed `--samples` times (its `--samples`, one output directory each under MODEL/headroom/, resumable); then, per
task, the share of seeds solved never, sometimes and always, pass@1 (the mean success) against pass@k (a seed solved
at least once), and the share of GRPO groups of 2, 4 and 8 episodes whose rewards would disagree (unbiased, from each
seed's k samples). GRPO learns only from the seeds solved sometimes; seeds never solved need guided episodes
(docs/real_model.md). Writes headroom.json and headroom.md beside the evaluations.
"""

import argparse
import json
from pathlib import Path

from browser_rl.command_line import parse_command_line
from browser_rl.command_options import EvalArguments
from browser_rl.evaluation import evaluate
from browser_rl.headroom import GROUP_SIZES
from browser_rl.metrics import setup_logging
from browser_rl.options import EpisodeArguments, ServerArguments, TaskArguments

SEED_SETS = {"training": 0, "held-out": 1_000_000}


def table(results: dict, samples: int) -> str:
    columns = ["pass@1", f"pass@{samples}", "never", "sometimes", "always"]
    sizes = [str(g) for g in GROUP_SIZES if g <= samples]
    lines = [
        "| seeds | temperature | task | " + " | ".join(columns + [f"groups of {g} disagree" for g in sizes]) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in columns + sizes) + " |",
    ]
    for (seed_set, temperature), by_task in results.items():
        for task, row in by_task.items():  # each task, then "all"
            values = [row[c] for c in columns] + [row["groups_disagreeing"][g] for g in sizes]
            cells = " | ".join(f"{100 * value:.0f}%" for value in values)
            lines.append(f"| {seed_set} ({row['seeds']}) | {temperature} | {task} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", nargs="+", default=[], help="names and presets, as train.py's tasks")
    parser.add_argument("--config", help="a recipe file whose tasks (and task modules) to play instead")
    parser.add_argument("--seeds", type=int, default=50, help="seeds of each set, per task")
    parser.add_argument("--samples", type=int, default=8, help="episodes per seed")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 1.5])
    parser.add_argument("--seed_sets", nargs="+", choices=list(SEED_SETS), default=list(SEED_SETS))
    parser.add_argument("--output_dir", help="default: MODEL/headroom")
    args = parser.parse_args()
    if not (args.tasks or args.config):
        parser.error("name the tasks: --tasks or --config")
    setup_logging()
    (tasks,) = parse_command_line(
        [TaskArguments], ["--config", args.config] if args.config else ["--tasks", *args.tasks]
    )
    output_dir = Path(args.output_dir or Path(args.model) / "headroom")
    results = {}
    for temperature in args.temperatures:
        for seed_set in args.seed_sets:
            evaluation_dir = output_dir / f"{seed_set}-t{temperature}"
            summary = evaluate(
                EvalArguments(
                    model=args.model,
                    episodes=args.seeds,
                    samples=args.samples,
                    first_seed=SEED_SETS[seed_set],
                    temperature=temperature,
                    output_dir=str(evaluation_dir),
                ),
                tasks,
                EpisodeArguments(),
                ServerArguments(),
            )
            results[(seed_set, temperature)] = summary["headroom"]
    (output_dir / "headroom.json").write_text(
        json.dumps({f"{s} t{t}": by_task for (s, t), by_task in results.items()}, indent=2) + "\n"
    )
    (output_dir / "headroom.md").write_text(table(results, args.samples) + "\n")
    print(table(results, args.samples))


if __name__ == "__main__":
    main()
