"""SFT phases during GRPO, against entropy collapse (ComputerRL's Entropulse): the run keeps its own successful
episodes, and when the policy's entropy falls below a threshold, or every N GRPO steps, it trains for a few steps on
them with the supervised loss, then goes back to GRPO.

A phase runs inside the GRPO trainer (train.py's RecipeTrainer): its steps are the trainer's optimizer steps, with
its optimizer, learning-rate schedule, accelerator and step counter, so they count toward max_steps and the schedule,
the colocated vLLM engine is given the new weights before the next rollout, and checkpoints hold them. Each
episode is trained on as it was played, token for token (the rollout's own ids), with the loss on its replies.

The buffer and the phase state are the same on every rank (every rank's successes are gathered into each), are
saved in each checkpoint (`sft_phases.json`) and restored on resume; the episodes of a phase step are drawn from
the step number alone, so a resumed run draws the same ones.
"""

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

STATE_FILE = "sft_phases.json"


@dataclass
class SftPhases:
    steps: int  # optimizer steps per phase; 0: no phases
    every: int  # a phase after this many GRPO steps (0: only by entropy)
    entropy_below: float  # a phase when a GRPO step's mean entropy falls below this (0: only every N steps)
    buffer_size: int  # the latest successful episodes kept
    episodes_per_step: int  # episodes a phase step trains on, all ranks together
    seed: int = 0
    buffer: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (token ids, reply mask) per episode
    phase_end: int = 0  # the global step the current phase ends before
    phases: int = 0  # phases begun
    grpo_steps: int = 0  # GRPO steps since the last phase
    last_entropy: float | None = None  # the last GRPO step's mean entropy, until a phase starts on it

    @property
    def enabled(self) -> bool:
        return self.steps > 0

    def keep(self, successes: list[tuple[list[int], list[int]]]) -> None:
        """Adds a step's successful episodes (every rank's, in rank order), keeping the latest buffer_size."""
        self.buffer = (self.buffer + [(list(ids), list(mask)) for ids, mask in successes])[-self.buffer_size :]

    def in_phase(self, step: int) -> bool:
        """Whether optimizer step `step` (the trainer's global step before it) is a phase step; decided at its first
        micro-batch, a phase begins here if it is due and the buffer holds a step's episodes."""
        if step < self.phase_end:
            return True
        due = (self.every and self.grpo_steps >= self.every) or (
            self.entropy_below and self.last_entropy is not None and self.last_entropy < self.entropy_below
        )
        if not self.enabled or not due or len(self.buffer) < self.episodes_per_step:
            return False
        self.phase_end, self.phases, self.grpo_steps, self.last_entropy = step + self.steps, self.phases + 1, 0, None
        return True

    def grpo_step_done(self, entropy: float | None) -> None:
        self.grpo_steps += 1
        self.last_entropy = entropy

    def episodes(self, step: int, micro_batch: int, rank: int, per_rank: int) -> list[tuple[list[int], list[int]]]:
        """This rank's share of a phase step's episodes, drawn without replacement from the buffer by the step and
        micro-batch numbers alone."""
        drawn = random.Random(f"{self.seed}/{step}/{micro_batch}").sample(
            range(len(self.buffer)), k=self.episodes_per_step
        )
        return [self.buffer[i] for i in drawn[rank * per_rank : (rank + 1) * per_rank]]

    def save(self, directory: str | Path) -> None:
        (Path(directory) / STATE_FILE).write_text(json.dumps(asdict(self)))

    def load(self, directory: str | Path) -> None:
        """The state a checkpoint saved, if it saved one (a run that had phases turned off did not)."""
        path = Path(directory) / STATE_FILE
        if path.exists():
            saved = json.loads(path.read_text())
            saved["buffer"] = [tuple(episode) for episode in saved["buffer"]]
            for name in ("buffer", "phase_end", "phases", "grpo_steps", "last_entropy"):
                setattr(self, name, saved[name])


def reply_loss(model, episodes: list[tuple[list[int], list[int]]], pad_token_id: int) -> tuple[torch.Tensor, float]:
    """The mean negative log-likelihood of the episodes' reply tokens, and the policy's mean entropy on them. Logits
    are taken only where some episode predicts a reply token (`logits_to_keep`): an episode's pages are thousands of
    tokens, its replies a few dozen, and a whole vocabulary at every position would not fit a GPU."""
    width = max(len(ids) for ids, _ in episodes)
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids + [pad_token_id] * (width - len(ids)) for ids, _ in episodes], device=device)
    attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in episodes], device=device)
    mask = torch.tensor([mask + [0] * (width - len(mask)) for _, mask in episodes], device=device).bool()
    targets = mask[:, 1:].any(0).nonzero().squeeze(-1) + 1  # positions of a reply token in some episode
    logits = model(input_ids=input_ids, attention_mask=attention, logits_to_keep=targets - 1).logits.float()
    logprobs = logits.log_softmax(-1)
    nll = -logprobs.gather(-1, input_ids[:, targets, None]).squeeze(-1)
    replies = mask[:, targets]
    with torch.no_grad():
        entropy = -(logprobs.exp() * logprobs).sum(-1)[replies].mean().item()
    return nll[replies].mean(), entropy
