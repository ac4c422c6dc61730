"""What several samples of each seed say about a policy (evaluate.py --samples): how much on-policy RL can move it.

GRPO learns only from a group whose episodes disagree, so only from seeds the policy solves sometimes: pass@1 (the
mean success) can rise towards pass@k (a seed solved at least once in k samples), and the seeds never solved need
another source of success (guided episodes). The share of groups of n episodes that would disagree, estimated
without bias from each seed's k samples, says which group size pays.
"""

from math import comb

from browser_rl.metrics import grouped

GROUP_SIZES = (2, 4, 8)


def disagreeing(solved: int, samples: int, group: int) -> float:
    """The chance that `group` episodes drawn without replacement from a seed's `samples`, `solved` of them solved,
    hold both a solved and an unsolved one."""
    return 1 - (comb(solved, group) + comb(samples - solved, group)) / comb(samples, group)


def seed_statistics(records: list[dict], samples: int) -> dict:
    """pass@1, pass@k, the shares of seeds never, sometimes and always solved, and of groups that would disagree, over
    evaluation records (task_name, seed, success) holding `samples` episodes of each seed."""
    per_seed = grouped(records, lambda r: (r["task_name"], r["seed"])).values()
    solved = [sum(r["success"] for r in of_seed) for of_seed in per_seed]
    seeds = len(solved)
    return {
        "seeds": seeds,
        "pass@1": sum(solved) / (seeds * samples),
        f"pass@{samples}": sum(c > 0 for c in solved) / seeds,
        "never": sum(c == 0 for c in solved) / seeds,
        "sometimes": sum(0 < c < samples for c in solved) / seeds,
        "always": sum(c == samples for c in solved) / seeds,
        "groups_disagreeing": {
            str(g): sum(disagreeing(c, samples, g) for c in solved) / seeds for g in GROUP_SIZES if g <= samples
        },
    }
