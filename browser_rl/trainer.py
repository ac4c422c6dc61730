"""The recipe's GRPOTrainer: TRL's, whose optimizer steps may be SFT phases on the run's own successes
(browser_rl.sft_phases), which runs no episode forward and backward that adds nothing to the gradient, and whose
checkpoint is whole, with its episode settings, options (browser_rl.run_config), phase state and task sampler's
state, once its trainer_state.json is written, on any number of ranks."""

import json
from pathlib import Path

import torch
from trl import GRPOTrainer

from browser_rl import run_config
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.model_card import write_model_card
from browser_rl.sft_phases import SftPhases, reply_loss
from browser_rl.tasks import TaskSampler


class RecipeTrainer(GRPOTrainer):
    """GRPOTrainer with SFT phases, no training on episodes without an advantage, and whole checkpoints. It relies
    on four of TRL's and transformers' private seams (pyproject.toml lists them; tests/test_seams.py checks each): the
    metric buffer `_metrics`, which a phase step logs into and the GRPO steps' entropy is read from, the loss types
    of `_compute_loss`, each scaled by the advantage, and `_save_rng_state` / `_load_rng_state`, the last things a
    rank writes into a checkpoint and the first it reads back."""

    def __init__(
        self,
        *args,
        phases: SftPhases,
        sampler: TaskSampler,
        episode_settings: EpisodeSettings,
        run_config: dict,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.phases = phases
        self.sampler = sampler
        self.episode_settings = episode_settings
        self.run_config = run_config
        self._micro_batches = 0
        self._phase_step = False

    def training_step(self, model, inputs, num_items_in_batch):
        micro_batch = self._micro_batches % self.current_gradient_accumulation_steps
        self._micro_batches += 1
        if micro_batch == 0:
            self._phase_step = self.phases.in_phase(self.state.global_step)
            self._step_entropy_from = len(self._metrics["train"].get("entropy", []))
        if self._phase_step:
            return self._sft_phase_step(model, micro_batch)
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self._micro_batches % self.current_gradient_accumulation_steps == 0:
            # `get`: a step whose every micro-batch was skipped has no entropy, which a key made here would log as None.
            step_entropy = self._metrics["train"].get("entropy", [])[self._step_entropy_from :]
            self.phases.grpo_step_done(sum(step_entropy) / len(step_entropy) if step_entropy else None)
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        skipped = self._adds_no_gradient(inputs)
        self._metrics["train"]["training/skipped_share"].append(float(skipped))
        if skipped:
            # Zero gradients, as the full pass gives, rather than none: on a step that trains on nothing the optimizer
            # then steps as it would have (AdamW's momentum moves the weights on a zero gradient too).
            return sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _adds_no_gradient(self, inputs) -> bool:
        """Whether this micro-batch's gradient is zero, known before its forward pass. Each of TRL's GRPO losses
        scales an episode's terms by its advantage, so episodes whose advantages are all zero (their groups all
        solved, or all failed) add nothing, unless a KL penalty (beta) or an auxiliary loss stands beside them. Once
        a warm-up solves most of its tasks, such episodes were most of a CPU step's training time (docs/real_model.md).
        Run anyway: on several ranks, where the gradients' all-reduce needs every rank's backward, and when an SFT
        phase waits on the entropy that their forward measures."""
        return (
            self.accelerator.num_processes == 1
            and self.beta == 0.0
            and not self.aux_loss_enabled
            and not (self.phases.enabled and self.phases.entropy_below)
            and not inputs["advantages"].any()
        )

    def _sft_phase_step(self, model, micro_batch: int) -> torch.Tensor:
        model.train()
        per_rank = self.args.per_device_train_batch_size
        episodes = self.phases.episodes(self.state.global_step, micro_batch, self.accelerator.process_index, per_rank)
        loss, entropy = reply_loss(model, episodes, self.processing_class.pad_token_id)
        self.accelerator.backward(loss / self.current_gradient_accumulation_steps)
        metrics = self._metrics["train"]
        metrics["sft_phase/loss"].append(self.accelerator.gather(loss.detach()).mean().item())
        metrics["sft_phase/entropy"].append(
            self.accelerator.gather(torch.tensor(entropy, device=loss.device)).mean().item()
        )
        metrics["sft_phase/number"].append(self.phases.phases)
        metrics["sft_phase/buffer"].append(len(self.phases.buffer))
        return loss.detach() / self.current_gradient_accumulation_steps

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        if self.accelerator.is_main_process:  # the same on every rank: one copy
            self.episode_settings.save(output_dir)
            run_config.save(self.run_config, output_dir)
            self.sampler.save(output_dir)
            if self.phases.enabled:
                self.phases.save(output_dir)
        # Every rank writes its own RNG state, and the first writes trainer_state.json right after its own, which
        # last_complete_checkpoint takes to mean that the checkpoint is whole. Without this wait, a run killed in
        # between resumes a slower rank with no RNG state, so that its episodes differ from the uninterrupted run's.
        self.accelerator.wait_for_everyone()

    def create_model_card(self, model_name=None, dataset_name=None, tags=None) -> None:
        """The recipe's card (browser_rl.model_card) in place of TRL's generic one, written where TRL writes its own:
        into output_dir with each checkpoint, and before a push."""
        if self.is_world_process_zero():
            tasks = self.run_config["tasks"] or [self.run_config["task_name"]]
            base_model = self.run_config["model_name_or_path"]
            write_model_card(
                self.args.output_dir, self.episode_settings, base_model, "GRPO", tasks, self.args.hub_model_id
            )

    def _load_rng_state(self, checkpoint) -> None:
        super()._load_rng_state(checkpoint)
        if checkpoint is not None:
            self.phases.load(checkpoint)
            self.sampler.load(checkpoint)


def score_only_the_replies_on_cpu() -> None:
    """TRL's fused LM head projects only the positions the loss scores (the replies' tokens) on a Triton device, and
    every position elsewhere, so that a compiling device (XLA, Neuron) sees the same shapes every batch. A CPU compiles
    nothing, and there projecting every prompt token through the vocabulary-wide head (49,152 wide for SmolLM2) was a
    third of a GRPO step's training time (docs/real_model.md). The positions scored, and so what is learned, are the
    same: the others' log-probabilities are zeroed either way."""
    from trl.kernels import chunked_logprob
    from trl.trainer import utils

    # TRL's own choice, read from where it is defined, so that making the trainer again changes nothing more.
    utils._use_triton = lambda device: device.type == "cpu" or chunked_logprob._use_triton(device)


def steps_done(checkpoint: str | Path) -> int:
    """The optimizer steps a complete checkpoint was saved after."""
    return json.loads(Path(checkpoint, "trainer_state.json").read_text())["global_step"]


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest checkpoint in output_dir that was written to the end. The trainer writes trainer_state.json
    last (after every rank's part: RecipeTrainer), so a run killed while saving leaves a checkpoint without one,
    which must not be resumed from."""
    complete = [p for p in Path(output_dir).glob("checkpoint-*") if (p / "trainer_state.json").exists()]
    return str(max(complete, key=lambda p: int(p.name.split("-")[-1]))) if complete else None
