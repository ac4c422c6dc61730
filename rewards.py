"""The reward: sparse task completion, scored once per episode."""


def solved(done: bool, env_reward: float) -> bool:
    """The one definition of a solved episode: it ended with BrowserGym's terminal reward above 0.

    Failing the task, running out of turns, and never writing a parseable action are all unsolved.
    """
    return done and env_reward > 0


def task_success(completions: list, env_done: list[bool], env_reward: list[float], **kwargs) -> list[float]:
    """TRL's reward function: 1.0 per solved episode, else 0.0. `env_done` and `env_reward` come from the
    rollout, one entry per completion."""
    return [float(solved(done, reward)) for done, reward in zip(env_done, env_reward)]
