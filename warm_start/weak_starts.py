"""Weak starts in one call, for the tests and the learning benchmark: a tiny model fine-tuned on a mix of right and
wrong episodes of the scripted plans (warm_start.record.record_mix), as `make smoke` builds its start with the two
commands, so that GRPO starts from a policy that writes actions and is right some of the time."""

from pathlib import Path

from transformers import AutoTokenizer

from browser_rl.command_options import FIRST_DEMONSTRATION_SEED
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.options import ModelOptions
from browser_rl.prompts import ChatTurns
from browser_rl.servers import ServerPool
from warm_start.demonstrations import sft_dataset
from warm_start.plans import ReplyMix
from warm_start.record import record_mix
from warm_start.warm_up import WarmUpConfig, fine_tune, longest_row


def weak_start_config(output_dir: Path, steps: int, batch_size: int, learning_rate: float) -> WarmUpConfig:
    """The weak starts' short fine-tune: a tiny model on a few hundred rows, at a constant rate."""
    return WarmUpConfig(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        logging_steps=50,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        activation_checkpointing=False,
        seed=0,
    )


def weak_start(
    base_model: str,
    output_dir: Path,
    env_url: str,
    tasks: list[str],
    replies: ReplyMix,
    settings: EpisodeSettings,
    steps: int = 150,
    batch_size: int = 16,
    learning_rate: float = 1e-3,
    seeds: int = 16,
) -> str:
    """`base_model` fine-tuned on the episodes of `seeds` instances of each task in `replies`'s mix, played with
    `settings` (which the model then carries), saved to output_dir."""
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    servers = ServerPool([env_url])
    seed_range = range(FIRST_DEMONSTRATION_SEED, FIRST_DEMONSTRATION_SEED + seeds)
    demonstrations = [d for task in tasks for d in record_mix(servers, tokenizer, task, seed_range, replies, settings)]
    dataset = sft_dataset(demonstrations, ChatTurns(tokenizer, settings.max_page_chars), longest_row(base_model))
    config = weak_start_config(output_dir, steps, batch_size, learning_rate)
    return fine_tune(ModelOptions(model_name_or_path=base_model), config, dataset, settings)
