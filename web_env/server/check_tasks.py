"""Checks your own tasks as the server will run them, as Gymnasium's check_env checks an environment:

    python -m web_env.server.check_tasks my_tasks.py            # every task the module registers, seeds 0-4
    python -m web_env.server.check_tasks my_tasks --seeds 10 --random_actions 30

For each task and seed, in the server's own environment: a seed gives the same instance every time and other seeds
others; `cheat` solves it; each of its `wrong_endings` ends it with reward 0; random allowlisted actions never make
`validate` raise; concurrent sessions and consecutive episodes share nothing; a request to another origin never
arrives; and what a reset costs. Exits with status 1 and one line per failure, 0 when all pass (every check in
detail: docs/your_own_task.md).
"""

import argparse
import contextlib
import http.server
import random
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from web_env import task_modules
from web_env.models import BrowserGymAction
from web_env.server import browser_setup
from web_env.server.app import process_tree_cpu_s
from web_env.server.browsers import BrowserPool
from web_env.server.environment import BrowserTaskEnvironment

ELEMENT = re.compile(r"\[(\d+)\] (\w+)")
RANDOM_KEYS = ["Enter", "Tab", "Escape", "ArrowDown", "Backspace"]


@dataclass
class Report:
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check(self, passed: bool, task: str, seed: int | None, what: str) -> bool:
        if not passed:
            self.failures.append(f"FAIL {task}" + (f" seed {seed}" if seed is not None else "") + f": {what}")
        return passed


def instance(observation) -> tuple[str, str]:
    """What a seed decides: the goal and the page as the policy reads it."""
    return observation.goal, observation.axtree_txt


def paid(observation) -> bool:
    return observation.reward > 0


class OtherOrigin:
    """A server on loopback that counts the requests reaching it: a page that reaches it got out of its origin."""

    def __init__(self):
        hits = self.hits = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def reach_out(url: str):
    """An action that tries every way out of the page: a fetch, an image, and a navigation."""

    def act(task, page):
        page.evaluate(
            "url => { fetch(url + 'fetch', {mode: 'no-cors'}).catch(() => {}); new Image().src = url + 'image'; }",
            url,
        )
        with contextlib.suppress(Exception):  # refused: what should happen
            page.goto(url + "navigation", timeout=2000)
        page.wait_for_timeout(300)

    return act


def random_action(observation, rng: random.Random) -> str:
    """One of the allowlist's actions (web_env.actions) on an element of the page, as a policy could write it."""
    elements = ELEMENT.findall(observation.axtree_txt)
    if not elements:
        return "scroll(0, 200)"
    bid, _role = rng.choice(elements)
    other, _ = rng.choice(elements)
    return rng.choice(
        [
            f"click('{bid}')",
            f"dblclick('{bid}')",
            f"hover('{bid}')",
            f"focus('{bid}')",
            f"fill('{bid}', 'x{rng.randint(0, 99)}')",
            f"clear('{bid}')",
            f"press('{bid}', '{rng.choice(RANDOM_KEYS)}')",
            f"select_option('{bid}', 'x')",
            f"drag_and_drop('{bid}', '{other}')",
            "scroll(0, 200)",
        ]
    )


def reference_instances(task: str, seeds: list[int], pool: BrowserPool, report: Report) -> dict[int, tuple]:
    """Each seed's instance in a fresh session, the reference the other checks compare with; and what a reset costs,
    measured while nothing else runs, so that the CPU read is the reset's alone."""
    reference, reset_s, reset_cpu = {}, [], []
    for seed in seeds:
        fresh = BrowserTaskEnvironment(pool)
        try:
            started, cpu = time.perf_counter(), process_tree_cpu_s()
            reference[seed] = instance(fresh.reset(seed=seed, task_name=task))
            reset_s.append(time.perf_counter() - started)
            reset_cpu.append(process_tree_cpu_s() - cpu)
        finally:
            fresh.close()
    distinct = len(set(reference.values()))
    report.check(
        distinct > len(seeds) // 2,
        task,
        None,
        f"{len(seeds)} seeds gave {distinct} distinct instance(s) (goal and page): does the task use its seed?",
    )
    report.notes.append(
        f"{task}: a reset in a fresh session takes {sum(reset_s) / len(reset_s):.2f} s, "
        f"{sum(reset_cpu) / len(reset_cpu):.2f} CPU-s of this process and its browsers"
    )
    return reference


