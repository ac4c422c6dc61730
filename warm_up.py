"""A starting policy built by supervised fine-tuning (TRL's SFTTrainer) on real first pages of a MiniWoB task.

Each page, token for token as the policy sees it at the start of an episode, is paired with every reply that
`replies(plan)` writes from the task's scripted plan (scripted_policy.py); the loss is on the replies only.
Mixing right replies with wrong ones gives a policy that writes actions but picks the right one only some of
the time: a start that GRPO can improve on. The learning benchmark and the tests build their policies so.
"""

from pathlib import Path
from typing import Callable

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from env_client import ServerPool
from rollout import Episode, EpisodeRunner
from scripted_policy import Plan, plan


def first_pages(env_url: str, tokenizer, task: str, seeds: range) -> list[Episode]:
    """Episodes that have only begun: their first observation and first prompt."""
    runner = EpisodeRunner(ServerPool.of(env_url), tokenizer, max_turns=0)
    try:
        return runner.run([(task, seed) for seed in seeds], generate=None)
    finally:
        runner.close()


def warm_up_dataset(env_url: str, tokenizer, task: str, replies: Callable[[Plan], list[str]]) -> Dataset:
    rows = {"input_ids": [], "completion_mask": []}
    for episode in first_pages(env_url, tokenizer, task, range(16)):
        observation = episode.observation
        for reply in replies(plan(task, observation.goal, observation.axtree_txt)):
            completion = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
            rows["input_ids"].append(episode.prompt_ids + completion)
            rows["completion_mask"].append([0] * len(episode.prompt_ids) + [1] * len(completion))
    return Dataset.from_dict(rows)


def warm_up(
    base_model: str,
    output_dir: Path,
    env_url: str,
    task: str,
    replies: Callable[[Plan], list[str]],
    steps: int = 150,
    batch_size: int = 16,
    learning_rate: float = 1e-3,
) -> str:
    """Fine-tunes `base_model` on `task`'s first pages and `replies`, and saves it to output_dir."""
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    config = SFTConfig(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        completion_only_loss=True,
        max_length=None,
        logging_steps=50,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        bf16=False,  # bf16 autocast on a CPU is several times slower than fp32
        gradient_checkpointing=False,
        seed=0,
    )
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(base_model),
        args=config,
        train_dataset=warm_up_dataset(env_url, tokenizer, task, replies),
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model(str(output_dir))
    return str(output_dir)
