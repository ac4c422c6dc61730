"""A starting policy for RL: supervised fine-tuning (TRL's SFTTrainer) on demonstrations (demonstrations.py).

Each demonstration is one training row, rendered token for token as the policy would have seen and written it
in a rollout, with the loss on its replies only. Full fine-tune by default, LoRA with --use_peft (merged into the
model it writes), bf16 where the device has it; every option of TRL's SFTConfig and ModelConfig works, in a YAML
file (--config) or on the command line. The model it writes is what train.py's model_name_or_path takes.

    python demonstrations.py --tasks enter-text login-user --output demos.jsonl
    python warm_up.py --demonstrations demos.jsonl --model_name_or_path LiquidAI/LFM2-350M --output_dir outputs/warm
    python train.py --config config.yaml --model_name_or_path outputs/warm

The smoke run's weak start is the same with a mix of right and wrong demonstrations (`make smoke` builds it):

    python demonstrations.py --tasks click-test --episodes 16 --replies one_right_of_eight --output weak.jsonl
    python warm_up.py --config configs/warm_up/smoke.yaml
"""

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoConfig, AutoTokenizer
from trl import ModelConfig, SFTConfig, SFTTrainer, TrlParser, get_peft_config

from demonstrations import FIRST_SEED, DemonstrationsError, load, record_mix, sft_dataset
from env_client import ServerPool
from generation import missing_model
from metrics import setup_logging
from prompts import ChatTurns
from scripted_policy import Replies

log = logging.getLogger("warm_up")


@dataclass
class WarmUpArguments:
    demonstrations: str = field(metadata={"help": "demonstrations file (JSON lines, demonstrations.py's format)"})
    keep_failed: bool = field(default=False, metadata={"help": "learn the unsuccessful episodes too"})
    max_page_chars: int = field(
        default=2000, metadata={"help": "accessibility-tree characters shown per turn: the same as train.py's"}
    )


@dataclass
class WarmUpConfig(SFTConfig):
    """SFTConfig with the loss on the replies only and nothing cut, bf16 where the device has it, fp32 on a CPU."""

    completion_only_loss: bool | None = True
    max_length: int | None = None  # an episode longer than the model takes is an error (demonstrations.sft_dataset)

    def __post_init__(self):
        if not torch.cuda.is_available():
            self.bf16 = False  # bf16 autocast on a CPU is several times slower than fp32
            self.use_cpu = True
        elif self.bf16 is None:
            self.bf16 = torch.cuda.is_bf16_supported() and not self.fp16
        super().__post_init__()


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


def fine_tune(model_args: ModelConfig, config: WarmUpConfig, dataset: Dataset) -> str:
    """TRL's SFTTrainer on `dataset` (token ids, loss on the replies only), full or LoRA as model_args say; the
    model, a LoRA adapter merged into it, is saved with its tokenizer to config.output_dir."""
    peft_config = get_peft_config(model_args)
    if peft_config is not None and model_args.lora_target_modules is None:
        peft_config.target_modules = "all-linear"  # as train.py's
    config.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision}
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    trainer = SFTTrainer(
        model=model_args.model_name_or_path,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train()
    model = trainer.accelerator.unwrap_model(trainer.model)
    if peft_config is not None:
        model = model.merge_and_unload()  # train.py starts from a model, and may put an adapter of its own on it
    model.save_pretrained(config.output_dir)
    tokenizer.save_pretrained(config.output_dir)
    return config.output_dir


def warm_up(
    base_model: str,
    output_dir: Path,
    env_url: str,
    tasks: list[str],
    replies: Replies,
    steps: int = 150,
    batch_size: int = 16,
    learning_rate: float = 1e-3,
    seeds: int = 16,
) -> str:
    """A weak start in one call (the tests' and the learning benchmark's): `base_model` fine-tuned on the episodes
    of `seeds` instances of each task in `replies`'s mix (demonstrations.record_mix), saved to output_dir."""
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    servers, seed_range = ServerPool([env_url]), range(FIRST_SEED, FIRST_SEED + seeds)
    demonstrations = [d for task in tasks for d in record_mix(servers, tokenizer, task, seed_range, replies)]
    dataset = sft_dataset(demonstrations, ChatTurns(tokenizer), longest_row(base_model))
    config = weak_start_config(output_dir, steps, batch_size, learning_rate)
    return fine_tune(ModelConfig(model_name_or_path=base_model), config, dataset)


def longest_row(model_name_or_path: str, revision: str | None = None) -> int:
    return AutoConfig.from_pretrained(model_name_or_path, revision=revision).max_position_embeddings


def main(args: WarmUpArguments, config: WarmUpConfig, model_args: ModelConfig) -> str:
    if missing := missing_model(model_args.model_name_or_path):
        raise DemonstrationsError(f"model_name_or_path: {missing}")
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    max_length = config.max_length or longest_row(model_args.model_name_or_path, model_args.model_revision)
    demonstrations = load(args.demonstrations, keep_failed=args.keep_failed)
    dataset = sft_dataset(demonstrations, ChatTurns(tokenizer, args.max_page_chars), max_length)
    reply_tokens = sum(map(sum, dataset["completion_mask"]))
    log.info(
        "%d episodes, %d tokens, %d of them replies", len(dataset), sum(map(len, dataset["input_ids"])), reply_tokens
    )
    return fine_tune(model_args, config, dataset)


if __name__ == "__main__":
    setup_logging()
    try:
        policy = main(*TrlParser((WarmUpArguments, WarmUpConfig, ModelConfig)).parse_args_and_config())
    except DemonstrationsError as error:
        print(f"warm_up.py: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"starting policy: {policy} (train.py: model_name_or_path: {policy})")
