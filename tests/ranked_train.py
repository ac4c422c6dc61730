"""train.py as the data-parallel tests run it: the same entry point, and each rank also appends to
OUTPUT_DIR/ranks/rank-N.jsonl, after every optimizer step, a digest of its weights, the episodes it played for that
step and, in an SFT phase, a digest of its success buffer and the buffer places of the episodes it trained on, so
that a test can compare the ranks with each other and with the step's logged figures. Every rank but
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
from browser_rl.sft_phases import SftPhases

played: list[list] = []  # the episodes of each EpisodeRunner.run since the last step
phase_step: dict = {}  # an SFT phase step's buffer digest, and the buffer places of each micro-batch's episodes
run_episodes = EpisodeRunner.run
draw_episodes = SftPhases.episodes
save_rng_state = GRPOTrainer._save_rng_state


def recording_run(self, instances, policy, max_context_tokens=None, traced=False, guide_turns=None):
    episodes = run_episodes(self, instances, policy, max_context_tokens, traced, guide_turns)
    played.append([(episode.task_name, episode.seed, episode.solved) for episode in episodes])
    return episodes


def recording_draw(self, step, micro_batch, rank, per_rank):
    episodes = draw_episodes(self, step, micro_batch, rank, per_rank)
    phase_step["buffer"] = hashlib.sha256(json.dumps(self.buffer).encode()).hexdigest()
    places = [next(i for i, kept in enumerate(self.buffer) if kept is episode) for episode in episodes]
    phase_step.setdefault("trained", []).append(places)
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
        row["phase"] = dict(phase_step)
        played.clear()  # a step the environment made play again counts its last run
        phase_step.clear()
        ranks = Path(args.output_dir) / "ranks"
        ranks.mkdir(parents=True, exist_ok=True)
        with open(ranks / f"rank-{os.environ.get('RANK', '0')}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    EpisodeRunner.run = recording_run
    SftPhases.episodes = recording_draw
    GRPOTrainer._save_rng_state = late_rng_state
    train.run_from_command_line([RankLog()])
