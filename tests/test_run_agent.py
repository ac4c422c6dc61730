"""run_agent.py plays a trained policy on one task, step by step, asking first in a dry run, and writes the episode's
trace and viewer; a policy behind an OpenAI-compatible server (vLLM's, started here: slow tier) plays exactly the
episodes the same model plays in process."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from browser_rl.command_options import EvalArguments
from browser_rl.episode_settings import DEFAULTS, EpisodeSettings
from browser_rl.errors import ModelUnavailable
from browser_rl.evaluation import evaluate
from browser_rl.gguf_export import export
from browser_rl.options import EpisodeArguments, ServerArguments, TaskArguments
from helpers import ROOT, run_agent
from web_env.server import browser_setup

DRY_RUN_PROMPT = "do it? [Y/n] "


def test_the_agent_prints_each_action_it_takes_and_writes_the_episode_s_trace_and_viewer(
    half_right_model, env_server, tmp_path
):
    arguments = ("--model", half_right_model, "--env_url", env_server.url, "--output_dir", str(tmp_path), "--dry_run")
    played = run_agent(*arguments, "--max_steps", "2", answers="y\n" * 2)
    assert played.returncode == 0, played.stderr[-3000:]
    assert f"{half_right_model} plays click-test, seed 1000000, at most 2 steps" in played.stdout
    (trace_file,) = (tmp_path / "traces" / "click-test").glob("*.json")
    trace = json.loads(trace_file.read_text())
    actions = [step["action"] for step in trace["steps"] if step["action"]]
    assert actions and all(action.startswith("click(") for action in actions)
    for step, action in enumerate(actions, 1):
        assert f"step {step}: {action}\n" in played.stdout  # printed before it was taken
    assert played.stdout.count(DRY_RUN_PROMPT) == len(actions)
    assert f"{'solved' if trace['solved'] else 'not solved'} after {len(actions)} step" in played.stdout
    viewer = tmp_path / "viewer.html"
    assert f"trace: {viewer}" in played.stdout and actions[0] in viewer.read_text()


def test_an_action_declined_in_a_dry_run_is_not_taken_and_the_episode_ends(half_right_model, env_server, tmp_path):
    arguments = ("--model", half_right_model, "--env_url", env_server.url, "--output_dir", str(tmp_path), "--dry_run")
    declined = run_agent(*arguments, answers="n\n")
    assert declined.returncode == 0, declined.stderr[-3000:]
    assert "step 1: click(" in declined.stdout and declined.stdout.count(DRY_RUN_PROMPT) == 1
    assert "stopped: the action was not taken" in declined.stdout
    assert "solved" not in declined.stdout and not (tmp_path / "traces").exists()


def test_an_unreachable_server_is_one_line_and_exit_status_2(unused_port, env_server, tmp_path):
    url = f"http://127.0.0.1:{unused_port}"
    result = run_agent("--model", url, "--env_url", env_server.url)
    assert result.returncode == 2
    assert result.stderr.startswith(f"run_agent.py: {url}: no OpenAI-compatible server serving a model there (")
    assert len(result.stderr.strip().splitlines()) == 1
    with pytest.raises(ModelUnavailable, match=re.escape(f"{url}: no OpenAI-compatible server")):
        evaluate(
            EvalArguments(model=url, output_dir=str(tmp_path)), TaskArguments(), EpisodeArguments(), ServerArguments()
        )


@pytest.fixture
def display():
    """A virtual display (Xvfb) on a number it picks itself, for the browser windows of --headed."""
    screen = subprocess.Popen(["Xvfb", "-displayfd", "1", "-screen", "0", "1280x800x24"], stdout=subprocess.PIPE)
    try:
        yield f":{screen.stdout.readline().decode().strip()}"
    finally:
        screen.terminate()
        screen.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.skipif(
    not shutil.which("Xvfb"), reason="no Xvfb: `make windowed-browser` installs it and the full Chromium"
)
def test_a_headed_agent_plays_in_a_browser_window_on_the_display(half_right_model, display, tmp_path):
    headless_link = Path.home() / browser_setup.LINKS / "playwright"
    agent = subprocess.Popen(
        [sys.executable, "run_agent.py", "--model", half_right_model, "--headed", "--dry_run"]
        + ["--output_dir", str(tmp_path)],
        cwd=ROOT,
        # As a process that prepared headless browsers first hands it down (the suite's workers do): their link.
        env={**os.environ, "DISPLAY": display, "PLAYWRIGHT_BROWSERS_PATH": str(headless_link)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not (line := agent.stdout.readline()).startswith("step 1: click("):
            assert line, agent.stderr.read()[-3000:]  # it ended first
        # The page the agent sees, in a window of the display, while the agent waits for the answer.
        windows = subprocess.run(["xwininfo", "-root", "-tree", "-display", display], capture_output=True, text=True)
        assert '"Click Test Task - Chromium"' in windows.stdout
        out, err = agent.communicate("n\n", timeout=120)
    finally:
        agent.kill()
    assert agent.returncode == 0, err[-3000:]
    assert "stopped: the action was not taken" in out


def test_headed_without_a_display_is_one_line_and_exit_status_2_from_the_agent_and_the_server(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    why = (
        "--headed: a browser window needs a display, and DISPLAY is unset (without one, run the command under xvfb-run)"
    )
    agent = run_agent("--model", "unused", "--headed")
    assert (agent.returncode, agent.stderr) == (2, f"run_agent.py: {why}\n")
    server = subprocess.run(
        [sys.executable, "-m", "web_env.server", "--headed"], cwd=ROOT, capture_output=True, text=True
    )
    assert server.returncode == 2 and server.stderr.strip().splitlines()[-1].endswith(f"error: {why}")


@pytest.fixture
def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def vllm_server(real_model, unused_port, monkeypatch):
    """`vllm serve` (vLLM's CPU build, through its module: the build's `vllm` script looks itself up under another
    package name) serving the real model in float32, as transformers plays it. Eager: compiling the model with
    torch's inductor, vLLM's default on a CPU, made the server take 98 to 172 s to start here, against 36 to 40 s
    (docs/test_suite.md); what the test checks is the client's episodes, the same from either."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # of the machine's memory, for one short context at a time
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(real_model)]
        + ["--port", str(unused_port), "--dtype", "float32", "--max-model-len", "4096", "--enforce-eager"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{unused_port}"
    try:
        while server.poll() is None:
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=5)
                break
            except OSError:
                time.sleep(2)
        assert server.poll() is None, server.stderr.read()[-3000:]
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


