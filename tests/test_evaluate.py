"""evaluate.py against a real server: full models and LoRA adapters, its records, traces and interval, and
BrowserGym's own benchmark: its tasks and seeds, played, resumed, and replayed where the environment failed."""

import base64
import collections
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter

import pytest
from PIL import Image

import evaluate as evaluate_py
import train
from browser_rl import evaluation
from browser_rl.command_line import parse_command_line
from browser_rl.command_options import EvalArguments
from browser_rl.episode import Episode
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.errors import ConfigError
from browser_rl.evaluation import (
    batches_keeping_tasks,
    evaluate,
    instances_to_play,
    protocol_differences,
    still_to_play,
)
from browser_rl.evaluation_report import CHART_FILE, measured_success, report, wilson_interval
from browser_rl.model_card import write_model_card
from browser_rl.options import EpisodeArguments, ServerArguments, TaskArguments
from browser_rl.traces import traced_in_evaluation
from helpers import ROOT, parse_config, within
from web_env.models import miniwob_name


@pytest.mark.parametrize(
    "successes, n, low, high",
    [(0, 50, 0.0, 0.0714), (50, 50, 0.9286, 1.0), (25, 50, 0.3664, 0.6336), (9, 10, 0.5958, 0.9821)],
)
def test_wilson_interval_matches_the_textbook_values(successes, n, low, high):
    assert wilson_interval(successes, n) == pytest.approx((low, high), abs=1e-4)


def test_evaluate_a_full_model_writes_episodes_summary_and_the_traces_asked_for(
    tiny_model, env_server, tmp_path, monkeypatch, caplog
):
    args = EvalArguments(
        model=tiny_model, episodes=5, batch_size=3, temperature=1.0, output_dir=str(tmp_path), traces="2"
    )
    monkeypatch.setattr(evaluation, "PROGRESS_EVERY_S", 0.0)  # a line at every generation
    with caplog.at_level(logging.INFO, logger="evaluate"):
        summary = evaluate(
            args, TaskArguments(), EpisodeArguments(max_turns=2), ServerArguments(env_url=env_server.url)
        )
    progress = [r.getMessage() for r in caplog.records if "replying to" in r.getMessage()]
    line = r"(0/5 episodes; in the batch of 3|3/5 episodes; in the batch of 2), replying to [123] at turn (1|2|1-2) of"
    assert progress and all(re.fullmatch(line + " at most 2", message) for message in progress), progress
    assert {message[:3] for message in progress} == {"0/5", "3/5"}
    batches = [r.getMessage() for r in caplog.records if "solved;" in r.getMessage()]
    assert re.fullmatch(r"3/5 episodes, \d solved; \d+s elapsed, about \d+s left", batches[0]), batches
    assert re.fullmatch(r"5/5 episodes, \d solved; \d+s elapsed", batches[1]), batches
    assert any("at turn 2" in message or "-2" in message for message in progress)
    records = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert sorted(r["seed"] for r in records) == list(range(1_000_000, 1_000_005))  # held out from training seeds
    assert all(len(r["replies"]) == len(r["actions"]) == r["turns"] for r in records)
    assert summary["episodes"] == 5 and summary["solved"] == sum(r["success"] for r in records)
    assert summary["unparsed_share"] == 1.0  # the random tiny model writes no action
    assert summary["ci95"] == pytest.approx(list(wilson_interval(summary["solved"], 5)))
    assert json.loads((tmp_path / "summary.json").read_text())["episodes"] == 5
    # What a curriculum can start from (train.py --curriculum_start): each task's rate, the temperature, the model.
    rate = summary["solved"] / 5
    assert measured_success(str(tmp_path)) == ({"click-test": rate}, 1.0, tiny_model)
    traces = sorted((tmp_path / "traces/click-test").glob("*.json"))
    assert [path.name for path in traces] == [f"episode-{i:05d}-seed-{records[i]['seed']}.json" for i in (0, 1)]
    for path, record in zip(traces, records, strict=False):
        trace = json.loads(path.read_text())
        assert [step["reply"] for step in trace["steps"]] == record["replies"]
        assert all(step["action"] is None and step["no_action"] for step in trace["steps"])
        for image in [step["image"] for step in trace["steps"]] + [trace["end"]["image"]]:
            assert Image.open(io.BytesIO(base64.b64decode(image))).size == (332, 214)
    assert (tmp_path / "viewer.html").read_text().count('"task": "click-test"') == 2


