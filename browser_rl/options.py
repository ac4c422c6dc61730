"""The recipe's own options, beside TRL's GRPOConfig and ModelConfig: which tasks episodes play, on which servers,
and what the policy sees of them (EnvArguments, shared by train.py and evaluate.py), and how train.py draws its
task instances, recovers from failed servers and runs SFT phases (RolloutArguments). Each check here runs when a
config is parsed, so that a mistake fails before a model is loaded."""

import os
from dataclasses import dataclass, field

from tasks import parse_tasks
from web_env.models import MAX_SETTLE_MS, MINIWOB_TASKS


@dataclass
class EnvArguments:
    task_name: str = field(default="click-test", metadata={"help": "MiniWoB task, e.g. click-test, enter-text"})
    tasks: list[str] = field(
        default_factory=list,
        metadata={"help": "several tasks: names, name:weight, or presets (tasks.PRESET_NAMES); empty: task_name"},
    )
    env_url: list[str] = field(
        default_factory=list,
        metadata={"help": "OpenEnv BrowserGym servers (URLs, or URLs separated by commas); none: start local ones"},
    )
    env_servers: int = field(
        default=0, metadata={"help": "env_server.py processes to start when env_url is unset; 0: one per 4 CPU cores"}
    )
    max_turns: int = field(default=10, metadata={"help": "actions per episode before it ends unsolved"})
    max_page_chars: int = field(default=2000, metadata={"help": "accessibility-tree characters shown per turn"})
    settle_ms: int | None = field(
        default=None,
        metadata={"help": "wait after each action before observing, in ms (BrowserGym's: 500); default: the server's"},
    )
    env_token: str | None = field(
        default=None, metadata={"help": "token of a server beyond loopback; default $BROWSER_RL_ENV_TOKEN"}
    )
    env_timeout_s: float = field(default=120.0, metadata={"help": "longest wait for one answer of the server"})
    lockstep: bool = field(
        default=False,
        metadata={"help": "every turn's generation waits for the whole batch: slower, but a rerun samples the same"},
    )

    def __post_init__(self):
        if self.task_name not in MINIWOB_TASKS:
            raise ValueError(f"task_name: unknown MiniWoB task {self.task_name!r}")
        self.task_weights()  # a mistake in the list fails here
        self.env_url = server_urls(self.env_url)
        for name in ("max_turns", "max_page_chars", "env_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.settle_ms is not None and not 0 <= self.settle_ms <= MAX_SETTLE_MS:
            raise ValueError(f"settle_ms must be from 0 to {MAX_SETTLE_MS}, got {self.settle_ms}")
        if self.env_servers < 0:
            raise ValueError(f"env_servers must be 0 (one per 4 cores) or more, got {self.env_servers}")
        # A server's own Python is about a quarter of an episode's CPU and runs on one core (one interpreter lock);
        # the browsers take the rest. One server per 4 cores keeps no interpreter the bottleneck.
        self.env_servers = self.env_servers or max(1, (os.cpu_count() or 1) // 4)

    def task_weights(self) -> dict[str, float]:
        """{task: relative weight} of the tasks to play: `tasks`, or `task_name` alone."""
        return parse_tasks(self.tasks or [self.task_name])


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
class RolloutArguments:
    num_task_seeds: int = field(default=1000, metadata={"help": "distinct seeds to train on, for each task"})
    curriculum: bool = field(
        default=False, metadata={"help": "draw tasks by p(1-p) of their running success, not by weight alone"}
    )
    max_env_failures: int = field(
        default=3, metadata={"help": "environment failures in a row before the run stops (each re-runs the step)"}
    )

    sft_phase_steps: int = field(
        default=0,
        metadata={"help": "optimizer steps of each SFT phase on the run's own successes (sft_phases.py); 0: none"},
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
        if self.num_task_seeds <= 0:
            raise ValueError(f"num_task_seeds must be positive, got {self.num_task_seeds}")
        if self.max_env_failures < 0:
            raise ValueError(f"max_env_failures must be 0 or more, got {self.max_env_failures}")
