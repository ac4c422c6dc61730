"""Starting policies: the weak starts' mix of right and wrong episodes, and warm_up.py's fine-tune of any
demonstrations file, full or LoRA, into a model train.py starts from."""

import math
import shlex
import subprocess
import sys

import pytest
from transformers import AutoModelForCausalLM
from trl import ModelConfig

import demonstrations
import warm_up
from demonstrations import FIRST_SEED, DemonstrationsError, load, record_mix, save
from env_client import ServerPool
from helpers import ROOT
from scripted_policy import Plan, a_third_right, plan
from warm_up import WarmUpArguments, weak_start_config


@pytest.mark.parametrize("actions, solved_share", [(1, 1 / 3), (2, 1 / 4), (3, 8 / 27)])
def test_a_third_right_solves_a_task_about_a_third_of_the_time_however_many_actions_it_takes(actions, solved_share):
    task_plan = Plan(right=[f"right {i}" for i in range(actions)], wrong=[f"wrong {i}" for i in range(actions)])
    replies = [a_third_right(task_plan, step) for step in range(actions)]
    assert all(set(r) == {task_plan.right[step], task_plan.wrong[step]} for step, r in enumerate(replies))
    # A policy that writes each step's replies in these proportions solves the task with this probability.
    assert math.prod(r.count(task_plan.right[step]) / len(r) for step, r in enumerate(replies)) == pytest.approx(
        solved_share
    )


def test_a_mix_demonstrates_each_reply_at_every_step_of_the_plan(env_server, tokenizer):
    seeds = range(FIRST_SEED, FIRST_SEED + 2)
    recorded = record_mix(ServerPool([env_server.url]), tokenizer, "login-user", seeds, a_third_right)
    assert len(recorded) == 3 * len(seeds)  # two rights and a wrong in three at each of three steps
    for demonstration in recorded:
        task_plan = plan("login-user", demonstration.goal, demonstration.turns[0].page)
        written = [turn.reply for turn in demonstration.turns]
        assert written in (task_plan.right, task_plan.wrong)
        assert demonstration.solved == (written == task_plan.right)
    assert sorted(d.seed for d in recorded) == sorted([*seeds] * 3)


@pytest.mark.slow
def test_warm_up_fine_tunes_a_demonstrations_file_with_lora_into_a_whole_model_train_py_starts_from(
    env_server, tokenizer, tiny_model, tmp_path
):
    """The command line, LoRA merged into the model it writes; a full fine-tune through the same `fine_tune` builds
    every weak start of the tests (conftest.py) and is checked on its own in test_learning.py."""
    demonstrations = tmp_path / "demos.jsonl"
    seeds = range(FIRST_SEED, FIRST_SEED + 4)
    save(record_mix(ServerPool([env_server.url]), tokenizer, "click-test", seeds, a_third_right), demonstrations)
    assert len(load(demonstrations)) == 4 and len(load(demonstrations, keep_failed=True)) == 12
    command = [sys.executable, "warm_up.py", "--demonstrations", str(demonstrations)]
    command += ["--model_name_or_path", tiny_model, "--output_dir", str(tmp_path / "warm"), "--max_steps", "3"]
    command += ["--per_device_train_batch_size", "2", "--report_to", "none", "--save_strategy", "no"]
    command += ["--activation_checkpointing", "false", "--use_peft", "--lora_r", "4"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "4 demonstrations from" in run.stderr and "8 unsuccessful ones left out" in run.stderr
    assert f"starting policy: {tmp_path / 'warm'}" in run.stdout
    warm = AutoModelForCausalLM.from_pretrained(tmp_path / "warm")  # a whole model, the adapter merged in
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert not (tmp_path / "warm" / "adapter_config.json").exists()
    assert any(not p.equal(base.get_parameter(n)) for n, p in warm.named_parameters())


def test_make_smokes_recording_command_asks_for_the_mix_of_a_task_with_a_plan(capsys):
    (line,) = [line for line in (ROOT / "Makefile").read_text().splitlines() if "$(PY) demonstrations.py" in line]
    args = demonstrations.parse_args(shlex.split(line)[2:])  # after $(PY) demonstrations.py
    assert (args.tasks, args.replies, args.episodes) == (["click-test"], "one_right_of_eight", 16)
    with pytest.raises(SystemExit):  # an expert's recording of a task without one
        demonstrations.parse_args(["--tasks", "click-test", "--output", "x.jsonl"])
    assert "no expert for click-test" in capsys.readouterr().err


def test_a_bad_demonstrations_file_stops_warm_up_before_a_model_is_loaded(tiny_model, tmp_path):
    (tmp_path / "demos.jsonl").write_text('{"version": 1}\n')
    args = WarmUpArguments(demonstrations=str(tmp_path / "demos.jsonl"))
    with pytest.raises(DemonstrationsError, match="6 error\\(s\\)") as error:
        warm_up.main(args, weak_start_config(tmp_path, 1, 1, 1e-3), ModelConfig(model_name_or_path=tiny_model))
    assert "demos.jsonl line 1: task: Field required" in str(error.value)
