"""Records the episodes bench/gpu_step.py replays on a machine without a browser: for each seed of one-action tasks,
the first observation, the right action (warm_start.plans's plan) and the observations after it and after a
wrong action, all from the real environment server.

    python bench/record_replay.py            # writes bench/replay/episodes.jsonl
"""

import argparse
import json
from pathlib import Path

from browser_rl.prompts import PROMPT_FIELDS
from env_client import BrowserGymEnv, LocalEnvServer
from warm_start.plans import plan
from web_env.models import BrowserGymAction

TASKS = ["click-test", "click-button"]  # one right action each; click-test is config.yaml's task
OUTPUT = Path(__file__).parent / "replay" / "episodes.jsonl"


def observed(result) -> dict:
    observation = result.observation
    return {
        "page": observation.axtree_txt,
        "error": observation.error,
        "done": result.done,
        "reward": float(result.reward or 0.0),
    }


def record(session, task: str, seed: int) -> dict:
    first = session.reset(task_name=task, seed=seed, fields=PROMPT_FIELDS).observation
    task_plan = plan(task, first.goal, first.axtree_txt)
    after_wrong = observed(session.step(BrowserGymAction(action_str=task_plan.wrong[0])))
    session.reset(task_name=task, seed=seed, fields=PROMPT_FIELDS)
    after_right = observed(session.step(BrowserGymAction(action_str=task_plan.right[0])))
    assert after_right["reward"] == 1.0 and after_right["done"], (task, seed, after_right)
    return {
        "task": task,
        "seed": seed,
        "goal": first.goal,
        "page": first.axtree_txt,
        "right": task_plan.right[0],
        "after_right": after_right,
        "after_wrong": after_wrong,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=32, help="per task")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    with LocalEnvServer(max_sessions=1) as server, BrowserGymEnv(base_url=server.url).sync() as session:
        rows = [record(session, task, seed) for task in TASKS for seed in range(args.seeds)]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{len(rows)} episodes of {', '.join(TASKS)} written to {args.output}")


if __name__ == "__main__":
    main()
