"""The recipe on Modal's GPUs: each command's own entry point, in a container with a GPU and two volumes.

    modal run modal_app.py --config my.yaml --use_peft      # train.py; `modal_gpu: H100:4`: torchrun over 4 GPUs
    modal run modal_app.py::record --config configs/warm_up/book_flight.yaml --tasks book-flight --episodes 500
    modal run modal_app.py::warm_up --config configs/warm_up/book_flight.yaml
    modal run modal_app.py::evaluate --model <run-name> --tasks book-flight --episodes 100

Each takes its command's options, the command line over the config, whose `modal_*` keys choose the GPU, timeout,
retries, secrets and environment servers (CPU sandboxes of their own, from the environment's Dockerfile). The
commands run in the `browser-rl-checkpoints` volume, whose paths they name; a training run writes to a directory of
its own there, and a retry resumes from its latest checkpoint (docs/guide.md, "On Modal").
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
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import modal
import yaml
from openenv.core.containers.runtime.modal_provider import ModalProvider
from transformers import TrainerCallback

import train
from browser_rl.command_line import parse_command_line, run_command
from browser_rl.command_options import ModalArguments
from browser_rl.errors import ConfigError, UsageError
from browser_rl.evaluation import evaluate as evaluate_model
from browser_rl.evaluation_report import report
from browser_rl.metrics import setup_logging
from browser_rl.options import RecipeConfig, ServerArguments, TaskArguments
from browser_rl.servers import open_server_pool
from env_client import LocalEnvServer
from evaluate import OPTIONS as EVALUATE_OPTIONS
from warm_start import record as record_command
from warm_start import warm_up as warm_up_command
from web_env.models import TOKEN_VARIABLE

PROJECT_DIR = Path(__file__).parent
# What the GPU's container runs: train.py and evaluate.py, the top-level modules they import, the recipe's package, and
# warm_start (recording, the warm-up, and the experts and plans that guide training's guided episodes).
RECIPE = ("train", "evaluate", "env_client", "rewards", "browser_rl", "warm_start")
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
        servers, new_server = sandboxed(servers, settings)
        groups[ServerArguments] = servers
    with contextlib.chdir(CHECKPOINTS_DIR):  # the paths the config names are the volume's
        if settings.gpus() == 1:
            train.main(*groups.values(), callbacks, new_server)
        else:
            train_on_ranks(settings.gpus(), args, tasks.task_modules, servers, training_args, new_server, commit)
    commit()
    return run_name


def sandboxed(servers: ServerArguments, settings: ModalArguments) -> tuple[ServerArguments, Callable]:
    """The servers of a command in Modal's container, and what makes each: unless env_url names some, sandboxes of
    its own (modal_env_servers), with a token made for it."""
    if servers.env_url:
        return servers, LocalEnvServer  # never called: the command plays on env_url's servers
    servers = replace(servers, env_servers=settings.modal_env_servers, env_token=secrets.token_hex(16))
    return servers, functools.partial(EnvServerSandbox, settings, token=servers.env_token)


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


@dataclass(frozen=True)
class Command:
    """A command modal_app.py runs in Modal's container besides training: its option groups (those a config file
    sets), its body, which takes them and what makes its environment servers, and where it writes."""

    options: tuple
    from_file: tuple
    body: Callable
    output: Callable

    def parse(self, args: list[str]) -> tuple[list, ModalArguments]:
        """The command's option groups and the Modal settings, from `args` as the command line holds them."""
        *groups, settings = parse_command_line(
            (*self.options, ModalArguments), args, from_file=(*self.from_file, ModalArguments)
        )
        return groups, settings


def warm_up_body(*groups, new_server) -> None:
    warm_up_command.main(*groups)  # plays no episode: no servers


def evaluate_body(*groups, new_server) -> None:
    print(report(evaluate_model(*groups, new_server)))


COMMANDS = {
    "record": Command(
        record_command.OPTIONS,
        record_command.OPTIONS,
        record_command.record_demonstrations,
        lambda g: g[0].demonstrations,
    ),
    "warm_up": Command(warm_up_command.OPTIONS, warm_up_command.OPTIONS, warm_up_body, lambda g: g[2].output_dir),
    "evaluate": Command(EVALUATE_OPTIONS, EVALUATE_OPTIONS[1:], evaluate_body, lambda g: g[0].output_dir),
}


