"""Soak: tens of thousands of episodes on one environment server, its process tree's memory and CPU sampled as they go.

    python bench/env_soak.py                                   # 20,000 episodes, 8 sessions
    python bench/env_soak.py --episodes 4000 --server_args --reload_every 1    # every episode loaded afresh

Eight sessions play the page-reading tasks and click-test by their scripted plans, right or wrong, each session
eight episodes of a task in a row (as a run's sessions mostly restart their page's task); one action in
ten is a hostile one (a disallowed call, ten thousand characters, a null byte, a long wait); every 200th episode
is played by a client process that is killed (SIGKILL) after its reset, mid-episode. Every `--sample_every`
episodes the script samples the server tree's memory (PSS: each shared page counted once) and CPU. At the end it
prints the failures (episodes whose reset or step raised), the samples, the CPU-seconds per episode, and the slope
of memory against episodes after the warm-up (a least-squares line over the samples past `--warm_up` episodes),
in MiB per 1,000 episodes, with the same slope for the renderers, the browsers, Playwright's driver and Python.
Run it on an otherwise idle machine.
"""

import argparse
import asyncio
import contextlib
import itertools
import random
import sys
import time

import psutil

from env_client import BrowserGymEnv, LocalEnvServer, cpu_reading
from warm_start.plans import PLANS, plan
from web_env.models import BrowserGymAction

TASKS = ["click-test", "click-button", "click-tab", "click-option", "focus-text-2", "enter-text", "login-user"]
RUN = 8  # episodes of one task in a row, per session
HOSTILE = ["goto('file:///etc/passwd')", "x" * 10_000, "click('\x00')", "__import__('os')", "noop(100000)"]
# A client that opens a session, resets, says so, and waits to be killed.
DOOMED_CLIENT = """
import json, sys, time
from websockets.sync.client import connect
with connect(sys.argv[1].replace("http", "ws") + "/ws") as ws:
    ws.send(json.dumps({"type": "reset", "data": {"task_name": "login-user", "seed": int(sys.argv[2])}}))
    ws.recv()
    print("reset", flush=True)
    time.sleep(600)
"""
PARTS = ("renderer", "browser", "node driver", "python")


def part(process: psutil.Process) -> str:
    command = " ".join(process.cmdline())
    if "--type=renderer" in command:
        return "renderer"
    if "run-driver" in command:
        return "node driver"
    return "python" if "web_env.server" in command else "browser"


def memory_mib(root: int) -> dict[str, float]:
    """PSS of a server's process tree in MiB, by part (Chromium's utility and GPU processes count as browser)."""
    totals = dict.fromkeys(PARTS, 0.0)
    parent = psutil.Process(root)
    for process in [parent, *parent.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            totals[part(process)] += process.memory_full_info().pss / 2**20
    return totals


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (episodes, MiB) points, in MiB per 1,000 episodes."""
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return 1000 * covariance / sum((x - mean_x) ** 2 for x, _ in points)


class Soak:
    def __init__(self, url: str, episodes: int, sessions: int):
        self.url, self.episodes, self.sessions = url, episodes, sessions
        self.played = self.failures = self.killed = 0
        self.random = random.Random(0)

    async def session(self, index: int) -> None:
        """Runs of RUN episodes of one task, each session starting at another task: as in training, where a
        session's page mostly holds the task of its next reset and episodes restart in it."""
        client, own = BrowserGymEnv(self.url), 0
        while self.played < self.episodes:
            self.played += 1
            number, own = self.played, own + 1
            try:
                if number % 200 == 0:
                    await self.killed_mid_episode(number)
                else:
                    await self.episode(client, TASKS[(index + own // RUN) % len(TASKS)], number)
            except Exception:  # any failure of the server is what this counts
                self.failures += 1
                with contextlib.suppress(Exception):
                    await client.close()
                client = BrowserGymEnv(self.url)
        await client.close()

    async def killed_mid_episode(self, seed: int) -> None:
        doomed = await asyncio.create_subprocess_exec(
            sys.executable, "-c", DOOMED_CLIENT, self.url, str(seed), stdout=asyncio.subprocess.PIPE
        )
        assert await doomed.stdout.readline() == b"reset\n"
        doomed.kill()
        await doomed.wait()
        self.killed += 1

    async def episode(self, client: BrowserGymEnv, task: str, seed: int) -> None:
        observation = (await client.reset(task_name=task, seed=seed)).observation
        steps = plan(task, observation.goal, observation.axtree_txt) if task in PLANS else None
        actions = steps.right if self.random.random() < 0.5 else [steps.wrong[0], *steps.right[1:]]
        for action in actions:
            if self.random.random() < 0.1:
                action = self.random.choice(HOSTILE)
            result = await client.step(BrowserGymAction(action_str=action))
            if result.done:
                break

    async def run(self, on_progress) -> None:
        async def progress():
            while self.played < self.episodes:
                on_progress(self.played)
                await asyncio.sleep(1.0)

        await asyncio.gather(progress(), *(self.session(index) for index in range(self.sessions)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--sample_every", type=int, default=500)
    parser.add_argument("--warm_up", type=int, default=2_000, help="episodes left out of the memory slope")
    parser.add_argument(
        "--server_args", nargs=argparse.REMAINDER, default=[], help="passed to the server (python -m web_env.server)"
    )
    args = parser.parse_args()
    samples = []  # (episodes, MiB by part, CPU seconds)
    with LocalEnvServer(max_sessions=args.sessions + 2, server_args=args.server_args) as server:
        soak = Soak(server.url, args.episodes, args.sessions)
        next_sample = itertools.count(0, args.sample_every)
        due = next(next_sample)
        start = time.perf_counter()

        def sample(played: int) -> None:
            nonlocal due
            if played >= due:
                cpu, _ = cpu_reading(server.url)
                samples.append((played, memory_mib(server.pid), cpu))
                total = sum(samples[-1][1].values())
                print(
                    f"{played:>6} episodes  {total:7.0f} MiB  {cpu:8.1f} CPU-s  {time.perf_counter() - start:6.0f} s",
                    flush=True,
                )
                due = next(next_sample)

        asyncio.run(soak.run(sample))
        cpu, served = cpu_reading(server.url)
        closed = sum(memory_mib(server.pid).values())  # once the sessions are closed: not a point of the slope
    after = [(n, mib, cpu) for n, mib, cpu in samples if n >= args.warm_up]
    print(
        f"\n{soak.played} episodes on {args.sessions} sessions ({served} resets served), {soak.failures} failures, "
        f"{soak.killed} clients killed mid-episode, {time.perf_counter() - start:.0f} s"
    )
    print(f"CPU: {cpu / served:.3f} CPU-s per episode over the whole run")
    print(
        f"memory after {args.warm_up} episodes: {sum(after[0][1].values()):.0f} MiB, at the last sample "
        f"{sum(after[-1][1].values()):.0f} MiB, with the sessions closed {closed:.0f} MiB; slope while they ran "
        f"{slope([(n, sum(m.values())) for n, m, _ in after]):+.1f} MiB per 1,000 episodes"
    )
    for name in PARTS:
        print(f"  {name:<12} {slope([(n, m[name]) for n, m, _ in after]):+6.1f} MiB per 1,000 episodes")


if __name__ == "__main__":
    main()
