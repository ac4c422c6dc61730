"""Teach a language model to control a web browser with GRPO on MiniWoB++ tasks.

    python train.py --config config.yaml                 # full fine-tune of LFM2-350M (GPU, vLLM colocated)
    python train.py --config config.yaml --use_peft      # LoRA
    python train.py --config configs/smoke.yaml          # tiny model on the CPU, a few minutes
    torchrun --nproc_per_node 4 train.py --config config.yaml   # data-parallel on 4 GPUs (or accelerate launch)

Every option of TRL's GRPOConfig and ModelConfig works in the YAML file and on the command line, plus the
recipe's own (arguments.py: EnvArguments, RolloutArguments). Without `env_url`, environment servers are started
locally and stopped at exit. Under a launcher each rank plays its share of a step's episodes on one pool of servers
(the first rank of each node starts the node's), and the step's figures are gathered from every rank.

The agent loop lives in rollout.py, generation in generation.py, the step line, metrics.jsonl and the learning
curve in metrics.py; this file wires them into TRL's GRPOTrainer.
"""

import contextlib
import difflib
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from accelerate.utils import gather_object
from datasets import Dataset
from transformers import AutoTokenizer, PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser, get_peft_config

from arguments import EnvArguments, RolloutArguments
from env_client import LocalEnvServer, cpu_s_per_episode, open_server_pool
from generation import GenerateFn, Reply, keep_vllm_cpu_weights_as_loaded, missing_model, trainer_generate
from metrics import MetricsLog, StepPrinter, episode_metrics, episodes_by_task, same_reward_share, setup_logging
from rewards import task_success
from rollout import EnvironmentUnavailable, EpisodeRunner, sampling
from sft_phases import SftPhases, reply_loss
from tasks import TaskSampler

log = logging.getLogger("train")

# Config keys of the cloud launcher (modal_app.py parses and checks them); train.py itself leaves them alone.
LAUNCHER_KEY_PREFIX = "modal_"


@dataclass
class RecipeConfig(GRPOConfig):
    """GRPOConfig that runs on a machine without CUDA instead of refusing to: fp32, transformers generation unless
    `vllm_on_cpu` asks for vLLM's CPU build, and, under a launcher, data parallelism over gloo."""

    vllm_on_cpu: bool = field(
        default=False,
        metadata={"help": "without CUDA, still generate with vLLM (its CPU build, vllm-cpu); for tests and debugging"},
    )

    def __post_init__(self):
        if not torch.cuda.is_available():
            if self.use_vllm and not self.vllm_on_cpu:
                log.warning("No CUDA device: generating with transformers instead of vLLM")
                self.use_vllm = False
            elif self.use_vllm:
                log.warning("No CUDA device: generating with vLLM's CPU build (vllm_on_cpu)")
            self.bf16 = False
            self.dataloader_pin_memory = False  # pinned memory serves a copy to a GPU
            # Without it, ranks under torchrun on the CPU each train a model of their own: no process group, no DDP.
            # One process needs no group (and an inherited LOCAL_RANK must not make it open one).
            self.use_cpu = int(os.environ.get("WORLD_SIZE", "1")) > 1
        super().__post_init__()


def seed_dataset(num_seeds: int) -> Dataset:
    """One row per seed. GRPO compares the episodes of one row, so they all replay one task instance: the seed,
    and the task the sampler draws for the row when its batch is played. The prompt is only the row's name,
    because the real prompt is the page the episode starts on."""
    seeds = range(num_seeds)
    return Dataset.from_dict({"prompt": [f"seed {seed}" for seed in seeds], "seed": list(seeds)})


def timed(generate: GenerateFn) -> tuple[GenerateFn, list[float]]:
    """`generate`, and the list of the seconds each of its calls took."""
    seconds = []

    def timed_generate(contexts: list[list[int]]) -> list[Reply]:
        start = time.perf_counter()
        replies = generate(contexts)
        seconds.append(time.perf_counter() - start)
        return replies

    return timed_generate, seconds