def check_task(task: str, reference: dict[int, tuple], random_actions: int, pool: BrowserPool, report: Report) -> None:
    first, second = BrowserTaskEnvironment(pool), BrowserTaskEnvironment(pool)
    other_origin = OtherOrigin()
    try:
        rng = random.Random(0)
        for seed, instance_of_seed in reference.items():
            check_seed(task, seed, instance_of_seed, first, second, random_actions, rng, report)
        first.reset(seed=next(iter(reference)), task_name=task)
        first.act_with(reach_out(other_origin.url))
        report.check(
            not other_origin.hits,
            task,
            None,
            f"requests to another origin went through: {other_origin.url} got {other_origin.hits}",
        )
    finally:
        other_origin.close()
        first.close()
        second.close()


def failed_with(error: Exception, task: str, report: Report) -> None:
    """A task whose code broke where no check expected it to fails with what it raised."""
    report.check(False, task, None, f"{type(error).__name__}: {error}".splitlines()[0])


def check_seed(task, seed, reference, first, second, random_actions, rng, report) -> None:
    def same_as_fresh(observation, after: str) -> bool:
        return report.check(
            instance(observation) == reference,
            task,
            seed,
            f"{after}, the goal or page differs from a fresh session's of the same seed",
        )

    # The cheat solves it; then the next episode of the session, and a session open beside it, see nothing of that.
    second.reset(seed=seed, task_name=task)  # open at once with the first
    same_as_fresh(first.reset(seed=seed, task_name=task), "in a session that played before")
    try:
        solved = first.act_with(lambda task, page: task.cheat(page, []))
        report.check(solved.done and solved.reward == 1.0, task, seed, f"cheat did not solve it: {verdict(solved)}")
    except NotImplementedError:
        report.notes.append(f"{task}: no cheat, so nothing checks that an episode can be solved")
    same_as_fresh(second.reset(seed=seed, task_name=task), "in a session open beside one that solved it")
    report.check(not paid(second.act_with(noop)), task, seed, "a session paid for what another session did")
    same_as_fresh(first.reset(seed=seed, task_name=task), "in the episode after a solved one")
    report.check(not paid(first.act_with(noop)), task, seed, "an episode paid for what the one before it did")
    # Each wrong ending scores 0.
    for ending in getattr(type(task_modules.task_maker(task)(seed=seed)), "wrong_endings", []):
        first.reset(seed=seed, task_name=task)
        ended = first.act_with(ending)
        report.check(
            not ended.error and ended.done and ended.reward == 0,
            task,
            seed,
            f"wrong ending {ending.__name__}: {ended.error or verdict(ended)}, where it should end the episode with"
            " reward 0",
        )
    # Random actions never make validate raise (a TaskError out of step).
    observation = first.reset(seed=seed, task_name=task)
    for _ in range(random_actions):
        action = random_action(observation, rng)
        try:
            observation = first.step(BrowserGymAction(action_str=action))
        except Exception as error:
            report.check(False, task, seed, f"after the random action {action}: {type(error).__name__}: {error}")
            observation = first.reset(seed=seed, task_name=task)
            continue
        if observation.done:
            observation = first.reset(seed=seed, task_name=task)


def noop(task, page) -> None:
    pass


def verdict(observation) -> str:
    return f"reward {observation.reward}, done {observation.done}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task_modules", nargs="+", help="module names importable from here, or .py paths")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per task, from 0")
    parser.add_argument("--random_actions", type=int, default=20, help="random actions per seed")
    parser.add_argument("--workers", type=int, default=4, help="tasks checked at a time, on as many browsers")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    browser_setup.prepare()
    try:
        tasks = task_modules.load(args.task_modules)
    except ValueError as error:
        parser.error(str(error))
    # The resets that measure what a reset costs run one at a time, with nothing beside them; the checks then run
    # side by side, for most of a check waits on the browser (an action the page refuses waits out 500 ms).
    pool, seeds = BrowserPool(min(args.workers, len(tasks))), list(range(args.seeds))
    reports, references = {task: Report() for task in tasks}, {}
    for task in tasks:
        print(f"checking {task} on seeds 0-{args.seeds - 1} ...", flush=True)
        try:
            references[task] = reference_instances(task, seeds, pool, reports[task])
        except Exception as error:
            failed_with(error, task, reports[task])

    def check(task: str) -> None:
        try:
            check_task(task, references[task], args.random_actions, pool, reports[task])
        except Exception as error:
            failed_with(error, task, reports[task])

    with ThreadPoolExecutor(max_workers=args.workers) as checking:
        list(checking.map(check, references))
    notes = [note for report in reports.values() for note in report.notes]
    failures = [failure for report in reports.values() for failure in report.failures]
    for line in notes + failures:
        print(line)
    outcome = f"{len(failures)} failure(s)" if failures else "all checks passed"
    print(f"{len(tasks)} task(s): {outcome}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
