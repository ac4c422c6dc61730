"""Which tasks a run plays (MiniWoB's, the workflows', a user's own), and how often: the config's task list (names,
weights, named presets), and the sampler that picks the task of each GRPO group, by weight or by a curriculum.

GRPO learns only from a group whose episodes disagree, so the curriculum weighs each task by p(1 - p) of its running
success rate p, floored so that every task stays in the mix; p starts at 50%, or at what an evaluation of the start
measured at the training temperature. The draws are spread out rather than independent, so that a short run still
plays every task: a task left out drifts untrained (docs/real_model.md has the runs behind both).
"""

import functools
import json
import random
from pathlib import Path

from web_env import task_modules
from web_env.models import MINIWOB_TASKS, miniwob_name

# One episode's draw: a task and its seed.
TaskInstance = tuple[str, int]

PRESETS = {
    # Tasks whose right action must be read from the page or the goal (ids and labels change with the seed);
    # login-user takes three actions, click-option two.
    "page-reading": ["click-button", "click-tab", "click-option", "focus-text-2", "enter-text", "login-user"],
    "all": sorted(MINIWOB_TASKS),  # every MiniWoB task BrowserGym scores
}
# BrowserGym's own split of MiniWoB (browsergym-experiments' task metadata): 62 train and 63 test tasks, split by
# families of similar tasks, so that the test tasks are unseen families, not unseen seeds of trained ones.
SPLIT_PRESETS = {"browsergym-train": "train", "browsergym-test": "test"}
PRESET_NAMES = [*PRESETS, *SPLIT_PRESETS]
STATE_FILE = "task_sampler.json"  # in each checkpoint, so that a resumed run draws on as the uninterrupted one
# p(1 - p) is at most 0.25 (at 50%); floored at 0.05, a task is drawn at least a fifth as often as that.
CURRICULUM_FLOOR = 0.05
SUCCESS_SMOOTHING = 0.8  # each new batch of a task's episodes moves its running success rate by a fifth


def known_tasks() -> tuple[str, ...]:
    """Every task a run may name: MiniWoB's, and those of the task modules loaded (TaskArguments.task_modules)."""
    return MINIWOB_TASKS + task_modules.own_tasks()


def parse_tasks(entries: list[str]) -> dict[str, float]:
    """The config's task list as {task: weight}. An entry is a task, `task:weight`, or a preset (`preset:weight`
    gives each of its tasks that weight); weights are relative, 1 by default."""
    weights: dict[str, float] = {}
    for entry in entries:
        name, _, weight_text = entry.partition(":")
        try:
            weight = float(weight_text) if weight_text else 1.0
        except ValueError:
            raise ValueError(f"tasks: weight of {entry!r} is not a number") from None
        if weight <= 0:
            raise ValueError(f"tasks: weight of {entry!r} must be positive")
        if name not in PRESET_NAMES and name not in known_tasks():
            raise ValueError(
                f"tasks: {name!r} is neither a task (MiniWoB's, or one of task_modules') nor a preset "
                f"({', '.join(PRESET_NAMES)})"
            )
        for task in preset_tasks(name) if name in PRESET_NAMES else [name]:
            if task in weights:
                raise ValueError(f"tasks: {task!r} is named twice")
            weights[task] = weight
    if not weights:
        raise ValueError("tasks: the list is empty")
    return weights


def preset_tasks(name: str) -> list[str]:
    """The tasks of a preset; the split presets come from BrowserGym's benchmark object itself."""
    if name in SPLIT_PRESETS:
        return browsergym_tasks(browsergym_benchmark("miniwob", SPLIT_PRESETS[name]))
    return PRESETS[name]


@functools.cache
def browsergym_benchmark(name: str, split: str | None = None):
    """BrowserGym's benchmark `name` (miniwob, miniwob_tiny_test) as browsergym-experiments defines it, or its
    `split` (train, test): its tasks, each task's seeds, its step limit. Imported here, on first use, because its
    metadata loads pandas."""
    from browsergym.experiments.benchmark import DEFAULT_BENCHMARKS

    benchmark = DEFAULT_BENCHMARKS[name]()
    return benchmark.subset_from_split(split) if split else benchmark


def split_of(task: str) -> str:
    """BrowserGym's split of a MiniWoB task ("train" or "test"), or "own" for a task of a task module."""
    return browsergym_split_of().get(task, "own")


