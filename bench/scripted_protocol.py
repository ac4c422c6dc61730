"""The scripted policy under BrowserGym's MiniWoB protocol, on the tasks that have plans (warm_start.plans.PLANS):
BrowserGym's own seeds and step limit for those tasks, played through the evaluation's batching, runner and scoring
(browser_rl/evaluation.py). A policy that follows the plans solves every instance, so anything short of 100% is the
protocol code scoring wrong (or the environment failing). It is the scripted row of docs/benchmark.md's comparison.

    python bench/scripted_protocol.py            # 35 episodes, a minute or so on two cores
    python bench/scripted_protocol.py --settle_ms 500   # with BrowserGym's wait before each observation
"""

import argparse
import contextlib
import sys
import time
from dataclasses import replace

from browser_rl.command_options import EvalArguments
from browser_rl.episode_settings import DEFAULTS
from browser_rl.evaluation import batches_keeping_tasks, episode_record, instances_to_play
from browser_rl.evaluation_report import split_summaries, summarize
from browser_rl.metrics import grouped, setup_logging
from browser_rl.options import ServerArguments, TaskArguments
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import open_server_pool
from warm_start.plans import PLANS, following_plans
from warm_start.tiny_lfm2 import build_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settle_ms", type=int, default=DEFAULTS.settle_ms, help="the wait before observing")
    parser.add_argument("--batch_size", type=int, default=16)
    args = parser.parse_args()
    instances, max_steps = instances_to_play(EvalArguments(model="scripted", benchmark="miniwob"), TaskArguments())
    planned = [(task, seed) for task, seed in instances if task in PLANS]
    settings = replace(DEFAULTS, max_turns=max_steps, settle_ms=args.settle_ms)
    tokenizer = build_tokenizer()  # the policy writes its actions as tokens, as a model would
    start = time.perf_counter()
    records = []
    with contextlib.ExitStack() as stack:
        servers = open_server_pool(stack, ServerArguments(env_servers=1), max_sessions=args.batch_size)
        runner = EpisodeRunner(servers, tokenizer, settings)
        stack.callback(runner.close)
        for batch in batches_keeping_tasks(planned, args.batch_size):
            played = runner.run_until_played(batch, following_plans(tokenizer))
            records += [episode_record(episode) for episode in played]
    seconds = time.perf_counter() - start
    overall = summarize(records)
    print(f"\nthe scripted policy under BrowserGym's miniwob protocol: {len(PLANS)} planned tasks, their seeds")
    print(f"(at most {max_steps} steps, settle_ms {settings.settle_ms}):")
    print(f"  all   {overall['solved']}/{overall['episodes']} solved")
    for split, summary in split_summaries(records).items():
        print(f"  {split:<5} {summary['solved']}/{summary['episodes']} solved")
    for task, of_task in grouped(records, lambda r: r["task_name"]).items():
        seeds = [r["seed"] for r in of_task]
        print(f"    {task:<16} {sum(r['success'] for r in of_task)}/{len(of_task)}  seeds {seeds}")
    print(f"  {len(records) / seconds:.2f} episodes/s")
    unsolved = [(r["task_name"], r["seed"], r["actions"], r["last_error"]) for r in records if not r["success"]]
    if unsolved:
        sys.exit(f"{len(unsolved)} planned episodes unsolved: {unsolved}")


if __name__ == "__main__":
    setup_logging()
    main()
