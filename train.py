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
import difflib
import functools
import itertools
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import yaml
from datasets import Dataset
from transformers import AutoTokenizer, PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser, get_peft_config
from trl.models import unwrap_model_for_generation

from env_client import Episode, EnvironmentFailure, EpisodeRunner, GenerateFn, LocalEnvServer
from env_server import MINIWOB_TASKS
from rewards import task_success

log = logging.getLogger("train")

METRICS_FILE = "metrics.jsonl"
REMOTE_RECOVERY_WAIT_S = 30.0  # after a failure of a server that train.py did not start
CURVE_FILE = "learning_curve.png"


@dataclass
class EnvArguments:
    task_name: str = field(default="click-test", metadata={"help": "MiniWoB task, e.g. click-test, enter-text"})
    env_url: str | None = field(
        default=None, metadata={"help": "URL of an OpenEnv BrowserGym server; unset starts env_server.py locally"}
    )
    max_turns: int = field(default=10, metadata={"help": "actions per episode before it ends unsolved"})
    max_page_chars: int = field(default=2000, metadata={"help": "accessibility-tree characters shown per turn"})
    num_task_seeds: int = field(default=1000, metadata={"help": "distinct task instances (seeds) to train on"})
    env_token: str | None = field(
        default=None, metadata={"help": "token of a server beyond loopback; default $BROWSER_RL_ENV_TOKEN"}
    )
    env_timeout_s: float = field(default=120.0, metadata={"help": "longest wait for one answer of the server"})
    max_env_failures: int = field(
        default=3, metadata={"help": "environment failures in a row before the run stops (each re-runs the step)"}
    )

    def __post_init__(self):
        if self.task_name not in MINIWOB_TASKS:
            raise ValueError(f"task_name: unknown MiniWoB task {self.task_name!r}")
        for name in ("max_turns", "max_page_chars", "num_task_seeds", "env_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_env_failures < 0:
            raise ValueError(f"max_env_failures must be 0 or more, got {self.max_env_failures}")


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


def sample_replies(
    model, contexts: list[list[int]], generation_config, pad_token_id: int, eos_token_ids: list[int], temperature: float
) -> tuple[list[list[int]], list[list[float]]]:
    """One batched `generate` over left-padded contexts. Returns each reply up to and including its first
    end-of-turn token, and each sampled token's log-probability under log_softmax(logits / temperature), the
    distribution the trainer scores (greedy decoding when temperature is 0: log-probs at temperature 1)."""
    width = max(map(len, contexts))
    input_ids = torch.tensor([[pad_token_id] * (width - len(c)) + c for c in contexts], device=model.device)
    attention_mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=model.device)
    generation_config = copy.deepcopy(generation_config)
    generation_config.update(output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config)
    sampled = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1).float() / (temperature or 1.0)
    logprobs = logits.log_softmax(-1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    replies, reply_logprobs = [], []
    for ids, lps in zip(sampled.tolist(), logprobs.tolist()):
        end = next((i + 1 for i, t in enumerate(ids) if t in eos_token_ids), len(ids))
        replies.append(ids[:end])
        reply_logprobs.append(lps[:end])
    return replies, reply_logprobs


def transformers_generate(trainer: GRPOTrainer) -> GenerateFn:
    """Batched sampling with the training model itself."""

    def generate(contexts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
        with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, generation_kwargs=trainer.generation_kwargs
        ) as model:
            return sample_replies(
                model, contexts, trainer.generation_config, trainer.processing_class.pad_token_id,
                trainer.eos_token_ids, trainer.temperature,
            )  # fmt: skip

    return generate


def vllm_generate(trainer: GRPOTrainer) -> GenerateFn:
    """Batched sampling with the colocated vLLM engine, whose weights the trainer syncs before each rollout."""

    def generate(contexts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
        _, completion_ids, logprobs, _ = trainer.vllm_generation.generate(
            prompts=contexts, images=None, num_generations=1
        )
        return completion_ids, [[top[0] for top in token] for token in logprobs]

    return generate


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    replies = [action for e in episodes for action in e.actions]
    return {
        "episodes/success_rate": sum(e.solved for e in episodes) / len(episodes),
        "episodes/turns": len(replies) / len(episodes),
        "episodes/unparsed_share": sum(a is None for a in replies) / max(len(replies), 1),
    }


class EnvironmentUnavailable(Exception):
    """The environment failed max_env_failures times in a row."""


def make_rollout_func(runner: EpisodeRunner, dataset: Dataset, recover: Callable[[], None], max_env_failures: int):
    """TRL's rollout contract: prompts in (each repeated num_generations times), one episode per prompt out.

    When the environment fails mid-rollout, `recover` restarts or waits for it and the whole batch runs again:
    an episode the environment cut short says nothing about the policy, so it is never scored.
    """
    task_of_prompt = {row["prompt"]: (row["task_name"], row["seed"]) for row in dataset}

    def run_episodes(specs: list[tuple[str, int]], generate: GenerateFn) -> list[Episode]:
        for failure in itertools.count(1):
            try:
                return runner.run(specs, generate)
            except EnvironmentFailure as error:
                if failure > max_env_failures:
                    raise EnvironmentUnavailable(f"the environment failed {failure}x in a row, last with {error}") from error
                log.warning(
                    "environment failure %d of at most %d (%s): recovering, then running the batch's %d episodes again",
                    failure, max_env_failures, error, len(specs),
                )  # fmt: skip
                recover()

    def rollout(prompts: list[str], trainer: GRPOTrainer) -> dict[str, list]:
        generate = vllm_generate(trainer) if trainer.use_vllm else transformers_generate(trainer)
        start = time.perf_counter()
        episodes = run_episodes([task_of_prompt[p] for p in prompts], generate)
        metrics = episode_metrics(episodes) | {"episodes/per_second": len(episodes) / (time.perf_counter() - start)}
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


class StepPrinter(TrainerCallback):
    """One line per logged step, with the numbers worth watching."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:
            return
        log.info(
            "step %d/%d | success %.1f%% | reward %.3f (std %.3f) | turns %.1f | no action %.0f%% | loss %.4f"
            " | entropy %.3f | lr %.2e | %.1f episodes/s",
            state.global_step, state.max_steps, 100 * logs.get("episodes/success_rate", float("nan")),
            logs["reward"], logs.get("reward_std", 0.0), logs.get("episodes/turns", float("nan")),
            100 * logs.get("episodes/unparsed_share", float("nan")), logs.get("loss", float("nan")),
            logs.get("entropy", float("nan")), logs.get("learning_rate", 0.0), logs.get("episodes/per_second", 0.0),
        )  # fmt: skip


class MetricsLog(TrainerCallback):
    """Appends every logged step to OUTPUT_DIR/metrics.jsonl as it happens (a crash loses nothing, a resumed
    run continues the file) and draws OUTPUT_DIR/learning_curve.png from it when training ends."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            Path(args.output_dir).mkdir(parents=True, exist_ok=True)
            with open(Path(args.output_dir) / METRICS_FILE, "a") as f:
                f.write(json.dumps({"step": state.global_step, **logs}) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and (Path(args.output_dir) / METRICS_FILE).exists():
            path = plot_learning_curve(Path(args.output_dir) / METRICS_FILE, Path(args.output_dir) / CURVE_FILE)
            log.info("learning curve: %s", path)


def logged_steps(metrics_file: Path) -> dict[int, dict]:
    """The training steps of a metrics.jsonl, by step number; a resumed run may log a step twice, the later wins."""
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    return {r["step"]: r for r in rows if "episodes/success_rate" in r}


def moving_average(values: list[float], window: int) -> list[float]:
    return [sum(values[max(0, i + 1 - window) : i + 1]) / min(i + 1, window) for i in range(len(values))]


def plot_learning_curve(metrics_file: Path, image_file: Path) -> Path:
    """Success rate per step (with a moving average) and episode length, from a metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    rows = logged_steps(metrics_file)
    steps = sorted(rows)
    success = [rows[s]["episodes/success_rate"] for s in steps]
    window = max(1, len(steps) // 10)
    smooth = moving_average(success, window)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True, height_ratios=[2, 1])
    top.plot(steps, success, ".", alpha=0.4, label="per step")
    top.plot(steps, smooth, "-", label=f"moving average ({window} steps)")
    top.set_ylabel("success rate (training episodes)")
    top.set_ylim(-0.05, 1.05)
    top.legend(loc="lower right")
    bottom.plot(steps, [rows[s]["episodes/turns"] for s in steps], "-")
    bottom.set_ylabel("turns per episode")
    bottom.set_xlabel("GRPO step")
    top.set_title(metrics_file.parent.name)
    fig.tight_layout()
    fig.savefig(image_file, dpi=100)
    plt.close(fig)
    return image_file


def build_trainer(
    env_args: EnvArguments,
    training_args: RecipeConfig,
    model_args: ModelConfig,
    tokenizer,
    runner: EpisodeRunner,
    recover: Callable[[], None],
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
        rollout_func=make_rollout_func(runner, dataset, recover, env_args.max_env_failures),
        callbacks=[StepPrinter(), MetricsLog(), *callbacks],
    )
    trainer.remove_callback(PrinterCallback)  # StepPrinter's line replaces its raw dict of every metric
    return trainer


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest checkpoint in output_dir that was written to the end. The trainer writes trainer_state.json
    last, so a run killed while saving leaves a checkpoint without one, which must not be resumed from."""
    complete = [p for p in Path(output_dir).glob("checkpoint-*") if (p / "trainer_state.json").exists()]
    return str(max(complete, key=lambda p: int(p.name.split("-")[-1]))) if complete else None


class ConfigError(Exception):
    """A configuration the recipe cannot run, with a message that names the key and the file."""


def parse_args(args: list[str] | None = None) -> tuple[EnvArguments, RecipeConfig, ModelConfig, ModalArguments]:
    """The recipe from `--config FILE` and command-line overrides (sys.argv when args is None)."""
    args = list(sys.argv[1:] if args is None else args)
    config_file = args[args.index("--config") + 1] if "--config" in args[:-1] else None
    parser = TrlParser((EnvArguments, RecipeConfig, ModelConfig, ModalArguments))

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
        for key in (key for key in config if key not in known):
            hint = "".join(f" (did you mean {m!r}?)" for m in difflib.get_close_matches(key, known, 1))
            fail(f"unknown key {key!r}{hint}; keys are GRPOConfig's, ModelConfig's and train.py's EnvArguments'")
    try:
        return parser.parse_args_and_config(args)
    except ValueError as e:  # TRL's and our own checks of values
        fail(str(e))


def main(
    env_args: EnvArguments,
    training_args: RecipeConfig,
    model_args: ModelConfig,
    callbacks: list[TrainerCallback] = (),
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    with contextlib.ExitStack() as stack:
        server = None
        if env_args.env_url is None:
            server = LocalEnvServer(env_args.task_name, max_sessions=training_args.generation_batch_size)
            stack.enter_context(server)
        runner = EpisodeRunner(
            env_args.env_url or server.url, tokenizer, env_args.max_turns, env_args.max_page_chars,
            token=env_args.env_token, timeout_s=env_args.env_timeout_s,
        )  # fmt: skip
        stack.callback(runner.close)
        # A local server is restarted; a remote one (a container, a hosted space) is given time to come back.
        recover = server.restart if server else functools.partial(time.sleep, REMOTE_RECOVERY_WAIT_S)

        trainer = build_trainer(env_args, training_args, model_args, tokenizer, runner, recover, callbacks)
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in trainer.model.parameters())
        log.info(
            "%s: %s trainable parameters of %s (%.2f%%), generation with %s",
            "LoRA" if model_args.use_peft else "full fine-tune", f"{trainable:,}", f"{total:,}",
            100 * trainable / total, "vLLM (colocated)" if training_args.use_vllm else "transformers",
        )  # fmt: skip
        # A run continues from the last complete checkpoint in its output directory: rerunning the command
        # after a crash, a kill or a preemption resumes it. A new output_dir starts afresh.
        resume_from = training_args.resume_from_checkpoint or last_complete_checkpoint(training_args.output_dir)
        if resume_from:
            log.info("resuming from %s", resume_from)
        trainer.train(resume_from_checkpoint=resume_from)
        trainer.save_model(training_args.output_dir)
        log.info("final %s saved to %s", "adapter" if model_args.use_peft else "model", training_args.output_dir)


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")


if __name__ == "__main__":
    setup_logging()
    try:
        env_args, training_args, model_args, _modal_args = parse_args()
    except ConfigError as error:
        print(f"train.py: configuration error: {error}", file=sys.stderr)
        sys.exit(2)
    try:
        main(env_args, training_args, model_args)
    except EnvironmentUnavailable as error:
        log.error("stopping: %s. Checkpoints are kept in %s; the same command resumes from the last one.",
                  error, training_args.output_dir)  # fmt: skip
        sys.exit(1)
