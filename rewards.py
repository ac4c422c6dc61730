"""The reward: 1.0 when an episode ends with its task solved, else 0.0, scored once per episode; and the one definition
of solved, which the training reward, the curriculum, per-task figures, evaluation and the demonstrations all take.

A MiniWoB page ends an episode with a raw reward of its own, from -1 to 1, and BrowserGym scores float(raw > 0). Some
pages pay a wrong ending part of their reward (most of the checkboxes right, the right person's wrong phone entry, a
colour far from the asked one, a wrong card), so BrowserGym's scoring counts those wrong endings as successes. Here an
episode is solved when the page paid its full reward, as MiniWoB++'s binary reward counts it; where a page scores
closeness on a continuous scale and its full reward wants a point or a colour exact (a click on a circle's exact
centre), 0.9 of it is close enough. docs/reward_audit.md lists every page that pays a wrong ending, what the ending
is, and why each is scored as it is; tests/test_reward_audit.py plays them.
"""

FULL_REWARD = 1.0
TOLERANCE = 1e-9  # a page's sums of fractions (1/3 + 1/3 + 1/3, 0.7 + 0.3) land a rounding error below 1.0
# Pages that score on a continuous scale how close a point or a colour came, whose full reward wants it exact, and
# for which MiniWoB++ says to threshold the reward (right-angle scores as its siblings do): within a tenth of the page's
# own scale of error counts as done.
CLOSE_ENOUGH = dict.fromkeys(
    ["bisect-angle", "circle-center", "find-midpoint", "right-angle", "use-colorwheel", "use-colorwheel-2"], 0.9
)


def solved(task: str, done: bool, reward: float, raw_reward: float | None) -> bool:
    """Whether an episode ended with its task solved: done, and the page's raw reward at the task's threshold (its
    full reward, or CLOSE_ENOUGH's). A server that does not report the raw reward (OpenEnv's public BrowserGym one)
    leaves BrowserGym's own scoring of `reward`, and the figures then count partial credit as it does.

    Failing the task, running out of turns, and never writing a parseable action are all unsolved."""
    if not done:
        return False
    if raw_reward is None:
        return reward > 0
    return raw_reward >= CLOSE_ENOUGH.get(task, FULL_REWARD) - TOLERANCE


def browsergym_solved(done: bool, reward: float) -> bool:
    """BrowserGym's own scoring (its reward, float(raw > 0)), which published figures report: for comparison."""
    return done and reward > 0


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
