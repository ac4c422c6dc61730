"""A starting policy built by supervised fine-tuning (TRL's SFTTrainer) on real episodes of MiniWoB tasks.

Each task instance is played by its scripted plan's right actions (scripted_policy.py), and the context of
every turn, token for token as the policy sees it, is paired with every reply that `replies(plan, step)`
writes for that step; the loss is on the replies only. Mixing right replies with wrong ones gives a policy that
writes actions but picks the right one only some of the time: a start that GRPO can improve on. The learning
benchmark, the smoke run and the tests build their policies so.

    python warm_up.py --base .cache/tiny-lfm2 --output .cache/smoke-start   # what `make smoke` starts from
"""

import argparse
import contextlib
from collections.abc import Callable
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from arguments import EnvArguments
from env_client import ServerPool, open_server_pool
from generation import Reply, missing_model
from metrics import setup_logging
from rollout import Episode, EpisodeRunner
from scripted_policy import Plan, following_plans, plan_of

Replies = Callable[[Plan, int], list[str]]  # an instance's plan and a step of it -> the replies to learn there


def right_only(plan: Plan, step: int) -> list[str]:
    """The step's right action alone: a policy that does what the plan does, as far as it can learn it."""
    return [plan.right[step]]


def one_right_of_eight(plan: Plan, step: int) -> list[str]:
    """For a one-click task: the right reply, six valid actions that leave it unsolved, one reply with no action.
    The policy learns to write actions, and picks the right one about a quarter of the time."""
    right = plan.right[step]
    bid = right.removeprefix("click(").removesuffix(")")
    wrong = [f"hover({bid})", f"focus({bid})", f"clear({bid})", "click('12')", "click('14')", "noop()"]
    return [right, *wrong, "I will click the button."]


def a_third_right(plan: Plan, step: int) -> list[str]:
    """The step's right action and its valid wrong one, in the mix that solves a task about a third of the time
    however many actions it takes: right one time in three for one action, one in two at each of two (a
    quarter), two in three at each of three (0.30)."""
    rights, wrongs = {1: (1, 2), 2: (1, 1)}.get(len(plan.right), (2, 1))
    return [plan.right[step]] * rights + [plan.wrong[step]] * wrongs


def scripted_turns(env_url: str, tokenizer, task: str, seeds: range) -> list[tuple[list[int], Plan, int]]:
    """(context, plan, step) of every turn of `task`'s episodes on `seeds`, each played by its plan's right
    actions: what the policy sees before each action of an episode that is going right."""
    turns = []
    follow = following_plans(tokenizer)

    def recording(episodes: list[Episode]) -> list[Reply]:
        turns.extend((episode.context(), plan_of(episode), episode.turns) for episode in episodes)
        return follow(episodes)

    runner = EpisodeRunner(ServerPool([env_url]), tokenizer, EnvArguments(max_turns=5, lockstep=True))
    try:
        for start in range(0, len(seeds), 16):  # 16 sessions at a time
            runner.run([(task, seed) for seed in seeds[start : start + 16]], recording)
    finally:
        runner.close()
    return turns


def warm_up_dataset(env_url: str, tokenizer, tasks: list[str], replies: Replies, seeds: int) -> Dataset:
    rows = {"input_ids": [], "completion_mask": []}
    for task in tasks:
        for context, task_plan, step in scripted_turns(env_url, tokenizer, task, range(seeds)):
            for reply in replies(task_plan, step):
                completion = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
                rows["input_ids"].append(context + completion)
                rows["completion_mask"].append([0] * len(context) + [1] * len(completion))
    return Dataset.from_dict(rows)


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
    """Fine-tunes `base_model` on the turns of `seeds` instances of each task and their `replies`, and saves it
    to output_dir."""
    dataset = warm_up_dataset(env_url, AutoTokenizer.from_pretrained(base_model), tasks, replies, seeds)
    return fine_tune(base_model, output_dir, dataset, steps, batch_size, learning_rate)


def fine_tune(
    base_model: str, output_dir: Path, dataset: Dataset, steps: int, batch_size: int, learning_rate: float
) -> str:
    """TRL's SFTTrainer on `dataset` (token ids, loss on the replies only); the model is saved to output_dir."""
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
        activation_checkpointing=False,
        seed=0,
    )
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(base_model),
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(base_model),
    )
    trainer.train()
    trainer.save_model(str(output_dir))
    return str(output_dir)


if __name__ == "__main__":
    setup_logging()
    parser = argparse.ArgumentParser(
        description="A weak click-test policy: one right reply of eight, on a local server."
    )
    parser.add_argument("--base", required=True, help="the model to fine-tune, e.g. .cache/tiny-lfm2")
    parser.add_argument("--output", required=True, help="where to save the starting policy")
    args = parser.parse_args()
    if missing := missing_model(args.base):
        parser.error(f"--base: {missing}")
    with contextlib.ExitStack() as stack:
        servers = open_server_pool(stack, EnvArguments(env_servers=1), max_sessions=16)
        policy = warm_up(args.base, Path(args.output), servers.urls[0], ["click-test"], one_right_of_eight)
    print(f"starting policy: {policy}")
