"""Teach a language model to control a web browser with GRPO on MiniWoB++ tasks.

    python train.py --config config.yaml                 # full fine-tune of LFM2-350M (GPU, vLLM colocated)
    python train.py --config config.yaml --use_peft      # LoRA
    python train.py --config configs/smoke.yaml          # tiny model on the CPU, a few minutes

Every option of TRL's GRPOConfig and ModelConfig works in the YAML file and on the command line, plus the
environment options of EnvArguments below. Without `env_url`, an environment server is started locally
and stopped at exit.
"""

import contextlib
import copy
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer, PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser, get_peft_config
from trl.models import unwrap_model_for_generation

from env_client import EpisodeRunner, GenerateFn, LocalEnvServer
from rewards import task_success

log = logging.getLogger("train")


@dataclass
class EnvArguments:
    task_name: str = field(default="click-test", metadata={"help": "MiniWoB task, e.g. click-test, enter-text"})
    env_url: str | None = field(
        default=None, metadata={"help": "URL of an OpenEnv BrowserGym server; unset starts env_server.py locally"}
    )
    max_turns: int = field(default=10, metadata={"help": "actions per episode before it ends unsolved"})
    max_page_chars: int = field(default=2000, metadata={"help": "accessibility-tree characters shown per turn"})
    num_task_seeds: int = field(default=1000, metadata={"help": "distinct task instances (seeds) to train on"})


@dataclass
class ModalArguments:
    """Where `modal run modal_app.py` runs this config. train.py itself does not use them."""

    modal_gpu: str = field(default="L4", metadata={"help": "Modal GPU type, e.g. L4, A10G, A100-40GB, H100"})
    modal_timeout_hours: float = field(default=6.0, metadata={"help": "wall-clock limit of one attempt"})
    modal_retries: int = field(default=3, metadata={"help": "attempts after a failure or preemption; each resumes"})
    modal_secrets: list[str] = field(
        default_factory=list, metadata={"help": "Modal secrets to attach, e.g. huggingface (HF_TOKEN), wandb"}
    )


@dataclass
class RecipeConfig(GRPOConfig):
    """GRPOConfig that runs on a machine without CUDA instead of refusing to: transformers generation, fp32."""

    def __post_init__(self):
        if not torch.cuda.is_available():
            if self.use_vllm:
                log.warning("No CUDA device: generating with transformers instead of vLLM")
                self.use_vllm = False
            self.bf16 = False
        super().__post_init__()


def task_dataset(task_name: str, num_seeds: int) -> Dataset:
    """One row per task instance. GRPO compares the episodes of one row, so they all replay the same seed;
    the prompt is only the row's name, because the real prompt is the page the episode starts on."""
    seeds = range(num_seeds)
    return Dataset.from_dict(
        {
            "prompt": [f"{task_name} seed {seed}" for seed in seeds],
            "task_name": [task_name] * num_seeds,
            "seed": list(seeds),
        }
    )


