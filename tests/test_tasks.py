"""The task list of a config and the sampler that draws each GRPO group's task."""

import collections
import json
import re
import subprocess
import sys

import pytest

from browser_rl.episode import Episode
from browser_rl.metrics import same_reward_share
from browser_rl.tasks import CURRICULUM_FLOOR, PRESETS, TaskSampler, parse_tasks, task_instances
from helpers import ROOT
from web_env.models import MINIWOB_TASKS, miniwob_name


def test_a_task_list_takes_names_weights_and_presets():
    assert parse_tasks(["click-test"]) == {"click-test": 1.0}
    assert parse_tasks(["click-button:3", "enter-text"]) == {"click-button": 3.0, "enter-text": 1.0}
    assert parse_tasks(["page-reading:2"]) == dict.fromkeys(PRESETS["page-reading"], 2.0)
    assert set(parse_tasks(["all"])) == set(MINIWOB_TASKS) and len(PRESETS["all"]) > 100


def test_the_split_presets_are_browsergym_s_own_split_and_no_family_of_tasks_straddles_it():
    from browsergym.experiments.benchmark import DEFAULT_BENCHMARKS

    benchmark = DEFAULT_BENCHMARKS["miniwob"]()
    split = {}
    for preset, name in (("browsergym-train", "train"), ("browsergym-test", "test")):
        tasks = [miniwob_name(args.task_name) for args in benchmark.subset_from_split(name).env_args_list]
        split[name] = set(parse_tasks([preset]))
        assert split[name] == set(tasks)
    assert (len(split["train"]), len(split["test"])) == (62, 63)
    assert split["train"] | split["test"] == set(MINIWOB_TASKS) and not split["train"] & split["test"]
    metadata = benchmark.task_metadata.assign(task=benchmark.task_metadata.task_name.map(miniwob_name))
    families = {name: set(metadata[metadata.task.isin(split[name])].similarity_group) for name in split}
    assert families["train"] and families["test"] and not families["train"] & families["test"]
    assert "click-option" in split["train"] and "click-button" in split["test"]  # page-reading spans both


@pytest.mark.parametrize(
    "entries, reason",
    [
        (
            ["click-buton"],
            "'click-buton' is neither a task (MiniWoB's, or one of task_modules') nor a preset"
            " (page-reading, all, browsergym-train, browsergym-test)",
        ),
        (["click-test:x"], "weight of 'click-test:x' is not a number"),
        (["click-test:0"], "weight of 'click-test:0' must be positive"),
        (["page-reading", "login-user"], "'login-user' is named twice"),
        ([], "the list is empty"),
    ],
)
def test_a_mistake_in_the_task_list_says_what_is_wrong(entries, reason):
    with pytest.raises(ValueError, match=f"^tasks: {reason}$".replace("(", r"\(").replace(")", r"\)")):
        parse_tasks(entries)


def test_without_the_curriculum_tasks_are_drawn_by_weight_alone():
    sampler = TaskSampler({"click-test": 3.0, "enter-text": 1.0}, curriculum=False, seed=1)
    sampler.update("click-test", [True] * 8)  # success does not matter
    assert sampler.probabilities() == {"click-test": 0.75, "enter-text": 0.25}
    drawn = collections.Counter(sampler.draw() for _ in range(4000))
    assert drawn["click-test"] / 4000 == pytest.approx(0.75, abs=0.03)


