"""How often each scripted expert (warm_start.experts) solves its task, on held-out seeds: the table in docs/experts.md.

    python bench/expert_success.py --max_turns 15 --max_page_chars 4000   # every expert, 100 seeds (about 15 minutes)
    python bench/expert_success.py --config configs/warm_up/book_flight.yaml --tasks book-flight book-flight-nodelay
    python bench/expert_success.py --tasks book-flight --episodes 20 --show_failures
    python bench/expert_success.py --config configs/workflows.yaml   # the workflows: the tasks and modules it names

Each expert plays its task through the environment server and the episode loop that training uses, reading the page
as the prompt shows it, with the episode settings a recipe file gives (`--config`: its max_turns, max_page_chars and
settle_ms), each flag given overriding it, else the recipe's defaults (browser_rl.episode_settings). Seeds start at
3,000,000: apart from training's (0-999), evaluation's (from 1,000,000) and recorded demonstrations' (from
2,000,000). Success is given with its 95% Wilson interval.
"""

import contextlib
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field

from browser_rl import episode_settings
from browser_rl.command_line import parse_command_line
from browser_rl.evaluation_report import wilson_interval
from browser_rl.metrics import setup_logging
from browser_rl.options import EpisodeArguments, ServerArguments, TaskArguments
from browser_rl.prompts import compact_page
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import open_server_pool
from warm_start.demonstrations import Demonstration
from warm_start.experts import EXPERTS, known_experts
from warm_start.record import record_experts
from warm_start.tiny_lfm2 import build_tokenizer
from web_env.models import miniwob_name

FIRST_SEED = 3_000_000


@dataclass
class BenchArguments:
    tasks: list[str] = field(
        default_factory=lambda: sorted(EXPERTS), metadata={"help": "tasks with an expert, or a preset of them"}
    )
    task_modules: list[str] = field(default_factory=list, metadata={"help": "modules of own tasks with experts"})
    episodes: int = 100
    first_seed: int = FIRST_SEED
    show_failures: bool = field(default=False, metadata={"help": "print the last page of each failed episode"})


def failure(demonstration: Demonstration) -> str:
    """Why an episode was not solved, in a few words."""
    last = demonstration.turns[-1]
    if demonstration.done:
        return f"the task judged it wrong after {last.reply}"
    if last.error:
        return f"{last.reply} failed: {last.error.splitlines()[0][:80]}"
    return f"ran out of turns after {last.reply}"


def similarity_groups() -> dict[str, int]:
    from browsergym.experiments.benchmark.metadata.utils import task_metadata

    metadata = task_metadata("miniwob")
    return {miniwob_name(row.task_name): int(row.similarity_group) for row in metadata.itertuples()}


def main() -> None:
    setup_logging()
    args, given = parse_command_line([BenchArguments, EpisodeArguments], from_file=[BenchArguments, EpisodeArguments])
    args.tasks = list(TaskArguments(task_modules=args.task_modules, tasks=args.tasks).task_weights())
    experts = known_experts(args.task_modules)
    if unknown := set(args.tasks) - set(experts):
        raise SystemExit(f"no expert for {', '.join(sorted(unknown))}; experts: {', '.join(sorted(experts))}")
    settings = episode_settings.resolve(given, None, "").settings
    print(f"episode settings: {settings.describe()}")
    tokenizer = build_tokenizer()
    groups = similarity_groups()
    rows = []
    with contextlib.ExitStack() as stack:
        servers = open_server_pool(stack, ServerArguments(env_servers=1), 16, args.task_modules)
        for task in args.tasks:
            start = time.perf_counter()
            instances = [(task, seed) for seed in range(args.first_seed, args.first_seed + args.episodes)]
            with closing(EpisodeRunner(servers, tokenizer, settings)) as runner:
                played = record_experts(runner, instances, experts)
            solved = sum(d.solved for d in played)
            low, high = wilson_interval(solved, len(played))
            reasons = Counter(failure(d) for d in played if not d.solved)
            turns = [len(d.turns) for d in played]
            pages = max(len(compact_page(turn.page)) for d in played for turn in d.turns)
            rows.append((task, groups.get(task, "own"), solved, len(played), low, high, turns, pages, reasons))
            print(f"{task}: {solved}/{len(played)} in {time.perf_counter() - start:.0f}s; longest page {pages} chars")
            if args.show_failures:
                for d in (d for d in played if not d.solved):
                    print(
                        f"--- seed {d.seed}: {d.goal}\n" + "\n".join(f"> {t.reply} | {t.error[:100]}" for t in d.turns)
                    )
                    print(compact_page(d.turns[-1].page))
    print("\n| task | group | success (95% interval) | turns (mean, most) | longest page | failures |")
    print("| --- | --- | --- | --- | --- | --- |")
    for task, group, solved, n, low, high, turns, pages, reasons in rows:
        why = "; ".join(f"{count}x {reason}" for reason, count in reasons.most_common(3)) or "none"
        print(
            f"| {task} | {group} | {solved}/{n} ({100 * low:.0f}-{100 * high:.0f}%) "
            f"| {sum(turns) / n:.1f}, {max(turns)} | {pages} | {why} |"
        )


if __name__ == "__main__":
    main()
