"""The recipe on Modal's GPUs: train.py's own entry point, in a container with a GPU and two volumes.

    modal run modal_app.py                                   # config.yaml
    modal run modal_app.py --config my.yaml --use-peft       # your config; LoRA; `modal_gpu: H100:4`: torchrun over 4

The YAML is read on your machine and shipped with the call; its `modal_*` keys choose the GPU, timeout, retries,
secrets and environment servers, which run in CPU sandboxes of their own (OpenEnv's ModalProvider, from the
environment's Dockerfile) reached over a tunnel with a token made for the run. Each run writes to its own directory of
the `browser-rl-checkpoints` volume, committed at every checkpoint, and a retry resumes from the latest one
(docs/guide.md, "On Modal").
"""

import contextlib
import datetime
import functools
import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import modal
import yaml
from openenv.core.containers.runtime.modal_provider import ModalProvider
from transformers import TrainerCallback

import train
from browser_rl.command_line import parse_command_line, run_command
from browser_rl.command_options import ModalArguments
from browser_rl.errors import ConfigError
from browser_rl.metrics import setup_logging
from browser_rl.options import RecipeConfig, ServerArguments, TaskArguments
from browser_rl.servers import open_server_pool
from env_client import LocalEnvServer
from web_env.models import TOKEN_VARIABLE

PROJECT_DIR = Path(__file__).parent
# What the GPU's container runs: train.py, the top-level modules it imports, the recipe's package, and the experts
# and plans that guide its guided episodes (warm_start).
RECIPE = ("train", "env_client", "rewards", "browser_rl", "warm_start")
# The environment package, whole: the trainer imports its wire types and actions, and builds the environment
# servers' image from its folder (server/Dockerfile, with the folder as the build context).
ENVIRONMENT_PACKAGE = PROJECT_DIR / "web_env"
SANDBOX_START_TIMEOUT_S = 600  # a sandbox's first start builds the image: minutes
CHECKPOINT_VOLUME = "browser-rl-checkpoints"
# Where the checkpoint volume is mounted; another directory only for running the body locally.
CHECKPOINTS_DIR = Path(os.environ.get("BROWSER_RL_CHECKPOINTS", "/checkpoints"))
HF_CACHE_DIR = "/root/.cache/huggingface"
COMMIT_EVERY_S = 60.0  # how often the volume is committed while ranks train in processes of their own
# Your task modules' folders, shipped with the call (they are read where you run `modal run`): where the GPU's
# container writes them, in the run's directory, and where a sandbox's image holds them (the Dockerfile copies its
# build context to /src/web_env).
OWN_TASKS = "own_tasks"
OWN_TASKS_IN_SANDBOX = f"/src/web_env/{OWN_TASKS}"
MAX_OWN_TASKS_BYTES = 50 * 2**20

image = (
    modal.Image.debian_slim(python_version="3.11")  # no browser: the environment servers run elsewhere
    .pip_install_from_pyproject(str(PROJECT_DIR / "pyproject.toml"), optional_dependencies=["gpu"])
    .env({"HF_HOME": HF_CACHE_DIR})
    .add_local_python_source(*RECIPE)
    .add_local_python_source(ENVIRONMENT_PACKAGE.name, ignore=[])  # its page scripts and Dockerfile too
)
hf_cache = modal.Volume.from_name("browser-rl-hf-cache", create_if_missing=True)
checkpoints = modal.Volume.from_name(CHECKPOINT_VOLUME, create_if_missing=True)
app = modal.App("browser-rl", image=image)


def function_options(settings: ModalArguments) -> dict:
    """Modal's options for one run, from the config's modal_* keys."""
    return {
        "gpu": settings.modal_gpu,
        "timeout": int(settings.modal_timeout_hours * 3600),
        "retries": modal.Retries(max_retries=settings.modal_retries, initial_delay=10.0),
        "secrets": [modal.Secret.from_name(name) for name in settings.modal_secrets],
    }


DEFAULT_OPTIONS = function_options(ModalArguments())


