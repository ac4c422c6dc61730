"""Where an episode's CPU goes in the environment: each part of a reset and a step, alone, on one real Chromium.

    python bench/env_profile.py                          # click-button, 40 times each part
    python bench/env_profile.py --task click-test --times 100

Each part runs `--times` times in one session of the server's environment (web_env/server/environment.py), in this
process, and is charged the CPU time of every process involved, split by kind: this process (the environment's
Python, Playwright's client), Playwright's Node driver, Chromium's browser process, its renderers, and its other
processes (GPU, utility). The
parts: a reset (its observation included) that loads the task's page and one that restarts the episode in the page,
each with every field of the observation and with the accessibility tree alone; the observation alone; its pieces
as BrowserGym computes them (marking the elements with their ids and unmarking, the accessibility tree, the DOM
snapshot and the pruned HTML); a click and BrowserGym's validation of it; one Playwright round trip
(`page.evaluate("1")`); opening and detaching a DevTools session; and encoding an observation as JSON. Run it on an
otherwise idle machine.
"""

import argparse
import os
import time
from collections.abc import Callable

import psutil
from browsergym.core.action.base import execute_python_code
from browsergym.core.observation import _post_extract, _pre_extract, extract_dom_snapshot, extract_merged_axtree
from browsergym.utils.obs import flatten_axtree_to_str, flatten_dom_to_str, prune_html

from warm_start.plans import plan
from web_env.actions import action_code
from web_env.server import browser_setup
from web_env.server.browsers import BrowserPool
from web_env.server.environment import OBSERVATION_FIELDS, TASK_CLASSES, BrowserTaskEnvironment

KINDS = ("python", "node driver", "browser", "renderer", "other chromium")
TREE_ONLY = ["goal", "axtree_txt", "error"]  # what the recipe's prompt reads


def process_kind(process: psutil.Process) -> str:
    if process.pid == os.getpid():
        return "python"
    command = " ".join(process.cmdline())
    if "run-driver" in command:
        return "node driver"
    if "--type=renderer" in command:
        return "renderer"
    return "other chromium" if "--type=" in command else "browser"


def cpu_by_kind() -> dict[str, float]:
    """CPU seconds so far of this process and every descendant, by kind."""
    me = psutil.Process()
    totals = dict.fromkeys(KINDS, 0.0)
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
            totals[process_kind(process)] += times.user + times.system
        except psutil.Error:
            pass
    return totals


def measure(name: str, times: int, part: Callable, before_each: Callable | None = None) -> dict:
    """CPU seconds per time of `part`, by kind; `before_each` runs first, uncounted."""
    totals = dict.fromkeys(KINDS, 0.0)
    for _ in range(times):
        if before_each:
            before_each()
        start = cpu_by_kind()
        part()
        time.sleep(0.05)  # what Chromium does for the part after answering (layout, painting) lands in it too
        end = cpu_by_kind()
        for kind in KINDS:
            totals[kind] += end[kind] - start[kind]
    return {"part": name} | {kind: seconds / times for kind, seconds in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="click-button", choices=sorted(TASK_CLASSES))
    parser.add_argument("--times", type=int, default=40)
    args = parser.parse_args()
    browser_setup.prepare()
    env = BrowserTaskEnvironment(BrowserPool(1))
    seeds = iter(range(1, 1_000_000))

    def reset(reload_every: int, fields: list[str]):
        def run():
            env._reload_every = reload_every
            return env.reset(task_name=args.task, seed=next(seeds), fields=fields)

        return run

    def on_browser(function: Callable, *arguments) -> Callable:
        return lambda: env._worker.call(function, *arguments)

    def page():
        return env._page

    def marked() -> None:
        env._worker.call(_pre_extract, page(), "standard_html", False)

    def unmark() -> None:
        env._worker.call(_post_extract, page())

    episode = {}

    def new_episode() -> None:
        episode["first"] = in_page_everything()

    def click() -> None:
        first = episode["first"]
        (action, *_) = plan(args.task, first.goal, first.axtree_txt).right
        env._worker.call(execute_python_code, action_code(action), page(), None, None)

    def devtools_session() -> None:
        env._worker.call(lambda: page().context.new_cdp_session(page()).detach())

    def prompt_fields_observation() -> None:
        env._fields = frozenset(TREE_ONLY)
        env._worker.call(env._observation, "", 0.0, False, 0.0)
        env._fields = frozenset(OBSERVATION_FIELDS)

    observation = reset(1, list(OBSERVATION_FIELDS))()  # warm-up: the browser, its context, the task's page
    fresh_everything, in_page_everything = reset(1, list(OBSERVATION_FIELDS)), reset(10**9, list(OBSERVATION_FIELDS))
    parts = [
        measure("reset, page loaded: every field", args.times, fresh_everything),
        measure("reset, page loaded: the prompt's fields", args.times, reset(1, TREE_ONLY)),
        measure("reset, restarted in the page: every field", args.times, in_page_everything),
        measure("reset, restarted in the page: the prompt's fields", args.times, reset(10**9, TREE_ONLY)),
        measure("observation alone: every field", args.times, on_browser(env._observation, "", 0.0, False, 0.0)),
        measure("observation alone: the prompt's fields", args.times, prompt_fields_observation),
        measure("  marking and unmarking (BrowserGym)", args.times, lambda: (marked(), unmark())),
        measure(
            "  accessibility tree, flattened (BrowserGym)",
            args.times,
            lambda: (flatten_axtree_to_str(env._worker.call(extract_merged_axtree, page())), unmark()),
            marked,
        ),
        measure(
            "  DOM snapshot and pruned HTML (BrowserGym)",
            args.times,
            lambda: (prune_html(flatten_dom_to_str(env._worker.call(extract_dom_snapshot, page()))), unmark()),
            marked,
        ),
        measure("click (BrowserGym's action code)", args.times, click, new_episode),
        measure("validation (BrowserGym)", args.times, on_browser(lambda: env._task.validate(page(), []))),
        measure("one Playwright round trip", args.times, on_browser(lambda: page().evaluate("1"))),
        measure("a DevTools session opened and detached", args.times, devtools_session),
        measure("observation to JSON: every field", args.times, observation.model_dump_json),
    ]
    env.close()
    print(f"\n{args.task}: CPU milliseconds per time, {args.times} times each, on {os.cpu_count()} CPUs\n")
    print(f"{'part':<52}" + "".join(f"{kind:>15}" for kind in KINDS) + f"{'total':>9}")
    for row in parts:
        cells = [1000 * row[kind] for kind in KINDS]
        print(f"{row['part']:<52}" + "".join(f"{cell:>15.1f}" for cell in cells) + f"{sum(cells):>9.1f}")


if __name__ == "__main__":
    main()
