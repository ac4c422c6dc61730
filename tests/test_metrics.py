"""What a run reports about itself: the step line's weakest task, and where success started and ended."""

from metrics import environment_cost, episode_metrics, success_trend, weakest_task
from rollout import Episode


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
