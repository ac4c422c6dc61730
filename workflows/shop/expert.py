"""The scripted expert of shop-checkout: the next action, read off the goal and the page as the policy reads it
(warm_start.experts, which records demonstrations with it, finds it here by the EXPERTS name)."""

import re

from warm_start.experts import History, click, fill, fill_then_submit, submit
from warm_start.page_tree import find, nodes

GOAL = re.compile(
    r"Buy (\d) of the (\w+) (\w+) (.+) in size (.+)\. Use coupon (\w+)\. Ship to (.+), (\d+) with (\w+ delivery)\."
)


def shop_checkout(goal: str, page: str, history: History) -> str:
    quantity, color, material, noun, size, coupon, street, zip_code, delivery = GOAL.fullmatch(goal).groups()
    headings = [n.name for n in nodes(page) if n.role == "heading"]
    if find(page, "button", "Place order"):
        fields = [
            (find(page, "textbox", "Street address")[0], street),
            (find(page, "textbox", "ZIP code")[0], zip_code),
        ]
        for box, text in fields:
            if box.value() != text:
                return fill(box, text)
        (radio,) = find(page, "radio", delivery.capitalize())
        return submit(page, "Place order") if "checked='true'" in radio.rest else click(radio)
    if find(page, "button", "Apply coupon"):
        if any(n.name == f"Coupon {coupon} applied." for n in nodes(page)):
            return click(find(page, "link", "Check out")[0])
        return fill_then_submit([(find(page, "textbox", "Coupon code")[0], coupon)], page, "Apply coupon")
    if find(page, "button", "Add to cart"):
        (box,) = find(page, "combobox", "Size")
        if box.value() != size:
            return f"select_option('{box.bid}', {size!r})"
        return fill_then_submit([(find(page, "textbox", "Quantity")[0], quantity)], page, "Add to cart")
    category = noun[0].upper() + noun[1:] + "s"
    if category in headings:
        return click(listed_product(page, color, material))
    return click(find(page, "link", category)[0])


def listed_product(page: str, color: str, material: str):
    """The link of the product whose line says its color and material: 'Everyday Tee' then 'blue, linen. $24.00'."""
    tree = nodes(page)
    for at, node in enumerate(tree[:-1]):
        if node.role == "link" and node.bid and tree[at + 1].name.startswith(f"{color}, {material}."):
            return node
    raise ValueError(f"no {color} {material} product listed")


EXPERTS = {"shop-checkout": shop_checkout}
