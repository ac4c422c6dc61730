"""Several samples of each seed (evaluate.py --samples, bench/headroom.py): pass@k, and the groups that would
disagree."""

import json
import subprocess
import sys
from math import comb

import pytest

from browser_rl.command_line import parse_command_line
from browser_rl.command_options import EvalArguments
from browser_rl.errors import ConfigError
from browser_rl.evaluation import batches_of_samples, evaluate
from browser_rl.evaluation_report import report
from browser_rl.headroom import disagreeing, seed_statistics
from browser_rl.options import EpisodeArguments, ServerArguments, TaskArguments
from helpers import ROOT


@pytest.mark.parametrize(
    "solved, samples, group, chance",
    [
        (0, 8, 4, 0.0),
        (8, 8, 4, 0.0),
        (4, 8, 4, 1 - 2 / comb(8, 4)),
        (1, 8, 2, 1 - comb(7, 2) / comb(8, 2)),  # one solved among 8: a pair holds it 1 time in 4
        (1, 8, 8, 1.0),
    ],
)
def test_a_group_disagrees_as_often_as_drawing_it_from_the_seeds_samples_would(solved, samples, group, chance):
    assert disagreeing(solved, samples, group) == pytest.approx(chance)


def test_seeds_are_never_sometimes_or_always_solved_and_pass_at_k_counts_those_solved_once():
    outcomes = {1: [0, 0, 0, 0], 2: [1, 0, 0, 0], 3: [1, 1, 0, 1], 4: [1, 1, 1, 1]}
    records = [{"task_name": "t", "seed": seed, "success": bool(s)} for seed, of in outcomes.items() for s in of]
    statistics = seed_statistics(records, 4)
    assert statistics["seeds"] == 4
    assert statistics["pass@1"] == pytest.approx(8 / 16) and statistics["pass@4"] == pytest.approx(3 / 4)
    assert (statistics["never"], statistics["sometimes"], statistics["always"]) == (0.25, 0.5, 0.25)
    assert statistics["groups_disagreeing"]["4"] == pytest.approx(0.5)  # the two seeds solved sometimes
    assert statistics["groups_disagreeing"]["2"] == pytest.approx((0.5 + 0.5) / 4)


def test_a_seeds_samples_are_played_in_one_batch():
    instances = [(task, seed) for task in ("a", "b") for seed in range(3) for _ in range(4)]
    batches = batches_of_samples(instances, 8, 4)
    assert sorted(i for batch in batches for i in batch) == sorted(instances)
    for batch in batches:
        assert len(batch) <= 8 and all(batch.count(instance) == 4 for instance in batch)


def test_evaluate_samples_each_seed_and_reports_pass_at_k(tiny_model, env_server, tmp_path):
    args = EvalArguments(model=tiny_model, episodes=3, samples=2, temperature=1.0, output_dir=str(tmp_path))
    summary = evaluate(args, TaskArguments(), EpisodeArguments(max_turns=1), ServerArguments(env_url=[env_server.url]))
    records = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert sorted(r["seed"] for r in records) == [1_000_000, 1_000_000, 1_000_001, 1_000_001, 1_000_002, 1_000_002]
    assert summary["headroom"]["all"]["seeds"] == 3 and "pass@2" in summary["headroom"]["click-test"]
    assert "2 samples of each of 3 seeds: pass@1" in report(summary)
    with pytest.raises(ConfigError, match="samples: 2 greedy episodes of one seed are one episode"):
        parse_command_line([EvalArguments], ["--model", tiny_model, "--samples", "2"])


@pytest.mark.slow
def test_the_headroom_bench_plays_both_seed_sets_and_writes_its_table(tiny_model, tmp_path):
    command = [sys.executable, "bench/headroom.py", "--model", tiny_model, "--tasks", "click-test", "--seeds", "2"]
    command += ["--samples", "2", "--temperatures", "1.0", "--output_dir", str(tmp_path)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = (tmp_path / "headroom.md").read_text().splitlines()
    assert rows[0].startswith("| seeds | temperature | task | pass@1 | pass@2 | never | sometimes | always |")
    assert [row.split(" | ")[:3] for row in rows[2:]] == [
        ["| training (2)", "1.0", "click-test"],
        ["| training (2)", "1.0", "all"],
        ["| held-out (2)", "1.0", "click-test"],
        ["| held-out (2)", "1.0", "all"],
    ]
    assert (tmp_path / "training-t1.0" / "episodes.jsonl").exists()
