"""The environment's CPU per untraced episode with the code of a checkout: to compare two commits side by side (what an
untraced episode costs before and after a change to the server), run alternately on the same idle machine.

    git worktree add /tmp/before 9fa5034
    for code in /tmp/before . /tmp/before .; do python bench/checkout_cost.py $code; done

The scripted plans (warm_start.plans) play 48 episodes of the page-reading tasks, four rounds on one server started
from the checkout; the first round starts the browsers and is not counted.
"""

import argparse
import contextlib
import os
import sys
from pathlib import Path

# Before the imports below, which come from the checkout.
parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("checkout", nargs="?", default=".", help="the checkout whose code plays (default: this one)")
CHECKOUT = Path(parser.parse_args().checkout).resolve()
sys.path.insert(0, str(CHECKOUT))  # the checkout's packages, and its server: started from there
os.chdir(CHECKOUT)

import browser_rl  # noqa: E402
from browser_rl.episode_settings import DEFAULTS  # noqa: E402
from browser_rl.evaluation import batches_keeping_tasks  # noqa: E402
from browser_rl.options import ServerArguments  # noqa: E402
from browser_rl.rollout import EpisodeRunner  # noqa: E402
from browser_rl.servers import open_server_pool  # noqa: E402
from browser_rl.tasks import PRESETS  # noqa: E402
from env_client import cpu_s_per_episode  # noqa: E402
from warm_start.plans import following_plans  # noqa: E402
from warm_start.tiny_lfm2 import build_tokenizer  # noqa: E402


def main() -> None:
    assert Path(browser_rl.__file__).is_relative_to(CHECKOUT), f"{browser_rl.__file__} is not {CHECKOUT}'s"
    instances = [(task, 3_000_000 + seed) for task in PRESETS["page-reading"] for seed in range(8)]
    tokenizer = build_tokenizer()
    policy = following_plans(tokenizer)
    cpu = []
    with contextlib.ExitStack() as stack:
        servers = open_server_pool(stack, ServerArguments(env_servers=1), max_sessions=16)
        runner = EpisodeRunner(servers, tokenizer, DEFAULTS)
        stack.callback(runner.close)
        for _ in range(4):
            before = servers.cpu_readings()
            for batch in batches_keeping_tasks(instances, 16):
                assert all(episode.solved for episode in runner.run(batch, policy))
            cpu.append(cpu_s_per_episode(before, servers.cpu_readings()))
    print(f"{CHECKOUT}: {[round(c, 4) for c in cpu[1:]]} CPU-s per untraced episode, three rounds of {len(instances)}")


if __name__ == "__main__":
    main()
