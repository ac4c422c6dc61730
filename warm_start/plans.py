"""Scripted plans for MiniWoB tasks: the actions that solve a task instance, read off its goal and first page,
and actions of the same shape that leave it unsolved.

The tests use them to drive the environment, the benchmarks to time it, the weak starts (warm_start.record
--replies) to write their mixes of right and wrong episodes, and guided GRPO episodes (warm_start.guides) to play the
first turns of a task without an expert. Where a task needs reading turn by turn, its expert does (warm_start.experts).
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

from browser_rl.episode import Episode
from browser_rl.generation import reply_of_text
from browser_rl.rollout import Policy
from warm_start.page_tree import find, nodes, quoted


@dataclass
class Plan:
    right: list[str]  # the actions that solve the instance, in order
    wrong: list[str]  # valid actions that do not solve it, one for each step of `right`


def bids(page: str, role: str, name: str | None = None) -> list[str]:
    """The bids of the page's elements of a role (and name), in page order."""
    return [node.bid for node in find(page, role, name)]


def click_test_plan(goal: str, page: str) -> Plan:
    return Plan(right=[f"click('{bids(page, 'button', 'Click Me!')[0]}')"], wrong=["click('9999')"])


def click_button_plan(goal: str, page: str) -> Plan:
    (target,) = quoted(goal)
    targets = bids(page, "button", target)  # any button of that label solves it
    right = targets[0]
    others = [node.bid for node in nodes(page) if node.bid and node.bid not in targets]
    # A page may hold that button alone; hovering over it is valid and leaves the task unsolved.
    return Plan(right=[f"click('{right}')"], wrong=[f"click('{others[0]}')" if others else f"hover('{right}')"])


def enter_text_plan(goal: str, page: str) -> Plan:
    (text,) = quoted(goal)
    box, submit = bids(page, "textbox")[0], bids(page, "button", "Submit")[0]
    return Plan(
        right=[f"fill('{box}', '{text}')", f"click('{submit}')"], wrong=[f"fill('{box}', '{text}x')", f"focus('{box}')"]
    )


def login_user_plan(goal: str, page: str) -> Plan:
    user, password = quoted(goal)
    user_box, password_box = bids(page, "textbox")[:2]
    login = bids(page, "button", "Login")[0]
    return Plan(
        right=[f"fill('{user_box}', '{user}')", f"fill('{password_box}', '{password}')", f"click('{login}')"],
        wrong=[f"fill('{user_box}', '{password}')", f"fill('{password_box}', '{password}!')", f"focus('{login}')"],
    )


def click_tab_plan(goal: str, page: str) -> Plan:
    (target,) = re.findall(r"Tab #\d+", goal)
    right, wrong = (
        bids(page, "tab", target)[0],
        next(b for b in bids(page, "tab") if b not in bids(page, "tab", target)),
    )
    return Plan(right=[f"click('{right}')"], wrong=[f"click('{wrong}')"])


def click_option_plan(goal: str, page: str) -> Plan:
    (option,) = re.findall(r"Select (.*) and click Submit", goal)
    right, wrong = (
        bids(page, "radio", option)[0],
        next(b for b in bids(page, "radio") if b not in bids(page, "radio", option)),
    )
    submit = bids(page, "button", "Submit")[0]
    return Plan(right=[f"click('{right}')", f"click('{submit}')"], wrong=[f"click('{wrong}')", f"focus('{submit}')"])


def focus_text_2_plan(goal: str, page: str) -> Plan:
    (nth,) = re.findall(r"(\d+)(?:st|nd|rd|th) input", goal)
    boxes = bids(page, "textbox")
    right = boxes[int(nth) - 1]
    return Plan(right=[f"focus('{right}')"], wrong=[f"focus('{next(b for b in boxes if b != right)}')"])


PLANS = {
    "click-test": click_test_plan,
    "click-button": click_button_plan,
    "click-tab": click_tab_plan,
    "click-option": click_option_plan,
    "focus-text-2": focus_text_2_plan,
    "enter-text": enter_text_plan,
    "login-user": login_user_plan,
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


# An instance's plan and a step of it -> the replies to demonstrate there, the right one first. Mixing right replies
# with wrong ones demonstrates a policy that writes actions but picks the right one only some of the time: a weak
# start that GRPO can improve on (the smoke run's, the learning benchmark's, the tests').
ReplyMix = Callable[[Plan, int], list[str]]


def right_only(plan: Plan, step: int) -> list[str]:
    """The step's right action alone: a policy that does what the plan does, as far as it can learn it."""
    return [plan.right[step]]


def one_right_of_eight(plan: Plan, step: int) -> list[str]:
    """For a one-click task: the right reply, six valid actions that leave it unsolved, one reply with no action.
    The policy learns to write actions, and picks the right one about a quarter of the time."""
    right = plan.right[step]
    bid = right.removeprefix("click(").removesuffix(")")
    wrong = [f"hover({bid})", f"focus({bid})", f"clear({bid})", "click('12')", "click('14')", "noop()"]
    return [right, *wrong, "I will click the button."]


def a_third_right(plan: Plan, step: int) -> list[str]:
    """The step's right action and its valid wrong one, in the mix that solves a task about a third of the time
    however many actions it takes: right one time in three for one action, one in two at each of two (a
    quarter), two in three at each of three (0.30)."""
    rights, wrongs = {1: (1, 2), 2: (1, 1)}.get(len(plan.right), (2, 1))
    return [plan.right[step]] * rights + [plan.wrong[step]] * wrongs


REPLY_MIXES: dict[str, ReplyMix] = {f.__name__: f for f in (right_only, one_right_of_eight, a_third_right)}


def choosing(tokenizer, replies: ReplyMix, index: int) -> Policy:
    """A policy that writes the `index`-th of `replies(plan, step)` at every step of the plan, and noop() past it
    (an episode that left the plan's path goes on until its turns run out)."""

    def choose(task_plan: Plan, step: int) -> str:
        return replies(task_plan, step)[index] if step < len(task_plan.right) else "noop()"

    return following_plans(tokenizer, choose)


def following_plans(tokenizer, choose: Callable[[Plan, int], str] = right_action) -> Policy:
    """A policy that replies to each episode with `choose(its plan, the number of actions it has taken)`: by
    default the plan's right action, which solves the instance."""
    return lambda episodes: [reply_of_text(tokenizer, choose(plan_of(e), e.turns)) for e in episodes]
