"""Chromium's headless shell against the full browser, side by side: what a launch and an episode cost in each.

    sudo apt-get install chromium chromium-headless-shell    # both, for the comparison
    python bench/headless_shell.py                            # 3 rounds, 70 episodes each
    python bench/headless_shell.py --rounds 5 --episodes 140

Each round plays, for each browser in turn (in a process of its own, the environment in it as the server runs it):
3 launches, each with its first reset, then the page-reading tasks and click-test by their scripted plans, one
episode after another in one session. CPU is the whole machine's (this process, Playwright's driver, every Chromium
process, and anything else running), so run it on an otherwise idle machine. Prints each round's figures and the
medians, the shell against the full browser; then whether every MiniWoB task's first page (goal and accessibility
tree, seed 3) reads the same in both.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time

BROWSERS = {"headless shell": "chromium-headless-shell", "full browser": "chromium"}


def use_only(binary: str) -> None:
    """Set this process up to drive MiniWoB pages in `binary` and no other Chromium."""
    from web_env.server import browser_setup

    browser_setup.SYSTEM_CHROMIUMS = (binary,)
    browser_setup.prepare()


def play(binary: str, episodes: int) -> dict:
    """In this process: the launches' and the episodes' seconds and CPU-seconds, each per launch or episode. The
    machine's CPU, so that renderers that come and go are counted too."""
    from env_throughput import machine_cpu_seconds as cpu_s  # bench/env_throughput.py, beside this script

    from browser_rl.tasks import PRESETS
    from warm_start.plans import plan
    from web_env.models import BrowserGymAction
    from web_env.server.browsers import BrowserPool
    from web_env.server.environment import BrowserTaskEnvironment

    use_only(binary)
    launches, started, cpu = 3, time.perf_counter(), cpu_s()
    for _ in range(launches):
        session = BrowserTaskEnvironment(BrowserPool(1))
        session.reset(task_name="click-test", seed=0)
        session.close()
    launch = {"launch_s": (time.perf_counter() - started) / launches, "launch_cpu_s": (cpu_s() - cpu) / launches}
    session = BrowserTaskEnvironment(BrowserPool(1))
    session.reset(task_name="click-test", seed=0)
    tasks, solved = [*PRESETS["page-reading"], "click-test"], 0
    started, cpu = time.perf_counter(), cpu_s()
    for n in range(episodes):
        task = tasks[n % len(tasks)]
        observation = session.reset(task_name=task, seed=100 + n)
        for action in plan(task, observation.goal, observation.axtree_txt).right:
            observation = session.step(BrowserGymAction(action_str=action))
            if observation.done:
                break
        solved += observation.reward == 1.0
    session.close()
    return {
        **launch,
        "episode_s": (time.perf_counter() - started) / episodes,
        "episode_cpu_s": (cpu_s() - cpu) / episodes,
        "solved": solved / episodes,
    }


def first_pages(binary: str) -> dict[str, list[str]]:
    """In this process: every MiniWoB task's goal and accessibility tree at its first reset, seed 3."""
    from web_env.server.browsers import BrowserPool
    from web_env.server.environment import TASK_CLASSES, BrowserTaskEnvironment

    use_only(binary)
    session = BrowserTaskEnvironment(BrowserPool(1))
    pages = {}
    for task in sorted(TASK_CLASSES):
        observation = session.reset(task_name=task, seed=3)
        pages[task] = [observation.goal, observation.axtree_txt]
    session.close()
    return pages


def in_a_process(*arguments: str) -> dict:
    """This script's answer to `arguments`, run in a process of its own: its last line of output, as JSON."""
    played = subprocess.run([sys.executable, __file__, *arguments], capture_output=True, text=True, check=True)
    return json.loads(played.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=70)
    parser.add_argument("--play", help=argparse.SUPPRESS)  # the browser a round's own process plays
    parser.add_argument("--pages", help=argparse.SUPPRESS)  # the browser whose first pages a process records
    args = parser.parse_args()
    if args.play or args.pages:
        print(json.dumps(play(args.play, args.episodes) if args.play else first_pages(args.pages)))
        return
    missing = [program for program in BROWSERS.values() if shutil.which(program) is None]
    if missing:
        sys.exit(f"Not on PATH: {', '.join(missing)}. Install both: apt-get install chromium chromium-headless-shell")
    results = {name: [] for name in BROWSERS}
    for round_ in range(args.rounds):
        for name, program in BROWSERS.items():
            results[name].append(in_a_process("--play", shutil.which(program), "--episodes", str(args.episodes)))
            row = results[name][-1]
            print(
                f"round {round_ + 1}, {name}: launch {row['launch_s']:.2f} s, {row['launch_cpu_s']:.2f} CPU-s; "
                f"episode {row['episode_s']:.3f} s, {row['episode_cpu_s']:.3f} CPU-s; solved {row['solved']:.0%}",
                flush=True,
            )
    medians = {
        name: {key: statistics.median(r[key] for r in rows) for key in rows[0]} for name, rows in results.items()
    }
    shell, full = medians["headless shell"], medians["full browser"]
    for key in ("launch_s", "launch_cpu_s", "episode_s", "episode_cpu_s"):
        print(
            f"median {key}: headless shell {shell[key]:.3f}, full browser {full[key]:.3f}, "
            f"ratio {shell[key] / full[key]:.2f}"
        )
    shell_pages, full_pages = (in_a_process("--pages", shutil.which(program)) for program in BROWSERS.values())
    differ = [task for task in full_pages if shell_pages[task] != full_pages[task]]
    print(
        f"first pages (goal and accessibility tree, seed 3) of {len(full_pages)} tasks: {len(differ)} differ {differ}"
    )


if __name__ == "__main__":
    main()
