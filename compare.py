"""Compare two evaluations of the same episodes, pair by pair: did the change gain, lose, or neither?

    python compare.py --before outputs/warm-up/eval-page-reading --after outputs/grpo/eval-page-reading

Each episode of one evaluate.py output directory is paired with the other's episode of the same task and seed; the
report gives each side's success per task and in all, the episodes gained and lost, and the exact McNemar test's
p-value of the difference (browser_rl/comparison.py). --output also writes it as JSON.
"""

import json
from pathlib import Path

from browser_rl.command_line import parse_command_line, run_command
from browser_rl.command_options import CompareArguments
from browser_rl.comparison import compare, report


def main() -> None:
    (args,) = parse_command_line((CompareArguments,))
    comparison = compare(args.before, args.after)
    print(report(comparison))
    if args.output:
        Path(args.output).write_text(json.dumps(comparison.as_dict(), indent=2) + "\n")


if __name__ == "__main__":
    run_command("compare.py", main)