@pytest.mark.parametrize(
    ("which", "solved", "kept_already", "kept"),
    [
        ("all", True, 9, True),
        ("failures", False, 9, True),
        ("failures", True, 0, False),
        ("2", True, 1, True),
        ("2", False, 2, False),
    ],
)
def test_traces_keeps_all_episodes_the_failures_or_the_first_n_of_each_task(which, solved, kept_already, kept):
    assert traced_in_evaluation(which, solved, kept_already) is kept


def test_progress_within_a_batch_is_said_at_most_every_progress_every_s(monkeypatch, caplog):
    episodes = [Episode("click-test", 0, actions=[None]), Episode("click-test", 1, actions=[None, None])]
    policy = evaluation.reporting_progress(lambda batch: ["reply"] * len(batch), 7, 20, 4, 10)
    with caplog.at_level(logging.INFO, logger="evaluate"):
        assert policy(episodes) == ["reply", "reply"]
        monkeypatch.setattr(evaluation, "PROGRESS_EVERY_S", 0.0)
        policy(episodes)
    assert caplog.messages == ["7/20 episodes; in the batch of 4, replying to 2 at turn 2-3 of at most 10"]


def test_traces_takes_all_failures_or_a_number():
    with pytest.raises(ValueError, match="traces: expected all, failures or a number"):
        EvalArguments(model="m", traces="some")


@pytest.mark.slow
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


def test_evaluate_a_task_list_prints_a_table_per_task_and_draws_it(tiny_model, env_server, tmp_path, monkeypatch):
    # A commit made while the episodes play (an hour, for a real model on a CPU) is not the code that played them.
    checkouts = iter(["the commit the run started at", "a commit made during the run"])
    monkeypatch.setattr(evaluation, "provenance", lambda: {"commit": next(checkouts), "packages": {}})
    args = EvalArguments(model=tiny_model, episodes=3, batch_size=6, output_dir=str(tmp_path))
    tasks = TaskArguments(tasks=["click-test", "click-button"])
    summary = evaluate(args, tasks, EpisodeArguments(max_turns=1), ServerArguments(env_url=env_server.url))
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
    assert summary["commit"] == "the commit the run started at"


def test_more_episodes_go_on_from_those_recorded_and_fewer_are_refused(tiny_model, env_server, tmp_path):
    model = tmp_path / "model"  # a trained policy, with its card: an evaluation beside it writes the card again
    shutil.copytree(tiny_model, model)
    EpisodeSettings(max_turns=1).save(model)
    write_model_card(model, EpisodeSettings(max_turns=1), base_model=tiny_model, method="GRPO", tasks=["click-test"])

    def evaluate_episodes(n: int) -> list[str]:
        args = EvalArguments(model=str(model), episodes=n, batch_size=2, output_dir=str(model / "eval"))
        evaluate(args, TaskArguments(), EpisodeArguments(), ServerArguments(env_url=[env_server.url]))
        return (model / "eval" / "episodes.jsonl").read_text().splitlines()

    first = evaluate_episodes(2)
    assert "`eval` |" in (model / "README.md").read_text()  # the card was written again, with this evaluation
    more = evaluate_episodes(3)
    assert more[:2] == first  # kept, not played again
    assert [json.loads(line)["seed"] for line in more] == [1_000_000, 1_000_001, 1_000_002]
    with pytest.raises(ConfigError, match=r"other settings \(episodes\)"):
        evaluate_episodes(2)


def test_a_resumed_evaluation_plays_every_repeat_of_an_instance_it_has_recorded_fewer_times():
    # BrowserGym's benchmark draws some (task, seed) twice: each is an episode of its own, recorded once per repeat.
    instances, _ = instances_to_play(EvalArguments(model="m", benchmark="miniwob"), TaskArguments())
    repeats = [instance for instance, count in Counter(instances).items() for _ in range(count - 1)]
    assert len(instances) == 625 and len(repeats) == 35
    once_each = [{"task_name": task, "seed": seed} for task, seed in dict.fromkeys(instances)]
    assert sorted(still_to_play(instances, once_each)) == sorted(repeats)
    assert still_to_play(instances, once_each + [{"task_name": t, "seed": s} for t, s in repeats]) == []


