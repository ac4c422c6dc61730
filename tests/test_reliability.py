"""Real CPU training runs (tiny LFM2, real server) under faults: a killed server, a hung one, one of three lost, none
at all; and a server whose parent died. A killed trainer resuming is in test_modal_app.py (one process) and
test_data_parallel.py (two ranks)."""

import os
import re
import signal
import subprocess
import sys

import pytest
from transformers import TrainerCallback

import train
from browser_rl import servers
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.errors import EnvironmentUnavailable
from browser_rl.metrics import METRICS_FILE, read_metrics
from env_client import LocalEnvServer, free_port
from helpers import FAST, ROOT, alive, lines_of, parse_config, train_command, train_here, wait_for
from warm_start.plans import right_only
from warm_start.weak_starts import weak_start

pytestmark = pytest.mark.slow  # whole training runs


@pytest.fixture(scope="module")
def clicking_model(tmp_path_factory, tiny_model, env_server):
    """A tiny LFM2 taught to click click-test's button: every episode it plays is solved, so a zero reward
    in its training log could only come from the environment. Made for FAST's two turns."""
    clicking = tmp_path_factory.mktemp("clicking")
    settings = EpisodeSettings(max_turns=2)
    return weak_start(tiny_model, clicking, env_server.url, ["click-test"], right_only, settings, 60, 4, 3e-3)


class AtTheEndOfStepOne(TrainerCallback):
    """Calls `fault()` once, when step 1 ends: as step 2's rollout is about to start."""

    def __init__(self, fault):
        self.fault = fault

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.fault()


def train_with_fault(model: str, output_dir, fault, *overrides: str) -> tuple[str, list[LocalEnvServer]]:
    """train_here for 4 steps on servers the run starts (web_env.server processes, as train.py's own), with
    `fault(servers)` when step 1 ends: the run's log, and the servers it started, in order. What fails is a server,
    so the trainer runs in the test's process."""
    started = []

    def new_server(max_sessions: int, task_modules: list[str]) -> LocalEnvServer:
        started.append(LocalEnvServer(max_sessions, task_modules))
        return started[-1]

    at_step_one = AtTheEndOfStepOne(lambda: fault(started))
    overrides = ("--max_steps", "4", "--save_steps", "10", *overrides)
    log = train_here(model, output_dir, *overrides, callbacks=[at_step_one], new_server=new_server)
    return log, started


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(signal.SIGKILL, id="server killed"),
        pytest.param(signal.SIGSTOP, id="server hung"),
    ],
)
def test_a_run_whose_server_fails_restarts_it_and_scores_no_infrastructure_zeros(clicking_model, tmp_path, fault):
    # A hung server is found by the wait for its answer, which must outlast the slowest true one: a new server's first
    # resets launch its browsers, and on two busy cores took over 5 s, which failed a server that was not hung (and
    # restarted it once more). A killed one is found by the refused connection.
    found_in = ["--env_timeout_s", "30"] if fault == signal.SIGSTOP else []
    failed = []

    def fail(started: list[LocalEnvServer]) -> None:
        failed.append(started[0].pid)
        os.killpg(started[0].pid, fault)

    log, _ = train_with_fault(clicking_model, tmp_path, fail, *found_in)
    assert len(failed) == 1
    assert "environment failure 1 of at most 3" in log, log[-5000:]
    assert fault != signal.SIGSTOP or "TimeoutError" in log
    assert len(re.findall(r"starting a local environment server", log)) == 2, log[-5000:]
    steps = [row for row in read_metrics(tmp_path / METRICS_FILE) if "reward" in row]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert [s["reward"] for s in steps] == [1.0] * 4  # the policy solves every episode it gets to finish


def test_a_run_on_three_servers_that_loses_one_goes_on_on_the_others(clicking_model, tmp_path):
    killed = []

    def kill_the_second(started: list[LocalEnvServer]) -> None:
        killed.append(started[1].url)
        os.killpg(started[1].pid, signal.SIGKILL)

    log, started = train_with_fault(
        clicking_model, tmp_path, kill_the_second, "--env_servers", "3", "--per_device_train_batch_size", "6"
    )
    urls = [server.url for server in started]
    assert len(urls) == 3 and killed == [urls[1]]
    assert f"environment server {urls[1]} failed: out of the rotation while it restarts" in log
    assert "running the batch's 6 episodes again on the 2 server(s) still up" in log
    steps = [row for row in read_metrics(tmp_path / METRICS_FILE) if "reward" in row]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert [s["reward"] for s in steps] == [1.0] * 4  # no episode cut short by the lost server was scored
    # Sessions spread by load: two on each server, then three on each of the two still up.
    spreads = [
        (up, sorted(spread.split(", ")))
        for up, spread in re.findall(r"6 sessions on (\d) of 3 environment servers: (.*)", log)
    ]
    assert spreads[0] == ("3", sorted(f"{url} x2" for url in urls))
    assert spreads[-1] == ("2", sorted(f"{url} x3" for url in urls if url != urls[1]))


def test_a_run_stops_with_a_clear_message_after_max_env_failures(tiny_model, tmp_path, monkeypatch):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setattr(servers, "REMOTE_RECOVERY_WAIT_S", 0.1)
    args = parse_config(
        "configs/smoke.yaml",
        "--model_name_or_path",
        tiny_model,
        "--env_url",
        dead,
        "--output_dir",
        str(tmp_path),
        "--max_env_failures",
        "2",
        *FAST,
    )
    with pytest.raises(EnvironmentUnavailable, match=r"failed 3x in a row, last with ConnectionError"):
        train.main(*args)

    result = subprocess.run(
        train_command(tiny_model, tmp_path, "--env_url", dead, "--max_env_failures", "0"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "stopping: the environment failed 1x in a row" in result.stderr
    assert "the same command resumes from the last one" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_server_whose_parent_died_is_gone_even_when_its_shutdown_hangs():
    # The server stand-in ignores SIGTERM, as a server whose graceful shutdown waits on a browser call that
    # never returns in effect does; its parent is killed without a chance to stop it. Its grace is a second
    # rather than the server's ten, so that the test does not wait them out.
    grace_s = 1.0
    server = (
        f"import os, signal, sys; parent = os.getppid(); sys.path.insert(0, {str(ROOT)!r}); "
        f"from web_env.server import app; app.SHUTDOWN_GRACE_S = {grace_s}; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); app.exit_with_parent(parent); "
        "print('watching', flush=True); signal.pause()"
    )
    parent = (
        "import subprocess, sys, time; "
        f"server = subprocess.Popen([sys.executable, '-c', {server!r}], start_new_session=True); "
        "print(server.pid, flush=True); time.sleep(600)"
    )
    starter = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    said = lines_of(starter, starter.stdout, timeout_s=60)
    server_pid = int(next(said))
    assert next(said) == "watching\n"
    starter.kill()
    starter.wait()
    assert alive(server_pid)
    assert wait_for(lambda: not alive(server_pid), timeout_s=grace_s + 10)