def task_instances(
    prompts: list[str], all_prompts: list[str], seed_of_prompt: dict[str, int], sampler: TaskSampler
) -> list[tuple[str, int]]:
    """(task, seed) for each of this rank's prompts: a task drawn for each group (the repeats of one prompt), its
    row's seed. The draws run over every rank's prompts, in rank order, and every rank's sampler has seen the same
    episodes, so all ranks draw alike and a group split between two ranks plays one task."""
    task_of_group = {}
    for prompt in all_prompts:
        task_of_group.setdefault(prompt, sampler.draw())
    return [(task_of_group[prompt], seed_of_prompt[prompt]) for prompt in prompts]


def make_rollout_func(runner: EpisodeRunner, dataset: Dataset, sampler: TaskSampler, max_env_failures: int):
    """TRL's rollout contract: prompts in (each repeated num_generations times), one episode per prompt out; a
    batch the environment failed is played again (EpisodeRunner.run_until_played)."""
    seed_of_prompt = {row["prompt"]: row["seed"] for row in dataset}

    def rollout(prompts: list[str], trainer: GRPOTrainer) -> dict[str, list]:
        generate, generating = timed(trainer_generate(trainer))
        all_prompts = gather_object(list(prompts))
        start, cpu_before = time.perf_counter(), runner.servers.cpu_readings(runner.env.env_token)
        specs = task_instances(prompts, all_prompts, seed_of_prompt, sampler)
        episodes = runner.run_until_played(specs, sampling(generate), longest_context(trainer), max_env_failures)
        seconds = time.perf_counter() - start
        rank_cpu = cpu_s_per_episode(cpu_before, runner.servers.cpu_readings(runner.env.env_token))
        # The step's figures describe every rank's episodes (each rank's, in rank order, as all_prompts), and the
        # step takes as long as its slowest rank.
        played = gather_object([episode.outcome() for episode in episodes])
        seconds, generation_s = max(gather_object([(seconds, sum(generating))]))
        environment_cpu = [cpu for cpu in gather_object([rank_cpu]) if cpu is not None]
        for task, of_task in episodes_by_task(played).items():
            sampler.update(task, [e.solved for e in of_task])
        metrics = episode_metrics(played) | {
            "groups/same_reward_share": same_reward_share(all_prompts, played),
            # What the sampler will draw next; with one task, always 1.
            **{f"tasks/{t}/probability": p for t, p in sampler.probabilities().items() if len(sampler.weights) > 1},
            "episodes/per_second": len(played) / seconds,
            # Generation and the browsers overlap; the environment's share is the time no generation was running.
            "time/generation_s": generation_s,
            "time/environment_s": seconds - generation_s,
        }
        if environment_cpu:  # what the servers and their browsers spent, per episode begun on them
            metrics["environment/cpu_s_per_episode"] = sum(environment_cpu) / len(environment_cpu)
        if trainer.phases.enabled:  # every rank keeps every rank's successes, as they were played
            trainer.phases.keep(gather_object([(e.context(), e.reply_mask()) for e in episodes if e.solved]))
            metrics["sft_phase/buffer"] = len(trainer.phases.buffer)
        # TRL's own metric buffer: averaged over the logging interval and logged with TRL's metrics, so
        # these reach metrics.jsonl, the step line and any configured tracker alike.
        for name, value in metrics.items():
            trainer._metrics["train"][name].append(value)
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": [e.logprobs for e in episodes],
            "env_mask": [e.env_mask for e in episodes],
            "env_done": [e.done for e in episodes],
            "env_reward": [e.env_reward for e in episodes],
        }

    return rollout


class RecipeTrainer(GRPOTrainer):
    """GRPOTrainer whose checkpoint is whole once its trainer_state.json is written, on any number of ranks, and
    whose optimizer steps may be SFT phases on the run's successes (sft_phases.py)."""

    phases: SftPhases
    _micro_batches = 0
    _phase_step = False

    def training_step(self, model, inputs, num_items_in_batch):
        micro_batch = self._micro_batches % self.current_gradient_accumulation_steps
        self._micro_batches += 1
        if micro_batch == 0:
            self._phase_step = self.phases.in_phase(self.state.global_step)
        if self._phase_step:
            return self._sft_phase_step(model, micro_batch)
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self._micro_batches % self.current_gradient_accumulation_steps == 0:
            step_entropy = self._metrics["train"]["entropy"][-self.current_gradient_accumulation_steps :]
            self.phases.grpo_step_done(sum(step_entropy) / len(step_entropy) if step_entropy else None)
        return loss

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
        if self.phases.enabled and self.accelerator.is_main_process:  # the same on every rank: one copy
            self.phases.save(output_dir)
        # Every rank writes its own RNG state, and the first writes trainer_state.json right after its own, which
        # last_complete_checkpoint takes to mean that the checkpoint is whole. Without this wait, a run killed in
        # between resumes a slower rank with no RNG state, so that its episodes differ from the uninterrupted run's.
        self.accelerator.wait_for_everyone()

    def _load_rng_state(self, checkpoint) -> None:
        super()._load_rng_state(checkpoint)
        if checkpoint is not None:
            self.phases.load(checkpoint)