class EnvServerSandbox:
    """The environment server in a Modal sandbox of its own, through OpenEnv's ModalProvider: a CPU container built from
    the Dockerfile, on an https tunnel, refusing clients without the run's token. A restart replaces the sandbox,
    and with it the URL; ServerPool follows."""

    startup_timeout_s = SANDBOX_START_TIMEOUT_S

    def __init__(self, settings: ModalArguments, max_sessions: int, task_modules: list[str], token: str):
        self.task_modules = [Path(module) for module in task_modules]  # their files, each served with its folder
        served = [f"{OWN_TASKS_IN_SANDBOX}/{module.parent.name}/{module.name}" for module in self.task_modules]
        self.provider = ModalProvider(
            app_name=app.name,
            # A sandbox outlives nothing by more than one attempt, even when its trainer is preempted.
            timeout=int(settings.modal_timeout_hours * 3600),
            # Its sessions are the run's alone: none is closed as idle while the run's policy thinks or trains.
            cmd=f"python -m web_env.server --host 0.0.0.0 --port 8000 --max_sessions {max_sessions} --idle_timeout_s 0"
            + (f" --task_modules {' '.join(served)}" if served else ""),
            cpu=settings.modal_env_cpu,
            memory=settings.modal_env_memory_mb,
            env_vars={TOKEN_VARIABLE: token},
        )
        self.url: str | None = None

    def start(self) -> None:
        context = image_context(tuple(self.task_modules))
        dockerfile = context / "server" / "Dockerfile"
        image = ModalProvider.image_from_dockerfile(str(dockerfile), context_dir=str(context))
        self.url = self.provider.start_container(image)
        self.provider.wait_for_ready(self.url, timeout_s=SANDBOX_START_TIMEOUT_S)

    def restart(self) -> None:
        self.provider.stop_container()
        self.start()

    def stop(self) -> None:
        self.provider.stop_container()


@functools.cache  # one copy for all of a run's sandboxes and their restarts
def image_context(own_tasks: tuple[Path, ...]) -> Path:
    """A sandbox image's build context: the environment package, with the task modules' folders in it if any."""
    if not own_tasks:
        return ENVIRONMENT_PACKAGE
    context = Path(tempfile.mkdtemp(prefix="env-image-")) / ENVIRONMENT_PACKAGE.name
    shutil.copytree(ENVIRONMENT_PACKAGE, context, ignore=shutil.ignore_patterns("__pycache__"))
    for module in own_tasks:
        shutil.copytree(module.parent, context / OWN_TASKS / module.parent.name, dirs_exist_ok=True)
    return context


class CommitCheckpoints(TrainerCallback):
    """Makes each checkpoint durable as soon as it is written: a preempted attempt loses at most save_steps."""

    def on_save(self, args, state, control, **kwargs):
        checkpoints.commit()


@app.function(
    gpu=DEFAULT_OPTIONS["gpu"],
    timeout=DEFAULT_OPTIONS["timeout"],
    retries=DEFAULT_OPTIONS["retries"],
    volumes={HF_CACHE_DIR: hf_cache, str(CHECKPOINTS_DIR): checkpoints},
)
def train_remote(config_yaml: str, run_name: str, extra_args: list[str], own_tasks: dict | None = None) -> str:
    """Trains `config_yaml` into the run's directory; a retry resumes from its last checkpoint (train.main does).
    `own_tasks` (shipped_task_modules) are written into the run's directory and trained on from there. Run locally
    (.local()), it starts its environment servers as local processes, as train.py does."""
    setup_logging()
    run_dir = CHECKPOINTS_DIR / run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.yaml"
    config_path.write_text(config_yaml)
    args = ["--config", str(config_path), *extra_args, "--output_dir", str(run_dir)]
    if own_tasks:
        args += ["--task_modules", *written_task_modules(own_tasks, run_dir / OWN_TASKS)]
    *recipe, settings = parse_command_line((*train.OPTIONS, ModalArguments), args)
    groups = {type(group): group for group in recipe}  # train.main's option groups, in its order
    tasks, servers, training_args = groups[TaskArguments], groups[ServerArguments], groups[RecipeConfig]
    new_server, callbacks, commit = LocalEnvServer, [], lambda: None
    if not modal.is_local():
        callbacks, commit = [CommitCheckpoints()], checkpoints.commit
        if not servers.env_url:  # the run's environment servers: sandboxes of its own, with a token made for it
            servers = replace(servers, env_servers=settings.modal_env_servers, env_token=secrets.token_hex(16))
            groups[ServerArguments] = servers
            new_server = functools.partial(EnvServerSandbox, settings, token=servers.env_token)
    if settings.gpus() == 1:
        train.main(*groups.values(), callbacks, new_server)
    else:
        train_on_ranks(settings.gpus(), args, tasks.task_modules, servers, training_args, new_server, commit)
    commit()
    return run_name


