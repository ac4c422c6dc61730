"""A starting policy for RL: supervised fine-tuning (TRL's SFTTrainer) on demonstrations (warm_start.demonstrations).

Each demonstration is one training row, rendered token for token as the policy would have seen and written it
in a rollout, with the loss on its replies only. Full fine-tune by default, LoRA with --use_peft (merged into the
model it writes), bf16 where the device has it; every option of TRL's SFTConfig and ModelConfig works. The model it
writes, with the episode settings its demonstrations were played with beside it, is what train.py starts from:

    python -m warm_start.warm_up --config configs/warm_up/book_flight.yaml

The smoke run's weak start, the book-flight path and a warm-up stopped at its lowest validation loss: docs/guide.md.
"""

import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from datasets import Dataset
from huggingface_hub import create_repo, upload_folder
from transformers import AutoConfig, AutoTokenizer, EarlyStoppingCallback, IntervalStrategy
from trl import SFTConfig, SFTTrainer

from browser_rl import episode_settings
from browser_rl.command_line import parse_command_line, run_command
from browser_rl.command_options import WarmUpArguments
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.errors import ConfigError
from browser_rl.metrics import grouped
from browser_rl.model_card import write_model_card
from browser_rl.model_source import resolve_model
from browser_rl.options import EpisodeArguments, ModelOptions, checkpoint_activations_by_trls_default
from browser_rl.prompts import ChatTurns
from warm_start.demonstrations import Demonstration, load, made_with, sft_dataset

log = logging.getLogger("warm_up")


@dataclass
class WarmUpConfig(SFTConfig):
    """SFTConfig with the loss on the replies only and nothing cut, bf16 where the device has it, fp32 on a CPU."""

    _argument_group_name = "training: TRL's SFTConfig"  # its heading in --help

    completion_only_loss: bool | None = True
    max_length: int | None = None  # an episode longer than the model takes is an error (demonstrations.sft_dataset)

    def __post_init__(self):
        if not torch.cuda.is_available():
            self.bf16 = False  # bf16 autocast on a CPU is several times slower than fp32
            self.use_cpu = True
        elif self.bf16 is None:
            self.bf16 = torch.cuda.is_bf16_supported() and not self.fp16
        checkpoint_activations_by_trls_default(self)
        super().__post_init__()


def sft_trainer(
    model_args: ModelOptions, config: WarmUpConfig, dataset: Dataset, validation: Dataset | None = None
) -> SFTTrainer:
    """TRL's SFTTrainer on `dataset` (token ids, and completion_mask on the replies: the loss's tokens), full or
    LoRA as model_args say; with `validation`, its replies' loss measured at each evaluation, and with
    load_best_model_at_end, training stopped once it rises."""
    config.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision}
    return SFTTrainer(
        model=model_args.model_name_or_path,
        args=config,
        train_dataset=dataset,
        eval_dataset=validation,
        processing_class=AutoTokenizer.from_pretrained(
            model_args.model_name_or_path, revision=model_args.model_revision
        ),
        peft_config=model_args.peft_config(),
        callbacks=[EarlyStoppingCallback(early_stopping_patience=1)] if config.load_best_model_at_end else None,
    )


def fine_tune(
    model_args: ModelOptions,
    config: WarmUpConfig,
    dataset: Dataset,
    settings: EpisodeSettings,
    validation: Dataset | None = None,
) -> str:
    """sft_trainer's training; the model (the best on `validation` with load_best_model_at_end), a LoRA adapter
    merged into it, is saved with its tokenizer and the episode settings its rows were rendered with to
    config.output_dir."""
    trainer = sft_trainer(model_args, config, dataset, validation)
    trainer.train()
    if config.load_best_model_at_end and trainer.state.best_metric is not None:
        log.info("kept the model of step %d: validation loss %.4f", best_step(trainer.state), trainer.state.best_metric)
        for checkpoint in Path(config.output_dir).glob("checkpoint-*"):  # the best one is loaded: none is needed
            shutil.rmtree(checkpoint)
    model = trainer.accelerator.unwrap_model(trainer.model)
    if model_args.use_peft:
        model = model.merge_and_unload()  # train.py starts from a model, and may put an adapter of its own on it
    model.save_pretrained(config.output_dir)
    trainer.processing_class.save_pretrained(config.output_dir)
    settings.save(config.output_dir)
    return config.output_dir