@pytest.mark.slow
def test_a_served_model_plays_exactly_the_episodes_it_plays_in_process(vllm_server, real_model, env_server, tmp_path):
    def played_by(model: str, name: str, tokenizer: str | None = None) -> list[dict]:
        evaluate(
            EvalArguments(model=model, tokenizer=tokenizer, episodes=2, output_dir=str(tmp_path / name)),
            TaskArguments(tasks=["click-test", "focus-text"]),
            EpisodeArguments(max_turns=2),
            ServerArguments(env_url=[env_server.url]),
        )
        return [json.loads(line) for line in (tmp_path / name / "episodes.jsonl").read_text().splitlines()]

    served, in_process = played_by(vllm_server, "served"), played_by(str(real_model), "in-process")
    keys = ("task_name", "seed", "replies", "actions", "success")
    assert [{k: e[k] for k in keys} for e in served] == [{k: e[k] for k in keys} for e in in_process]
    assert len(served) == 4 and all(e["replies"] for e in served)

    # Served from its exported file (as llama-server serves one), the file names the tokenizer and the settings.
    exported = tmp_path / "agent.gguf"
    model = AutoModelForCausalLM.from_pretrained(real_model, dtype=torch.float32)
    export(model, AutoTokenizer.from_pretrained(real_model), EpisodeSettings(max_turns=2), exported, "f16")
    by_file = played_by(vllm_server, "served-told-the-file", tokenizer=str(exported))
    assert [{k: e[k] for k in keys} for e in by_file] == [{k: e[k] for k in keys} for e in in_process]

    played = run_agent(
        "--model", vllm_server, "--env_url", env_server.url, "--output_dir", str(tmp_path), "--max_steps", "1"
    )
    assert played.returncode == 0, played.stderr[-3000:]
    # The real model as built saved no settings: the agent says which it plays with.
    assert f"{vllm_server} has no saved episode settings: playing with {DEFAULTS.describe()}" in played.stderr
    assert f"{vllm_server} plays click-test, seed 1000000, at most 1 step\n" in played.stdout
    assert f"step 1: no action in the reply {in_process[0]['replies'][0]!r}" in played.stdout
    assert (tmp_path / "viewer.html").exists()
