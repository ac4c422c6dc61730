"""A GRPO step's groups drawn again until enough disagree, instances that agreed last time skipped, and a group that
all failed played again guided (browser_rl/dynamic_sampling.py): on a stand-in environment whose outcomes are the
task's, then in a real GRPO run."""

import json

import pytest

from browser_rl.dynamic_sampling import GroupDraws
from browser_rl.episode import Episode
from browser_rl.metrics import read_metrics
from browser_rl.tasks import TaskSampler
from helpers import train_here

# Each task's group outcome, whatever its seed: "mixed" groups disagree, the others agree.
TASKS = ["mixed", "solved", "failed"]


def outcome(task: str, seed: int, slot: int, guide_turns: int = 0) -> Episode:
    """A "failed" task is solved when guided for two turns or more, "hard" never; the guide plays one action each
    turn, and the policy one more after it."""
    solved = task == "solved" or (task == "mixed" and slot % 2 == 0) or (task == "failed" and guide_turns >= 2)
    actions = ["guide"] * guide_turns + ["policy"]
    if task == "one-action":  # the guide's one action solves it: the policy never acts
        solved, actions = bool(guide_turns), ["guide"] if guide_turns else ["policy"]
    return Episode(task, seed, actions=actions, done=solved, env_reward=float(solved), guide_turns=guide_turns)


class StandIn:
    """A PlayRound for the ranks' slots `mine`, every rank's outcomes its own to compute; it notes what it played."""

    def __init__(self, mine=range(10**6)):
        self.mine = mine
        self.rounds: list[dict] = []
        self.guided: list[dict] = []

    def __call__(self, slots: dict, guide_turns: dict):
        self.rounds.append(dict(slots))
        self.guided.append({slot: turns for slot, turns in guide_turns.items() if turns})
        outcomes = {slot: outcome(*instance, slot, guide_turns[slot]) for slot, instance in slots.items()}
        return {slot: o for slot, o in outcomes.items() if slot in self.mine}, outcomes


def draws(wanted: int, max_groups: int = 16, curriculum: bool = False) -> GroupDraws:
    return GroupDraws(TaskSampler(dict.fromkeys(TASKS, 1.0), curriculum, seed=0), 1000, wanted, max_groups, seed=0)


def instances(*per_group: tuple[str, int], size: int = 4) -> list:
    return [instance for instance in per_group for _ in range(size)]


def test_groups_that_agree_are_drawn_again_until_as_many_disagree_as_wanted():
    stand_in = StandIn()
    played = draws(wanted=3).play(instances(("solved", 1), ("mixed", 2), ("failed", 3), ("solved", 4)), 4, 1, stand_in)
    assert played.informative == 3 and played.in_update == 4
    kept = [played.episodes[slot] for slot in range(16)]
    groups = [kept[first : first + 4] for first in range(0, 16, 4)]
    assert sum(len({e.solved for e in group}) > 1 for group in groups) == 3
    assert all(len({(e.task_name, e.seed) for e in group}) == 1 for group in groups)  # a group is one instance
    assert groups[1][0].seed == 2  # the group that disagreed at once is kept as played
    # Every round after the first replays only groups that had not yet disagreed, and no more than are missing.
    assert all(slot not in range(4, 8) for r in stand_in.rounds[1:] for slot in r)
    assert played.groups_played == sum(len(r) for r in stand_in.rounds) // 4
    assert len(played.outcomes) == 4 * played.groups_played == len(played.groups_of_outcomes)
    assert len(played.played) == 4 * played.groups_played  # this rank's own: every episode it played