def train_on_ranks(ranks: int, args: list[str], task_modules, servers, training_args, new_server, commit) -> None:
    """train.py under torchrun, one rank per GPU, on environment servers started here for every rank's episodes.
    The ranks are processes of their own, which cannot commit the volume: it is committed every COMMIT_EVERY_S
    meanwhile (a checkpoint caught half written is passed over on resume), and a failed launch fails the attempt,
    so that Modal retries it."""
    with contextlib.ExitStack() as stack:
        pool = open_server_pool(stack, servers, training_args.generation_batch_size * ranks, task_modules, new_server)
        command = [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)),
            *(train.__file__, *args, "--env_url", ",".join(pool.urls)),
        ]
        token = {TOKEN_VARIABLE: servers.env_token} if servers.env_token else {}  # kept off the command line
        ranks_process = subprocess.Popen(command, env=os.environ | token)
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                ranks_process.wait(timeout=COMMIT_EVERY_S)
                break
            commit()
    if ranks_process.returncode != 0:
        raise RuntimeError(f"torchrun over {ranks} GPUs exited with {ranks_process.returncode}")


def shipped_task_modules(modules: list[str]) -> dict | None:
    """The task modules this process loaded, to ship with the call: each module's file (named relative to the folder
    it ships in) and every file of its folder (its app), as {"modules": [...], "files": {path: bytes}}."""
    if not modules:
        return None
    shipped = {"modules": [], "files": {}}
    for module in modules:
        path = Path(module) if module.endswith(".py") else Path(importlib.util.find_spec(module).origin)
        folder = path.parent
        shipped["modules"].append(f"{folder.name}/{path.name}")
        for file in folder.rglob("*"):
            if file.is_file() and "__pycache__" not in file.parts:
                shipped["files"][f"{folder.name}/{file.relative_to(folder)}"] = file.read_bytes()
    size = sum(map(len, shipped["files"].values()))
    if size > MAX_OWN_TASKS_BYTES:
        raise ConfigError(
            f"task_modules: their folders hold {size / 2**20:.0f} MB, which every run would ship; keep each task "
            f"module and its app in a folder of their own (at most {MAX_OWN_TASKS_BYTES // 2**20} MB)"
        )
    return shipped


def written_task_modules(own_tasks: dict, directory: Path) -> list[str]:
    """Writes shipped task modules' folders into `directory`; the paths of their modules there."""
    for name, content in own_tasks["files"].items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(content)
    return [str(directory / module) for module in own_tasks["modules"]]


def run_name_for(config: dict) -> str:
    name = Path(config.get("output_dir", "run")).name
    return f"{name}-{datetime.datetime.now():%Y%m%d-%H%M%S}"


@app.local_entrypoint()
def main(config: str = "config.yaml", use_peft: bool = False, run_name: str = ""):
    run_command("modal_app.py", lambda: launch(config, use_peft, run_name))


def launch(config: str, use_peft: bool, run_name: str) -> None:
    extra_args = ["--use_peft"] if use_peft else []
    # Parsed here first, so that a mistake in the file fails on this machine, not on a rented GPU.
    tasks, *_, settings = parse_command_line((*train.OPTIONS, ModalArguments), ["--config", config, *extra_args])
    config_yaml = Path(config).read_text()
    run_name = run_name or run_name_for(yaml.safe_load(config_yaml))
    print(f"run {run_name}: {config} on a Modal {settings.modal_gpu}, up to {settings.modal_retries} retries")
    own_tasks = shipped_task_modules(tasks.task_modules)
    train_remote.with_options(**function_options(settings)).remote(config_yaml, run_name, extra_args, own_tasks)
    print(f"done. Checkpoints and the final model are in the volume {CHECKPOINT_VOLUME}, directory {run_name}:")
    print(f"    modal volume get {CHECKPOINT_VOLUME} {run_name} ./{run_name}")
