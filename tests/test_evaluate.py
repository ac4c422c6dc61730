"""evaluate.py against a real server: full models and LoRA adapters, its records, screenshots and interval."""

import json
import subprocess
import sys

import pytest
from PIL import Image

import train
from arguments import EnvArguments
from evaluate import CHART_FILE, EvalArguments, evaluate, report, wilson_interval
from helpers import ROOT, parse_config


@pytest.mark.parametrize(
    "successes, n, low, high",
    [(0, 50, 0.0, 0.0714), (50, 50, 0.9286, 1.0), (25, 50, 0.3664, 0.6336), (9, 10, 0.5958, 0.9821)],
)
def test_wilson_interval_matches_the_textbook_values(successes, n, low, high):
    assert wilson_interval(successes, n) == pytest.approx((low, high), abs=1e-4)


def test_evaluate_a_full_model_writes_episodes_summary_and_screenshots(tiny_model, env_server, tmp_path):
    args = EvalArguments(
        model=tiny_model, episodes=5, batch_size=3, temperature=1.0, output_dir=str(tmp_path), screenshots=True
    )
    summary = evaluate(args, EnvArguments(max_turns=2, env_url=env_server.url))
    records = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in records] == list(range(1_000_000, 1_000_005))  # held out from training seeds
    assert all(len(r["replies"]) == len(r["actions"]) == r["turns"] for r in records)
    assert summary["episodes"] == 5 and summary["solved"] == sum(r["success"] for r in records)
    assert summary["unparsed_share"] == 1.0  # the random tiny model writes no action
    assert summary["ci95"] == pytest.approx(list(wilson_interval(summary["solved"], 5)))
    assert json.loads((tmp_path / "summary.json").read_text())["episodes"] == 5
    for i in range(5):
        for which in ("first", "last"):
            image = Image.open(tmp_path / f"episode-{i:04d}-{which}.png")
            assert image.mode == "RGB" and image.width > 100 and image.height > 100


def test_evaluate_a_lora_adapter_directory_from_the_command_line(tiny_model, env_server, tmp_path):
    adapter = tmp_path / "adapter"
    train.main(
        *parse_config(
            "configs/smoke.yaml",
            "--model_name_or_path",
            tiny_model,
            "--env_url",
            env_server.url,
            "--use_peft",
            "--output_dir",
            str(adapter),
            "--max_steps",
            "1",
            "--num_generations",
            "2",
            "--per_device_train_batch_size",
            "2",
        )
    )
    assert (adapter / "adapter_config.json").exists()
    result = subprocess.run(
        [
            sys.executable,
            "evaluate.py",
            "--model",
            str(adapter),
            "--episodes",
            "4",
            "--max_turns",
            "1",
            "--env_url",
            env_server.url,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{adapter} on click-test (4 episodes, greedy)" in result.stdout
    assert "success rate  0.0% (0/4), 95% CI 0.0-49.0%" in result.stdout
    assert "replies without a valid action  100.0%" in result.stdout
    assert len((adapter / "eval-click-test" / "episodes.jsonl").read_text().splitlines()) == 4


def test_evaluate_a_task_list_prints_a_table_per_task_and_draws_it(tiny_model, env_server, tmp_path):
    args = EvalArguments(model=tiny_model, episodes=3, batch_size=6, output_dir=str(tmp_path))
    summary = evaluate(args, EnvArguments(max_turns=1, env_url=env_server.url, tasks=["click-test", "click-button"]))
    records = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert sorted((r["task_name"], r["seed"]) for r in records) == sorted(
        (task, seed) for task in ("click-test", "click-button") for seed in range(1_000_000, 1_000_003)
    )  # the same held-out seeds for every task
    assert list(summary["tasks"]) == ["click-test", "click-button"]
    assert all(t["episodes"] == 3 for t in summary["tasks"].values())
    assert summary["mean_success_rate"] == sum(t["success_rate"] for t in summary["tasks"].values()) / 2
    table = report(summary)
    assert f"{tiny_model} on 2 tasks (3 episodes each, greedy):" in table
    assert "  click-button                 0.0%    0.0-56.2%      -     100.0%" in table
    assert "  mean over tasks              0.0%" in table
    assert Image.open(tmp_path / CHART_FILE).width > 300