def build_trainer(
    env_args: EnvArguments,
    rollout_args: RolloutArguments,
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
    dataset = seed_dataset(rollout_args.num_task_seeds)
    sampler = TaskSampler(env_args.task_weights(), rollout_args.curriculum, seed=training_args.seed)
    if training_args.use_vllm and not torch.cuda.is_available():
        keep_vllm_cpu_weights_as_loaded()
    trainer = RecipeTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=task_success,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        rollout_func=make_rollout_func(runner, dataset, sampler, rollout_args.max_env_failures),
        callbacks=[StepPrinter(), MetricsLog(), *callbacks],
    )
    trainer.phases = SftPhases(
        steps=rollout_args.sft_phase_steps,
        every=rollout_args.sft_phase_every,
        entropy_below=rollout_args.sft_phase_entropy,
        buffer_size=rollout_args.success_buffer_size,
        episodes_per_step=training_args.per_device_train_batch_size * training_args.world_size,
        seed=training_args.seed,
    )
    trainer.remove_callback(PrinterCallback)  # StepPrinter's line replaces its raw dict of every metric
    return trainer


def longest_context(trainer: GRPOTrainer) -> int:
    """The longest context that leaves room for a whole reply: the engine's maximum length (vLLM's, or the
    model's own), less max_completion_length."""
    if trainer.use_vllm:
        max_length = trainer.vllm_generation.llm.llm_engine.model_config.max_model_len
    else:
        max_length = trainer.model.config.max_position_embeddings
    return max_length - trainer.max_completion_length


