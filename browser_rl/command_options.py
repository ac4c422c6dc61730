"""Each command's own options, beside the groups they share with training (browser_rl.options): what evaluate.py
measures, what run_agent.py plays, which evaluations compare.py pairs, what export_gguf.py writes, what
warm_start.record plays, what warm_start.warm_up fine-tunes on, and where modal_app.py runs. Each under its own
heading in --help; each check runs when a config is parsed."""

from dataclasses import dataclass, field

from browser_rl.tasks import SPLIT_PRESETS
from web_env import task_modules

BENCHMARKS = ("miniwob", "miniwob_tiny_test")  # browsergym-experiments' MiniWoB benchmarks


@dataclass
class PolicyArguments:
    """The policy evaluate.py and run_agent.py play, and how it replies: the options both commands take."""

    model: str = field(
        metadata={
            "help": "model directory, hub id, checkpoint, LoRA adapter directory, .gguf file, or the URL of an "
            "OpenAI-compatible server serving one (vllm serve, llama-server)"
        }
    )
    tokenizer: str | None = field(
        default=None,
        metadata={
            "help": "with a server's URL: the served model's directory, hub id or .gguf file, where the server "
            "names it otherwise"
        },
    )
    temperature: float = field(default=0.0, metadata={"help": "0 for greedy decoding, else sampling temperature"})
    max_new_tokens: int = field(default=32, metadata={"help": "tokens per reply"})


@dataclass
class EvalArguments(PolicyArguments):
    """What evaluate.py measures and how; its tasks, episodes and servers are the groups above, as in training. A
    --config file sets those groups, never these (a training file's temperature or output_dir is training's)."""

    _argument_group_name = "evaluation"  # its heading in --help

    episodes: int = field(default=50, metadata={"help": "episodes to run per task, one seed each"})
    samples: int = field(
        default=1, metadata={"help": "episodes per seed, sampled alike (with --temperature): pass@k of k samples"}
    )
    first_seed: int = field(default=1_000_000, metadata={"help": "seed of the first episode; the rest follow"})
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
class AgentArguments(PolicyArguments):
    """Which policy run_agent.py plays, on which instance of the task, for how many steps, and where its trace goes;
    the task and the servers are the groups above, as in training."""

    _argument_group_name = "agent"  # its heading in --help

    seed: int = field(default=1_000_000, metadata={"help": "the task's instance (held-out seeds start at 1,000,000)"})
    url: str | None = field(
        default=None, metadata={"help": "play --goal on this page instead of a task (its origin alone is reachable)"}
    )
    goal: str | None = field(default=None, metadata={"help": "with --url: what the agent is asked to do there"})
    max_steps: int | None = field(
        default=None, metadata={"help": "actions at most (default: the max_turns the model was trained with)"}
    )
    dry_run: bool = field(default=False, metadata={"help": "show each action and ask before doing it"})
    headed: bool = field(
        default=False, metadata={"help": "show the browser's window as the agent plays (a display, the full Chromium)"}
    )
    output_dir: str = field(default="agent-runs", metadata={"help": "where the trace and viewer.html are written"})

    def __post_init__(self):
        if (self.url is None) != (self.goal is None):
            raise ValueError("url and goal go together: the page, and what to do on it")
        if self.url is not None:
            task_modules.as_origin(task_modules.origin_of(self.url))  # http(s) and a host
        for name in ("max_steps", "max_new_tokens"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass
class CompareArguments:
    """Which two evaluations compare.py pairs, and where it writes the comparison."""

    _argument_group_name = "comparison"  # its heading in --help

    before: str = field(metadata={"help": "evaluate.py output directory of the model before (the start)"})
    after: str = field(metadata={"help": "evaluate.py output directory of the model after, on the same instances"})
    output: str | None = field(default=None, metadata={"help": "also write the comparison to this JSON file"})


@dataclass
class ExportArguments:
    """Which policy export_gguf.py writes as a GGUF file, where, and how its matrices are stored."""

    _argument_group_name = "export"  # its heading in --help

    model: str = field(metadata={"help": "model directory, hub id, checkpoint, or LoRA adapter directory"})
    output: str = field(metadata={"help": "the .gguf file to write; an Ollama Modelfile is written beside it"})
    outtype: str = field(
        default="f16",
        metadata={"help": "f32 (exact), f16 (half the size) or q8_0 (a quarter; llama.cpp's 8-bit blocks)"},
    )

    def __post_init__(self):
        if self.outtype not in ("f32", "f16", "q8_0"):
            raise ValueError(f"outtype: {self.outtype!r} is not one of f32, f16, q8_0")
        if not self.output.endswith(".gguf"):
            raise ValueError(f"output: {self.output!r} does not end in .gguf")


# Seeds of recorded demonstrations start here: apart from training's (0 .. num_task_seeds - 1) and evaluation's
# (from 1,000,000), so that no evaluated instance was ever demonstrated.
FIRST_DEMONSTRATION_SEED = 2_000_000


@dataclass
class RecordArguments:
    """What `python -m warm_start.record` plays and where it writes it; the policy's tokenizer is model_name_or_path's
    (a warm-up file names the model it fine-tunes)."""

    _argument_group_name = "recording demonstrations"  # its heading in --help

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

    _argument_group_name = "warm-up"  # its heading in --help

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

    _argument_group_name = "Modal"  # its heading in --help

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
