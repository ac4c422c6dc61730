"""Whether a task's actions are reported failed on a busy machine: each action played with the renderer slowed by
DevTools' CPU throttling, on the environment's short path and on BrowserGym's own code, side by side.

    python bench/slowed_actions.py --task click-pie --seeds 20            # the drawing, taller than the view
    python bench/slowed_actions.py --task click-collapsible-2 --rate 60

For each seed, each path's session (a browser context of its own) resets the task and plays the actions the restart
comparison plays (tests/restart_harness.py: the scripted plan's, else a click or fill of the page's first elements),
each with the renderer `--rate` times slower. It prints, per path, how many actions were reported failed and how many
episodes were solved: an action that did what it asked and was reported failed is a step that depends on how busy the
machine is (docs/environment.md, the short path).
"""

import argparse
import sys
from pathlib import Path

# The restart comparison's harness and the sessions it plays in: beside the tests, in tests/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from in_process_sessions import browsers, new_session
from restart_harness import FIELDS, fixed_actions, renderer_slowed, step

PATHS = {"short path": {}, "BrowserGym's code": {"browsergym_actions": True}}


def play_slowed(session, task: str, seed: int, rate: float) -> tuple[int, int, bool]:
    """(actions, actions reported failed, solved) of one episode with every action slowed `rate` times."""
    observation = session.reset(task_name=task, seed=seed, fields=FIELDS)
    actions = fixed_actions(task, observation.goal, observation.axtree_txt, right=True)
    failed, reward = 0, 0.0
    for action in actions:
        with renderer_slowed(session, rate):
            observation = step(session, action)
        failed += bool(observation.error)
        reward = observation.reward or 0.0
        if observation.done:
            break
    return len(actions), failed, reward == 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="click-pie")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--rate", type=float, default=20, help="how many times slower the renderer runs")
    args = parser.parse_args()
    pool = browsers(len(PATHS))
    totals = {path: [0, 0, 0] for path in PATHS}
    with new_session(pool, **PATHS["short path"]) as short, new_session(pool, **PATHS["BrowserGym's code"]) as stock:
        for seed in range(args.seeds):
            for path, session in zip(PATHS, (short, stock), strict=True):
                actions, failed, solved = play_slowed(session, args.task, seed, args.rate)
                totals[path] = [totals[path][0] + actions, totals[path][1] + failed, totals[path][2] + solved]
            print(f"seed {seed}: " + "; ".join(f"{p}: {t[1]} of {t[0]} failed" for p, t in totals.items()), flush=True)
    for path, (actions, failed, solved) in totals.items():
        print(f"{path}: {failed} of {actions} actions reported failed, {solved} of {args.seeds} episodes solved")


if __name__ == "__main__":
    main()
