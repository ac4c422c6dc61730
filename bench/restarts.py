"""Episodes restarted in the page, checked over every task: which tasks restart (census), and whether a restart in a
page that has lived through many episodes of allowed but disruptive actions is still the episode a fresh load of the
same seed gives (aging).

    python bench/restarts.py census                   # every task: restarts in the page, or why it loads afresh
    python bench/restarts.py aging                    # every task, 100 aging episodes, 2 seeds for each prior state
    python bench/restarts.py aging --tasks use-colorwheel ascending-numbers --episodes 30 --seeds 1
    python bench/restarts.py slowed --task click-collapsible-2 --times 30   # the last action before, on a busy machine
    python bench/restarts.py settling                 # every task: does its compared episode change a second later?

Census: for each task one session loads the task's page, then, for each state an episode can be left in
(untouched, half done, timed out, played out, roughed up), leaves an episode in it and resets to the task again: the
reset restarts in the page, or its observation says why the page was loaded afresh (`loaded_because`). It prints a
line per task and "N of 125 tasks restart in the page".

Aging: for each task, one session ages a page: `--episodes` episodes in it (seeds 0, 1, ...), each with `--actions`
allowed actions on random elements of the page, each kind in turn (keys, scrolls, double clicks, drags, hovers,
select_option, long fills, clicks, focus, clear). Then, for each prior state and each of `--seeds` seeds, the aged
session leaves an episode in that state, restarts the compared seed and plays it with fixed actions; a second session
loads the same seed afresh and plays the same. Goal, tree, each action's reward, termination, error and tree, and the
page itself (URL, focus, scroll offsets, form values) must be equal. Tasks that always load afresh are compared too,
as a check of the comparison. It prints a line per task (with the aging resets that loaded afresh, and why) and the
count, and writes them to `--output` (JSON). Both sessions run in this process, one after the other, on browsers of
their own; `--workers` tasks at a time.

Slowed: the restart after an episode whose last action ran on a busy machine, made by DevTools' CPU throttling of
the renderer (`--rate` times slower) for that action alone. `--times` times, the session loads the task afresh,
leaves an episode played out in it (seed 1011) with its last action slowed, restarts seed 11 and plays it; each
restarted episode is compared with one fresh load of seed 11. It prints how many differed and how many resets
restarted in the page (docs/environment.md: a click that ran out of BrowserGym's 500 ms on a moving header).

Settling: for each task but the time-dependent ones, seed 11's compared episode on a fresh load, as `play` plays it
(the page's timed effects off; `--timed_effects on` keeps them, as a training episode does): after the reset and
after each action, the tree and page state observed are read again a second later. A task whose page changed in
that second has an observation that the machine's load decides, and a comparison of it would depend on the load;
it prints each such task with the action and the first difference, and the count.
"""

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The harness the tests check restarts with, and the sessions it plays in: beside the tests, in tests/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from in_process_sessions import browsers, new_session
from restart_harness import (
    BEFORE,
    FIELDS,
    RESTARTED,
    TIME_DEPENDENT,
    aging,
    first_difference,
    leave,
    play_compared,
    settling,
)
from web_env.server.browsers import BrowserPool
from web_env.server.environment import TASK_CLASSES


def census(pool: BrowserPool, task: str) -> dict[str, str]:
    """For each state the episode before a reset was left in: "" where the reset restarted in the page, else why
    it loaded the page afresh. A new session, so that its page starts young."""
    outcomes = {}
    with new_session(pool) as session:
        session.reset(task_name=task, seed=0, fields=FIELDS)  # the task's page, loaded
        for n, state in enumerate(BEFORE):
            leave(session, task, 100 + n, state)
            observation = session.reset(task_name=task, seed=200 + n, fields=FIELDS)
            outcomes[state] = observation.metadata.get("loaded_because", "")
    return outcomes


def print_census(tasks: list[str]) -> list[str]:
    """Prints each task's census; the tasks that restart in the page after every state."""
    pool, start, restarting = browsers(), time.perf_counter(), []
    for task in tasks:
        outcomes = census(pool, task)
        reasons = sorted({reason for reason in outcomes.values() if reason})
        if reasons:
            after = ", ".join(state for state, reason in outcomes.items() if reason)
            print(f"{task:<28} loads afresh after {after}: {'; '.join(reasons)}", flush=True)
        else:
            restarting.append(task)
            print(f"{task:<28} restarts in the page", flush=True)
    print(f"{len(restarting)} of {len(tasks)} tasks restart in the page ({time.perf_counter() - start:.0f}s)")
    return restarting


