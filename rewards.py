"""The reward: sparse task completion, scored once per episode."""


def task_success(completions: list, env_done: list[bool], env_reward: list[float], **kwargs) -> list[float]:
    """1.0 for an episode that ended with the task solved (BrowserGym's terminal reward > 0), else 0.0.

    Failing the task, running out of turns, and never writing a parseable action all score 0.0.
    `env_done` and `env_reward` come from the rollout, one entry per completion.
    """
    return [1.0 if done and reward > 0 else 0.0 for done, reward in zip(env_done, env_reward)]
