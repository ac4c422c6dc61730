"""Guided episodes (browser_rl/guidance.py, warm_start/guides.py): a guide plays an episode's first turns, shown to the
policy and masked out of the loss, and a GRPO run guides the groups that all failed."""

import pytest

from browser_rl.episode import Episode
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.generation import Reply, reply_of_text
from browser_rl.guidance import guided, next_guide_turns
from browser_rl.metrics import read_metrics
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import ServerPool
from browser_rl.traces import episode_trace
from helpers import segments, train_here
from warm_start.guides import guide_of_tasks


def test_the_guide_plays_the_first_turns_and_its_replies_are_shown_but_never_trained_on(env_server, tokenizer):
    runner = EpisodeRunner(ServerPool([env_server.url]), tokenizer, EpisodeSettings(max_turns=2), lockstep=True)
    guide, known = guide_of_tasks(runner.chat, ["enter-text", "no-such-task"], [])
    asked = []

    def policy(episodes: list[Episode]) -> list[Reply]:
        asked.append([(e.seed, e.turns) for e in episodes])
        return [Reply([*tokenizer.encode("noop()"), tokenizer.eos_token_id], [-1.0] * 3, True) for _ in episodes]

    try:
        plain, led = runner.run([("enter-text", 5), ("enter-text", 6)], guided(policy, guide), guide_turns=[0, 1])
    finally:
        runner.close()
    assert known == {"enter-text"}
    assert asked == [[(5, 0)], [(5, 1), (6, 1)]]  # the policy never replied to the guided turn
    assert led.actions[0].startswith("fill(") and led.actions[1] == plain.actions[0] == "noop()"
    (guide_reply_ids,) = [reply_of_text(tokenizer, led.replies[0]).ids]
    # In the token stream: the guide's reply, the page after it, then the policy's reply, the only tokens trained on.
    assert led.completion_ids[: len(guide_reply_ids)] == guide_reply_ids
    policy_segments = [ids for mask, ids in segments(led.completion_ids, led.env_mask) if mask == 1]
    assert len(policy_segments) == 1 and tokenizer.decode(policy_segments[0], skip_special_tokens=True) == "noop()"
    assert all(lp == 0.0 for lp, mask in zip(led.logprobs, led.env_mask) if mask == 0)
    assert sum(led.reply_mask()) == len(policy_segments[0])  # an SFT phase learns the policy's reply alone
    assert plain.env_mask[0] == 1 and sum(plain.env_mask) == 2 * len(policy_segments[0])
    # Its trace says whose each reply was.
    assert [step["guided"] for step in episode_trace(led, 2000, "test")["steps"]] == [True, False]


@pytest.mark.parametrize(
    "turns, guided_outcomes, expected",
    [
        (2, [(False, 3), (False, 3)], 3),  # all failed: one more
        (2, [(True, 3), (False, 3)], 2),  # some solved: as it was
        (2, [(True, 3), (True, 4)], 1),  # all solved: one fewer
        (3, [(True, 2)], 2),  # the guide finished it alone: one fewer
        (1, [(True, 1)], 0),  # finished by a one-action guide: never again
        (4, [(False, 5)], 4),  # at most max_turns - 1 (5 here): the policy acts at least once
    ],
)
def test_a_tasks_guide_turns_follow_its_guided_episodes(turns, guided_outcomes, expected):
    episodes = [
        Episode("t", 0, actions=["a"] * played, done=solved, env_reward=float(solved), guide_turns=turns)
        for solved, played in guided_outcomes
    ]
    assert next_guide_turns(turns, episodes, max_turns=5) == expected


def test_a_grpo_run_guides_the_groups_that_all_failed(tiny_model, tmp_path):
    """The tiny model cannot type a name: every enter-text group fails, and is played again with its guided half's
    name typed by the plan."""
    log = train_here(tiny_model, tmp_path, "--task_name", "enter-text", "--max_steps", "1", "--guided_episodes", "true")
    (step,) = [m for m in read_metrics(tmp_path / "metrics.jsonl") if "reward" in m]
    assert step["groups/in_update"] == 2 and step["guided/episodes"] == 2 and step["groups/played"] == 4
    assert "guided episodes for enter-text" in log and "2 guided episodes" in log
