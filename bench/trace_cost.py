"""What tracing costs the environment: CPU per episode of the same episodes untraced and traced (each page a JPEG,
each action's element box), side by side on one server, rounds alternating; and what the traces weigh.

The scripted policy (warm_start.plans) plays the page-reading tasks, solving every episode in 1 to 4 actions, so both
rounds play the same actions on the same seeds. A first round, untraced, starts the browsers and is not counted.

    python bench/trace_cost.py                 # 3 pairs of rounds of 48 episodes, a few minutes on two cores
"""

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from browser_rl.episode_settings import DEFAULTS
from browser_rl.evaluation import batches_keeping_tasks
from browser_rl.options import ServerArguments
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import open_server_pool
from browser_rl.tasks import PRESETS
from browser_rl.traces import TRACES_DIR, episode_trace, write_trace, write_viewer
from env_client import cpu_s_per_episode
from warm_start.plans import following_plans
from warm_start.tiny_lfm2 import build_tokenizer

BATCH = 16


def play_round(runner: EpisodeRunner, instances: list, policy, traced: bool) -> tuple[float, float, list]:
    """(server CPU-s per episode, wall seconds, the episodes) of one round."""
    before, start = runner.servers.cpu_readings(), time.perf_counter()
    episodes = []
    for batch in batches_keeping_tasks(instances, BATCH):
        episodes += runner.run(batch, policy, traced=traced)
    seconds = time.perf_counter() - start
    unsolved = [(e.task_name, e.seed) for e in episodes if not e.solved]
    assert not unsolved, f"the scripted policy left episodes unsolved: {unsolved}"
    return cpu_s_per_episode(before, runner.servers.cpu_readings()), seconds, episodes


def trace_weight(episodes: list, max_page_chars: int) -> tuple[float, float, float]:
    """(KB of JPEG per page, KB of trace per episode, seconds to write the traces and their viewer)."""
    images = [len(image) * 3 / 4 / 1024 for e in episodes for image in e.images]
    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        for index, episode in enumerate(episodes):
            path = Path(directory) / TRACES_DIR / episode.task_name / f"{index}.json"
            write_trace(episode_trace(episode, max_page_chars, f"episode {index}"), path)
        viewer = write_viewer(Path(directory), "trace cost")
        seconds = time.perf_counter() - start
        kb = sum(p.stat().st_size for p in Path(directory, TRACES_DIR).rglob("*.json")) / 1024 / len(episodes)
        assert viewer.stat().st_size > 0
    return statistics.mean(images), kb, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="pairs of rounds, untraced then traced")
    parser.add_argument("--seeds", type=int, default=8, help="seeds per task in a round")
    args = parser.parse_args()
    tasks = PRESETS["page-reading"]
    instances = [(task, 3_000_000 + seed) for task in tasks for seed in range(args.seeds)]
    tokenizer = build_tokenizer()
    policy = following_plans(tokenizer)
    rounds = {False: [], True: []}
    with contextlib.ExitStack() as stack:
        servers = open_server_pool(stack, ServerArguments(env_servers=1), max_sessions=BATCH)
        runner = EpisodeRunner(servers, tokenizer, DEFAULTS)
        stack.callback(runner.close)
        play_round(runner, instances, policy, traced=False)  # the browsers started, the pages loaded: not counted
        for _ in range(args.pairs):
            for traced in (False, True):
                rounds[traced].append(play_round(runner, instances, policy, traced))
    episodes = rounds[True][-1][2]
    actions = statistics.mean(e.turns for e in episodes)
    page_kb, trace_kb, write_s = trace_weight(episodes, DEFAULTS.max_page_chars)
    cpu = {traced: [cpu for cpu, _, _ in of] for traced, of in rounds.items()}
    wall = {traced: [seconds for _, seconds, _ in of] for traced, of in rounds.items()}
    ratio = statistics.mean(cpu[True]) / statistics.mean(cpu[False])
    result = {
        "episodes_per_round": len(instances),
        "actions_per_episode": round(actions, 2),
        "cpu_s_per_episode_untraced": [round(c, 4) for c in cpu[False]],
        "cpu_s_per_episode_traced": [round(c, 4) for c in cpu[True]],
        "traced_over_untraced_cpu": round(ratio, 3),
        "round_s_untraced": [round(s, 2) for s in wall[False]],
        "round_s_traced": [round(s, 2) for s in wall[True]],
        "jpeg_kb_per_page": round(page_kb, 1),
        "trace_kb_per_episode": round(trace_kb, 1),
        "writing_traces_and_viewer_s_per_episode": round(write_s / len(episodes), 5),
    }
    print(json.dumps(result, indent=2))
    print(
        f"\n{len(instances)} episodes a round ({actions:.1f} actions each), {args.pairs} pairs of rounds: "
        f"{statistics.mean(cpu[False]):.3f} CPU-s/episode untraced, {statistics.mean(cpu[True]):.3f} traced "
        f"({ratio:.2f}x); {page_kb:.1f} KB of JPEG a page, {trace_kb:.1f} KB a trace"
    )


if __name__ == "__main__":
    main()
