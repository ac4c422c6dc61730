"""What a run reports about itself: the step line's weakest task, where success started and ended, the environment's
cost, the share of training skipped, and success per BrowserGym split."""

import logging
from types import SimpleNamespace

from browser_rl import metrics
from browser_rl.episode import Episode
from browser_rl.metrics import (
    StepPrinter,
    breakdown,
    environment_cost,
    episode_metrics,
    skipped_training,
    success_trend,
    weakest_task,
)
from browser_rl.progress import time_left
from browser_rl.tasks import PRESETS


def test_the_time_left_is_the_pace_so_far_times_what_is_left():
    assert time_left(310, 1, 5) == "5m 10s elapsed, about 20m 40s left"
    assert time_left(42, 2, 3) == "42s elapsed, about 21s left"
    assert time_left(4000, 1, 3) == "1h 06m elapsed, about 2h 13m left"
    assert time_left(5, 0, 3) == "5s elapsed"  # no pace yet
    assert time_left(5, 3, 3) == "5s elapsed"


def test_the_step_line_ends_with_the_runs_time_and_the_time_left_at_a_resumed_runs_own_pace(monkeypatch, caplog):
    now = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: now[0])
    printer, state = StepPrinter(), SimpleNamespace(global_step=4, max_steps=10, is_world_process_zero=True)
    printer.on_train_begin(None, state, None)  # resumed at step 4
    now[0], state.global_step = 1120.0, 6  # two steps in two minutes
    with caplog.at_level(logging.INFO, logger="train"):
        printer.on_log(None, state, None, logs={"reward": 0.5, "time/generation_s": 1.0})
    assert caplog.messages[0].startswith("step 6/10 | ")
    assert caplog.messages[0].endswith(" | 2m 00s elapsed, about 4m 00s left")


def test_the_step_line_names_the_weakest_task_when_there_are_several():
    assert weakest_task({"tasks/click-test/success_rate": 0.75, "tasks/login-user/success_rate": 0.25}) == (
        " (weakest login-user 25%)"
    )
    assert weakest_task({"tasks/click-test/success_rate": 0.75}) == ""


def test_the_end_of_a_run_says_where_success_started_and_ended():
    rows = {step: {"episodes/success_rate": rate} for step, rate in enumerate([0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9], 1)}
    assert success_trend(rows) == "success 20% over the first 3 step(s), 80% over the last 3"
    assert (
        success_trend({1: {"episodes/success_rate": 0.5}})
        == "success 50% over the first 1 step(s), 50% over the last 1"
    )


def test_the_step_line_says_what_the_environment_spent_and_how_many_resets_restarted_in_the_page():
    episodes = [
        Episode("click-test", seed, restarted_in_page=restarted)
        for seed, restarted in enumerate([True, True, True, False])
    ]
    logs = episode_metrics(episodes + [Episode("click-test", 9)])  # a server that does not say counts for neither
    assert logs["environment/restarted_share"] == 0.75
    assert environment_cost(logs) == " | environment 75% restarted in the page"
    logs["environment/cpu_s_per_episode"] = 0.0912
    assert environment_cost(logs) == " | environment 0.091 CPU-s/episode, 75% restarted in the page"
    assert environment_cost({}) == ""


def test_the_step_line_says_what_share_of_its_training_was_skipped_for_want_of_an_advantage():
    assert skipped_training({"training/skipped_share": 0.75}) == " (75% of micro-batches skipped: no advantage)"
    assert skipped_training({"training/skipped_share": 0.0}) == ""
    assert skipped_training({}) == ""  # an SFT phase's step, or several ranks


def test_a_step_of_several_tasks_reports_success_on_each_of_browsergym_s_splits():
    solved = dict(done=True, env_reward=1.0)
    episodes = [Episode("click-option", 0, **solved), Episode("click-option", 1), Episode("click-button", 2, **solved)]
    logs = episode_metrics(episodes)  # click-option is in BrowserGym's train split, click-button in its test split
    assert logs["splits/train/success_rate"] == 0.5 and logs["splits/test/success_rate"] == 1.0
    assert not any(name.startswith("splits/") for name in episode_metrics(episodes[:2]))  # one task: its own rate


def test_the_learning_curve_draws_a_line_per_task_for_a_few_and_per_split_for_many():
    few = {1: {"tasks/click-test/success_rate": 1.0, "tasks/click-button/success_rate": 0.0}}
    assert breakdown(few) == [
        ("click-button", "tasks/click-button/success_rate"),
        ("click-test", "tasks/click-test/success_rate"),
    ]
    many = {1: {f"tasks/{task}/success_rate": 0.5 for task in PRESETS["all"][:62]}}
    many[1] |= {"splits/test/success_rate": 0.4, "splits/train/success_rate": 0.6}
    assert breakdown(many) == [("test split", "splits/test/success_rate"), ("train split", "splits/train/success_rate")]
    assert breakdown({1: {"tasks/click-test/success_rate": 1.0}}) == []


def test_a_steps_success_is_the_policys_own_not_its_guided_episodes():
    solved = dict(done=True, env_reward=1.0)
    guided = [Episode("login-user", seed, guide_turns=2, **solved) for seed in (0, 1)]
    alone = [Episode("login-user", 2), Episode("login-user", 3, **solved), Episode("click-button", 4)]
    logs = episode_metrics(guided + alone)
    assert logs["episodes/success_rate"] == 1 / 3 and logs["tasks/login-user/success_rate"] == 0.5
    assert logs["splits/train/success_rate"] == 0.5 and logs["episodes/count"] == 5  # login-user: train split
