"""The reward: sparse task completion, scored once per episode."""


def solved(done: bool, env_reward: float) -> bool:
    """The one definition of a solved episode: it ended with BrowserGym's terminal reward above 0.

    Failing the task, running out of turns, and never writing a parseable action are all unsolved.
    """
    return done and env_reward > 0


def task_success(
    completions: list, env_done: list[bool], env_reward: list[float], step_figures=None, log_metric=None, **kwargs
) -> list[float]:
    """TRL's reward function: 1.0 per solved episode, else 0.0. `env_done` and `env_reward` come from the rollout, one
    entry per completion.

    TRL gives a reward function `log_metric` for the figures it measures, averaged over the logging interval and
    logged with TRL's own (the step line, metrics.jsonl, trackers); its rollout function has no such hook, so the
    step's figures, which the rollout measured (`step_figures`, the same for every completion), are logged here."""
    for name, value in (step_figures[0] if step_figures else {}).items():
        log_metric(name, value)
    return [float(solved(done, reward)) for done, reward in zip(env_done, env_reward)]
