"""train.py as the data-parallel tests run it: the same entry point, and each rank also appends to
OUTPUT_DIR/ranks/rank-N.jsonl, after every optimizer step, a digest of its weights and the episodes it played for
that step, so that a test can compare the ranks with each other and with the step's logged figures. Every rank but
the first saves its part of a checkpoint a second late, as a rank slowed down by its machine may: the checkpoint
must not count as whole before it has."""

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from transformers import TrainerCallback
from trl import GRPOTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # train.py, beside tests/: the checkout's command
import train
from browser_rl.rollout import EpisodeRunner

played: list[list] = []  # the episodes of each EpisodeRunner.run since the last step
run_episodes = EpisodeRunner.run
save_rng_state = GRPOTrainer._save_rng_state


def recording_run(self, specs, policy, max_context_tokens=None):
    episodes = run_episodes(self, specs, policy, max_context_tokens)
    played.append([(episode.task_name, episode.seed, episode.solved) for episode in episodes])
    return episodes


def late_rng_state(self, output_dir):
    if self.args.process_index > 0:
        time.sleep(1.0)
    save_rng_state(self, output_dir)


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
    GRPOTrainer._save_rng_state = late_rng_state
    train.run_from_command_line([RankLog()])
