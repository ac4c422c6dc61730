"""The guides of guided GRPO episodes (browser_rl.guidance): for each task, its scripted expert (warm_start.experts,
and a task module's own expert.py), else its scripted plan (warm_start.plans)."""

from browser_rl.episode import Episode
from browser_rl.prompts import ChatTurns
from browser_rl.rollout import Policy
from warm_start.experts import expert_policy, known_experts
from warm_start.plans import PLANS, Plan, following_plans


def guide_of_tasks(chat: ChatTurns, tasks: list[str], task_modules: list[str]) -> tuple[Policy, frozenset[str]]:
    """A policy that plays each episode as its task's expert or plan would, and the tasks of `tasks` it knows."""
    experts = known_experts(task_modules)
    by_expert, by_plan = expert_policy(chat, experts), following_plans(chat.tokenizer, right_or_wait)

    def play(episodes: list[Episode]) -> list:
        return [(by_expert if e.task_name in experts else by_plan)([e])[0] for e in episodes]

    return play, frozenset(task for task in tasks if task in experts or task in PLANS)


def right_or_wait(task_plan: Plan, step: int) -> str:
    """The plan's action at `step`; past its end (a page that did not end the episode), noop()."""
    return task_plan.right[step] if step < len(task_plan.right) else "noop()"
