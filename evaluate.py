"""Measure a policy on web tasks against the real environment.

    python evaluate.py --model outputs/lfm2-350m-click-test --episodes 50           # greedy
    python evaluate.py --model outputs/smoke --temperature 1.0 --traces failures    # as training samples; viewer.html
    python evaluate.py --model outputs/smollm2-page-reading --tasks page-reading     # a per-task table and chart
    python evaluate.py --model outputs/smollm2-page-reading --benchmark miniwob --split test   # BrowserGym's protocol

The model is played with the episode settings it was trained with (saved beside it); --config takes the tasks and
servers of a recipe file, never its training options. What it prints and writes: browser_rl/evaluation.py.
"""

import os

from browser_rl.command_line import parse_command_line, run_command
from browser_rl.command_options import EvalArguments
from browser_rl.errors import UsageError
from browser_rl.evaluation import evaluate
from browser_rl.evaluation_report import report
from browser_rl.options import EpisodeArguments, ServerArguments, TaskArguments

OPTIONS = (EvalArguments, TaskArguments, EpisodeArguments, ServerArguments)


def main() -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UsageError("evaluate.py runs as one process: start it with python, not torchrun or accelerate launch")
    args, tasks, episodes, servers = parse_command_line(OPTIONS, from_file=OPTIONS[1:])
    print(report(evaluate(args, tasks, episodes, servers)))


if __name__ == "__main__":
    run_command("evaluate.py", main)
