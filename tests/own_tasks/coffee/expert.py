"""The scripted expert of order-coffee: the next action, read off the goal and the page as the policy reads them."""

import re

from warm_start.experts import History, click, fill, submit
from warm_start.page_tree import find

GOAL = re.compile(r"Order a (\w+) (\w+) for (\w+)\.")


def order_coffee(goal: str, page: str, history: History) -> str:
    size, drink, name = GOAL.fullmatch(goal).groups()
    (drink_choice,) = find(page, "radio", drink)
    (size_choice,) = find(page, "radio", size)
    (name_box,) = find(page, "textbox", "Name on the cup")
    for choice in (drink_choice, size_choice):
        if "checked='true'" not in choice.rest:
            return click(choice)
    if name_box.value() != name:
        return fill(name_box, name)
    return submit(page, "Place order")


EXPERTS = {"order-coffee": order_coffee}
