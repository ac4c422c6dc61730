"""The reward: 1.0 for a solved episode, by the one definition of solved (rewards.solved), else 0.0; and the step's
figures handed to TRL's metric log."""

from rewards import solved, task_success
from web_env.scoring import CLOSE_ENOUGH, episode_reward


def scored(tasks, done, reward, raw) -> list[float]:
    return task_success([None] * len(tasks), env_task=tasks, env_done=done, env_reward=reward, env_raw_reward=raw)


def test_a_solved_episode_scores_one():
    assert scored(["click-test"], [True], [1.0], [1.0]) == [1.0]


def test_failed_truncated_and_unparsed_episodes_score_zero():
    tasks = ["click-test"] * 4  # failed, out of turns, never parsed (never stepped), done at zero
    assert scored(tasks, [True, False, False, True], [0.0, 0.0, 0.0, 0.0], [-1.0, 0.0, None, 0.0]) == [0.0] * 4


def test_a_positive_reward_before_the_episode_ends_does_not_count():
    assert scored(["click-test"], [False], [1.0], [1.0]) == [0.0]


def test_partial_credit_scores_zero_where_browsergym_pays_it():
    # Most checkboxes right (the page's 0.6), the right person's wrong phone entry (0.4): BrowserGym's reward is 1.
    assert scored(["click-checkboxes", "phone-book"], [True, True], [1.0, 1.0], [0.6, 0.4]) == [0.0, 0.0]
    assert scored(["phone-book"], [True], [1.0], [0.7 + 0.3]) == [1.0]  # a sum of fractions just below 1.0


def test_a_continuous_page_counts_close_enough_and_no_closer():
    assert CLOSE_ENOUGH["circle-center"] == 0.9
    assert solved("circle-center", True, 1.0, 0.93) and not solved("circle-center", True, 1.0, 0.85)
    assert not solved("click-checkboxes", True, 1.0, 0.93)  # exact pages want their full reward


def test_a_server_that_does_not_report_the_raw_reward_leaves_browsergym_s_scoring():
    assert scored(["click-test", "click-test"], [True, True], [1.0, 0.0], [None, None]) == [1.0, 0.0]


def test_the_step_s_figures_reach_trl_s_metric_log():
    logged = {}
    figures = {"episodes/success_rate": 0.5, "tasks/click-test/success_rate": 0.5}
    task_success(
        [None, None],
        env_task=["click-test"] * 2,
        env_done=[True, True],
        env_reward=[1.0, 0.0],
        env_raw_reward=[1.0, -1.0],
        step_figures=[figures, figures],  # TRL hands each completion the rollout's one value
        log_metric=lambda name, value: logged.setdefault(name, value),
    )
    assert logged == figures


def test_the_server_s_reward_is_one_only_for_the_page_paying_in_full_at_the_end():
    assert episode_reward("click-checkboxes", done=True, raw_reward=1.0) == 1.0
    assert episode_reward("click-checkboxes", done=True, raw_reward=0.6) == 0.0  # BrowserGym pays it
    assert episode_reward("click-test", done=False, raw_reward=1.0) == 0.0
    assert episode_reward("click-test", done=True, raw_reward=-1.0) == 0.0
    assert episode_reward("circle-center", done=True, raw_reward=0.93) == 1.0
