"""What an episode of your own task costs the environment: the tutorial's coffee task (docs/your_own_task.md), or
the three workflows (docs/workflows.md), played through this project's server and through BrowserGym's own
BrowserEnv, the same seeds and actions, one after the other in one run.

    python bench/own_task_cost.py                  # the coffee task, 20 episodes each
    python bench/own_task_cost.py --episodes 50
    python bench/own_task_cost.py --episodes 10 --tasks book-clinic pay-bills shop-checkout \
        --task_modules workflows/clinic/clinic_task.py workflows/bills/bills_task.py workflows/shop/shop_task.py

Each coffee episode: a reset, then the four actions that place the goal's order (two clicks, a fill, a click), each
observed. A workflow's episode: a reset, then its expert's actions (warm_start.experts), read off the page as the
policy reads it (cut at --max_page_chars), to the end. Environment CPU: for the server, its process and its children
(browsers, the bill portal's process) (GET /cpu) plus this process, the client; for BrowserEnv, this process and its
children. BrowserEnv is as BrowserGym ships it (a browser launched at each reset, half a second's wait before each
observation); the server observes at once (settle_ms 0, the workflows' setting).
"""

import argparse
import asyncio
import time
from pathlib import Path

import gymnasium as gym
from browsergym.utils.obs import flatten_axtree_to_str

from browser_rl.prompts import cut_page
from browser_rl.tasks import parse_tasks
from env_client import BrowserGymEnv, LocalEnvServer, cpu_reading
from warm_start.experts import Expert, known_experts
from web_env import task_modules
from web_env.models import BrowserGymAction
from web_env.server import browser_setup
from web_env.server.app import process_tree_cpu_s

COFFEE = Path(__file__).resolve().parents[1] / "tests" / "own_tasks" / "coffee" / "coffee_task.py"
MAX_TURNS = 14


class Player:
    """A task's expert playing it: the next action for an observation, and the episode's actions so far."""

    def __init__(self, expert: Expert, max_page_chars: int):
        self.expert, self.max_page_chars, self.history = expert, max_page_chars, []

    def next_action(self, goal: str, axtree: str, error: str) -> str:
        if self.history:
            self.history[-1] = (self.history[-1][0], error)
        action = self.expert(goal, cut_page(axtree, self.max_page_chars), self.history)
        self.history.append((action, ""))
        return action


async def play_on_the_server(url: str, task: str, seeds: list[int], expert: Expert, max_page_chars: int) -> int:
    solved = 0
    async with BrowserGymEnv(base_url=url) as env:
        for seed in seeds:
            observation = (await env.reset(task_name=task, seed=seed, settle_ms=0)).observation
            player = Player(expert, max_page_chars)
            for _ in range(MAX_TURNS):
                action = player.next_action(observation.goal, observation.axtree_txt, observation.error)
                result = await env.step(BrowserGymAction(action_str=action))
                observation = result.observation
                if result.done:
                    break
            solved += result.done and result.reward == 1.0
    return solved


def server_figures(task: str, modules: list[str], seeds: list[int], expert: Expert, max_page_chars: int) -> dict:
    with LocalEnvServer(max_sessions=1, task_modules=modules, server_args=["--browsers", "1"]) as server:
        # The browser launched and the page made: not counted
        asyncio.run(play_on_the_server(server.url, task, seeds[:1], expert, max_page_chars))
        # The client: this process alone (the server is its child, counted by its own GET /cpu).
        before, client_before, started = cpu_reading(server.url), time.process_time(), time.perf_counter()
        solved = asyncio.run(play_on_the_server(server.url, task, seeds, expert, max_page_chars))
        wall = time.perf_counter() - started
        after, client = cpu_reading(server.url), time.process_time() - client_before
    server_cpu = after[0] - before[0]
    return {"solved": solved, "cpu_s": server_cpu + client, "client_cpu_s": client, "wall_s": wall}


def browsergym_figures(task: str, seeds: list[int], expert: Expert, max_page_chars: int) -> dict:
    env = gym.make(f"browsergym/{task}")
    try:
        solved, before, started = 0, process_tree_cpu_s(), time.perf_counter()
        for seed in seeds:
            observation, _info = env.reset(seed=seed)
            player = Player(expert, max_page_chars)
            for _ in range(MAX_TURNS):
                axtree = flatten_axtree_to_str(observation["axtree_object"])
                action = player.next_action(observation["goal"], axtree, observation["last_action_error"])
                observation, reward, terminated, _truncated, _info = env.step(action)
                if terminated:
                    break
            solved += terminated and reward == 1.0
        return {"solved": solved, "cpu_s": process_tree_cpu_s() - before, "wall_s": time.perf_counter() - started}
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--tasks", nargs="+", default=["order-coffee"], help="order-coffee, or own tasks with experts")
    parser.add_argument("--task_modules", nargs="*", default=[], help="the modules of the own tasks named")
    parser.add_argument("--max_page_chars", type=int, default=2500, help="the page as the experts read it")
    args = parser.parse_args()
    browser_setup.prepare()
    modules = [str(COFFEE), *args.task_modules]
    task_modules.load(modules)
    experts = known_experts(modules)
    seeds = list(range(args.episodes))
    n = args.episodes
    tasks = list(parse_tasks(args.tasks))
    # This server's figures first: BrowserEnv leaves Playwright's event loop running in this thread
    ours = {task: server_figures(task, modules, seeds, experts[task], args.max_page_chars) for task in tasks}
    theirs = {task: browsergym_figures(task, seeds, experts[task], args.max_page_chars) for task in tasks}
    for task in tasks:
        print(f"{task}, {n} episodes (a reset and each action observed)")
        print(f"{'':<26}{'solved':>8}{'CPU-s/episode':>15}{'wall s/episode':>16}")
        for name, figures in [("this server", ours[task]), ("BrowserGym's BrowserEnv", theirs[task])]:
            print(f"{name:<26}{figures['solved']:>5}/{n}{figures['cpu_s'] / n:>15.3f}{figures['wall_s'] / n:>16.2f}")
        print(f"this server's client (in the figure above): {ours[task]['client_cpu_s'] / n:.3f} CPU-s/episode")
        cpu, wall = ours[task]["cpu_s"] / theirs[task]["cpu_s"], ours[task]["wall_s"] / theirs[task]["wall_s"]
        print(f"this server against BrowserEnv: {cpu:.2f}x the CPU, {wall:.2f}x the wall time")


if __name__ == "__main__":
    main()