def test_a_step_plays_at_most_max_groups_and_then_trains_on_what_it_has():
    sampler = TaskSampler({"solved": 1.0}, curriculum=False)
    group_draws = GroupDraws(sampler, 1000, wanted=2, max_groups=10, seed=0)
    stand_in = StandIn()
    played = group_draws.play(instances(("solved", 1), ("solved", 2), ("solved", 3), ("solved", 4)), 4, 1, stand_in)
    assert played.groups_played == 10 and played.informative == 0
    assert [len(r) // 4 for r in stand_in.rounds] == [4, 2, 2, 2]  # each round plays the groups still missing
    assert [played.episodes[slot].seed for slot in range(0, 16, 4)] == [1, 2, 3, 4]  # the first play is kept


def test_without_wanted_groups_each_group_is_played_once_as_drawn():
    group_draws = draws(wanted=0)
    group_draws.sampler.record_group(("solved", 1), [True] * 4)
    stand_in = StandIn()
    drawn = instances(("solved", 1), ("failed", 3))
    played = group_draws.play(drawn, 4, 1, stand_in)
    assert stand_in.rounds == [dict(enumerate(drawn))] and played.skipped == 0
    assert (played.groups_played, played.informative) == (2, 0)


def test_an_instance_whose_last_group_agreed_is_skipped_once():
    group_draws = draws(wanted=1)
    group_draws.sampler.record_group(("solved", 1), [True] * 4)
    group_draws.sampler.record_group(("mixed", 2), [True, False, True, False])  # disagreed: played
    stand_in = StandIn()
    played = group_draws.play(instances(("solved", 1), ("mixed", 2)), 4, 1, stand_in)
    assert played.skipped == 1
    assert ("solved", 1) not in stand_in.rounds[0].values() and ("mixed", 2) in stand_in.rounds[0].values()
    # Skipped once: drawn again, it is played.
    stand_in = StandIn()
    group_draws.play(instances(("solved", 1), ("mixed", 2)), 4, 2, stand_in)
    assert ("solved", 1) in stand_in.rounds[0].values()


def test_ranks_draw_alike_and_each_keeps_its_own_slots_of_a_group_split_between_them():
    drawn = instances(("solved", 1), ("mixed", 2), ("failed", 3))  # 12 slots: the second group spans both ranks
    ranks = [StandIn(range(0, 6)), StandIn(range(6, 12))]
    played = [draws(wanted=3).play(list(drawn), 4, 7, rank) for rank in ranks]
    assert ranks[0].rounds == ranks[1].rounds  # the same draws, round after round
    assert sorted(played[0].episodes) == list(range(6)) and sorted(played[1].episodes) == list(range(6, 12))
    assert played[0].informative == played[1].informative == 3


def test_the_curriculum_learns_from_every_episode_played_kept_or_not():
    group_draws = draws(wanted=4, curriculum=True)
    played = group_draws.play(instances(("failed", 1), ("failed", 2), ("failed", 3), ("failed", 4)), 4, 1, StandIn())
    failed_played = sum(o.task_name == "failed" for o in played.outcomes)
    assert failed_played > 16 > sum(e.task_name == "failed" for e in played.episodes.values())
    assert group_draws.sampler.success["failed"] < 0.5 * 0.8**2  # moved by each round that played it


def test_what_agreed_is_kept_in_a_checkpoint(tmp_path):
    sampler = TaskSampler(dict.fromkeys(TASKS, 1.0), curriculum=False)
    sampler.record_group(("solved", 1), [True] * 4)
    sampler.save(tmp_path)
    resumed = TaskSampler(dict.fromkeys(TASKS, 1.0), curriculum=False)
    resumed.load(tmp_path)
    assert resumed.agreed_last_time(("solved", 1)) and not resumed.agreed_last_time(("solved", 2))


def guided_draws(turns: int | None = None, curriculum: bool = False) -> GroupDraws:
    tasks = ["failed", "mixed", "one-action"]
    sampler = TaskSampler(dict.fromkeys(tasks, 1.0), curriculum, seed=0)
    if turns is not None:
        sampler.guide_turns["failed"] = turns
    return GroupDraws(sampler, 1000, 0, 16, 0, guided_tasks=frozenset({"failed", "one-action"}), max_turns=5)


def test_a_group_that_all_failed_is_played_again_half_guided_and_kept_once_it_disagrees():
    group_draws, stand_in = guided_draws(turns=2, curriculum=True), StandIn()
    played = group_draws.play(instances(("failed", 1), ("mixed", 2)), 4, 1, stand_in)
    assert [sorted(r) for r in stand_in.rounds] == [list(range(8)), [0, 1, 2, 3]]  # the same instance again
    assert stand_in.rounds[1] == dict.fromkeys(range(4), ("failed", 1)) and stand_in.guided[1] == {0: 2, 1: 2}
    assert played.informative == 2 and [played.episodes[slot].guide_turns for slot in range(4)] == [2, 2, 0, 0]
    assert played.figures()["guided/episodes"] == 2 and played.figures()["guided/success_rate"] == 1.0
    assert group_draws.sampler.guide_turns["failed"] == 1  # all its guided episodes solved: one turn fewer
    # The curriculum learns from the episodes the policy played alone: the task failed every one of them.
    assert group_draws.sampler.success["failed"] == pytest.approx(0.5 * 0.8 * 0.8)


def test_a_task_whose_guided_episodes_all_fail_gets_one_more_guide_turn():
    group_draws, stand_in = guided_draws(), StandIn()
    played = group_draws.play(instances(("failed", 1)), 4, 1, stand_in)
    assert stand_in.guided == [{}, {0: 1, 1: 1}]  # a first guide turn: not enough for this task
    assert played.informative == 0 and [played.episodes[slot].guide_turns for slot in range(4)] == [0, 0, 0, 0]
    assert group_draws.sampler.guide_turns["failed"] == 2


def test_a_task_its_guide_finishes_in_one_action_is_not_guided_again():
    group_draws, stand_in = guided_draws(), StandIn()
    group_draws.play(instances(("one-action", 1)), 4, 1, stand_in)
    assert group_draws.sampler.guide_turns["one-action"] == 0
    stand_in = StandIn()
    group_draws.play(instances(("one-action", 2)), 4, 2, stand_in)
    assert stand_in.guided == [{}]


@pytest.mark.parametrize("wanted, beta", [(0, 0.0), (2, 0.04)])
def test_a_real_grpo_step_trains_on_the_groups_that_disagree(half_right_model, tmp_path, wanted, beta):
    """The half-right model: two groups of four one-action episodes a step; TRL's own count of the update's groups
    without an advantage (frac_reward_zero_std) must be what dynamic sampling says it kept. With the README's KL
    penalty, TRL's reference model scores the same episodes."""
    one_action = ("--max_turns", "1", "--num_generations", "4", "--per_device_train_batch_size", "8")
    log = train_here(
        half_right_model,
        tmp_path,
        *one_action,
        "--max_steps",
        "2",
        "--save_steps",
        "2",
        "--informative_groups",
        str(wanted),
        "--beta",
        str(beta),
    )
    steps = [m for m in read_metrics(tmp_path / "metrics.jsonl") if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["groups/in_update"] == 2 and 2 <= m["groups/played"] <= 8
        assert m["frac_reward_zero_std"] == pytest.approx(1 - m["groups/informative"] / 2)
        if wanted:
            # Enough disagree, or the step played all it may.
            assert m["groups/informative"] == 2 or m["groups/played"] == 8
        else:
            assert m["groups/played"] == 2
        assert ("kl" in m) == (beta > 0) and m.get("kl", 0) >= 0
        assert f"groups {m['groups/informative']:.0f}/2 disagree, {m['groups/played']:.0f} played" in log
    state = json.loads((tmp_path / "checkpoint-2" / "task_sampler.json").read_text())
    assert "agreed" in state
