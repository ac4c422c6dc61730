"""Teach a language model to control a web browser with GRPO on web tasks.

    python train.py --config config.yaml                 # full fine-tune of LFM2-350M (GPU, vLLM colocated)
    python train.py --config config.yaml --use_peft      # LoRA
    torchrun --nproc_per_node 4 train.py --config config.yaml   # data-parallel on 4 GPUs (or accelerate launch)

Every option of TRL's GRPOConfig and ModelConfig works, plus the recipe's own (`--help` shows them in groups).
Without `env_url`, environment servers are started locally and stopped at exit. This file wires the recipe's parts into
TRL's GRPOTrainer: the episodes (browser_rl/rollout.py), the step's groups (browser_rl/dynamic_sampling.py), its
figures (browser_rl/metrics.py), the SFT phases and whole checkpoints (browser_rl/trainer.py).
"""

import contextlib
import logging
import os
import threading
import time
from dataclasses import replace

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from transformers import AutoTokenizer, PrinterCallback, TrainerCallback

from browser_rl import episode_settings, run_config
from browser_rl.command_line import parse_command_line, run_command
from browser_rl.dynamic_sampling import GroupDraws, StepPlay
from browser_rl.errors import ConfigError, EnvironmentUnavailable
from browser_rl.evaluation_report import measured_success
from browser_rl.generation import GenerateFn, Reply, keep_vllm_cpu_weights_as_loaded, trainer_generate
from browser_rl.guidance import guided
from browser_rl.metrics import MetricsLog, StepPrinter, say_a_slow_play, step_metrics
from browser_rl.model_source import resolve_model
from browser_rl.options import (
    EpisodeArguments,
    ModelOptions,
    RecipeConfig,
    ServerArguments,
    SftPhaseArguments,
    TaskArguments,
)
from browser_rl.progress import TerminalProgress, on_a_terminal
from browser_rl.rollout import EpisodeRunner, Policy, model_policy
from browser_rl.servers import open_server_pool
from browser_rl.sft_phases import SftPhases
from browser_rl.tasks import TaskInstance, TaskSampler, task_instances
from browser_rl.traces import TrainingTraces, covers_a_traced_step
from browser_rl.trainer import RecipeTrainer, last_complete_checkpoint, score_only_the_replies_on_cpu, steps_done
from env_client import LocalEnvServer, cpu_s_per_episode
from rewards import task_success
from warm_start.guides import guide_of_tasks

log = logging.getLogger("train")

# Without max_groups_per_step, a step that wants informative groups plays at most this many times its groups.
MAX_GROUPS_PER_STEP = 4
OPTIONS = (TaskArguments, EpisodeArguments, ServerArguments, SftPhaseArguments, RecipeConfig, ModelOptions)


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


def make_rollout_func(
    runner: EpisodeRunner,
    dataset: Dataset,
    draws: GroupDraws,
    guide: Policy | None,
    phases: SftPhases,
    traces: TrainingTraces,
):
    """TRL's rollout contract: prompts in (each repeated num_generations times), one episode per prompt out. A step
    plays its groups (again where too few disagree: browser_rl.dynamic_sampling), measures every episode it played,
    keeps its successes for the SFT phases, and every trace_every steps traces a few of the first rank's."""
    seed_of_prompt = {row["prompt"]: row["seed"] for row in dataset}

    def rollout(prompts: list[str], trainer: RecipeTrainer) -> dict[str, list]:
        all_prompts = gather_object(list(prompts))
        instances = task_instances(all_prompts, all_prompts, seed_of_prompt, draws.sampler)
        step, args = trainer.state.global_step + 1, trainer.args
        served = max(1, args.steps_per_generation * args.num_iterations // args.gradient_accumulation_steps)
        traced = trainer.accelerator.is_main_process and covers_a_traced_step(step, served, args.trace_every)
        first = trainer.accelerator.process_index * len(prompts)
        rounds = StepRounds(runner, trainer, range(first, first + len(prompts)), guide, traced)
        played = draws.play(instances, trainer.num_generations, step, rounds)
        episodes = [played.episodes[slot] for slot in rounds.mine]
        figures = rounds.figures(played)
        if trainer.accelerator.is_main_process:
            say_a_slow_play(step, args.max_steps, figures)
        if traced:
            traces.write(step, episodes, trainer.callback_handler.callbacks)
        if len(draws.sampler.weights) > 1:  # what the sampler will draw next
            figures |= {f"tasks/{t}/probability": p for t, p in draws.sampler.probabilities().items()}
        if phases.enabled:  # every rank keeps every rank's successes, as they were played
            phases.keep(gather_object([(e.context(), e.reply_mask()) for e in played.played if e.solved]))
            figures["sft_phase/buffer"] = len(phases.buffer)
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": [e.logprobs for e in episodes],
            "env_mask": [e.env_mask for e in episodes],
            "env_task": [e.task_name for e in episodes],
            "env_done": [e.done for e in episodes],
            "env_reward": [e.env_reward for e in episodes],
            "env_raw_reward": [e.raw_reward for e in episodes],
            "step_figures": figures,  # to TRL's metric log, through the reward function (rewards.task_success)
        }

    return rollout


