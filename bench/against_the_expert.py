"""An evaluation's episodes beside the scripted expert's on the same seeds, action by action: where a policy leaves
the expert's way (docs/real_model.md, book-clinic).

    python bench/against_the_expert.py outputs/real/clinic-warm-up/eval-100

The expert (warm_start.experts) plays every task and seed the evaluation recorded, through the environment server and
the episode loop that training uses, with the evaluation's episode settings and task modules. For each turn: of the
episodes that followed the expert until then, in how many the policy's action there is the expert's (where the two
differ at a turn, they see different pages from then on), and the policy's commonest action there; then, each turn on
its own, in how many of all the episodes the policy's action is the expert's.
"""

import argparse
import contextlib
import json
from collections import Counter
from contextlib import closing
from pathlib import Path

from browser_rl.episode_settings import EpisodeSettings
from browser_rl.metrics import setup_logging
from browser_rl.options import ServerArguments
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import open_server_pool
from warm_start.experts import known_experts
from warm_start.record import record_experts
from warm_start.tiny_lfm2 import build_tokenizer
from web_env import task_modules


def experts_actions(evaluation: Path, episodes: list[dict]) -> dict[tuple[str, int], list[str]]:
    """The expert's actions on each (task, seed) of the episodes, played as the evaluation played them."""
    settings = json.loads((evaluation / "summary.json").read_text())
    modules = settings["arguments"]["task_modules"]
    task_modules.load(modules)
    episode_settings = EpisodeSettings(**settings["episode_settings"])
    tokenizer = build_tokenizer()
    instances = [(e["task_name"], e["seed"]) for e in episodes]
    with contextlib.ExitStack() as stack:
        servers = open_server_pool(stack, ServerArguments(env_servers=1), 16, modules)
        with closing(EpisodeRunner(servers, tokenizer, episode_settings)) as runner:
            played = record_experts(runner, instances, known_experts(modules))
    unsolved = [f"{d.task} seed {d.seed}" for d in played if not d.solved]
    if unsolved:
        print(f"the expert does not solve {len(unsolved)}: {', '.join(unsolved)}")
    return {(d.task, d.seed): [turn.reply for turn in d.turns] for d in played}


def main() -> None:
    setup_logging()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("evaluation", type=Path, help="an evaluate.py output_dir (episodes.jsonl, summary.json)")
    evaluation = parser.parse_args().evaluation
    episodes = [json.loads(line) for line in (evaluation / "episodes.jsonl").read_text().splitlines()]
    expert = experts_actions(evaluation, episodes)
    pairs = [(e["actions"], expert[e["task_name"], e["seed"]]) for e in episodes]
    turns = range(max(len(theirs) for _, theirs in pairs))
    print(f"{len(pairs)} episodes; turn: the policy's action is the expert's in (of those that agreed until then)")
    for turn in turns:
        reached = [(ours, theirs) for ours, theirs in pairs if len(theirs) > turn and ours[:turn] == theirs[:turn]]
        same = sum(len(ours) > turn and ours[turn] == theirs[turn] for ours, theirs in reached)
        commonest, count = Counter(ours[turn] if len(ours) > turn else None for ours, _ in pairs).most_common(1)[0]
        print(f"  turn {turn + 1}: {same} of {len(reached)}; commonest of all {len(pairs)}: {commonest} ({count})")
    print("each turn on its own: the policy's action is the expert's in")
    for turn in turns:
        same = sum(len(ours) > turn and len(theirs) > turn and ours[turn] == theirs[turn] for ours, theirs in pairs)
        print(f"  turn {turn + 1}: {same} of {len(pairs)}")


if __name__ == "__main__":
    main()
