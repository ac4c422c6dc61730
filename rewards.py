"""The reward: 1.0 when an episode ends with its task solved, else 0.0, scored once per episode; and the one definition
of solved, which the training reward, the curriculum, per-task figures, evaluation and the demonstrations all take.

Solved is the page paying its full reward (web_env.scoring, which the environment server's own reward takes too), not
BrowserGym's float(raw > 0), which pays some pages' partial credit for a wrong ending (docs/reward_audit.md).
"""

from web_env.scoring import paid_in_full


def solved(task: str, done: bool, reward: float, raw_reward: float | None) -> bool:
    """Whether an episode ended with its task solved: done, and the page's raw reward at the task's threshold (its
    full reward, or close enough: web_env.scoring). A server that does not report the raw reward (OpenEnv's public
    BrowserGym one) leaves BrowserGym's own scoring of `reward`, and the figures then count partial credit as it does.

    Failing the task, running out of turns, and never writing a parseable action are all unsolved."""
    if not done:
        return False
    if raw_reward is None:
        return reward > 0
    return paid_in_full(task, raw_reward)


def browsergym_solved(done: bool, browsergym_reward: float) -> bool:
    """BrowserGym's own scoring (its reward, float(raw > 0)), which published figures report: for comparison."""
    return done and browsergym_reward > 0


def task_success(
    completions: list,
    env_task: list[str],
    env_done: list[bool],
    env_reward: list[float],
    env_raw_reward: list[float | None],
    step_figures=None,
    log_metric=None,
    **kwargs,
) -> list[float]:
    """TRL's reward function: 1.0 per solved episode, else 0.0. The env_* lists come from the rollout, one entry per
    completion.

    TRL gives a reward function `log_metric` for the figures it measures, averaged over the logging interval and
    logged with TRL's own (the step line, metrics.jsonl, trackers); its rollout function has no such hook, so the
    step's figures, which the rollout measured (`step_figures`, the same for every completion), are logged here."""
    for name, value in (step_figures[0] if step_figures else {}).items():
        log_metric(name, value)
    scored = zip(env_task, env_done, env_reward, env_raw_reward, strict=True)
    return [float(solved(task, done, reward, raw)) for task, done, reward, raw in scored]