def on_server(env_server) -> tuple:
    """The task, episode and server arguments of an evaluation of the default task on the shared server."""
    return TaskArguments(), EpisodeArguments(), ServerArguments(env_url=[env_server.url])


def browsergym_episodes(benchmark) -> list[tuple[str, int, int]]:
    return [(miniwob_name(a.task_name), a.task_seed, a.max_steps) for a in benchmark.env_args_list]


@pytest.mark.parametrize(
    "name, split", [("miniwob", None), ("miniwob", "train"), ("miniwob", "test"), ("miniwob_tiny_test", None)]
)
def test_the_protocol_plays_browsergym_s_own_benchmark_tasks_seeds_and_step_limit(name, split):
    from browsergym.experiments.benchmark import DEFAULT_BENCHMARKS

    benchmark = DEFAULT_BENCHMARKS[name]()
    benchmark = benchmark.subset_from_split(split) if split else benchmark
    instances, max_steps = instances_to_play(EvalArguments(model="m", benchmark=name, split=split), TaskArguments())
    assert [(task, seed, max_steps) for task, seed in instances] == browsergym_episodes(benchmark)
    if (name, split) == ("miniwob", None):
        assert len(instances) == 625 and len({task for task, _ in instances}) == 125 and max_steps == 10


@pytest.mark.parametrize("tasks, per_task, batch_size", [(125, 5, 16), (1, 50, 16), (2, 3, 6), (3, 2, 8)])
def test_batches_play_every_episode_once_and_keep_each_task_in_its_lane(tasks, per_task, batch_size):
    instances = [(f"task-{t}", seed) for t in range(tasks) for seed in range(per_task)]
    batches = batches_keeping_tasks(instances, batch_size)
    assert sorted(i for batch in batches for i in batch) == sorted(instances)
    assert all(0 < len(batch) <= batch_size for batch in batches)
    assert len(batches) == -(-len(instances) // batch_size)  # no batch left part empty that need not be
    # A task's episodes follow one another in the batches they are in: a session keeps its page's task.
    for t in range(tasks):
        used = [b for b, batch in enumerate(batches) if any(task == f"task-{t}" for task, _ in batch)]
        assert used == list(range(used[0], used[-1] + 1))


def test_the_wait_before_observing_is_a_difference_unless_it_is_browsergym_s():
    def waits(settings: EpisodeSettings) -> list[str]:
        return [difference for difference in protocol_differences(settings) if "before observing" in difference]

    assert waits(EpisodeSettings(settle_ms=500)) == []
    assert waits(EpisodeSettings())[0].startswith("a wait of 0 ms before observing")
    assert waits(EpisodeSettings(settle_ms=100))[0].startswith("a wait of 100 ms before observing")


def test_the_protocol_end_to_end_resumes_after_a_crash_and_refuses_another_evaluation_s_directory(
    tiny_model, env_server, tmp_path
):
    args = dict(model=tiny_model, benchmark="miniwob_tiny_test", batch_size=2, output_dir=str(tmp_path))
    summary = evaluate(EvalArguments(**args), *on_server(env_server))
    episodes = tmp_path / "episodes.jsonl"
    records = [json.loads(line) for line in episodes.read_text().splitlines()]
    from browsergym.experiments.benchmark import DEFAULT_BENCHMARKS

    expected = browsergym_episodes(DEFAULT_BENCHMARKS["miniwob_tiny_test"]())
    assert collections.Counter((r["task_name"], r["seed"]) for r in records) == collections.Counter(
        (task, seed) for task, seed, _ in expected
    )
    assert all(r["turns"] == 5 for r in records)  # the random tiny model never solves one: BrowserGym's 5 steps
    assert summary["arguments"]["max_turns"] == 5 and summary["seeds"] == [[t, s] for t, s, _ in expected]
    assert set(summary["splits"]) == {"train"} and summary["splits"]["train"]["episodes"] == 4
    assert summary["commit"] and summary["packages"]["browsergym-experiments"]
    assert any("bid actions only" in difference for difference in summary["protocol_differences"])
    text = report(summary)
    assert "BrowserGym's miniwob_tiny_test: 4 episodes of 5 steps" in text and "train split" in text
    # Both scorings: the recipe's, and BrowserGym's, which pays some pages' partial credit (docs/reward_audit.md).
    assert all("browsergym_success" in r and "raw_reward" in r for r in records)
    assert summary["browsergym_solved"] == sum(r["browsergym_success"] for r in records)
    assert "as BrowserGym scores it" in text

    # A crash after two episodes, the third cut off mid-line: the rerun plays the two missing ones, no more.
    lines = episodes.read_text().splitlines(keepends=True)
    episodes.write_text("".join(lines[:2]) + lines[2][:20])
    resumed = evaluate(EvalArguments(**args), *on_server(env_server))
    again = episodes.read_text().splitlines(keepends=True)
    assert again[:2] == lines[:2] and len(again) == 4 and resumed["episodes"] == 4
    assert sorted(again) == sorted(lines)  # greedy: the replayed episodes are the same episodes
    with pytest.raises(ConfigError, match=r"holds an evaluation with other settings \(temperature\)"):
        evaluate(EvalArguments(**args | {"temperature": 1.0}), *on_server(env_server))
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    evaluate(
        EvalArguments(**args | {"model": str(model), "output_dir": str(tmp_path / "eval")}),
        *on_server(env_server),
    )
    (model / "config.json").touch()  # trained further in place: another model
    with pytest.raises(ConfigError, match=r"other settings \(model_files\)"):
        evaluate(
            EvalArguments(**args | {"model": str(model), "output_dir": str(tmp_path / "eval")}),
            *on_server(env_server),
        )


class KillsTheServerOnCue(logging.Handler):
    """Kills the local environment server whose start the log announced, at the first record that says `cue`."""

    def __init__(self, cue: str):
        super().__init__()
        self.cue, self.server_pid, self.killed = cue, None, False

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if match := re.search(r"local environment server at \S+ \(pid (\d+)\)", message):
            self.server_pid = int(match.group(1))
        if not self.killed and self.cue in message:
            os.killpg(self.server_pid, signal.SIGKILL)
            self.killed = True


@pytest.mark.slow
def test_an_episode_the_environment_failed_is_played_again_and_never_scored(tiny_model, tmp_path, caplog):
    # evaluate.py's own arguments, played in this process: what fails is its server, and a process of its own would
    # add only its imports.
    command_line = ["--model", tiny_model, "--benchmark", "miniwob_tiny_test", "--batch_size", "2"]
    command_line += ["--env_servers", "1", "--env_timeout_s", "10", "--output_dir", str(tmp_path)]
    args = parse_command_line(evaluate_py.OPTIONS, command_line, from_file=evaluate_py.OPTIONS[1:])
    killer = KillsTheServerOnCue("2/4 episodes")  # the second batch is starting
    logging.getLogger().addHandler(killer)
    try:
        with caplog.at_level(logging.INFO):
            summary = within(300, lambda: evaluate(*args))
    finally:
        logging.getLogger().removeHandler(killer)
    assert killer.killed
    assert "environment failure 1 of at most 3" in caplog.text
    records = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["turns"] == 5 and not r["last_error"].startswith("Connection") for r in records)
    assert "all episodes" in report(summary)


@pytest.mark.parametrize(
    "arguments, error",
    [
        (dict(benchmark="webarena"), "benchmark: 'webarena' is not one of miniwob, miniwob_tiny_test"),
        (dict(split="test"), "split: 'test': --split takes train or test, with --benchmark"),
        (dict(benchmark="miniwob", split="valid"), "split: 'valid': --split takes train or test, with --benchmark"),
        (dict(batch_size=0), "batch_size must be positive, got 0"),
    ],
)
def test_a_mistaken_evaluation_says_what_is_wrong_before_loading_anything(arguments, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        EvalArguments(model="m", **arguments)


def test_the_protocol_takes_no_task_list_of_its_own():
    with pytest.raises(ConfigError, match="leave --tasks out"):
        evaluate(
            EvalArguments(model="m", benchmark="miniwob"),
            TaskArguments(tasks=["click-test"]),
            EpisodeArguments(),
            ServerArguments(),
        )
