"""Starting policies: the weak starts' mix of right and wrong episodes, and warm_start.warm_up's fine-tune of any
demonstrations file, full or LoRA, into a model train.py starts from."""

import math
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from datasets import Dataset
from huggingface_hub import RepoUrl
from transformers import AutoModelForCausalLM

from browser_rl import agent, episode_settings
from browser_rl.command_line import parse_command_line
from browser_rl.command_options import FIRST_DEMONSTRATION_SEED, WarmUpArguments
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.errors import ConfigError, DemonstrationsError
from browser_rl.generation import load_policy, model_generate
from browser_rl.options import EpisodeArguments, ModelOptions
from browser_rl.prompts import ChatTurns
from browser_rl.servers import ServerPool
from browser_rl.sft_phases import reply_loss
from helpers import ROOT, parse_config
from warm_start import record, warm_up
from warm_start.demonstrations import load, save, sft_dataset
from warm_start.plans import Plan, a_third_right, plan
from warm_start.record import record_mix
from warm_start.weak_starts import weak_start_config
from web_env.models import BrowserGymObservation

FIRST_SEED = FIRST_DEMONSTRATION_SEED


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
    seeds, settings = range(FIRST_SEED, FIRST_SEED + 2), EpisodeSettings(max_turns=3)
    recorded = record_mix(ServerPool([env_server.url]), tokenizer, "login-user", seeds, a_third_right, settings)
    assert len(recorded) == 3 * len(seeds)  # two rights and a wrong in three at each of three steps
    assert {demonstration.settings for demonstration in recorded} == {settings}
    for demonstration in recorded:
        task_plan = plan("login-user", demonstration.goal, demonstration.turns[0].page)
        written = [turn.reply for turn in demonstration.turns]
        assert written in (task_plan.right, task_plan.wrong)
        assert demonstration.solved == (written == task_plan.right)
    assert sorted(d.seed for d in recorded) == sorted([*seeds] * 3)


def test_the_warm_ups_batches_take_the_loss_on_the_reply_tokens_only(tiny_model, tmp_path):
    """What TRL's SFTTrainer is handed by the warm-up (its config, make smoke's, and its dataset's completion_mask)
    makes batches whose labels are the reply tokens and nothing else: no page, no padding."""
    _, _, config, model_args = parse_command_line(
        warm_up.OPTIONS,
        ["--config", str(ROOT / "configs/warm_up/smoke.yaml"), "--model_name_or_path", tiny_model]
        + ["--output_dir", str(tmp_path), "--per_device_train_batch_size", "2"],
    )
    # Two episodes as sft_dataset renders them: page, reply, page, reply; and page, reply.
    rows = {
        "input_ids": [[1, 20, 21, 22, 30, 31, 7, 23, 24, 32, 7], [1, 25, 26, 33, 7]],
        "completion_mask": [[0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1], [0, 0, 0, 1, 1]],
    }
    trainer = warm_up.sft_trainer(model_args, config, Dataset.from_dict(rows))
    batch = next(iter(trainer.get_train_dataloader()))
    expected = []
    for ids in batch["input_ids"].tolist():
        (row,) = [r for r, row_ids in enumerate(rows["input_ids"]) if ids[: len(row_ids)] == row_ids]
        replies = [t if m else -100 for t, m in zip(rows["input_ids"][row], rows["completion_mask"][row], strict=True)]
        expected.append(replies + [-100] * (len(ids) - len(replies)))
    assert batch["labels"].tolist() == expected