@app.function(
    gpu=DEFAULT_OPTIONS["gpu"],
    timeout=DEFAULT_OPTIONS["timeout"],
    retries=DEFAULT_OPTIONS["retries"],
    volumes={HF_CACHE_DIR: hf_cache, str(CHECKPOINTS_DIR): checkpoints},
)
def command_remote(name: str, config_yaml: str | None, args: list[str], own_tasks: dict | None = None) -> None:
    """Runs warm_start.record, warm_start.warm_up or evaluate.py (COMMANDS[name]) as on your machine, in the volume,
    so that the paths it names are the volume's; the episodes it plays run on sandboxes of its own, as training's do.
    Run locally (.local()), it starts its environment servers as local processes."""
    setup_logging()
    command = COMMANDS[name]
    with tempfile.TemporaryDirectory() as shipped:
        if config_yaml is not None:
            (Path(shipped) / "config.yaml").write_text(config_yaml)
            args = ["--config", str(Path(shipped) / "config.yaml"), *args]
        if own_tasks:
            args = [*args, "--task_modules", *written_task_modules(own_tasks, Path(shipped))]
        groups, settings = command.parse(args)
        new_server = LocalEnvServer
        if not modal.is_local():
            at = next((i for i, group in enumerate(groups) if isinstance(group, ServerArguments)), None)
            if at is not None:
                groups[at], new_server = sandboxed(groups[at], settings)
        with contextlib.chdir(CHECKPOINTS_DIR):
            command.body(*groups, new_server=new_server)
    if not modal.is_local():
        checkpoints.commit()


def own_options(arglist: tuple[str, ...], default_config: str | None) -> tuple[str | None, str, list[str]]:
    """modal_app.py's own options, --config FILE and --run_name NAME, and the command's (the rest, as it takes them)."""
    args, taken = list(arglist), {"--config": default_config, "--run_name": ""}
    for name in taken:
        if name in args:
            at = args.index(name)
            if at + 1 == len(args):
                raise UsageError(f"{name} takes a value")
            taken[name] = args[at + 1]
            del args[at : at + 2]
    return taken["--config"], taken["--run_name"], args


@app.local_entrypoint()
def main(*arglist: str):
    """train.py on Modal: modal run modal_app.py [--config FILE] [--run_name NAME] [train.py's options]."""
    run_command("modal_app.py", lambda: launch(arglist))


def launch(arglist: tuple[str, ...]) -> None:
    config, run_name, extra_args = own_options(arglist, "config.yaml")
    # Parsed here first, so that a mistake in the file fails on this machine, not on a rented GPU.
    tasks, *_, settings = parse_command_line((*train.OPTIONS, ModalArguments), ["--config", config, *extra_args])
    config_yaml = Path(config).read_text()
    run_name = run_name or run_name_for(yaml.safe_load(config_yaml))
    print(f"run {run_name}: {config} on a Modal {settings.modal_gpu}, up to {settings.modal_retries} retries")
    own_tasks = shipped_task_modules(tasks.task_modules)
    train_remote.with_options(**function_options(settings)).remote(config_yaml, run_name, extra_args, own_tasks)
    print(f"done. Checkpoints and the final model are in the volume {CHECKPOINT_VOLUME}, directory {run_name}:")
    print(f"    modal volume get {CHECKPOINT_VOLUME} {run_name} ./{run_name}")


@app.local_entrypoint()
def record(*arglist: str):
    """warm_start.record on Modal: modal run modal_app.py::record [--config FILE] [its options]."""
    run_command("modal_app.py::record", lambda: launch_command("record", arglist))


@app.local_entrypoint()
def warm_up(*arglist: str):
    """warm_start.warm_up on Modal: modal run modal_app.py::warm_up [--config FILE] [its options]."""
    run_command("modal_app.py::warm_up", lambda: launch_command("warm_up", arglist))


@app.local_entrypoint()
def evaluate(*arglist: str):
    """evaluate.py on Modal: modal run modal_app.py::evaluate [--config FILE] [its options]."""
    run_command("modal_app.py::evaluate", lambda: launch_command("evaluate", arglist))


def launch_command(name: str, arglist: tuple[str, ...]) -> None:
    config, _, args = own_options(arglist, None)
    command = COMMANDS[name]
    # Parsed here first, as training's, so that a mistake fails on this machine.
    groups, settings = command.parse(["--config", config, *args] if config else args)
    if settings.gpus() > 1:
        raise ConfigError(f"modal_gpu: {name} runs on one GPU; several ({settings.modal_gpu}) are for training")
    tasks = next((group for group in groups if isinstance(group, TaskArguments)), None)
    own_tasks = shipped_task_modules(tasks.task_modules) if tasks else None
    print(f"{name}: {config or 'the command line'} on a Modal {settings.modal_gpu}, in the volume {CHECKPOINT_VOLUME}")
    config_yaml = Path(config).read_text() if config else None
    command_remote.with_options(**function_options(settings)).remote(name, config_yaml, args, own_tasks)
    output = command.output(groups)
    print(f"done. {f'{output} is' if output else 'Its output is'} in the volume {CHECKPOINT_VOLUME}:")
    print(f"    modal volume get {CHECKPOINT_VOLUME} {output or 'PATH'} ./{output or 'PATH'}")
