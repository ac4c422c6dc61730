"""When an episode is solved: the one definition that the server's reward and the recipe's figures (rewards.py) share.

A MiniWoB page ends an episode with a raw reward of its own, from -1 to 1, and BrowserGym scores float(raw > 0). Some
pages pay a wrong ending part of their reward (most of the checkboxes right, the right person's wrong phone entry, a
colour far from the asked one, a wrong card), so BrowserGym's scoring counts those wrong endings as successes. Here an
episode is solved when the page paid its full reward, as MiniWoB++'s binary reward counts it; where a page scores
closeness on a continuous scale and its full reward wants a point or a colour exact (a click on a circle's exact
centre), 0.9 of it is close enough. docs/reward_audit.md lists every page that pays a wrong ending, what the ending
is, and why each is scored as it is; tests/test_reward_audit.py plays them. A task of your own is solved when its
`validate` returns its full reward, 1.0.
"""

FULL_REWARD = 1.0
TOLERANCE = 1e-9  # a page's sums of fractions (1/3 + 1/3 + 1/3, 0.7 + 0.3) land a rounding error below 1.0
# Pages that score on a continuous scale how close a point or a colour came, whose full reward wants it exact, and
# for which MiniWoB++ says to threshold the reward (right-angle scores as its siblings do): within a tenth of the page's
# own scale of error counts as done.
CLOSE_ENOUGH = dict.fromkeys(
    ["bisect-angle", "circle-center", "find-midpoint", "right-angle", "use-colorwheel", "use-colorwheel-2"], 0.9
)


def paid_in_full(task: str, raw_reward: float) -> bool:
    """Whether a page's raw reward is its task's full reward (or CLOSE_ENOUGH's share of it)."""
    return raw_reward >= CLOSE_ENOUGH.get(task, FULL_REWARD) - TOLERANCE


def episode_reward(task: str, done: bool, raw_reward: float) -> float:
    """The server's reward for a step: 1.0 when it ended the episode with the page paying in full, else 0.0."""
    return float(done and paid_in_full(task, raw_reward))
