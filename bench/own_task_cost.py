"""What an episode of your own task costs the environment: the tutorial's coffee task (docs/your_own_task.md) played
through this project's server and through BrowserGym's own BrowserEnv, the same seeds and actions, one after the other
in one run.

    python bench/own_task_cost.py                  # 20 episodes each
    python bench/own_task_cost.py --episodes 50

Each episode: a reset, then the four actions that place the goal's order (two clicks, a fill, a click), each observed.
Environment CPU: for the server, its process and browsers (GET /cpu) plus this process, the client; for BrowserEnv,
this process and its browsers. BrowserEnv is as BrowserGym ships it (a browser launched at each reset, half a second's
wait before each observation).
"""

import argparse
import asyncio
import re
import time
from pathlib import Path

import gymnasium as gym
from browsergym.utils.obs import flatten_axtree_to_str

from env_client import BrowserGymEnv, LocalEnvServer, cpu_reading
from web_env import task_modules
from web_env.models import BrowserGymAction
from web_env.server import browser_setup
from web_env.server.app import process_tree_cpu_s

COFFEE = Path(__file__).resolve().parents[1] / "tests" / "own_tasks" / "coffee" / "coffee_task.py"
TASK = "order-coffee"


def element(axtree: str, role: str, name: str) -> str:
    return re.search(rf"\[(\d+)\] {role} '{re.escape(name)}'", axtree).group(1)


def asked_order(goal: str) -> dict:
    """The order the coffee task's goal asks for."""
    size, drink, name = re.fullmatch(r"Order a (\w+) (\w+) for (\w+)\.", goal).groups()
    return {"drink": drink, "size": size, "name": name}


def order_actions(axtree: str, order: dict) -> list[str]:
    """What a person does to place `order` on the coffee page: two clicks, a fill and a click."""
    return [
        f"click('{element(axtree, 'radio', order['drink'])}')",
        f"click('{element(axtree, 'radio', order['size'])}')",
        f"fill('{element(axtree, 'textbox', 'Name on the cup')}', '{order['name']}')",
        f"click('{element(axtree, 'button', 'Place order')}')",
    ]


async def play_on_the_server(url: str, seeds: list[int]) -> int:
    solved = 0
    async with BrowserGymEnv(base_url=url) as env:
        for seed in seeds:
            observation = (await env.reset(task_name=TASK, seed=seed)).observation
            for action in order_actions(observation.axtree_txt, asked_order(observation.goal)):
                result = await env.step(BrowserGymAction(action_str=action))
            solved += result.done and result.reward == 1.0
    return solved


def server_figures(seeds: list[int]) -> dict:
    with LocalEnvServer(max_sessions=1, server_args=["--browsers", "1"]) as server:
        asyncio.run(play_on_the_server(server.url, seeds[:1]))  # the browser launched and the page made: not counted
        # The client: this process alone (the server is its child, counted by its own GET /cpu).
        before, client_before, started = cpu_reading(server.url), time.process_time(), time.perf_counter()
        solved = asyncio.run(play_on_the_server(server.url, seeds))
        wall = time.perf_counter() - started
        after, client = cpu_reading(server.url), time.process_time() - client_before
    server_cpu = after[0] - before[0]
    return {"solved": solved, "cpu_s": server_cpu + client, "client_cpu_s": client, "wall_s": wall}


def browsergym_figures(seeds: list[int]) -> dict:
    env = gym.make(f"browsergym/{TASK}")
    try:
        solved, before, started = 0, process_tree_cpu_s(), time.perf_counter()
        for seed in seeds:
            observation, _info = env.reset(seed=seed)
            axtree = flatten_axtree_to_str(observation["axtree_object"])
            for action in order_actions(axtree, asked_order(observation["goal"])):
                observation, reward, terminated, _truncated, _info = env.step(action)
            solved += terminated and reward == 1.0
        return {"solved": solved, "cpu_s": process_tree_cpu_s() - before, "wall_s": time.perf_counter() - started}
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20)
    args = parser.parse_args()
    browser_setup.prepare()
    task_modules.load([str(COFFEE)])
    seeds = list(range(args.episodes))
    ours = server_figures(seeds)
    theirs = browsergym_figures(seeds)
    n = args.episodes
    print(f"{TASK}, {n} episodes of 4 actions each (a reset and 4 observed steps)")
    print(f"{'':<26}{'solved':>8}{'CPU-s/episode':>15}{'wall s/episode':>16}")
    for name, figures in [("this server", ours), ("BrowserGym's BrowserEnv", theirs)]:
        print(f"{name:<26}{figures['solved']:>5}/{n}{figures['cpu_s'] / n:>15.3f}{figures['wall_s'] / n:>16.2f}")
    print(f"this server's client (in the figure above): {ours['client_cpu_s'] / n:.3f} CPU-s/episode")
    cpu, wall = ours["cpu_s"] / theirs["cpu_s"], ours["wall_s"] / theirs["wall_s"]
    print(f"this server against BrowserEnv: {cpu:.2f}x the CPU, {wall:.2f}x the wall time")


if __name__ == "__main__":
    main()