class StepRounds:
    """Plays the rounds of a step (browser_rl.dynamic_sampling.PlayRound) on this rank's slots (`mine`), their guided
    turns by `guide`, a batch the environment failed played again (traced, with their pages' images), and times them
    all: the step takes as long as its slowest rank."""

    def __init__(self, runner: EpisodeRunner, trainer, mine: range, guide: Policy | None, traced: bool):
        self.runner, self.mine, self.traced = runner, mine, traced
        self.generate, self.generating = timed(trainer_generate(trainer))
        self.policy = model_policy(self.generate) if guide is None else guided(model_policy(self.generate), guide)
        self.context = longest_context(trainer)
        self.start, self.cpu_before = time.perf_counter(), runner.servers.cpu_readings()

    def __call__(self, slots: dict[int, TaskInstance], guide_turns: dict[int, int]):
        own = [slot for slot in sorted(slots) if slot in self.mine]
        mine = {}
        if own:  # a round may replay only other ranks' groups
            instances, turns = [slots[slot] for slot in own], [guide_turns[slot] for slot in own]
            played = self.runner.run_until_played(instances, self.policy, self.context, self.traced, turns)
            mine = dict(zip(own, played, strict=True))
        outcomes = dict(gather_object([(slot, episode.outcome()) for slot, episode in mine.items()]))
        return mine, outcomes

    def figures(self, played: StepPlay) -> dict:
        """The figures of every episode the step played, every rank's."""
        seconds = time.perf_counter() - self.start
        cpu = cpu_s_per_episode(self.cpu_before, self.runner.servers.cpu_readings())
        seconds, generation_s = max(gather_object([(seconds, sum(self.generating))]))
        cpu_s = [reading for reading in gather_object([cpu]) if reading is not None]
        return step_metrics(played.outcomes, played.groups_of_outcomes, seconds, generation_s, cpu_s) | played.figures()


def longest_context(trainer: RecipeTrainer) -> int:
    """The longest context that leaves room for a whole reply: the engine's maximum length (vLLM's, or the
    model's own), less max_completion_length."""
    if trainer.use_vllm:
        max_length = trainer.vllm_generation.llm.llm_engine.model_config.max_model_len
    else:
        max_length = trainer.model.config.max_position_embeddings
    return max_length - trainer.max_completion_length


def measured_at_start(tasks: TaskArguments, training_args: RecipeConfig) -> dict[str, float]:
    """Each task's success rate as the evaluation in tasks.curriculum_start measured it, the curriculum's start. Only
    an evaluation sampled at the training temperature measures the policy GRPO samples: greedy decoding solves more
    of some tasks and less of others."""
    if not tasks.curriculum_start:
        return {}
    try:
        measured, temperature, model = measured_success(tasks.curriculum_start)
    except (OSError, ValueError, KeyError) as error:
        raise ConfigError(
            f"curriculum_start: no evaluate.py summary read in {tasks.curriculum_start!r}: {error}"
        ) from None
    if temperature != training_args.temperature:
        decoding = f"at temperature {temperature}" if temperature else "greedy"
        raise ConfigError(
            f"curriculum_start: {tasks.curriculum_start!r} was evaluated {decoding}, and training samples at "
            f"temperature {training_args.temperature}: evaluate the start model with --temperature "
            f"{training_args.temperature}"
        )
    unmeasured = [task for task in tasks.task_weights() if task not in measured]
    log.info(
        "the curriculum starts from the success %s measured of %s%s",
        tasks.curriculum_start,
        model,
        f"; not measured there, starting at 50%: {', '.join(unmeasured)}" if unmeasured else "",
    )
    return measured


