"""Real GRPO steps on the CPU: the tiny LFM2 against a real environment server."""

import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from peft import AutoPeftModelForCausalLM
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForCausalLM

import train
from browser_rl import metrics
from browser_rl.command_options import EvalArguments
from browser_rl.episode_settings import EpisodeSettings, saved_with
from browser_rl.errors import ConfigError
from browser_rl.evaluation import evaluate
from browser_rl.metrics import CURVE_FILE, METRICS_FILE, read_metrics
from browser_rl.options import EpisodeArguments, ServerArguments, TaskArguments
from browser_rl.trainer import RecipeTrainer
from env_client import LocalEnvServer
from helpers import FAST, ROOT, alive, built_trainer, lines_of, parse_config, process_tree, train_command


def run_training(tiny_model, env_url, output_dir, *extra):
    args = parse_config(
        "configs/smoke.yaml",
        *("--model_name_or_path", tiny_model, "--env_url", env_url, "--output_dir", str(output_dir)),
        *("--max_steps", "2", "--save_steps", "1", *FAST, *extra),
    )
    train.main(*args)
    return json.loads((output_dir / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]


def assert_steps_logged(log_history):
    steps = [entry for entry in log_history if "reward" in entry]
    assert [entry["step"] for entry in steps] == [1, 2]
    assert all(math.isfinite(entry["loss"]) and 0.0 <= entry["reward"] <= 1.0 for entry in steps)


def test_full_fine_tune_trains_and_writes_a_checkpoint_that_loads(half_right_model, tmp_path):
    """On a model that acts, right about half the time: two groups of four one-action episodes a step, in lock step,
    so that the run is the same every time. On a server of its own, whose browsers hold no page yet."""
    one_action = ("--max_turns", "1", "--num_generations", "4", "--per_device_train_batch_size", "8")
    with LocalEnvServer(max_sessions=16, server_args=["--browsers", "2"]) as server:
        assert_steps_logged(run_training(half_right_model, server.url, tmp_path, *one_action, "--lockstep", "true"))
    metrics = read_metrics(tmp_path / METRICS_FILE)
    steps = [m for m in metrics if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(0 < m["episodes/success_rate"] < 1 for m in steps)  # its groups disagree: the steps have a gradient
    for m in steps:
        assert {"episodes/success_rate", "episodes/turns", "episodes/unparsed_share", "entropy", "loss"} <= m.keys()
        assert m["episodes/success_rate"] == m["reward"]  # the reward is task success
        # The step's time, split: each part positive, together the step TRL timed.
        split = [m["time/generation_s"], m["time/environment_s"], m["time/training_s"]]
        assert all(seconds > 0 for seconds in split) and math.isclose(sum(split), m["step_time"], rel_tol=1e-6)
        assert 0 < m["environment/cpu_s_per_episode"] < 5  # what the server and its browsers spent per episode
    # The run's sessions load click-test's page at their first episode, and restart their episodes in it from then on.
    assert [m["environment/restarted_share"] for m in steps] == [0.0, 1.0]
    assert Image.open(tmp_path / CURVE_FILE).width > 300
    for path in (tmp_path / "checkpoint-1", tmp_path / "checkpoint-2", tmp_path):
        model = AutoModelForCausalLM.from_pretrained(path)
        assert model.config.model_type == "lfm2"
    final = AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    last = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-2").state_dict()
    assert all(torch.equal(final[k], last[k]) for k in final)
    # Each step moved the weights (every one of them: a full fine-tune).
    start = AutoModelForCausalLM.from_pretrained(half_right_model).state_dict()
    first = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-1").state_dict()
    for before, after in ((start, first), (first, last)):
        assert all(not torch.equal(before[k], after[k]) for k in after)
    # The model and every checkpoint carry the episode settings they were trained with: one action an episode.
    for path in (tmp_path / "checkpoint-1", tmp_path / "checkpoint-2", tmp_path):
        assert saved_with(str(path)) == EpisodeSettings(max_turns=1)


def test_lora_trains_and_writes_an_adapter_that_loads(tiny_model, env_server, tmp_path):
    assert_steps_logged(run_training(tiny_model, env_server.url, tmp_path, "--use_peft"))
    adapter = json.loads((tmp_path / "adapter_config.json").read_text())
    assert set(adapter["target_modules"]) == {"q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3"}
    model = AutoPeftModelForCausalLM.from_pretrained(tmp_path)
    assert any("lora_A" in name for name, _ in model.named_parameters())


def server_pid_in(log: str) -> int:
    return int(re.search(r"local environment server at \S+ \(pid (\d+)\)", log).group(1))


@pytest.mark.slow
def test_train_py_starts_its_own_server_and_stops_it_at_exit(tiny_model, tmp_path):
    result = subprocess.run(
        # With activation checkpointing, as the real model's configs have it: TRL's generation toggles it, which warns.
        train_command(tiny_model, tmp_path, "--max_steps", "1", "--activation_checkpointing", "true"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stderr
    assert re.search(
        r"full fine-tune: [\d,]+ trainable parameters of [\d,]+ \([\d.]+%\), generation with transformers", log
    )
    assert re.search(r"step 1/1 \| success [\d.]+% \| reward [\d.]+", log)
    assert "step 1/1 played" not in log  # a step of seconds has one line (metrics.SAY_PLAYED_AFTER_S)
    assert "stopped the local environment server" in log
    assert "Warning:" not in log, [line for line in log.splitlines() if "Warning:" in line]  # a clean run
    assert (tmp_path / "model.safetensors").exists()
    assert not alive(server_pid_in(log))


@pytest.mark.slow
def test_ctrl_c_stops_the_run_and_its_server(tiny_model, tmp_path):
    # Far more steps than can run before the signal: the run must end because of it, not by finishing.
    # SIGINT as a terminal's Ctrl-C delivers it: a test runner started in the background by a script inherits
    # SIGINT ignored, and so would the run.
    process = subprocess.Popen(
        train_command(tiny_model, tmp_path, "--max_steps", "1000"),
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    server_pid = None
    deadline = time.monotonic() + 300
    for line in lines_of(process, process.stderr, timeout_s=300):
        if "local environment server at" in line:
            server_pid = server_pid_in(line)
        if re.search(r"step \d+/1000 \|", line) or time.monotonic() > deadline:
            break
    assert alive(server_pid)
    process.send_signal(signal.SIGINT)
    try:
        _, rest = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()  # it did not stop: fail, leaving no run behind
        raise
    assert process.returncode != 0, rest[-3000:]
    assert not alive(server_pid)


@pytest.mark.slow
def test_a_local_server_whose_trainer_is_killed_stops_with_its_browsers():
    # The trainer's stand-in starts a local server, opens a session (launching a browser), and is killed -9.
    code = (
        "import time; from env_client import LocalEnvServer, BrowserGymEnv\n"
        "server = LocalEnvServer(max_sessions=2).__enter__()\n"
        "client = BrowserGymEnv(base_url=server.url).sync().__enter__()\n"
        "client.reset(seed=0)\n"
        "print(server.pid, flush=True); time.sleep(600)\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    server_pid = int(next(lines_of(trainer, trainer.stdout, timeout_s=120)))
    server_tree = process_tree(server_pid)
    assert any(b"chrom" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in server_tree if alive(pid))
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in server_tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [pid for pid in server_tree if alive(pid)]


def test_episodes_whose_group_agrees_are_not_run_and_the_step_moves_the_weights_as_if_they_were(
    half_right_model, env_server, tmp_path, monkeypatch
):
    """Eight groups of two one-action episodes, one a micro-batch. A group whose episodes got the same reward (about
    half of them: the model is right half the time) has no advantage and adds nothing to the gradient, so its
    micro-batches are not run forward; the step's weights are those of the same step with every micro-batch run."""
    from trl import GRPOTrainer

    forward = GRPOTrainer._compute_loss
    runs = []
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", lambda self, *a: runs.append(1) or forward(self, *a))
    one_step = ("--max_turns", "1", "--num_generations", "2", "--per_device_train_batch_size", "1")
    one_step += ("--gradient_accumulation_steps", "16", "--max_steps", "1", "--lockstep", "true")

    def step(output_dir):
        runs.clear()
        model_and_server = ("--model_name_or_path", half_right_model, "--env_url", env_server.url)
        train.main(*parse_config("configs/smoke.yaml", *model_and_server, "--output_dir", str(output_dir), *one_step))
        [logged] = [m for m in read_metrics(output_dir / METRICS_FILE) if "reward" in m]
        return logged, len(runs), AutoModelForCausalLM.from_pretrained(output_dir).state_dict()

    skipping, run_skipping, weights_skipping = step(tmp_path / "skipping")
    monkeypatch.setattr(RecipeTrainer, "_adds_no_gradient", lambda self, inputs: False)
    every, run_every, weights_every = step(tmp_path / "every")

    assert skipping["reward"] == every["reward"]  # the same episodes
    assert 0 < skipping["groups/same_reward_share"] < 1  # groups of both kinds
    assert skipping["training/skipped_share"] == skipping["groups/same_reward_share"]
    assert run_skipping == 16 * (1 - skipping["groups/same_reward_share"]) and run_every == 16
    for name, weight in weights_every.items():
        torch.testing.assert_close(weights_skipping[name], weight, rtol=0, atol=0, msg=name)


def test_a_step_whose_every_group_agrees_trains_on_nothing_and_still_logs_its_line(
    tiny_model, env_server, tmp_path, caplog, monkeypatch
):
    """The random tiny model never solves click-test: every reward is 0, every micro-batch skipped."""
    caplog.set_level(logging.INFO, logger="train")
    monkeypatch.setattr(metrics, "SAY_PLAYED_AFTER_S", 0.0)  # every step says when it has played, as a slow one does
    run_training(tiny_model, env_server.url, tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.name == "train" and " | reward " in r.getMessage()]
    assert [line.split(" | ")[0] for line in lines] == ["step 1/2", "step 2/2"]
    # A slow step says when its play is done, before its training: a real model's takes minutes either way.
    said = [m.group() for r in caplog.records if (m := re.match(r"step \d/2 played 4 episodes in ", r.getMessage()))]
    assert said == ["step 1/2 played 4 episodes in ", "step 2/2 played 4 episodes in "]
    steps = [r.getMessage() for r in caplog.records if r.name == "train" and r.getMessage().startswith("step ")]
    said_when = [m[:8] + (" played" if re.match(r"step \d/2 played", m) else " trained") for m in steps]
    assert said_when == ["step 1/2 played", "step 1/2 trained", "step 2/2 played", "step 2/2 trained"]
    assert all("entropy nan" in line and "(100% of micro-batches skipped: no advantage)" in line for line in lines)
    # The optimizer stepped on zero gradients, as it does when every micro-batch is run: its state counts both steps.
    optimizer = torch.load(tmp_path / "checkpoint-2" / "optimizer.pt", weights_only=False)
    assert {int(state["step"]) for state in optimizer["state"].values()} == {2}


def test_a_run_on_several_tasks_reports_each_to_the_tracker(tiny_model, env_server, tmp_path):
    tasks = ["click-test", "click-button"]
    run_training(
        tiny_model, env_server.url, tmp_path, "--report_to", "tensorboard", "--tasks", *tasks, "--curriculum", "true"
    )
    events = EventAccumulator(str(next(tmp_path.rglob("events.out.tfevents.*")).parent))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/reward", "train/episodes/success_rate", "train/episodes/turns", "train/loss"} <= tags
    assert [e.step for e in events.Scalars("train/episodes/success_rate")] == [1, 2]
    assert {"train/groups/same_reward_share", *(f"train/tasks/{task}/probability" for task in tasks)} <= tags
    played = {tag.split("/")[2] for tag in tags if tag.startswith("train/tasks/") and tag.endswith("/success_rate")}
    assert played and played <= set(tasks)
    for row in read_metrics(tmp_path / METRICS_FILE):
        if "reward" in row:
            shares = [row[f"tasks/{task}/probability"] for task in tasks]
            assert math.isclose(sum(shares), 1.0) and 0.0 <= row["groups/same_reward_share"] <= 1.0


def test_a_resumed_run_draws_the_tasks_the_uninterrupted_run_drew(tiny_model, env_server, tmp_path):
    """Three tasks, two groups a step: which tasks step 2 plays depends on what step 1 drew, which the checkpoint
    between them must keep (a sampler started afresh would draw step 1's tasks again)."""
    tasks = ("--tasks", "click-test", "click-button", "focus-text", "--curriculum", "true")
    run_training(tiny_model, env_server.url, tmp_path / "whole", *tasks)
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "whole" / "checkpoint-1", resumed / "checkpoint-1")
    run_training(tiny_model, env_server.url, resumed, *tasks)  # resumes from its last checkpoint

    def step_2(run):
        [row] = [row for row in read_metrics(run / METRICS_FILE) if row.get("step") == 2 and "reward" in row]
        played = {key.split("/")[1] for key in row if key.startswith("tasks/") and key.endswith("/success_rate")}
        return played, {key: value for key, value in row.items() if key.endswith("/probability")}

    played, probabilities = step_2(tmp_path / "whole")
    assert len(played) == 2
    assert step_2(resumed) == (played, probabilities)


def test_a_finished_run_rerun_as_it_was_trains_nothing_more(tiny_model, env_server, tmp_path, caplog):
    run_training(tiny_model, env_server.url, tmp_path)
    model = (tmp_path / "model.safetensors").read_bytes()
    with caplog.at_level(logging.INFO, logger="train"):
        run_training(tiny_model, env_server.url, tmp_path)  # the same command again, as after a crash
    assert "checkpoint-2 is at step 2 of max_steps 2: nothing to train" in caplog.text
    assert not (tmp_path / "checkpoint-3").exists() and (tmp_path / "model.safetensors").read_bytes() == model


def test_a_rerun_with_other_options_is_refused_naming_them_and_resumes_or_restarts_when_told(
    tiny_model, env_server, tmp_path, caplog
):
    run_training(tiny_model, env_server.url, tmp_path)
    first = (tmp_path / "checkpoint-2" / "model.safetensors").read_bytes()
    with pytest.raises(ConfigError, match=r"learning_rate: 0\.0005 -> 0\.0001; num_generations: 2 -> 4"):
        run_training(tiny_model, env_server.url, tmp_path, "--learning_rate", "1e-4", "--num_generations", "4")
    # What says how the run is kept or logged may change: more steps go on from the checkpoint.
    with caplog.at_level(logging.INFO):
        run_training(tiny_model, env_server.url, tmp_path, "--max_steps", "3", "--logging_steps", "2")
    assert "resuming from" in caplog.text and (tmp_path / "checkpoint-3").is_dir()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        run_training(tiny_model, env_server.url, tmp_path, "--learning_rate", "1e-4", "--changed_config", "resume")
    assert "with changed options: learning_rate: 0.0005 -> 0.0001" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        run_training(tiny_model, env_server.url, tmp_path, "--learning_rate", "2e-4", "--changed_config", "restart")
    assert f"moved to {tmp_path / 'earlier-1'}" in caplog.text
    assert (tmp_path / "earlier-1" / "checkpoint-2" / "model.safetensors").read_bytes() == first  # kept as it was
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]  # trained anew
    assert json.loads((tmp_path / "checkpoint-1" / "run_config.json").read_text())["learning_rate"] == 2e-4


def test_the_folder_a_run_pushes_to_the_hub_holds_its_episode_settings_and_the_recipes_model_card(
    tiny_model, env_server, tmp_path, monkeypatch
):
    # The Hub cannot be reached here: what a push would upload is the output folder as it is at the push.
    uploaded = []
    monkeypatch.setattr(RecipeTrainer, "init_hf_repo", lambda self, token=None: None)
    monkeypatch.setattr(RecipeTrainer, "_push_from_checkpoint", lambda self, checkpoint: None)

    def push_to_hub(self, **kwargs):
        self.create_model_card()  # as transformers' push does first
        uploaded.append({name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path) if "." in name})

    monkeypatch.setattr(RecipeTrainer, "push_to_hub", push_to_hub)
    run_training(tiny_model, env_server.url, tmp_path, "--push_to_hub", "true", "--hub_model_id", "you/agent")
    (folder,) = uploaded
    assert "episode_settings.json" in folder and "model.safetensors" in folder
    card = folder["README.md"].decode()
    assert f"GRPO from `{tiny_model}` on click-test" in card and "# you/agent: a web agent" in card
    assert f"It plays with {saved_with(str(tmp_path)).describe()}." in card
    assert "python run_agent.py --model you/agent --task_name click-test" in card
    assert "Not measured yet: `python evaluate.py --model you/agent --tasks click-test --episodes 50`" in card
    # Evaluated where it was saved, it says so.
    evaluate(
        EvalArguments(model=str(tmp_path), episodes=2),
        TaskArguments(),
        EpisodeArguments(),
        ServerArguments(env_url=[env_server.url]),
    )
    summary = json.loads((tmp_path / "eval-click-test" / "summary.json").read_text())
    low, high = (100 * bound for bound in summary["ci95"])
    success = f"{100 * summary['success_rate']:.1f}% ({summary['solved']}/2, {low:.1f}-{high:.1f}%)"
    row = f"| click-test | 2 | greedy | {success} | `eval-click-test` |"
    assert row in (tmp_path / "README.md").read_text()


@pytest.mark.parametrize("terminal", [True, False])
def test_a_run_shows_a_progress_bar_only_where_its_output_is_a_terminal(
    tiny_model, tokenizer, tmp_path, monkeypatch, terminal
):
    monkeypatch.setattr(train, "on_a_terminal", lambda: terminal)
    trainer, runner = built_trainer(
        tokenizer, "http://unused", "--model_name_or_path", tiny_model, "--output_dir", str(tmp_path)
    )
    runner.close()
    shown = [type(callback).__name__ for callback in trainer.callback_handler.callbacks]
    assert (
        ("TerminalProgress" in shown) == terminal and "ProgressCallback" not in shown and "PrinterCallback" not in shown
    )


def test_the_curriculum_starts_from_an_evaluation_sampled_at_the_training_temperature(
    tiny_model, tokenizer, tmp_path, caplog
):
    evaluated = tmp_path / "eval"
    evaluated.mkdir()

    def evaluation_at(temperature):  # as evaluate.py writes it: tests/test_evaluate.py reads a real one
        summary = {
            "tasks": {"click-test": {"success_rate": 1.0}, "click-button": {"success_rate": 0.25}},
            "arguments": {"temperature": temperature, "model": "the start"},
        }
        (evaluated / "summary.json").write_text(json.dumps(summary))

    tasks = ("--tasks", "click-test", "click-button", "focus-text", "--curriculum", "true")
    start = ("--curriculum_start", str(evaluated), "--model_name_or_path", tiny_model, "--output_dir", str(tmp_path))
    with pytest.raises(ConfigError, match=r"no evaluate\.py summary read in"):
        built_trainer(tokenizer, "http://unused", *tasks, *start)
    evaluation_at(0.0)
    with pytest.raises(ConfigError, match=r"evaluated greedy, and training samples at temperature 1\.0"):
        built_trainer(tokenizer, "http://unused", *tasks, *start)
    evaluation_at(1.0)
    with caplog.at_level(logging.INFO, logger="train"):
        trainer, runner = built_trainer(tokenizer, "http://unused", *tasks, *start)
    runner.close()
    assert trainer.sampler.success == {"click-test": 1.0, "click-button": 0.25, "focus-text": 0.5}
    assert (
        f"starts from the success {evaluated} measured of the start; not measured there, starting at 50%: "
        "focus-text" in caplog.text
    )
    with pytest.raises(ConfigError, match="set curriculum to true as well"):
        parse_config("configs/smoke.yaml", *start)


def test_on_the_cpu_the_lm_head_projects_the_replies_alone_to_the_same_log_probs_and_gradients(tiny_model, monkeypatch):
    """TRL's fused LM head (what GRPO's loss calls) projects every position on a CPU unless told otherwise; told to
    project only the scored ones, it gives the same log-probabilities and the same gradients."""
    from trl.kernels import chunked_logprob
    from trl.trainer import utils

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    utils.add_fused_lm_head(model)
    input_ids = torch.randint(20, model.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :7] = 0  # left padding, as a prompt shorter than the batch's longest has
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :-6] = -100  # the replies: the last 6 positions
    projected = []
    project = utils._ChunkedLogProbFunction.apply
    monkeypatch.setattr(
        utils._ChunkedLogProbFunction, "apply", lambda h, *a: projected.append(len(h)) or project(h, *a)
    )

    def scored():
        model.zero_grad()
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
        (out.log_probs * torch.linspace(0.5, 1.5, 39)).sum().backward()
        return out.log_probs.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    monkeypatch.setattr(utils, "_use_triton", chunked_logprob._use_triton)  # TRL's own choice, restored after
    every_position = scored()
    train.score_only_the_replies_on_cpu()
    replies_only = scored()

    assert projected == [3 * 39, 3 * 6]  # labels shift by one: 39 positions a row, 6 of them scored
    torch.testing.assert_close(replies_only[0], every_position[0])
    assert every_position[0].abs().sum() > 0
    for name, grad in every_position[1].items():
        torch.testing.assert_close(replies_only[1][name], grad, msg=name)