def test_a_short_run_plays_every_task_its_share_give_or_take_one():
    tasks = [f"task-{i}" for i in range(20)]
    sampler = TaskSampler(dict.fromkeys(tasks, 1.0), curriculum=True, seed=1)
    groups = []
    for step in range(10):  # 4 groups of 4 episodes a step
        prompts = [f"seed {4 * step + group}" for group in range(4) for _ in range(4)]
        seed_of_prompt = {prompt: int(prompt.split()[1]) for prompt in prompts}
        groups += task_instances(prompts, prompts, seed_of_prompt, sampler)[::4]
    drawn = [task for task, _ in groups]
    assert collections.Counter(drawn) == dict.fromkeys(tasks, 2)
    assert drawn[:20] != sorted(drawn[:20])  # the seed orders a round, not the config

    weighted = TaskSampler({"click-test": 3.0, "enter-text": 1.0}, curriculum=False, seed=2)
    for n in range(1, 41):  # windows of every length from 1 to 40, each starting one draw after the last ended
        weighted.draw()
        played = collections.Counter(weighted.draw() for _ in range(n))
        assert abs(played["enter-text"] - n / 4) <= 1, (n, played)


def test_a_sampler_loaded_from_a_checkpoint_draws_on_as_the_one_that_saved_it(tmp_path):
    tasks = dict.fromkeys(["click-test", "enter-text", "login-user"], 1.0)
    running = TaskSampler(tasks, curriculum=True, seed=4)
    for _ in range(5):
        running.update(running.draw(), [True, False, False, False])
    running.save(tmp_path)
    resumed = TaskSampler(tasks, curriculum=True, seed=9)  # a seed of its own: only what was saved can agree
    resumed.load(tmp_path)
    assert resumed.probabilities() == running.probabilities()
    assert [resumed.draw() for _ in range(12)] == [running.draw() for _ in range(12)]


def test_the_curriculum_favours_tasks_whose_groups_disagree_and_starves_none():
    sampler = TaskSampler(dict.fromkeys(["mastered", "half", "hopeless"], 1.0), curriculum=True)
    assert len(set(sampler.probabilities().values())) == 1  # nothing known yet: uniform
    for _ in range(30):
        sampler.update("mastered", [True] * 8)
        sampler.update("half", [True, False] * 4)
        sampler.update("hopeless", [False] * 8)
    assert sampler.success["mastered"] > 0.99 and sampler.success["half"] == pytest.approx(0.5)
    p = sampler.probabilities()
    assert p["half"] == pytest.approx(0.25 / (0.25 + 2 * CURRICULUM_FLOOR))  # p(1-p) at its largest
    assert p["mastered"] == p["hopeless"] == pytest.approx(CURRICULUM_FLOOR / (0.25 + 2 * CURRICULUM_FLOOR))


def test_a_curriculum_started_from_measured_success_draws_the_tasks_in_doubt_from_its_first_round():
    """A short run's first round: from 50% everywhere the curriculum draws every task alike, as no curriculum does;
    from an evaluation's rates it draws the tasks its groups can disagree on."""
    tasks = dict.fromkeys(["mastered", "hopeless", "half", "unmeasured"], 1.0)
    measured = {"mastered": 1.0, "hopeless": 0.0, "half": 0.5, "elsewhere": 0.3}
    started = TaskSampler(tasks, curriculum=True, seed=1, measured=measured)
    assert started.success == {"mastered": 1.0, "hopeless": 0.0, "half": 0.5, "unmeasured": 0.5}
    drawn = collections.Counter(started.draw() for _ in range(12))
    assert drawn == {"half": 5, "unmeasured": 5, "mastered": 1, "hopeless": 1}
    uninformed = TaskSampler(tasks, curriculum=True, seed=1)
    assert collections.Counter(uninformed.draw() for _ in range(12)) == dict.fromkeys(tasks, 3)


