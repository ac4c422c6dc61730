"""Environment throughput: stock BrowserGym and env_server.py side by side on MiniWoB click-test.

    python bench/env_throughput.py                       # 40 episodes each, then 8 concurrent sessions
    python bench/env_throughput.py --episodes 100 --sessions 8

One episode is a reset and a click on the button, checked to give reward 1.0. For each setup it prints
wall-clock episodes per second, CPU-seconds per episode (the whole machine's, from /proc/stat: Python,
the server, every Chromium process) and the peak memory (PSS) of the environment's process tree, then
the ratios against the stock loop. Run it on an otherwise idle machine.
"""

import argparse
import asyncio
import contextlib
import os
import threading
import time
from dataclasses import dataclass

import gymnasium as gym
import psutil
from browsergym.utils.obs import flatten_axtree_to_str

import env_server
from env_client import BrowserGymEnv, LocalEnvServer
from env_protocol import BrowserGymAction
from scripted_policy import plan


@dataclass
class Result:
    name: str
    episodes: int
    wall_s: float
    cpu_s: float
    peak_mb: float

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s

    @property
    def cpu_s_per_episode(self) -> float:
        return self.cpu_s / self.episodes


def machine_cpu_seconds() -> float:
    """CPU time spent by every process on the machine since boot (user, nice, system, irq, softirq)."""
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq


def tree_memory_mb(root: int) -> float:
    """Proportional set size (PSS) of a process and all its descendants: resident memory with each shared
    page counted once across the processes sharing it, so Chromium's many processes are not over-counted."""
    total = 0
    parent = psutil.Process(root)
    for process in [parent, *parent.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += process.memory_full_info().pss
    return total / 2**20


class PeakMemory:
    """Samples a process tree's resident memory in the background and keeps the peak."""

    def __init__(self, root: int):
        self.root, self.peak_mb, self._stop = root, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join()

    def _sample(self):
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, tree_memory_mb(self.root))
            self._stop.wait(1.0)


def measure(name: str, episodes: int, memory_root: int, run) -> Result:
    with PeakMemory(memory_root) as memory:
        cpu, wall = machine_cpu_seconds(), time.perf_counter()
        run()
        wall, cpu = time.perf_counter() - wall, machine_cpu_seconds() - cpu
    return Result(name, episodes, wall, cpu, memory.peak_mb)


def click_the_button(page: str) -> str:
    (action,) = plan("click-test", "", page).right
    return action


def stock_loop(episodes: int, first_seed: int) -> None:
    env = gym.make("browsergym/miniwob.click-test")
    try:
        for seed in range(first_seed, first_seed + episodes):
            obs, _ = env.reset(seed=seed)
            _, reward, terminated, _, _ = env.step(click_the_button(flatten_axtree_to_str(obs["axtree_object"])))
            assert reward == 1.0 and terminated, (seed, reward, terminated)
    finally:
        env.close()


async def server_loop(url: str, sessions: int, episodes: int, first_seed: int) -> None:
    async def one_session(index: int, clients: list[BrowserGymEnv]):
        client = clients[index]
        for seed in range(first_seed + index, first_seed + episodes, sessions):
            obs = (await client.reset(seed=seed)).observation
            result = await client.step(BrowserGymAction(action_str=click_the_button(obs.axtree_txt)))
            assert result.reward == 1.0 and result.done, (seed, result.reward, result.done)

    clients = [BrowserGymEnv(base_url=url) for _ in range(sessions)]
    try:
        await asyncio.gather(*(one_session(i, clients) for i in range(sessions)))
    finally:
        await asyncio.gather(*(client.close() for client in clients))


def run_server(server: LocalEnvServer, sessions: int, episodes: int, first_seed: int) -> None:
    # In a thread of its own: the stock loop's Playwright keeps an event loop attached to this one.
    errors = []
    thread = threading.Thread(
        target=lambda: errors.append(asyncio.run(server_loop(server.url, sessions, episodes, first_seed)))
    )
    thread.start()
    thread.join()
    if errors != [None]:
        raise RuntimeError("the server loop failed")


def memory_growth(server: LocalEnvServer, sessions: int, episodes: int) -> tuple[float, float]:
    """The server's memory after 50 more episodes, and after `episodes` more (50 included)."""
    run_server(server, sessions, 50, first_seed=20_000)
    after_50 = tree_memory_mb(server.pid)
    run_server(server, sessions, episodes - 50, first_seed=20_050)
    return after_50, tree_memory_mb(server.pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--sessions", type=int, default=8, help="concurrent sessions of the second server run")
    parser.add_argument("--memory-episodes", type=int, default=500, help="length of the memory-growth run (0: skip)")
    args = parser.parse_args()
    env_server.use_packaged_miniwob_pages()
    env_server.ensure_chromium()
    print(f"machine: {os.cpu_count()} CPUs; {args.episodes} click-test episodes per setup\n")

    stock_loop(1, first_seed=10_000)  # warm-up: imports, first browser launch
    results = [measure("stock BrowserGym loop", args.episodes, os.getpid(), lambda: stock_loop(args.episodes, 0))]
    with LocalEnvServer(max_sessions=args.sessions) as server:
        run_server(server, args.sessions, args.sessions, first_seed=10_000)  # warm-up: browsers, a context per session
        results.append(
            measure("env_server, 1 session", args.episodes, server.pid, lambda: run_server(server, 1, args.episodes, 0))
        )
        results.append(
            measure(
                f"env_server, {args.sessions} sessions",
                args.episodes,
                server.pid,
                lambda: run_server(server, args.sessions, args.episodes, 0),
            )
        )
        if args.memory_episodes:
            memory = memory_growth(server, args.sessions, args.memory_episodes)

    print(f"{'setup':<26} {'episodes/s':>11} {'CPU-s/episode':>14} {'peak PSS MB':>12}")
    for r in results:
        print(f"{r.name:<26} {r.episodes_per_s:>11.2f} {r.cpu_s_per_episode:>14.3f} {r.peak_mb:>12.0f}")
    stock, single, concurrent = results
    if args.memory_episodes:
        print(
            f"\nserver memory (PSS, browsers included) after 50 episodes: {memory[0]:.0f} MB, "
            f"after {args.memory_episodes}: {memory[1]:.0f} MB ({100 * (memory[1] / memory[0] - 1):+.1f}%)"
        )
    cpu_ratio_single = stock.cpu_s_per_episode / single.cpu_s_per_episode
    print(
        f"\nratios against the stock loop: episodes per CPU-second x{cpu_ratio_single:.1f} "
        f"(1 session), x{stock.cpu_s_per_episode / concurrent.cpu_s_per_episode:.1f} ({args.sessions} sessions); "
        f"wall-clock episodes/s x{concurrent.episodes_per_s / stock.episodes_per_s:.1f} ({args.sessions} sessions)"
    )


if __name__ == "__main__":
    main()
