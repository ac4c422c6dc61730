"""Guided episodes: where a task instance is never solved, an expert plays the first turns of some of its episodes and
the policy goes on from there (BREAD's expert prefixes; prefix sampling).

A group whose episodes all failed has no advantage. Played again with half its episodes starting after the expert's
first k actions, those shown to the policy as earlier turns but masked out of the loss (`env_mask` 0, browser_rl.rollout
.add_reply), the policy's own actions from there on can succeed, and the group then disagrees. k is each task's own: it
starts at one action, grows while a task's guided episodes all fail, and shrinks once they all succeed, and when a
guided episode was finished by the expert alone (no action of the policy's to learn from).
"""

from dataclasses import replace

from browser_rl.episode import Episode
from browser_rl.rollout import Policy

FIRST_GUIDE_TURNS = 1


def guided(policy: Policy, guide: Policy) -> Policy:
    """`policy`, but for each episode's first `guide_turns` turns, which `guide` plays, its replies marked guided."""

    def play(episodes: list[Episode]) -> list:
        replies = [None] * len(episodes)
        by_guide = [i for i, episode in enumerate(episodes) if episode.turns < episode.guide_turns]
        by_policy = [i for i in range(len(episodes)) if i not in by_guide]
        for place, reply in zip(by_guide, guide([episodes[i] for i in by_guide]) if by_guide else [], strict=True):
            replies[place] = replace(reply, guided=True)
        for place, reply in zip(by_policy, policy([episodes[i] for i in by_policy]) if by_policy else [], strict=True):
            replies[place] = reply
        return replies

    return play


def finished_by_the_guide(episode: Episode) -> bool:
    return episode.done and episode.turns <= episode.guide_turns


def next_guide_turns(turns: int, guided_episodes: list[Episode], max_turns: int) -> int:
    """A task's guide turns after a group's guided episodes: one more while they all fail, one fewer once they all
    succeed or the guide finished one alone; between one and max_turns - 1 (the policy acts at least once). 0, never
    guided again, for a task whose guide finishes it in one action (nothing is left for the policy to learn)."""
    if turns == 1 and any(finished_by_the_guide(e) for e in guided_episodes):
        return 0
    if any(finished_by_the_guide(e) for e in guided_episodes) or all(e.solved for e in guided_episodes):
        turns -= 1
    elif not any(e.solved for e in guided_episodes):
        turns += 1
    return max(FIRST_GUIDE_TURNS, min(turns, max_turns - 1))
