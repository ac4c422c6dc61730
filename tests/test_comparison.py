"""compare.py: two evaluations paired by task instance, with the exact McNemar test."""

import json
import sys

import pytest

import compare
from browser_rl.command_options import EvalArguments
from browser_rl.comparison import compare as compare_evaluations
from browser_rl.comparison import report
from browser_rl.errors import UsageError
from browser_rl.evaluation import evaluate
from browser_rl.options import EpisodeArguments, ServerArguments, TaskArguments


def write_evaluation(directory, outcomes: list[tuple[str, int, bool]], **settings) -> str:
    """An evaluate.py output directory holding these (task, seed, solved) episodes, in this order of play."""
    directory.mkdir()
    lines = [json.dumps({"task_name": task, "seed": seed, "success": solved}) for task, seed, solved in outcomes]
    (directory / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    (directory / "settings.json").write_text(json.dumps({"temperature": 0.0, "model": str(directory)} | settings))
    return str(directory)


def test_episodes_pair_by_task_and_seed_whatever_order_each_evaluation_played_them(tmp_path):
    # Two tasks, the second instance repeated (BrowserGym's lists repeat some); the orders of play differ.
    before = [("a", 1, True), ("a", 2, False), ("b", 7, False), ("b", 7, True), ("a", 3, False)]
    after = [("b", 7, True), ("a", 3, True), ("a", 1, True), ("b", 7, True), ("a", 2, True), ("a", 9, True)]
    comparison = compare_evaluations(
        write_evaluation(tmp_path / "before", before), write_evaluation(tmp_path / "after", after)
    )
    a, b = comparison.tasks["a"], comparison.tasks["b"]
    assert (a.pairs, a.before, a.after, a.only_before, a.only_after) == (3, 1, 3, 0, 2)
    # b 7's first play failed before and solved after; its second solved both times.
    assert (b.pairs, b.before, b.after, b.only_before, b.only_after) == (2, 1, 2, 0, 1)
    assert comparison.overall.pairs == 5 and comparison.overall.only_after == 3
    assert comparison.unpaired == (0, 1)  # a 9 was played after only
    assert sorted((c["task_name"], c["seed"]) for c in comparison.changed) == [("a", 2), ("a", 3), ("b", 7)]
    text = report(comparison)
    assert "without a pair, left out: 0 episodes before, 1 after" in text
    assert "    a gained (2): 2, 3\n    b gained (1): 7" in text


@pytest.mark.parametrize(
    "gained, lost, p",
    [
        (9, 1, 0.021484375),  # two-sided exact binomial: 2 * (1 + 10) / 2**10
        (5, 5, 1.0),
        (0, 0, 1.0),  # nothing changed
        (6, 0, 0.03125),  # 2 / 2**6
    ],
)
def test_the_p_value_is_the_exact_two_sided_binomial_test_of_the_pairs_that_changed(tmp_path, gained, lost, p):
    agreeing = [("t", seed, seed % 2 == 0) for seed in range(20)]  # the same on both sides: they do not count
    changed = range(100, 100 + gained + lost)
    before = agreeing + [("t", seed, seed >= 100 + gained) for seed in changed]
    after = agreeing + [("t", seed, seed < 100 + gained) for seed in changed]
    comparison = compare_evaluations(
        write_evaluation(tmp_path / "before", before), write_evaluation(tmp_path / "after", after)
    )
    assert (comparison.overall.only_after, comparison.overall.only_before) == (gained, lost)
    assert comparison.overall.p_value == pytest.approx(p)


def test_settings_played_otherwise_are_named_and_evaluations_without_common_instances_refused(tmp_path):
    before = write_evaluation(tmp_path / "before", [("t", 1, True)], temperature=0.0, max_turns=3)
    after = write_evaluation(tmp_path / "after", [("t", 1, True)], temperature=1.0, max_turns=3)
    assert "played otherwise: temperature: 0.0 -> 1.0" in report(compare_evaluations(before, after))
    older = write_evaluation(tmp_path / "older", [("t", 1, True)], temperature=1.0)  # before max_turns was recorded
    assert "played otherwise" not in report(compare_evaluations(after, older))
    elsewhere = write_evaluation(tmp_path / "elsewhere", [("t", 2, True)])
    with pytest.raises(UsageError, match=r"no task instance \(task and seed\) in common"):
        compare_evaluations(before, elsewhere)


def run_compare(monkeypatch, *arguments: str) -> None:
    monkeypatch.setattr(sys, "argv", ["compare.py", *arguments])
    compare.run_command("compare.py", compare.main)


def test_compare_py_on_two_real_evaluations_prints_the_pairs_and_writes_them(
    tiny_model, env_server, tmp_path, monkeypatch, capsys
):
    directories = []
    for temperature in (0.0, 1.0):
        output_dir = tmp_path / f"eval-{temperature}"
        args = EvalArguments(model=tiny_model, episodes=3, temperature=temperature, output_dir=str(output_dir))
        tasks = TaskArguments(tasks=["click-test", "click-button"])
        evaluate(args, tasks, EpisodeArguments(max_turns=1), ServerArguments(env_url=[env_server.url]))
        directories.append(str(output_dir))
    run_compare(
        monkeypatch, "--before", directories[0], "--after", directories[1], "--output", str(tmp_path / "c.json")
    )
    printed = capsys.readouterr().out
    assert "click-test" in printed and "click-button" in printed and "all paired episodes" in printed
    assert "played otherwise: temperature: 0.0 -> 1.0" in printed
    written = json.loads((tmp_path / "c.json").read_text())
    assert written["pairs"] == 6 and set(written["tasks"]) == {"click-test", "click-button"}
    assert 0.0 <= written["p_value"] <= 1.0

    with pytest.raises(SystemExit) as exit_status:
        run_compare(monkeypatch, "--before", str(tmp_path), "--after", directories[1])
    assert exit_status.value.code == 2
    assert (
        capsys.readouterr().err.strip()
        == f"compare.py: {tmp_path}: no episodes.jsonl (an evaluate.py output directory holds one)"
    )
