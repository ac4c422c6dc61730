"""The starting policies' training data: scripted episodes, turn by turn, and the mix of right and wrong replies."""

import math

import pytest

from env_client import BrowserGymEnv
from prompts import ChatTurns
from scripted_policy import Plan, plan
from warm_up import a_third_right, scripted_turns


@pytest.mark.parametrize("actions, solved_share", [(1, 1 / 3), (2, 1 / 4), (3, 8 / 27)])
def test_a_third_right_solves_a_task_about_a_third_of_the_time_however_many_actions_it_takes(actions, solved_share):
    task_plan = Plan(right=[f"right {i}" for i in range(actions)], wrong=[f"wrong {i}" for i in range(actions)])
    replies = [a_third_right(task_plan, step) for step in range(actions)]
    assert all(set(r) == {task_plan.right[step], task_plan.wrong[step]} for step, r in enumerate(replies))
    # A policy that writes each step's replies in these proportions solves the task with this probability.
    assert math.prod(r.count(task_plan.right[step]) / len(r) for step, r in enumerate(replies)) == pytest.approx(
        solved_share
    )


def test_scripted_turns_are_every_turn_of_episodes_that_follow_the_right_plan(env_server, tokenizer):
    turns = scripted_turns(env_server.url, tokenizer, "login-user", range(2))
    assert sorted(step for _, _, step in turns) == [0, 0, 1, 1, 2, 2]
    with BrowserGymEnv(base_url=env_server.url).sync() as session:
        first_pages = [session.reset(task_name="login-user", seed=seed).observation for seed in range(2)]
    first_prompts = [ChatTurns(tokenizer).first_prompt(observation) for observation in first_pages]
    plans = [plan("login-user", observation.goal, observation.axtree_txt) for observation in first_pages]
    for context, task_plan, step in turns:
        (seed,) = [seed for seed, prompt in enumerate(first_prompts) if context[: len(prompt)] == prompt]
        assert task_plan == plans[seed]
        # Each later turn's context holds the plan's right actions so far, as the policy wrote them, and no more.
        text = tokenizer.decode(context)
        assert text.count("<|im_start|>assistant") == step + 1
        assert all(f"{action}<|im_end|>" in text for action in task_plan.right[:step])
    episodes = {}
    for context, task_plan, step in turns:
        episodes.setdefault(tuple(task_plan.right), {})[step] = context
    assert len(episodes) == 2
    for contexts in episodes.values():  # each episode's contexts grow turn by turn
        assert contexts[0] == contexts[1][: len(contexts[0])] and contexts[1] == contexts[2][: len(contexts[1])]