def exit_with_the_launcher() -> None:
    """torchrun starts each rank in a session of its own, so a launcher killed outright (kill -9, the OOM killer)
    would leave its ranks training on, holding their GPUs and writing checkpoints beside a relaunched run's. A rank
    stops once its launcher is gone; the servers it started stop with it."""
    launcher = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(1.0)
        log.error("the launcher (process %d) is gone: this rank stops", launcher)
        os._exit(1)

    threading.Thread(target=watch, name="launcher watch", daemon=True).start()


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest checkpoint in output_dir that was written to the end. The trainer writes trainer_state.json
    last (after every rank's part: RecipeTrainer), so a run killed while saving leaves a checkpoint without one,
    which must not be resumed from."""
    complete = [p for p in Path(output_dir).glob("checkpoint-*") if (p / "trainer_state.json").exists()]
    return str(max(complete, key=lambda p: int(p.name.split("-")[-1]))) if complete else None


class ConfigError(Exception):
    """A configuration the recipe cannot run, with a message that names the key and the file."""


def parse_args(args: list[str] | None = None, launcher: type | None = None) -> tuple:
    """The recipe from `--config FILE` and command-line overrides (sys.argv when args is None):
    (EnvArguments, RolloutArguments, RecipeConfig, ModelConfig).

    `launcher` is a launcher's dataclass of `modal_*` settings (modal_app.py's), parsed from the same file and
    returned fifth, so that a mistake in them fails as early as any other; without it those keys are passed over.
    """
    args = list(sys.argv[1:] if args is None else args)
    config_file = args[args.index("--config") + 1] if "--config" in args[:-1] else None
    parser = TrlParser((EnvArguments, RolloutArguments, RecipeConfig, ModelConfig, *([launcher] if launcher else [])))

    def fail(message: str):
        raise ConfigError(f"{message} (in {config_file + ' or ' if config_file else ''}the command line)")

    parser.error = fail  # argparse would print a usage of several hundred options before its one-line message
    if config_file:
        try:
            config = yaml.safe_load(Path(config_file).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {config_file}") from None
        except yaml.YAMLError as e:
            fail(f"not valid YAML: {' '.join(str(e).split())}")
        known = {action.dest for action in parser._actions} | {"env"}  # TRL's `env:` sets environment variables
        passed_over = () if launcher else (LAUNCHER_KEY_PREFIX,)
        for key in (key for key in config if key not in known and not key.startswith(passed_over)):
            hint = "".join(f" (did you mean {m!r}?)" for m in difflib.get_close_matches(key, known, 1))
            fail(
                f"unknown key {key!r}{hint}; keys are GRPOConfig's, ModelConfig's, EnvArguments' and RolloutArguments'"
            )
    try:
        *parsed, _passed_over, unknown = parser.parse_args_and_config(
            args, return_remaining_strings=True, separate_remaining_strings=True
        )
    except ValueError as e:  # TRL's and our own checks of values
        fail(str(e))
    if unknown:
        fail(f"unrecognized arguments: {' '.join(unknown)}")
    return tuple(parsed)


def main(
    env_args: EnvArguments,
    rollout_args: RolloutArguments,
    training_args: RecipeConfig,
    model_args: ModelConfig,
    callbacks: list[TrainerCallback] = (),
    new_server=LocalEnvServer,
) -> None:
    """Trains on env_url's servers, or else on env_servers servers that `new_server` makes (env_server.py processes,
    or modal_app.py's sandboxes) and the run stops at exit."""
    if training_args.world_size > 1:
        exit_with_the_launcher()
    if training_args.process_index > 0:  # the first rank speaks for the run; the others only warn
        logging.getLogger().setLevel(logging.WARNING)
    if missing := missing_model(model_args.model_name_or_path):
        raise ConfigError(f"model_name_or_path: {missing}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    except OSError as error:  # neither a directory here nor a model the hub gave
        raise ConfigError(f"model_name_or_path {model_args.model_name_or_path!r}: {error}".splitlines()[0]) from None
    with contextlib.ExitStack() as stack:
        # Every rank's episodes: a failed server's sessions move to the others.
        max_sessions = training_args.generation_batch_size
        servers = open_server_pool(
            stack, env_args, max_sessions, new_server, training_args.local_process_index, training_args.world_size
        )
        runner = EpisodeRunner(servers, tokenizer, env_args)
        stack.callback(runner.close)
        trainer = build_trainer(env_args, rollout_args, training_args, model_args, tokenizer, runner, callbacks)
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in trainer.model.parameters())
        log.info(
            "%s: %s trainable parameters of %s (%.2f%%), generation with %s",
            "LoRA" if model_args.use_peft else "full fine-tune",
            f"{trainable:,}",
            f"{total:,}",
            100 * trainable / total,
            "vLLM (colocated)" if training_args.use_vllm else "transformers",
        )
        # A run continues from the last complete checkpoint in its output directory: rerunning the command
        # after a crash, a kill or a preemption resumes it. A new output_dir starts afresh.
        resume_from = training_args.resume_from_checkpoint or last_complete_checkpoint(training_args.output_dir)
        if resume_from:
            log.info("resuming from %s", resume_from)
        trainer.train(resume_from_checkpoint=resume_from)
        trainer.save_model(training_args.output_dir)
        log.info("final %s saved to %s", "adapter" if model_args.use_peft else "model", training_args.output_dir)


def run_from_command_line(callbacks: list[TrainerCallback] = ()) -> None:
    """`python train.py ...` (or one rank of `torchrun ... train.py ...`): parse, train, and exit with a message
    rather than a traceback for a configuration or environment failure."""
    setup_logging()
    try:
        env_args, rollout_args, training_args, model_args = parse_args()
        main(env_args, rollout_args, training_args, model_args, callbacks)
    except ConfigError as error:
        print(f"train.py: configuration error: {error}", file=sys.stderr)
        sys.exit(2)
    except EnvironmentUnavailable as error:
        log.error(
            "stopping: %s. Checkpoints are kept in %s; the same command resumes from the last one.",
            error,
            training_args.output_dir,
        )
        sys.exit(1)


if __name__ == "__main__":
    run_from_command_line()
