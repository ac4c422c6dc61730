"""bench/gpu_step.py, which measures GRPO steps on a GPU machine without a browser, kept working on the CPU: its
replay of recorded episodes behind OpenEnv's server, and a short run of its full and LoRA setups."""

import json
import subprocess
import sys

import pytest

from env_client import BrowserGymEnv
from helpers import ROOT
from replay_environment import RECORDED, serve_replay
from web_env.models import BrowserGymAction


def test_the_replayed_episodes_are_solved_by_their_right_action_alone():
    url = serve_replay(max_sessions=2)
    with BrowserGymEnv(base_url=url).sync() as session:
        first = session.reset(task_name="click-test", seed=3).observation
        assert first.goal and "button" in first.axtree_txt
        (recorded,) = [
            row
            for row in map(json.loads, RECORDED.read_text().splitlines())
            if row["seed"] == 3 and row["task"] == "click-test"
        ]
        right = recorded["right"]
        wrong = session.step(BrowserGymAction(action_str="click('1')"))
        assert (wrong.done, wrong.reward) == (False, 0.0)
        solved = session.step(BrowserGymAction(action_str=right))
        assert (solved.done, solved.reward) == (True, 1.0)


@pytest.mark.slow
def test_the_gpu_step_benchmark_trains_full_and_lora_and_splits_the_seconds():
    command = [sys.executable, "bench/gpu_step.py", "--tiny", "--steps", "2", "--"]
    command += ["--num_generations", "2", "--gradient_accumulation_steps", "2", "--max_turns", "2"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.startswith(("full", "lora"))}
    assert set(rows) >= {"full", "lora"}
    for setup in ("full", "lora"):
        seconds, generation, training = rows[setup][1:4]
        assert float(seconds) > 0 and float(generation.rstrip("s")) > 0 and float(training.rstrip("s")) > 0