@functools.cache
def browsergym_split_of() -> dict[str, str]:
    """{task: "train" or "test"}: BrowserGym's split of every MiniWoB task."""
    return {task: split for preset, split in SPLIT_PRESETS.items() for task in preset_tasks(preset)}


def browsergym_tasks(benchmark) -> list[str]:
    return sorted({miniwob_name(args.task_name) for args in benchmark.env_args_list})


def task_instances(
    prompts: list[str], all_prompts: list[str], seed_of_prompt: dict[str, int], sampler: "TaskSampler"
) -> list[TaskInstance]:
    """(task, seed) for each of this rank's prompts: a task drawn for each GRPO group (the repeats of one prompt),
    its row's seed. The draws run over every rank's prompts, in rank order, and every rank's sampler has seen the same
    episodes, so all ranks draw alike and a group split between two ranks plays one task."""
    task_of_group = {}
    for prompt in all_prompts:
        if prompt not in task_of_group:  # one draw a group, not one an episode
            task_of_group[prompt] = sampler.draw()
    return [(task_of_group[prompt], seed_of_prompt[prompt]) for prompt in prompts]


class TaskSampler:
    """Draws the task of each GRPO group: in proportion to the configured weights, or, with `curriculum`, to the
    weights times each task's p(1 - p) (with a floor), p starting at the `measured` success rate where there is one.
    `update` feeds it the episodes each batch played.

    A weighted round-robin: at each draw every task is owed its probability, and the task owed most is drawn and pays
    one draw back. Over any run of draws each task is played its share give or take one, where independent draws
    leave some tasks out by chance."""

    def __init__(
        self, weights: dict[str, float], curriculum: bool, seed: int = 0, measured: dict[str, float] | None = None
    ):
        self.weights = dict(weights)
        self.curriculum = curriculum
        # A task not measured starts at 50%: as informative as a task can be.
        self.success = {task: (measured or {}).get(task, 0.5) for task in weights}
        # What each task is owed starts at random, so that the order of the first round is the seed's, not the config's.
        start = random.Random(seed)
        self._owed = {task: start.random() for task in weights}
        self.agreed: set[TaskInstance] = set()  # the instances whose last group's episodes all got one reward
        self.guide_turns: dict[str, int] = {}  # each guided task's guide turns (browser_rl.guidance)

    def probabilities(self) -> dict[str, float]:
        weights = dict(self.weights)
        if self.curriculum:
            for task, p in self.success.items():
                weights[task] *= max(p * (1 - p), CURRICULUM_FLOOR)
        total = sum(weights.values())
        return {task: weight / total for task, weight in weights.items()}

    def draw(self) -> str:
        for task, probability in self.probabilities().items():
            self._owed[task] += probability
        task = max(self._owed, key=self._owed.get)
        self._owed[task] -= 1
        return task

    def update(self, task: str, solved: list[bool]) -> None:
        rate = sum(solved) / len(solved)
        self.success[task] = SUCCESS_SMOOTHING * self.success[task] + (1 - SUCCESS_SMOOTHING) * rate

    def record_group(self, instance: TaskInstance, solved: list[bool]) -> None:
        """What a group of `instance` ended with: whether its episodes agreed (browser_rl.dynamic_sampling)."""
        if len(set(solved)) == 1:
            self.agreed.add(instance)
        else:
            self.agreed.discard(instance)

    def agreed_last_time(self, instance: TaskInstance) -> bool:
        return instance in self.agreed

    def forget(self, instance: TaskInstance) -> None:
        self.agreed.discard(instance)

    def save(self, directory: str | Path) -> None:
        state = {"success": self.success, "owed": self._owed, "agreed": sorted(self.agreed)}
        state["guide_turns"] = self.guide_turns
        (Path(directory) / STATE_FILE).write_text(json.dumps(state))

    def load(self, directory: str | Path) -> None:
        """The state a checkpoint saved, if it saved one (checkpoints written before the sampler's state was kept
        did not: such a run draws afresh)."""
        path = Path(directory) / STATE_FILE
        if path.exists():
            saved = json.loads(path.read_text())
            self.success, self._owed = saved["success"], saved["owed"]
            self.agreed = {(task, seed) for task, seed in saved.get("agreed", [])}
            self.guide_turns = saved.get("guide_turns", {})
