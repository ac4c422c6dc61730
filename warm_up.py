"""A starting policy built by supervised fine-tuning (TRL's SFTTrainer) on real first pages of a MiniWoB task.

Each page, token for token as the policy sees it at the start of an episode, is paired with every reply that
`replies(plan)` writes from the task's scripted plan (scripted_policy.py); the loss is on the replies only.
Mixing right replies with wrong ones gives a policy that writes actions but picks the right one only some of
the time: a start that GRPO can improve on. The learning benchmark, the smoke run and the tests build their
policies so.

    python warm_up.py --base .cache/tiny-lfm2 --output .cache/smoke-start   # what `make smoke` starts from
"""

import argparse

from pathlib import Path
from typing import Callable

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from env_client import LocalEnvServer, ServerPool
from metrics import setup_logging
from rollout import Episode, EpisodeRunner
from scripted_policy import Plan, plan


def one_right_of_eight(plan: Plan) -> list[str]:
    """For a one-click task: the right reply, six valid actions that leave it unsolved, one reply with no action.
    The policy learns to write actions, and picks the right one about a quarter of the time."""
    (right,) = plan.right
    bid = right.removeprefix("click(").removesuffix(")")
    wrong = [f"hover({bid})", f"focus({bid})", f"clear({bid})", "click('12')", "click('14')", "noop()"]
    return [right, *wrong, "I will click the button."]


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


if __name__ == "__main__":
    setup_logging()
    parser = argparse.ArgumentParser(description="A weak click-test policy: one right reply of eight, on a local server.")
    parser.add_argument("--base", required=True, help="the model to fine-tune, e.g. .cache/tiny-lfm2")
    parser.add_argument("--output", required=True, help="where to save the starting policy")
    args = parser.parse_args()
    with LocalEnvServer("click-test", max_sessions=16) as server:
        print(f"starting policy: {warm_up(args.base, Path(args.output), server.url, 'click-test', one_right_of_eight)}")
