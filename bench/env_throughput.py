"""Environment throughput: the stock BrowserGym loop and the server (web_env.server) side by side, CPU-s per episode.

    python bench/env_throughput.py                         # 40 stock episodes, 200 server episodes per setup
    python bench/env_throughput.py --stock_episodes 20 --episodes 400

Three workloads: click-test (a reset and a click on the button, checked to solve it), the page-reading mix (the
six page-reading tasks, each played by its scripted plan's right actions, up to three), and login-user (two fills
and a click). Episodes are played as the trainer plays them: groups of 4 episodes of one task instance, each group's
task drawn at random. Setups:
- the stock BrowserGym loop: gymnasium environments, one episode after another;
- the server loading every episode's page afresh (`--reload_every 1`, as before in-page restarts), restarting
  episodes in the page with BrowserGym's code for every action (`--browsergym_actions`, as before page_actions.py),
  and as it runs by default, each with 1 and with 8 sessions, driven by the recipe's own rollout code
  (rollout.EpisodeRunner with a scripted policy, asking for the fields the prompt reads);
- the server driven by OpenEnv's generic client, which asks for every field, one session, with BrowserGym's code
  for every action and by default.
CPU is the whole machine's (the client's Python, the server, every Chromium process), so run it on an otherwise idle
machine; it prints CPU-seconds and wall seconds per episode for each setup, and each against the stock loop.
"""

import argparse
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import psutil
from browsergym.utils.obs import flatten_axtree_to_str
from openenv.core.generic_client import GenericEnvClient

from browser_rl.episode_settings import EpisodeSettings
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import ServerPool
from browser_rl.tasks import PRESETS, TaskInstance
from env_client import LocalEnvServer, cpu_reading
from warm_start.plans import following_plans, plan
from warm_start.tiny_lfm2 import build_tokenizer
from web_env.server import browser_setup

WORKLOADS = {"click-test": ["click-test"], "mix": PRESETS["page-reading"], "login-user": ["login-user"]}
GROUP = 4  # episodes per task instance, as num_generations
STOCK_THREAD = ThreadPoolExecutor(max_workers=1)


def machine_cpu_seconds() -> float:
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq


def measure(episodes: int, run: Callable[[], None], server: str | None = None) -> tuple[float, float, float | None]:
    """(machine CPU seconds, the server's own CPU seconds, wall seconds) per episode of `run`, which plays `episodes`
    episodes; the server's from its GET /cpu."""
    cpu, wall, server_cpu = machine_cpu_seconds(), time.perf_counter(), server and cpu_reading(server)[0]
    run()
    server_cpu = server and (cpu_reading(server)[0] - server_cpu) / episodes
    return (machine_cpu_seconds() - cpu) / episodes, server_cpu, (time.perf_counter() - wall) / episodes


