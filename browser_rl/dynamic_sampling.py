"""A GRPO step's groups, drawn again until enough of them disagree (DAPO's dynamic sampling; GRESO's skipping).

A group whose episodes all got the same reward (all solved, or none) has no advantage and teaches nothing; from a
warm-up that leaves most task instances almost always or almost never solved, three groups in four were such
(docs/real_model.md), so an update learned from about one. Here a step plays its groups, then replaces each group that
agreed by a new draw (a task from the sampler, a seed from the step's own random stream) and plays those, round after
round, until `wanted` groups disagree or the step has played `max_groups` groups; the update holds the groups that
disagreed, and agreeing ones where too few did (they add nothing to the gradient, and the trainer skips them). Before
a step plays, an instance whose last group agreed is skipped once, in favour of a new draw. Agreement is on the task's
success only, never on a shaped score. Every episode played, kept or not, feeds the curriculum and the step's figures.
"""

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from browser_rl.episode import Episode
from browser_rl.guidance import FIRST_GUIDE_TURNS, next_guide_turns
from browser_rl.metrics import episodes_by_task
from browser_rl.tasks import TaskInstance, TaskSampler

# A round plays the groups given (every rank's slots -> instance, and each slot's guide turns: browser_rl.guidance), and
# returns this rank's episodes of its own slots and every rank's outcomes of all of them (Episode.outcome), by slot.
PlayRound = Callable[[dict[int, TaskInstance], dict[int, int]], tuple[dict[int, Episode], dict[int, Episode]]]


@dataclass
class StepPlay:
    """What a step played: this rank's episodes to train on (by slot), every rank's outcomes of every episode played
    (in the order played) with the group each was played in, and the groups' counts."""

    episodes: dict[int, Episode] = field(default_factory=dict)
    outcomes: list[Episode] = field(default_factory=list)
    groups_of_outcomes: list[str] = field(default_factory=list)
    played: list[Episode] = field(default_factory=list)  # this rank's own episodes, every one played
    in_update: int = 0
    groups_played: int = 0
    informative: int = 0
    skipped: int = 0

    def figures(self) -> dict[str, float]:
        guided = [outcome for outcome in self.outcomes if outcome.guide_turns]
        figures = {
            "groups/in_update": self.in_update,
            "groups/informative": self.informative,
            "groups/played": self.groups_played,
            "groups/skipped": self.skipped,
            "guided/episodes": len(guided),
        }
        if guided:
            figures["guided/success_rate"] = sum(outcome.solved for outcome in guided) / len(guided)
        return figures


def disagree(outcomes: list[Episode]) -> bool:
    return len({outcome.solved for outcome in outcomes}) > 1


def round_slots(
    pending: dict[int, int], groups: list[range], instance_of_group: list[TaskInstance]
) -> tuple[dict[int, TaskInstance], dict[int, int]]:
    """The slots of the pending groups -> their instance, and -> their guide turns: half of a guided group's."""
    slots, guide_turns = {}, {}
    for g, turns in pending.items():
        for place, slot in enumerate(groups[g]):
            slots[slot] = instance_of_group[g]
            guide_turns[slot] = turns if place < len(groups[g]) // 2 else 0
    return slots, guide_turns