def build_trainer(
    tasks: TaskArguments,
    phases: SftPhaseArguments,
    training_args: RecipeConfig,
    model_args: ModelOptions,
    tokenizer,
    runner: EpisodeRunner,
    config: dict,
    callbacks: list[TrainerCallback] = (),
) -> RecipeTrainer:
    """The trainer of the model model_args name (a directory or Hub id: resolve_model's), on the runner's episodes."""
    training_args.model_init_kwargs = {"dtype": model_args.dtype, "revision": model_args.model_revision}
    dataset = seed_dataset(tasks.num_task_seeds)
    sampler = TaskSampler(
        tasks.task_weights(),
        tasks.curriculum,
        seed=training_args.seed,
        measured=measured_at_start(tasks, training_args),
    )
    groups_per_step = training_args.generation_batch_size // training_args.num_generations
    if tasks.informative_groups > groups_per_step:
        raise ConfigError(
            f"informative_groups: {tasks.informative_groups} of a step's {groups_per_step} groups "
            "(generation_batch_size / num_generations)"
        )
    guide, guided_tasks = None, frozenset()
    if tasks.guided_episodes:
        guide, guided_tasks = guide_of_tasks(runner.chat, list(tasks.task_weights()), tasks.task_modules)
        if not guided_tasks:
            raise ConfigError("guided_episodes: none of the tasks has an expert or a scripted plan to guide it")
        log.info("guided episodes for %s", ", ".join(sorted(guided_tasks)))
    draws = GroupDraws(
        sampler,
        tasks.num_task_seeds,
        wanted=tasks.informative_groups,
        max_groups=tasks.max_groups_per_step or MAX_GROUPS_PER_STEP * groups_per_step,
        seed=training_args.seed,
        guided_tasks=guided_tasks,
        max_turns=runner.settings.max_turns,
    )
    sft_phases = SftPhases(
        steps=phases.sft_phase_steps,
        every=phases.sft_phase_every,
        entropy_below=phases.sft_phase_entropy,
        buffer_size=phases.success_buffer_size,
        episodes_per_step=training_args.per_device_train_batch_size * training_args.world_size,
        seed=training_args.seed,
    )
    if not torch.cuda.is_available():
        score_only_the_replies_on_cpu()
        if training_args.use_vllm:
            keep_vllm_cpu_weights_as_loaded()
    trainer = RecipeTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=task_success,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=model_args.peft_config(),
        rollout_func=make_rollout_func(
            runner,
            dataset,
            draws,
            guide,
            sft_phases,
            TrainingTraces(training_args.output_dir, runner.settings.max_page_chars),
        ),
        callbacks=[StepPrinter(), MetricsLog(), *([TerminalProgress()] if on_a_terminal() else []), *callbacks],
        phases=sft_phases,
        sampler=sampler,
        episode_settings=runner.settings,
        run_config=config,
    )
    trainer.remove_callback(PrinterCallback)  # StepPrinter's line replaces its raw dict of every metric
    return trainer


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


def checkpoint_to_resume(training_args: RecipeConfig, config: dict) -> str | None:
    """The checkpoint this run goes on from: the one named, else the output_dir's last complete one, if it was
    written with the same options or `changed_config` says to resume anyway (browser_rl.run_config)."""
    checkpoint = training_args.resume_from_checkpoint or last_complete_checkpoint(training_args.output_dir)
    changed = run_config.changes(checkpoint, config) if checkpoint else []
    if not changed:
        return checkpoint
    if training_args.changed_config == "refuse":
        raise ConfigError(
            f"{checkpoint} was trained with other options ({'; '.join(changed)}): rerun with --changed_config resume "
            "to go on from it with these, --changed_config restart to start afresh, or choose another --output_dir"
        )
    if training_args.changed_config == "resume":
        log.warning("resuming from %s with changed options: %s", checkpoint, "; ".join(changed))
        return checkpoint
    if training_args.process_index == 0:
        aside = run_config.set_aside(training_args.output_dir)
        log.warning("starting afresh: the earlier run (%s) moved to %s", "; ".join(changed), aside)
    return None