@pytest.mark.slow
def test_warm_up_fine_tunes_a_demonstrations_file_with_lora_into_a_whole_model_train_py_starts_from(
    env_server, tokenizer, tiny_model, tmp_path
):
    """The command line, LoRA merged into the model it writes; a full fine-tune through the same `fine_tune` builds
    every weak start of the tests (conftest.py) and is checked on its own in test_learning.py."""
    demonstrations, settings = tmp_path / "demos.jsonl", EpisodeSettings(max_turns=1, max_page_chars=1500)
    seeds, servers = range(FIRST_SEED, FIRST_SEED + 4), ServerPool([env_server.url])
    save(record_mix(servers, tokenizer, "click-test", seeds, a_third_right, settings), demonstrations)
    assert len(load(demonstrations)) == 4 and len(load(demonstrations, keep_failed=True)) == 12
    command = [sys.executable, "-m", "warm_start.warm_up", "--demonstrations", str(demonstrations)]
    command += ["--model_name_or_path", tiny_model, "--output_dir", str(tmp_path / "warm"), "--max_steps", "3"]
    command += ["--per_device_train_batch_size", "2", "--report_to", "none", "--save_strategy", "no"]
    command += ["--activation_checkpointing", "false", "--use_peft", "--lora_r", "4", "--learning_rate", "1e-2"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "4 demonstrations from" in run.stderr and "8 unsuccessful ones left out" in run.stderr
    assert f"starting policy: {tmp_path / 'warm'}" in run.stdout
    warm = AutoModelForCausalLM.from_pretrained(tmp_path / "warm")  # a whole model, the adapter merged in
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert not (tmp_path / "warm" / "adapter_config.json").exists()
    rows = sft_dataset(load(demonstrations), ChatTurns(tokenizer, settings.max_page_chars), max_length=10_000)
    episodes = list(zip(rows["input_ids"], rows["completion_mask"], strict=True))
    before, after = (reply_loss(model, episodes, tokenizer.pad_token_id)[0].item() for model in (base, warm))
    assert before - after > 0.5, (before, after)  # the loss on its demonstrations' replies went down
    assert episode_settings.saved_with(str(tmp_path / "warm")) == settings  # what its demonstrations were played with
    card = (tmp_path / "warm" / "README.md").read_text()
    assert f"SFT warm-up on 4 demonstrations from `{tiny_model}` on click-test" in card
    assert f"It plays with {settings.describe()}." in card


def test_the_warm_up_pushes_its_model_folder_with_settings_and_card_to_the_repository_named(tmp_path, monkeypatch):
    # The Hub cannot be reached here: the repository made and the folder uploaded are what a push would send.
    calls = []
    monkeypatch.setattr(warm_up, "create_repo", lambda repo_id, **kwargs: calls.append(repo_id) or RepoUrl(repo_id))
    monkeypatch.setattr(warm_up, "upload_folder", lambda repo_id, folder_path, **kwargs: calls.append(folder_path))
    config = warm_up.WarmUpConfig(output_dir=str(tmp_path), hub_model_id="you/warm", report_to="none")
    assert warm_up.push_folder(str(tmp_path), config) == "you/warm"
    assert calls == ["you/warm", str(tmp_path)]


def test_make_smokes_recording_command_records_the_mix_its_warm_up_reads_with_the_smoke_runs_settings():
    (line,) = [line for line in (ROOT / "Makefile").read_text().splitlines() if "-m warm_start.record" in line]
    arguments = shlex.split(line)[3:]  # after $(PY) -m warm_start.record
    args, tasks, episodes, _, _ = parse_command_line(record.OPTIONS, arguments)
    assert (tasks.task_weights(), args.replies, args.episodes) == ({"click-test": 1.0}, "one_right_of_eight", 16)
    (warm_up_args, *_) = parse_command_line(warm_up.OPTIONS, ["--config", str(ROOT / "configs/warm_up/smoke.yaml")])
    assert args.demonstrations == warm_up_args.demonstrations  # the file the warm-up then reads
    _, smoke_run, *_ = parse_config("configs/smoke.yaml")
    recorded_with = episode_settings.resolve(episodes, None, "the recording").settings
    assert episode_settings.resolve(smoke_run, recorded_with, "the smoke start").overridden == ()


def test_a_recording_of_a_task_without_an_expert_is_refused_before_any_server_starts():
    with pytest.raises(ConfigError, match="tasks: no expert for click-test"):
        record.main(["--tasks", "click-test", "--demonstrations", "x.jsonl", "--model_name_or_path", "m"])


@pytest.mark.parametrize("kind", ["directory", "gguf"])
def test_a_bad_demonstrations_file_stops_warm_up_before_a_model_is_loaded(tiny_model, tmp_path, monkeypatch, kind):
    (tmp_path / "demos.jsonl").write_text('{"version": 1}\n')
    args = WarmUpArguments(demonstrations=str(tmp_path / "demos.jsonl"))
    policy = tmp_path / "policy.gguf"  # a .gguf file is converted, minutes for a real one, only once the rows are good
    policy.write_bytes(b"not read before the demonstrations are\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    name = tiny_model if kind == "directory" else str(policy)
    config, model = weak_start_config(tmp_path, 1, 1, 1e-3), ModelOptions(model_name_or_path=name)
    with pytest.raises(DemonstrationsError, match="6 error\\(s\\)") as error:
        warm_up.main(args, EpisodeArguments(), config, model)
    assert "demos.jsonl line 1: task: Field required" in str(error.value)


def test_filtered_behaviour_cloning_records_a_models_own_episodes_with_the_settings_it_was_trained_with(
    half_right_model, env_server, tmp_path, monkeypatch
):
    fed = []  # the tokens of each forward pass of the recorder's model

    def counting(path):
        model, tokenizer = load_policy(path)
        model.register_forward_pre_hook(
            lambda _, args, kwargs: fed.append(kwargs["input_ids"].numel()), with_kwargs=True
        )
        return model, tokenizer

    monkeypatch.setattr(agent, "load_policy", counting)
    demonstrations = tmp_path / "own.jsonl"
    record.main(
        [
            *("--tasks", "click-test", "--episodes", "8", "--first_seed", "0", "--env_url", env_server.url),
            *("--sampled_by", half_right_model, "--model_name_or_path", half_right_model, "--temperature", "0"),
            *("--demonstrations", str(demonstrations)),
        ]
    )
    rows = load(demonstrations, keep_failed=True)
    assert [(row.task, row.seed) for row in rows] == [("click-test", seed) for seed in range(8)]
    assert all(row.settings == episode_settings.saved_with(half_right_model) for row in rows)
    assert all(len(row.turns) == 1 for row in rows)  # the model's one action a turn, as it was trained
    # Each reply is the model's own (greedy here, so that it can be written again): its reply to the page recorded.
    model, tokenizer = load_policy(half_right_model)
    chat = ChatTurns(tokenizer, rows[0].settings.max_page_chars)
    prompts = [
        chat.first_prompt(BrowserGymObservation(goal=row.goal, axtree_txt=row.turns[0].page, text="")) for row in rows
    ]
    for row, prompt in zip(rows, prompts):
        (reply,) = model_generate(model, tokenizer, 0, 32)([prompt])
        assert row.turns[0].reply == tokenizer.decode(reply.ids, skip_special_tokens=True)
    # Sampled as evaluate.py samples: what a batch's first prompts share (the system prompt) prefilled once, so the
    # recorder fed its model fewer tokens than the 8 prompts hold (a batched generate feeds them all, padded).
    assert 0 < sum(fed) < sum(map(len, prompts))
    assert len(load(demonstrations)) == sum(row.solved for row in rows)  # the warm-up learns its successes alone
    with pytest.raises(ConfigError, match="sampled_by and replies each say who plays the episodes"):
        record.main(
            [
                *("--tasks", "click-test", "--demonstrations", "x.jsonl", "--model_name_or_path", "m"),
                *("--sampled_by", "m", "--replies", "right_only"),
            ]
        )


def test_a_warm_up_with_validation_keeps_the_model_of_its_lowest_validation_loss(
    env_server, tokenizer, tiny_model, tmp_path, caplog, capsys
):
    demonstrations = tmp_path / "demos.jsonl"
    seeds, settings = range(FIRST_SEED, FIRST_SEED + 8), EpisodeSettings(max_turns=1)
    save(
        record_mix(ServerPool([env_server.url]), tokenizer, "click-test", seeds, a_third_right, settings),
        demonstrations,
    )
    arguments = ["--config", str(ROOT / "configs/warm_up/smoke.yaml"), "--demonstrations", str(demonstrations)]
    arguments += ["--model_name_or_path", tiny_model, "--output_dir", str(tmp_path / "warm"), "--keep_failed", "true"]
    arguments += ["--max_steps", "-1", "--learning_rate", "1e-2", "--logging_strategy", "epoch"]
    with pytest.raises(ConfigError, match="validation_share: set eval_strategy"):
        warm_up.main(*parse_command_line(warm_up.OPTIONS, [*arguments, "--validation_share", "0.25"]))
    # The early stop as README.md's page-reading warm-up runs it: its config's options.
    page_reading = yaml.safe_load((ROOT / "configs/warm_up/smollm2_page_reading_cpu.yaml").read_text())
    early_stop = ["validation_share", "num_train_epochs", "eval_strategy", "save_strategy", "load_best_model_at_end"]
    for key in [*early_stop, "save_only_model", "save_total_limit"]:
        arguments += [f"--{key}", str(page_reading[key])]
    assert [page_reading[key] for key in early_stop] == [0.25, 4, "epoch", "epoch", True]
    with caplog.at_level("INFO"):
        warm_up.main(*parse_command_line(warm_up.OPTIONS, arguments))
    assert "18 episodes" in caplog.text and "6 held out to validate on" in caplog.text  # 2 of each seed's 3 kept
    losses = [float(v) for v in re.findall(r"'eval_loss': '?([0-9.]+)", capsys.readouterr().out)]
    (kept,) = re.findall(r"kept the model of step \d+: validation loss ([0-9.]+)", caplog.text)
    assert 1 <= len(losses) <= 4 and float(kept) == pytest.approx(min(losses), abs=1e-4)
    if len(losses) < 4:  # stopped early: the loss rose after its lowest
        assert losses[-1] > min(losses)
    assert not list((tmp_path / "warm").glob("checkpoint-*")) and (tmp_path / "warm" / "model.safetensors").exists()
