from rewards import task_success


def test_solved_episode_scores_one():
    assert task_success([None], env_done=[True], env_reward=[1.0]) == [1.0]


def test_failed_truncated_and_unparsed_episodes_score_zero():
    rewards = task_success(
        [None] * 4,
        env_done=[True, False, False, True],  # failed, out of turns, never parsed (never stepped), done at zero
        env_reward=[0.0, 0.0, 0.0, -1.0],
    )
    assert rewards == [0.0, 0.0, 0.0, 0.0]


def test_a_positive_reward_before_the_episode_ends_does_not_count():
    assert task_success([None], env_done=[False], env_reward=[1.0]) == [0.0]