def transformers_generate(trainer: GRPOTrainer) -> GenerateFn:
    """Batched sampling with the training model, returning each sampled token's log-probability under the
    same temperature-scaled distribution the trainer scores (log_softmax(logits / temperature))."""
    tokenizer = trainer.processing_class
    generation_config = copy.deepcopy(trainer.generation_config)
    generation_config.update(output_logits=True, return_dict_in_generate=True)

    def generate(contexts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
        width = max(map(len, contexts))
        input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(c)) + c for c in contexts])
        attention_mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        device = trainer.accelerator.device
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped, trainer.accelerator, generation_kwargs=trainer.generation_kwargs
            ) as model,
            torch.no_grad(),
        ):
            out = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                generation_config=generation_config,
            )
        sampled = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float() / trainer.temperature
        logprobs = logits.log_softmax(-1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
        replies, reply_logprobs = [], []
        for ids, lps in zip(sampled.tolist(), logprobs.tolist()):
            end = next((i + 1 for i, t in enumerate(ids) if t in trainer.eos_token_ids), len(ids))
            replies.append(ids[:end])
            reply_logprobs.append(lps[:end])
        return replies, reply_logprobs

    return generate


def vllm_generate(trainer: GRPOTrainer) -> GenerateFn:
    """Batched sampling with the colocated vLLM engine, whose weights the trainer syncs before each rollout."""

    def generate(contexts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
        _, completion_ids, logprobs, _ = trainer.vllm_generation.generate(
            prompts=contexts, images=None, num_generations=1
        )
        return completion_ids, [[top[0] for top in token] for token in logprobs]

    return generate


def make_rollout_func(runner: EpisodeRunner, dataset: Dataset):
    """TRL's rollout contract: prompts in (each repeated num_generations times), one episode per prompt out."""
    task_of_prompt = {row["prompt"]: (row["task_name"], row["seed"]) for row in dataset}

    def rollout(prompts: list[str], trainer: GRPOTrainer) -> dict[str, list]:
        generate = vllm_generate(trainer) if trainer.use_vllm else transformers_generate(trainer)
        start = time.perf_counter()
        episodes = runner.run([task_of_prompt[p] for p in prompts], generate)
        seconds = time.perf_counter() - start
        solved = sum(task_success(None, [e.done for e in episodes], [e.env_reward for e in episodes]))
        replies = sum(e.turns for e in episodes)
        unparsed = sum(a is None for e in episodes for a in e.actions)
        log.info(
            "rollout: %d episodes in %.1fs (%.2f episodes/s), solved %d, %.1f turns each, %d/%d replies without an action",
            len(episodes), seconds, len(episodes) / seconds, solved, replies / len(episodes), unparsed, replies,
        )  # fmt: skip
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": [e.logprobs for e in episodes],
            "env_mask": [e.env_mask for e in episodes],
            "env_done": [e.done for e in episodes],
            "env_reward": [e.env_reward for e in episodes],
        }

    return rollout


class StepPrinter(TrainerCallback):
    """One line per logged step, with the numbers worth watching."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:
            return
        log.info(
            "step %d/%d | reward %.3f (std %.3f) | loss %.4f | completion tokens %.0f | lr %.2e",
            state.global_step, state.max_steps, logs["reward"], logs.get("reward_std", 0.0), logs.get("loss", float("nan")),
            logs.get("completions/mean_length", 0.0), logs.get("learning_rate", 0.0),
        )  # fmt: skip


def build_trainer(
    env_args: EnvArguments,
    training_args: RecipeConfig,
    model_args: ModelConfig,
    tokenizer,
    runner: EpisodeRunner,
    callbacks: list[TrainerCallback] = (),
) -> GRPOTrainer:
    peft_config = get_peft_config(model_args)
    if peft_config is not None and model_args.lora_target_modules is None:
        peft_config.target_modules = "all-linear"
    training_args.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision}
    dataset = task_dataset(env_args.task_name, env_args.num_task_seeds)
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=task_success,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        rollout_func=make_rollout_func(runner, dataset),
        callbacks=[StepPrinter(), *callbacks],
    )
    trainer.remove_callback(PrinterCallback)  # StepPrinter's line replaces its raw dict of every metric
    return trainer


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest checkpoint in output_dir that was written to the end. The trainer writes trainer_state.json
    last, so a run killed while saving leaves a checkpoint without one, which must not be resumed from."""
    complete = [p for p in Path(output_dir).glob("checkpoint-*") if (p / "trainer_state.json").exists()]
    return str(max(complete, key=lambda p: int(p.name.split("-")[-1]))) if complete else None


def parse_args(args: list[str] | None = None) -> tuple[EnvArguments, RecipeConfig, ModelConfig, ModalArguments]:
    """The recipe from `--config FILE` and command-line overrides (sys.argv when args is None)."""
    return TrlParser((EnvArguments, RecipeConfig, ModelConfig, ModalArguments)).parse_args_and_config(args)


def main(
    env_args: EnvArguments,
    training_args: RecipeConfig,
    model_args: ModelConfig,
    callbacks: list[TrainerCallback] = (),
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    with contextlib.ExitStack() as stack:
        env_url = env_args.env_url
        if env_url is None:
            server = LocalEnvServer(env_args.task_name, max_sessions=training_args.generation_batch_size)
            env_url = stack.enter_context(server).url
        runner = EpisodeRunner(env_url, tokenizer, env_args.max_turns, env_args.max_page_chars)
        stack.callback(runner.close)

        trainer = build_trainer(env_args, training_args, model_args, tokenizer, runner, callbacks)
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in trainer.model.parameters())
        log.info(
            "%s: %s trainable parameters of %s (%.2f%%), generation with %s",
            "LoRA" if model_args.use_peft else "full fine-tune", f"{trainable:,}", f"{total:,}",
            100 * trainable / total, "vLLM (colocated)" if training_args.use_vllm else "transformers",
        )  # fmt: skip
        if training_args.resume_from_checkpoint:
            log.info("resuming from %s", training_args.resume_from_checkpoint)
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model(training_args.output_dir)
        log.info("final %s saved to %s", "adapter" if model_args.use_peft else "model", training_args.output_dir)


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")


if __name__ == "__main__":
    setup_logging()
    env_args, training_args, model_args, _modal_args = parse_args()
    main(env_args, training_args, model_args)