class GroupDraws:
    """A step's groups (`group_size` consecutive slots each, as TRL groups a generation batch's advantages), played
    by `play_round` until `wanted` of them disagree or `max_groups` were played; with `guided_tasks`, a group of one of
    them whose episodes all failed is played again once, half its episodes guided (browser_rl.guidance)."""

    def __init__(
        self,
        sampler: TaskSampler,
        num_seeds: int,
        wanted: int,
        max_groups: int,
        seed: int,
        guided_tasks: frozenset[str] = frozenset(),
        max_turns: int = 1,
    ):
        self.sampler = sampler
        self.num_seeds = num_seeds
        self.wanted = wanted
        self.max_groups = max_groups
        self.seed = seed
        self.guided_tasks = guided_tasks
        self.max_turns = max_turns

    def play(self, instances: list[TaskInstance], group_size: int, step: int, play_round: PlayRound) -> StepPlay:
        # The step's own stream: every rank draws alike, and a resumed run draws as the uninterrupted one did.
        draws = random.Random(f"{self.seed}-{step}")
        groups = [range(first, first + group_size) for first in range(0, len(instances), group_size)]
        instance_of_group = [instances[group[0]] for group in groups]
        result = StepPlay(in_update=len(groups))
        if self.wanted:
            result.skipped = self._skip_agreed(instance_of_group, draws)
        pending = dict.fromkeys(range(len(groups)), 0)  # the groups to play next -> their guide turns
        informative, guided = set(), set()
        for round_number in itertools.count():
            mine, outcomes = play_round(*round_slots(pending, groups, instance_of_group))
            result.groups_played += len(pending)
            result.played += mine.values()
            self._learn_from([outcomes[slot] for slot in sorted(outcomes)])
            for g, turns in pending.items():
                of_group = [outcomes[slot] for slot in groups[g]]
                self._note(instance_of_group[g], of_group, turns)
                result.outcomes += of_group
                result.groups_of_outcomes += [f"{round_number}-{g}"] * len(of_group)
                if disagree(of_group) or round_number == 0:  # a first play is kept until a group that disagrees
                    result.episodes.update({slot: mine[slot] for slot in groups[g] if slot in mine})
                if disagree(of_group):
                    informative.add(g)
            to_guide = {
                g: self.sampler.guide_turns.get(instance_of_group[g][0], FIRST_GUIDE_TURNS)
                for g, turns in pending.items()
                if not turns and g not in guided and self._needs_a_guide([outcomes[slot] for slot in groups[g]])
            }
            pending = self._next_round(len(groups), informative, to_guide, result.groups_played)
            guided |= {g for g, turns in pending.items() if turns}
            for g, turns in pending.items():
                if not turns:
                    instance_of_group[g] = self._draw(draws)
            if not pending:
                break
        result.informative = len(informative)
        return result

    def _skip_agreed(self, instance_of_group: list[TaskInstance], draws: random.Random) -> int:
        """Each instance whose last group agreed, skipped once for a new draw; how many were."""
        skipped = 0
        for index, instance in enumerate(instance_of_group):
            if self.sampler.agreed_last_time(instance):
                self.sampler.forget(instance)  # skipped once: drawn again later, it is played
                instance_of_group[index] = self._draw(draws)
                skipped += 1
        return skipped

    def _learn_from(self, outcomes: list[Episode]) -> None:
        """The curriculum learns each task's success from the episodes the policy played alone."""
        for task, of_task in episodes_by_task([o for o in outcomes if not o.guide_turns]).items():
            self.sampler.update(task, [outcome.solved for outcome in of_task])

    def _note(self, instance: TaskInstance, of_group: list[Episode], turns: int) -> None:
        if turns:  # a guided replay: its guided episodes set the task's guide turns
            guided = [outcome for outcome in of_group if outcome.guide_turns]
            self.sampler.guide_turns[instance[0]] = next_guide_turns(turns, guided, self.max_turns)
        else:
            self.sampler.record_group(instance, [outcome.solved for outcome in of_group])

    def _needs_a_guide(self, of_group: list[Episode]) -> bool:
        task = of_group[0].task_name
        guidable = task in self.guided_tasks and self.sampler.guide_turns.get(task) != 0
        return guidable and not any(outcome.solved for outcome in of_group)

    def _next_round(self, groups: int, informative: set, to_guide: dict[int, int], played: int) -> dict[int, int]:
        """The groups the next round plays (-> their guide turns): those to guide, then new draws for the groups still
        missing, within max_groups."""
        budget = self.max_groups - played
        pending = dict(list(to_guide.items())[: max(budget, 0)])
        missing = min(self.wanted - len(informative) - len(pending), budget - len(pending))
        redraw = [g for g in range(groups) if g not in informative and g not in pending][: max(missing, 0)]
        return pending | dict.fromkeys(redraw, 0)

    def _draw(self, draws: random.Random) -> TaskInstance:
        return self.sampler.draw(), draws.randrange(self.num_seeds)
