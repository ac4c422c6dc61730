"""train.py as the data-parallel tests run it: the same entry point, and each rank also appends to
OUTPUT_DIR/ranks/rank-N.jsonl, after every optimizer step, a digest of its weights and the episodes it played for
that step, so that a test can compare the ranks with each other and with the step's logged figures."""

import hashlib
import json
import os
from pathlib import Path

from transformers import TrainerCallback

import train
from rollout import EpisodeRunner

played: list[list] = []  # the episodes of each EpisodeRunner.run since the last step
run_episodes = EpisodeRunner.run


def recording_run(self, specs, policy, max_context_tokens=None):
    episodes = run_episodes(self, specs, policy, max_context_tokens)
    played.append([(episode.task_name, episode.seed, episode.solved) for episode in episodes])
    return episodes


class RankLog(TrainerCallback):
    def on_step_end(self, args, state, control, model=None, **kwargs):
        digest = hashlib.sha256()
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
        row = {"step": state.global_step, "weights": digest.hexdigest(), "episodes": played[-1] if played else []}
        played.clear()  # a step the environment made play again counts its last run
        ranks = Path(args.output_dir) / "ranks"
        ranks.mkdir(parents=True, exist_ok=True)
        with open(ranks / f"rank-{os.environ.get('RANK', '0')}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    EpisodeRunner.run = recording_run
    train.run_from_command_line([RankLog()])