def print_aging(tasks: list[str], episodes: int, actions: int, seeds: int, output: str, workers: int) -> bool:
    """Ages and compares each task's page, `workers` tasks at a time (a browser each); whether every task's
    restarts equal fresh loads."""
    pool, results, start, printing = browsers(2 * workers), {}, time.perf_counter(), threading.Lock()
    Path(output).parent.mkdir(parents=True, exist_ok=True)  # once, before the hours of aging, not at each task

    def age_and_compare(task: str) -> None:
        task_start = time.perf_counter()
        result = aging(pool, task, episodes, actions, seeds)
        outcomes, differences = result["aging_resets"], result["differences"]
        verdict = "equal" if not differences else f"{len(differences)} differ: {differences[0]}"
        with printing:
            results[task] = result
            print(
                f"{task:<28} aged {outcomes.get(RESTARTED, 0)}/{episodes} in the page, "
                f"{result['compared_restarts']}/{len(BEFORE) * seeds} compared restarts, {verdict} "
                f"({time.perf_counter() - task_start:.0f}s)",
                flush=True,
            )
            for reason, count in outcomes.items():
                if reason != RESTARTED:
                    print(f"    {count} loaded afresh: {reason}")
            for timing in result["fresh_loads_differ"]:
                print(f"    two fresh loads differ too, so the page's timing, not the restart: {timing}")
            Path(output).write_text(json.dumps(dict(sorted(results.items())), indent=1) + "\n")

    with ThreadPoolExecutor(max_workers=workers) as running:
        list(running.map(age_and_compare, tasks))
    equal = [task for task, result in results.items() if not result["differences"]]
    timing = sum(len(result["fresh_loads_differ"]) for result in results.values())
    print(
        f"{len(equal)} of {len(results)} tasks equal to a fresh load after aging, {timing} comparison(s) where two "
        f"fresh loads differ ({time.perf_counter() - start:.0f}s)"
    )
    return len(equal) == len(results)


def print_settling(tasks: list[str], timed_effects_on: bool) -> list[str]:
    """Prints each task whose compared episode changed a second after an observation; those tasks."""
    pool, start, changing = browsers(1), time.perf_counter(), []
    with new_session(pool, reload_every=1) as session:
        for task in tasks:
            if task in TIME_DEPENDENT:
                continue
            changed = settling(session, task, timed_effects_on)
            if changed:
                changing.append(task)
                print(f"{task:<28} changed a second later after {'; '.join(changed)}", flush=True)
    compared = len([task for task in tasks if task not in TIME_DEPENDENT])
    elapsed = time.perf_counter() - start
    print(f"{len(changing)} of {compared} tasks changed a second after an observation ({elapsed:.0f}s)")
    return changing


def slowed(task: str, times: int, rate: float) -> dict:
    """`times` restarts of `task`'s seed 11, each after a fresh load and an episode played out with its last action
    slowed `rate` times, against one fresh load of seed 11: how many differed, and how many restarted in the page."""
    pool = browsers(2)
    with new_session(pool) as restarting, new_session(pool, reload_every=1) as loading:
        reference = play_compared(loading, task, 11, right=True)[1]
        other = next(name for name in sorted(TASK_CLASSES) if name != task)
        differed = restarted = 0
        for _ in range(times):
            restarting.reset(task_name=other, seed=0, fields=FIELDS)  # so that the episode left loads the page
            leave(restarting, task, 1011, "played out", last_slowed=rate)
            metadata, episode = play_compared(restarting, task, 11, right=True)
            restarted += metadata["restarted_in_page"]
            if episode != reference:
                differed += 1
                print(f"differs: {first_difference(episode, reference)}", flush=True)
    return {"differed": differed, "restarted": restarted, "times": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("census", "aging", "settling"):
        command = commands.add_parser(name)
        command.add_argument("--tasks", nargs="*", default=sorted(TASK_CLASSES))
    aging = commands.choices["aging"]
    aging.add_argument("--episodes", type=int, default=100, help="aging episodes per page")
    aging.add_argument("--actions", type=int, default=3, help="disruptive actions per aging episode")
    aging.add_argument("--seeds", type=int, default=2, help="compared seeds per prior state")
    aging.add_argument("--output", default="outputs/restart_aging.json", help="the results as JSON, by task")
    aging.add_argument("--workers", type=int, default=4, help="tasks aged at a time, each on browsers of its own")
    slow = commands.add_parser("slowed")
    slow.add_argument("--task", default="click-collapsible-2")
    slow.add_argument("--times", type=int, default=30, help="restarts compared")
    slow.add_argument("--rate", type=float, default=20, help="how many times slower the renderer runs the last action")
    commands.choices["settling"].add_argument(
        "--timed_effects", choices=["on", "off"], default="off", help="the page's timed effects (TIMED_EFFECTS)"
    )
    args = parser.parse_args()
    if args.command == "census":
        print_census(args.tasks)
    elif args.command == "settling":
        sys.exit(1 if print_settling(args.tasks, args.timed_effects == "on") else 0)
    elif args.command == "slowed":
        result = slowed(args.task, args.times, args.rate)
        print(
            f"{result['differed']} of {result['times']} restarted episodes differ from a fresh load; "
            f"{result['restarted']} of {result['times']} resets restarted in the page"
        )
        sys.exit(1 if result["differed"] else 0)
    elif not print_aging(args.tasks, args.episodes, args.actions, args.seeds, args.output, args.workers):
        sys.exit(1)


if __name__ == "__main__":
    main()