def test_simulated_runs_count_the_groups_that_disagree_and_more_of_them_from_an_evaluation(tmp_path):
    """bench/group_signal.py, the figure behind --curriculum_start (docs/real_model.md), run as the docs run it on
    two evaluations' summaries at once: every task certain, and most tasks mastered."""

    def simulated(name: str, success: dict[str, float]) -> subprocess.Popen:
        evaluation = tmp_path / name
        evaluation.mkdir()
        summary = {"arguments": {"temperature": 1.0, "model": "a start"}, "tasks": {}}
        summary["tasks"] = {task: {"success_rate": rate} for task, rate in success.items()}
        (evaluation / "summary.json").write_text(json.dumps(summary))
        command = [sys.executable, "bench/group_signal.py", "--evaluation", str(evaluation), "--runs", "200"]
        return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)

    def mean_groups(run: subprocess.Popen) -> dict[str, float]:
        printed, _ = run.communicate()
        assert run.returncode == 0
        return {name: float(mean) for name, mean in re.findall(r"^  (\S.*?) +([\d.]+)  \(middle half", printed, re.M)}

    certain = simulated("certain", {"solved": 1.0, "never": 0.0})
    mostly_certain = simulated(
        "mostly-certain", {**dict.fromkeys([f"mastered-{i}" for i in range(7)], 1.0), "half": 0.5, "rare": 0.2}
    )
    none = mean_groups(certain)
    assert set(none) == {"by weight alone", "the curriculum from 50%", "the curriculum from the evaluation"}
    assert set(none.values()) == {0.0}
    mean = mean_groups(mostly_certain)
    assert mean["by weight alone"] == pytest.approx(40 * (1 - 0.5**4 * 2 + 1 - 0.8**4 - 0.2**4) / 9, abs=0.3)
    assert mean["by weight alone"] < mean["the curriculum from 50%"] < mean["the curriculum from the evaluation"]
    assert mean["the curriculum from the evaluation"] > 2 * mean["by weight alone"], mean


def test_the_running_success_rate_moves_a_fifth_of_the_way_per_batch():
    sampler = TaskSampler({"click-test": 1.0}, curriculum=True)
    sampler.update("click-test", [True, True, True, False])
    assert sampler.success["click-test"] == pytest.approx(0.8 * 0.5 + 0.2 * 0.75)


def test_ranks_draw_alike_so_a_group_split_between_two_plays_one_task():
    prompts = [f"seed {seed}" for seed in (4, 9, 2, 7) for _ in range(3)]
    seed_of_prompt = {f"seed {seed}": seed for seed in (4, 9, 2, 7)}
    first, second = prompts[:6], prompts[6:]  # each rank's share; seed 9's group falls on both
    ranks = [TaskSampler({"click-test": 1.0, "enter-text": 1.0}, curriculum=False, seed=3) for _ in range(2)]
    played = [task_instances(share, prompts, seed_of_prompt, ranks[i]) for i, share in enumerate((first, second))]
    tasks_of_seed = {}
    for task, seed in played[0] + played[1]:
        tasks_of_seed.setdefault(seed, set()).add(task)
    assert all(len(tasks) == 1 for tasks in tasks_of_seed.values()), tasks_of_seed
    assert set().union(*tasks_of_seed.values()) == {"click-test", "enter-text"}  # the draws differ between groups


def test_each_group_plays_one_task_instance_and_groups_that_agree_are_counted():
    sampler = TaskSampler({"click-test": 1.0, "enter-text": 1.0}, curriculum=False, seed=0)
    prompts = ["seed 4"] * 4 + ["seed 9"] * 4 + ["seed 2"] * 4
    instances = task_instances(prompts, prompts, {"seed 4": 4, "seed 9": 9, "seed 2": 2}, sampler)
    for group in range(3):
        assert len(set(instances[4 * group : 4 * group + 4])) == 1  # one (task, seed) per group
    assert [seed for _, seed in instances[::4]] == [4, 9, 2]
    assert {task for task, _ in instances} == {"click-test", "enter-text"}  # seed 0 draws both

    def episode(solved: bool) -> Episode:
        return Episode("click-test", 0, done=True, env_reward=1.0 if solved else 0.0)

    solved = [True, True, True, True, False, True, False, False, False, False, False, False]
    assert same_reward_share(prompts, [episode(s) for s in solved]) == pytest.approx(2 / 3)
