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

from browser_rl.metrics import episodes_by_task
from browser_rl.rollout import Episode
from browser_rl.tasks import TaskInstance, TaskSampler

# A round plays the groups given (every rank's slots -> instance), and returns this rank's episodes of its own slots
# and every rank's outcomes of all of them (Episode.outcome), each by slot.
PlayRound = Callable[[dict[int, TaskInstance]], tuple[dict[int, Episode], dict[int, Episode]]]


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
        return {
            "groups/in_update": self.in_update,
            "groups/played": self.groups_played,
            "groups/informative": self.informative,
            "groups/skipped": self.skipped,
        }


def disagree(outcomes: list[Episode]) -> bool:
    return len({outcome.solved for outcome in outcomes}) > 1


class GroupDraws:
    """A step's groups (`group_size` consecutive slots each, as TRL groups a generation batch's advantages), played
    by `play_round` until `wanted` of them disagree or `max_groups` were played."""

    def __init__(self, sampler: TaskSampler, num_seeds: int, wanted: int, max_groups: int, seed: int):
        self.sampler = sampler
        self.num_seeds = num_seeds
        self.wanted = wanted
        self.max_groups = max_groups
        self.seed = seed

    def play(self, instances: list[TaskInstance], group_size: int, step: int, play_round: PlayRound) -> StepPlay:
        # The step's own stream: every rank draws alike, and a resumed run draws as the uninterrupted one did.
        draws = random.Random(f"{self.seed}-{step}")
        groups = [range(first, first + group_size) for first in range(0, len(instances), group_size)]
        instance_of_group = [instances[group[0]] for group in groups]
        result = StepPlay(in_update=len(groups))
        for index, instance in enumerate(instance_of_group):
            if self.wanted and self.sampler.agreed_last_time(instance):
                self.sampler.forget(instance)  # skipped once: drawn again later, it is played
                instance_of_group[index] = self._draw(draws)
                result.skipped += 1
        pending, informative = list(range(len(groups))), set()
        for round_number in itertools.count():
            slots = {slot: instance_of_group[g] for g in pending for slot in groups[g]}
            mine, outcomes = play_round(slots)
            result.groups_played += len(pending)
            result.played += mine.values()
            for task, of_task in episodes_by_task([outcomes[slot] for slot in sorted(outcomes)]).items():
                self.sampler.update(task, [outcome.solved for outcome in of_task])
            for g in pending:
                of_group = [outcomes[slot] for slot in groups[g]]
                self.sampler.record_group(instance_of_group[g], [outcome.solved for outcome in of_group])
                result.outcomes += of_group
                result.groups_of_outcomes += [f"{round_number}-{g}"] * len(of_group)
                if disagree(of_group) or round_number == 0:  # a first play is kept until a group that disagrees
                    result.episodes.update({slot: mine[slot] for slot in groups[g] if slot in mine})
                if disagree(of_group):
                    informative.add(g)
            missing = min(self.wanted - len(informative), self.max_groups - result.groups_played)
            pending = [g for g in range(len(groups)) if g not in informative][: max(missing, 0)]
            if not pending:
                break
            for g in pending:
                instance_of_group[g] = self._draw(draws)
        result.informative = len(informative)
        return result

    def _draw(self, draws: random.Random) -> TaskInstance:
        return self.sampler.draw(), draws.randrange(self.num_seeds)
