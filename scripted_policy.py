"""Scripted policies for MiniWoB tasks: the actions that solve a task instance, read off its goal and first page,
and actions of the same shape that leave it unsolved.

The tests use them to drive the environment, the benchmarks to time it, and the warm-up of a starting policy
(warm_up.py) to write its examples. The recipe itself never does: its policy learns from the reward alone.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

from generation import written
from rollout import Episode, Policy


@dataclass
class Plan:
    right: list[str]  # the actions that solve the instance, in order
    wrong: list[str]  # valid actions that do not solve it, one for each step of `right`


def bids(page: str, role: str, name: str | None = None) -> list[str]:
    """The bids of the page's elements of a role (and name), in page order."""
    name_pattern = re.escape(name) if name is not None else "[^']*"
    return re.findall(rf"\[(\w+)\] {role} '{name_pattern}'", page)


def quoted(goal: str) -> list[str]:
    return re.findall(r'"([^"]*)"', goal)


def click_test(goal: str, page: str) -> Plan:
    return Plan(right=[f"click('{bids(page, 'button', 'Click Me!')[0]}')"], wrong=["click('9999')"])


def click_button(goal: str, page: str) -> Plan:
    (target,) = quoted(goal)
    targets = bids(page, "button", target)  # any button of that label solves it
    right = targets[0]
    others = [bid for bid in re.findall(r"\[(\w+)\]", page) if bid not in targets]
    # A page may hold that button alone; hovering over it is valid and leaves the task unsolved.
    return Plan(right=[f"click('{right}')"], wrong=[f"click('{others[0]}')" if others else f"hover('{right}')"])


def enter_text(goal: str, page: str) -> Plan:
    (text,) = quoted(goal)
    box, submit = bids(page, "textbox")[0], bids(page, "button", "Submit")[0]
    return Plan(
        right=[f"fill('{box}', '{text}')", f"click('{submit}')"], wrong=[f"fill('{box}', '{text}x')", f"focus('{box}')"]
    )


def login_user(goal: str, page: str) -> Plan:
    user, password = quoted(goal)
    user_box, password_box = bids(page, "textbox")[:2]
    login = bids(page, "button", "Login")[0]
    return Plan(
        right=[f"fill('{user_box}', '{user}')", f"fill('{password_box}', '{password}')", f"click('{login}')"],
        wrong=[f"fill('{user_box}', '{password}')", f"fill('{password_box}', '{password}!')", f"focus('{login}')"],
    )


def click_tab(goal: str, page: str) -> Plan:
    (target,) = re.findall(r"Tab #\d+", goal)
    right, wrong = (
        bids(page, "tab", target)[0],
        next(b for b in bids(page, "tab") if b not in bids(page, "tab", target)),
    )
    return Plan(right=[f"click('{right}')"], wrong=[f"click('{wrong}')"])


def click_option(goal: str, page: str) -> Plan:
    (option,) = re.findall(r"Select (.*) and click Submit", goal)
    right, wrong = (
        bids(page, "radio", option)[0],
        next(b for b in bids(page, "radio") if b not in bids(page, "radio", option)),
    )
    submit = bids(page, "button", "Submit")[0]
    return Plan(right=[f"click('{right}')", f"click('{submit}')"], wrong=[f"click('{wrong}')", f"focus('{submit}')"])


def focus_text_2(goal: str, page: str) -> Plan:
    (nth,) = re.findall(r"(\d+)(?:st|nd|rd|th) input", goal)
    boxes = bids(page, "textbox")
    right = boxes[int(nth) - 1]
    return Plan(right=[f"focus('{right}')"], wrong=[f"focus('{next(b for b in boxes if b != right)}')"])


PLANS = {
    "click-test": click_test,
    "click-button": click_button,
    "click-tab": click_tab,
    "click-option": click_option,
    "focus-text-2": focus_text_2,
    "enter-text": enter_text,
    "login-user": login_user,
}


def plan(task: str, goal: str, page: str) -> Plan:
    """The scripted plan for an instance of `task`, from its goal and its first page's accessibility tree."""
    return PLANS[task](goal, page)


def plan_of(episode: Episode) -> Plan:
    """The plan of an episode's task instance, from the goal and the page it started on."""
    first = episode.first_observation
    return plan(episode.task_name, first.goal, first.axtree_txt)


def right_action(task_plan: Plan, step: int) -> str:
    return task_plan.right[step]


def following_plans(tokenizer, choose: Callable[[Plan, int], str] = right_action) -> Policy:
    """A policy that replies to each episode with `choose(its plan, the number of actions it has taken)`: by
    default the plan's right action, which solves the instance."""
    return lambda episodes: [written(tokenizer, choose(plan_of(e), e.turns)) for e in episodes]