def best_step(state) -> int:
    return int(state.best_model_checkpoint.rsplit("-", 1)[-1]) if state.best_model_checkpoint else state.global_step


def held_out(demonstrations: list[Demonstration], share: float) -> tuple[list[Demonstration], list[Demonstration]]:
    """(training, validation): the last `share` of each task's demonstrations, by seed, held out (at least one)."""
    training, validation = [], []
    for of_task in grouped(demonstrations, lambda d: d.task).values():
        of_task = sorted(of_task, key=lambda d: d.seed)
        cut = len(of_task) - max(1, round(share * len(of_task)))
        training += of_task[:cut]
        validation += of_task[cut:]
    return training, validation


OPTIONS = (WarmUpArguments, EpisodeArguments, WarmUpConfig, ModelOptions)


def longest_row(model_name_or_path: str, revision: str | None = None) -> int:
    return AutoConfig.from_pretrained(model_name_or_path, revision=revision).max_position_embeddings


def main(args: WarmUpArguments, episodes: EpisodeArguments, config: WarmUpConfig, model_args: ModelOptions) -> str:
    demonstrations = load(args.demonstrations, keep_failed=args.keep_failed)
    if args.validation_share and config.eval_strategy == IntervalStrategy.NO:
        raise ConfigError(
            "validation_share: set eval_strategy (epoch or steps) to measure it, and save_strategy the same with "
            "load_best_model_at_end true to keep the best model"
        )
    settings = episode_settings.resolve(episodes, made_with(demonstrations, args.demonstrations), args.demonstrations)
    for overridden in settings.overridden:
        log.warning("rendering the demonstrations with %s (override_episode_settings)", overridden)
    # Once the demonstrations are known good: converting a .gguf file takes minutes.
    base_model = model_args.model_name_or_path  # as given: what the model card names
    model = resolve_model(model_args.model_name_or_path, "model_name_or_path")
    model_args = replace(model_args, model_name_or_path=model)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    max_length = config.max_length or longest_row(model_args.model_name_or_path, model_args.model_revision)
    chat = ChatTurns(tokenizer, settings.settings.max_page_chars, settings.settings.action_reference)
    training, validation = (
        held_out(demonstrations, args.validation_share) if args.validation_share else (demonstrations, [])
    )
    dataset = sft_dataset(training, chat, max_length)
    reply_tokens = sum(map(sum, dataset["completion_mask"]))
    log.info(
        "%d episodes, %d tokens, %d of them replies%s",
        *(len(dataset), sum(map(len, dataset["input_ids"])), reply_tokens),
        f"; {len(validation)} held out to validate on" if validation else "",
    )
    held = sft_dataset(validation, chat, max_length) if validation else None
    policy = fine_tune(model_args, config, dataset, settings.settings, held)
    method = f"SFT warm-up on {len(training)} demonstrations"
    tasks = sorted({d.task for d in training})
    write_model_card(policy, settings.settings, base_model, method, tasks, config.hub_model_id)
    if config.push_to_hub:
        log.info("pushed to %s", push_folder(policy, config))
    print(f"starting policy: {policy} (train.py: model_name_or_path: {policy})")
    return policy


def push_folder(folder: str, config: WarmUpConfig) -> str:
    """Uploads the warm-up's model folder (model, tokenizer, episode settings, card) to the Hub repository
    hub_model_id names (else one named after the folder), as the trainer's own push would; returns its id."""
    repo = create_repo(
        config.hub_model_id or Path(folder).name, token=config.hub_token, private=config.hub_private_repo, exist_ok=True
    )
    upload_folder(repo_id=repo.repo_id, folder_path=folder, token=config.hub_token, ignore_patterns=["checkpoint-*"])
    return repo.repo_id


if __name__ == "__main__":
    run_command("warm_start.warm_up", lambda: main(*parse_command_line(OPTIONS)))
