"""Two evaluations of the same episodes compared pair by pair: what compare.py prints and writes.

Each episode of one evaluation is paired with the episode of the other that played the same task instance (task and
seed; an instance a list repeats pairs by its order of play). Two success rates measured on the same instances differ
by chance far less than two measured on different ones, and only the pairs that changed say which way: the exact
McNemar test (statsmodels) asks whether those went one way more often than chance would send them. Per task and in
all; the episodes that changed are listed.
"""

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from statsmodels.stats.contingency_tables import mcnemar

from browser_rl.errors import UsageError
from browser_rl.metrics import grouped

EPISODES_FILE = "episodes.jsonl"
SETTINGS_FILE = "settings.json"
# Settings two evaluations of one comparison may differ in without saying so: which model, and how it was run.
NOT_COMPARED = {"model", "model_files", "output_dir", "batch_size", "traces", "lockstep", "env_url", "env_servers"}
NOT_COMPARED |= {"env_timeout_s", "max_env_failures", "override_episode_settings", "episodes"}


@dataclass
class PairedCount:
    """Pairs of episodes: how many, solved by each side, solved by one side only."""

    pairs: int = 0
    before: int = 0
    after: int = 0
    only_before: int = 0
    only_after: int = 0

    def add(self, before: bool, after: bool) -> None:
        self.pairs += 1
        self.before += before
        self.after += after
        self.only_before += before and not after
        self.only_after += after and not before

    @property
    def p_value(self) -> float:
        """Exact McNemar: the two-sided binomial test of the changed pairs against one half."""
        table = [[0, self.only_before], [self.only_after, 0]]  # the agreeing pairs do not enter the exact test
        return float(mcnemar(table, exact=True).pvalue)

    def as_dict(self) -> dict:
        return {**vars(self), "p_value": self.p_value}


@dataclass
class Comparison:
    before: str
    after: str
    overall: PairedCount = field(default_factory=PairedCount)
    tasks: dict[str, PairedCount] = field(default_factory=dict)
    changed: list[dict] = field(default_factory=list)  # each pair that changed: task, seed, solved before, after
    unpaired: tuple[int, int] = (0, 0)  # episodes of each side without a pair
    differing_settings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "before": self.before,
            "after": self.after,
            **self.overall.as_dict(),
            "tasks": {task: count.as_dict() for task, count in self.tasks.items()},
            "changed": self.changed,
            "unpaired": list(self.unpaired),
            "differing_settings": self.differing_settings,
        }


def read_evaluation(directory: str) -> tuple[list[dict], dict]:
    """An evaluation's episodes, in the order it played them, and its settings (evaluate.py's output directory)."""
    episodes_file = Path(directory, EPISODES_FILE)
    if not episodes_file.exists():
        raise UsageError(f"{directory}: no {EPISODES_FILE} (an evaluate.py output directory holds one)")
    records = [json.loads(line) for line in episodes_file.read_text().splitlines() if line.strip()]
    settings_file = Path(directory, SETTINGS_FILE)
    return records, json.loads(settings_file.read_text()) if settings_file.exists() else {}


def keyed_by_instance(records: list[dict]) -> dict[tuple[str, int, int], bool]:
    """{(task, seed, k): solved} of each episode, k counting the earlier episodes of the same instance."""
    seen: Counter = Counter()
    keyed = {}
    for record in records:
        instance = (record["task_name"], record["seed"])
        keyed[(*instance, seen[instance])] = record["success"]
        seen[instance] += 1
    return keyed


def differing_settings(before: dict, after: dict) -> list[str]:
    """The settings (decoding, episode settings, tasks) in which the two evaluations differ; a setting only one of
    them records (an option added in between) says nothing of the other."""
    keys = (before.keys() & after.keys()) - NOT_COMPARED
    return sorted(f"{k}: {before[k]!r} -> {after[k]!r}" for k in keys if before[k] != after[k])


def compare(before_dir: str, after_dir: str) -> Comparison:
    """The pairs of two evaluations (the episodes of the same instances), counted per task and in all."""
    (before_records, before_settings), (after_records, after_settings) = map(read_evaluation, (before_dir, after_dir))
    before, after = keyed_by_instance(before_records), keyed_by_instance(after_records)
    paired = [key for key in before if key in after]
    if not paired:
        raise UsageError(f"{before_dir} and {after_dir} played no task instance (task and seed) in common")
    comparison = Comparison(before_dir, after_dir, unpaired=(len(before) - len(paired), len(after) - len(paired)))
    comparison.differing_settings = differing_settings(before_settings, after_settings)
    for task, keys in grouped(paired, lambda key: key[0]).items():
        comparison.tasks[task] = PairedCount()
        for key in keys:
            comparison.tasks[task].add(before[key], after[key])
            comparison.overall.add(before[key], after[key])
            if before[key] != after[key]:
                comparison.changed.append(
                    {"task_name": task, "seed": key[1], "before": before[key], "after": after[key]}
                )
    return comparison


def rate(solved: int, pairs: int) -> str:
    return f"{solved:>4}/{pairs:<4} {100 * solved / pairs:5.1f}%"


def report(comparison: Comparison) -> str:
    """The comparison as compare.py prints it: a row per task and one for all, then the episodes that changed."""
    header = f"  {'task':<26} {'before':>15} {'after':>15} {'gained':>6} {'lost':>5} {'p (exact McNemar)':>18}"
    rows = [f"before: {comparison.before}", f"after:  {comparison.after}", header]
    for name, count in [*comparison.tasks.items(), ("all paired episodes", comparison.overall)]:
        rows.append(
            f"  {name:<26} {rate(count.before, count.pairs):>15} {rate(count.after, count.pairs):>15}"
            f" {count.only_after:>6} {count.only_before:>5} {count.p_value:>18.4g}"
        )
    unpaired_before, unpaired_after = comparison.unpaired
    if unpaired_before or unpaired_after:
        rows.append(f"  without a pair, left out: {unpaired_before} episodes before, {unpaired_after} after")
    for setting in comparison.differing_settings:
        rows.append(f"  played otherwise: {setting}")
    if comparison.changed:
        rows.append("  episodes that changed, by seed:")
    for task, changes in grouped(comparison.changed, lambda change: change["task_name"]).items():
        for outcome, after in (("gained", True), ("lost", False)):
            if seeds := sorted(change["seed"] for change in changes if change["after"] == after):
                rows.append(f"    {task} {outcome} ({len(seeds)}): {', '.join(map(str, seeds))}")
    return "\n".join(rows)
