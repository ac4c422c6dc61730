"""Measure a policy on web tasks against the real environment.

    python evaluate.py --model outputs/lfm2-350m-click-test --episodes 50           # greedy
    python evaluate.py --model outputs/smoke --temperature 1.0                      # as sampled in training
    python evaluate.py --model outputs/smoke --traces failures     # what it did: OUTPUT_DIR/viewer.html
    python evaluate.py --model outputs/multi --tasks page-reading                   # a suite: a per-task table
    python evaluate.py --model outputs/book-flight --config configs/book_flight.yaml  # the run's tasks and servers
    python evaluate.py --model outputs/multi --benchmark miniwob                    # BrowserGym's protocol
    python evaluate.py --model outputs/multi --benchmark miniwob --split test       # its held-out task families

The model is played with the episode settings it was trained with (turns, page characters, wait: saved beside it);
--config takes the tasks and servers of a recipe file, never its training options. What it prints and writes:
browser_rl/evaluation.py.
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