def main(
    tasks: TaskArguments,
    episodes: EpisodeArguments,
    servers: ServerArguments,
    phases: SftPhaseArguments,
    training_args: RecipeConfig,
    model_args: ModelOptions,
    callbacks: list[TrainerCallback] = (),
    new_server=LocalEnvServer,
) -> None:
    """Trains on env_url's servers, or else on env_servers servers that `new_server` makes (web_env.server processes,
    or modal_app.py's sandboxes) and the run stops at exit."""
    if training_args.world_size > 1:
        exit_with_the_launcher()
    if training_args.process_index > 0:  # the first rank speaks for the run; the others only warn
        logging.getLogger().setLevel(logging.WARNING)
    config = run_config.run_config(tasks, episodes, phases, training_args, model_args)  # as given, before resolving
    model = resolve_model(model_args.model_name_or_path, "model_name_or_path")  # a .gguf file: its checkpoint
    named = training_args.resume_from_checkpoint
    if named and not os.path.isdir(named):
        raise ConfigError(
            f"resume_from_checkpoint: no checkpoint directory at {named!r}; without the option a run resumes from "
            "the last checkpoint in its output_dir"
        )
    # A run continues from the last complete checkpoint in its output directory: rerunning the command after a crash,
    # a kill or a preemption resumes it. A new output_dir starts afresh. The first rank sets an earlier run aside
    # before the others look.
    with training_args.main_process_first(desc="the checkpoint to resume from"):
        resume_from = checkpoint_to_resume(training_args, config)
    settings = episode_settings.resolve(episodes, episode_settings.saved_with(model), model)
    if resume_from:
        episode_settings.resolve(episodes, episode_settings.saved_with(resume_from), resume_from)
    if resume_from and 0 < training_args.max_steps <= (done := steps_done(resume_from)):
        # The trainer would take one step past its end: a finished run rerun as it was would change its model.
        log.info("%s is at step %d of max_steps %d: nothing to train", resume_from, done, training_args.max_steps)
        return
    for overridden in settings.overridden:
        log.warning("playing with %s (override_episode_settings)", overridden)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model, revision=model_args.model_revision)
    except OSError as error:  # neither a directory here nor a model the hub gave
        raise ConfigError(f"model_name_or_path {model!r}: {error}".splitlines()[0]) from None
    with contextlib.ExitStack() as stack:
        # Every rank's episodes: a failed server's sessions move to the others.
        pool = open_server_pool(
            stack,
            servers,
            training_args.generation_batch_size,
            tasks.task_modules,
            new_server,
            training_args.local_process_index,
            training_args.world_size,
        )
        runner = EpisodeRunner(pool, tokenizer, settings.settings, episodes.lockstep, servers.max_env_failures)
        stack.callback(runner.close)
        resolved = replace(model_args, model_name_or_path=model)  # the options as given stay as given
        trainer = build_trainer(tasks, phases, training_args, resolved, tokenizer, runner, config, callbacks)
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in trainer.model.parameters())
        log.info(
            "%s: %s trainable parameters of %s (%.2f%%), generation with %s; episodes with %s",
            "LoRA" if model_args.use_peft else "full fine-tune",
            f"{trainable:,}",
            f"{total:,}",
            100 * trainable / total,
            "vLLM (colocated)" if training_args.use_vllm else "transformers",
            settings.settings.describe(),
        )
        if resume_from:
            log.info("resuming from %s", resume_from)
        try:
            trainer.train(resume_from_checkpoint=resume_from)
        except EnvironmentUnavailable as error:
            kept = f"checkpoints are kept in {training_args.output_dir}; the same command resumes from the last one"
            raise EnvironmentUnavailable(f"{error}. {kept.capitalize()}") from error
        if trainer.accelerator.is_main_process:  # first: with push_to_hub, save_model uploads the folder
            settings.settings.save(training_args.output_dir)
        trainer.save_model(training_args.output_dir)
        log.info("final %s saved to %s", "adapter" if model_args.use_peft else "model", training_args.output_dir)


def run_from_command_line(callbacks: list[TrainerCallback] = ()) -> None:
    """`python train.py ...` (or one rank of `torchrun ... train.py ...`): parse, train, and exit as every command
    does on a mistake or an environment that stays unavailable (browser_rl.command_line)."""
    run_command("train.py", lambda: main(*parse_command_line(OPTIONS), callbacks=callbacks))


if __name__ == "__main__":
    run_from_command_line()