def instances(workload: str, episodes: int, first_seed: int) -> list[TaskInstance]:
    """(task, seed) of each episode: groups of GROUP episodes of one instance, as a GRPO step plays them."""
    rng = random.Random(first_seed)
    groups = [(rng.choice(WORKLOADS[workload]), first_seed + g) for g in range(episodes // GROUP)]
    return [group for group in groups for _ in range(GROUP)]


def stock_loop(workload: str, episodes: int, first_seed: int) -> None:
    """Stock BrowserGym on a thread of its own: its sync Playwright, which stays on the thread that started it, must
    not claim this thread's event loop, which the rollouts run on."""
    STOCK_THREAD.submit(stock_episodes, workload, episodes, first_seed).result()


def stock_episodes(workload: str, episodes: int, first_seed: int) -> None:
    environments = {}
    try:
        for task, seed in instances(workload, episodes, first_seed):
            env = environments.setdefault(task, gym.make(f"browsergym/miniwob.{task}"))
            obs, _ = env.reset(seed=seed)
            for action in plan(task, obs["goal"], flatten_axtree_to_str(obs["axtree_object"])).right:
                _, reward, terminated, _, _ = env.step(action)
            assert reward == 1.0 and terminated, (task, seed, reward)
    finally:
        for env in environments.values():
            env.close()


def runner_loop(runner: EpisodeRunner, workload: str, sessions: int, episodes: int, first_seed: int) -> None:
    """The recipe's rollouts, batches of `sessions` episodes, a scripted policy in place of a model."""
    policy = following_plans(runner.chat.tokenizer)
    drawn = instances(workload, episodes, first_seed)
    for start in range(0, len(drawn), sessions):
        played = runner.run(drawn[start : start + sessions], policy)
        assert all(episode.solved for episode in played), [(e.task_name, e.seed) for e in played]


def generic_client_loop(url: str, workload: str, episodes: int, first_seed: int) -> None:
    """OpenEnv's own client, as any OpenEnv user's code would drive the server: it asks for every field."""
    with GenericEnvClient(base_url=url).sync() as client:
        for task, seed in instances(workload, episodes, first_seed):
            observation = client.reset(task_name=task, seed=seed).observation
            for action in plan(task, observation["goal"], observation["axtree_txt"]).right:
                result = client.step({"action_str": action})
            assert result.reward == 1.0, (task, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stock_episodes", type=int, default=40)
    parser.add_argument("--episodes", type=int, default=200, help="per server setup")
    args = parser.parse_args()
    browser_setup.use_packaged_miniwob_pages()
    browser_setup.ensure_chromium()
    tokenizer, rows = build_tokenizer(), []
    for workload in WORKLOADS:
        stock_loop(workload, GROUP, first_seed=10_000)  # warm-up: imports, the first browsers
        run = lambda w=workload: stock_loop(w, args.stock_episodes, 0)  # noqa: E731
        rows.append((workload, "stock BrowserGym loop", measure(args.stock_episodes, run)))
    for server_args, name in (
        (["--reload_every", "1", "--browsergym_actions"], "env_server, page loaded every episode"),
        (["--browsergym_actions"], "env_server, restarts in the page, BrowserGym's actions"),
        ([], "env_server, restarts in the page"),
    ):
        with LocalEnvServer(max_sessions=8, server_args=server_args) as server:
            for workload in WORKLOADS:
                for sessions in (1, 8):  # sessions live on from batch to batch, as in a run
                    runner = EpisodeRunner(ServerPool([server.url]), tokenizer, EpisodeSettings(max_turns=3))
                    runner_loop(runner, workload, sessions, 8 * GROUP, 20_000)  # warm-up: contexts, pages
                    run = lambda r=runner, w=workload, s=sessions: runner_loop(r, w, s, args.episodes, 0)  # noqa: E731
                    rows.append((workload, f"{name}, {sessions} session(s)", measure(args.episodes, run, server.url)))
                    runner.close()
            if "--reload_every" not in server_args:
                for workload in ("click-test", "login-user"):
                    generic_client_loop(server.url, workload, 8, first_seed=30_000)
                    run = lambda w=workload: generic_client_loop(server.url, w, args.episodes, 0)  # noqa: E731
                    rows.append(
                        (workload, f"{name}, 1 session, OpenEnv's client", measure(args.episodes, run, server.url))
                    )
    stock = {workload: cpu for workload, name, (cpu, _, _) in rows if name.startswith("stock")}
    print(f"\nPer episode, on {os.cpu_count()} CPUs: the whole machine's CPU-seconds (client, server, every Chromium")
    print("process), the server's own (it and its browsers), wall seconds, and the stock loop's CPU over this one's:\n")
    print(f"{'workload':<12}{'setup':<82}{'CPU-s':>8}{'server':>8}{'wall s':>8}{'stock / this':>14}")
    for workload, name, (cpu, server_cpu, wall) in sorted(rows, key=lambda row: list(WORKLOADS).index(row[0])):
        server_cell = "-" if server_cpu is None else f"{server_cpu:.3f}"
        print(f"{workload:<12}{name:<82}{cpu:>8.3f}{server_cell:>8}{wall:>8.3f}{stock[workload] / cpu:>13.1f}x")


if __name__ == "__main__":
    main()
