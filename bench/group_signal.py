"""How many of a GRPO run's groups can teach anything, by how the run draws its tasks: simulated from each task's
success rate as an evaluation of the start model measured it at the training temperature (docs/real_model.md, the
train split's GRPO runs).

    python bench/group_signal.py --evaluation outputs/real/browsergym-train-warm-up-2ep/eval-train-tasks-t1 \\
        --steps 10 --groups_per_step 4 --num_generations 4

A group whose episodes all end alike has no advantage and trains nothing. Each simulated run draws its groups' tasks
with the recipe's own sampler (browser_rl.tasks.TaskSampler), plays each episode as a coin that lands solved at the
task's measured rate, and feeds the outcomes back to the sampler as train.py does. The figures are the mean over the
runs of the groups with an advantage, for three ways of drawing: by weight alone, the curriculum from 50%, and the
curriculum from the evaluation (train.py --curriculum_start).
"""

import argparse
import random
import statistics

from browser_rl.evaluation_report import measured_success
from browser_rl.tasks import TaskSampler

DRAWINGS = {
    "by weight alone": {"curriculum": False},
    "the curriculum from 50%": {"curriculum": True},
    "the curriculum from the evaluation": {"curriculum": True, "from_evaluation": True},
}


def groups_with_an_advantage(
    success: dict[str, float], drawing: dict, steps: int, groups_per_step: int, num_generations: int, seed: int
) -> int:
    """The groups of one simulated run whose episodes disagree."""
    coins = random.Random(seed)
    measured = success if drawing.get("from_evaluation") else None
    sampler = TaskSampler(dict.fromkeys(success, 1.0), drawing["curriculum"], seed=seed, measured=measured)
    disagreeing = 0
    for _ in range(steps):
        for task in [sampler.draw() for _ in range(groups_per_step)]:  # a step's tasks are drawn before it plays
            solved = [coins.random() < success[task] for _ in range(num_generations)]
            disagreeing += 0 < sum(solved) < num_generations
            sampler.update(task, solved)
    return disagreeing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evaluation", required=True, help="an evaluate.py output directory, sampled at temperature")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--groups_per_step", type=int, default=4)
    parser.add_argument("--num_generations", type=int, default=4)
    parser.add_argument("--runs", type=int, default=1000, help="simulated runs a figure is the mean of")
    args = parser.parse_args()
    success, temperature, model = measured_success(args.evaluation)
    print(f"{model}, sampled at temperature {temperature}: {len(success)} tasks")
    for name, success_rate in sorted(success.items(), key=lambda item: item[1]):
        print(f"  {success_rate:5.0%}  {name}")
    groups = args.steps * args.groups_per_step
    print(
        f"groups with an advantage of {groups} ({args.steps} steps of {args.groups_per_step} x {args.num_generations})"
    )
    for name, drawing in DRAWINGS.items():
        runs = [
            groups_with_an_advantage(success, drawing, args.steps, args.groups_per_step, args.num_generations, seed)
            for seed in range(args.runs)
        ]
        print(f"  {name:36s} {statistics.mean(runs):5.1f}  (middle half of runs {quartiles(runs)})")


def quartiles(values: list[int]) -> str:
    low, _, high = statistics.quantiles(values, n=4)
    return f"{low:g}-{high:g}"


if __name__ == "__main__":
    main()
