"""The scripted expert of pay-bills: the next action, read off the goal and the page as the policy reads it
(warm_start.experts, which records demonstrations with it, finds it here by the EXPERTS name)."""

import re

from warm_start.experts import History, click, fill_then_submit
from warm_start.page_tree import find, nodes, quoted

BILL = re.compile(r"the (\w+) bill on (\S+) if it is \$(\d+\.\d\d)")


def pay_bills(goal: str, page: str, history: History) -> str:
    user, password = quoted(goal)[:2]
    bills = {kind: (date, amount) for kind, date, amount in BILL.findall(goal)}
    if find(page, "button", "Sign in"):
        return fill_then_submit(
            [(find(page, "textbox", "User name")[0], user), (find(page, "textbox", "Password")[0], password)],
            page,
            "Sign in",
        )
    if find(page, "button", "Schedule payment"):
        (heading,) = [n.name for n in nodes(page) if n.role == "heading" and n.name.startswith("Pay ")]
        date, amount = bills[heading.removeprefix("Pay ").split(":")[0]]
        fields = [
            (find(page, "textbox", "Amount ($)")[0], amount),
            (find(page, "textbox", "Pay on (YYYY-MM-DD)")[0], date),
        ]
        return fill_then_submit(fields, page, "Schedule payment")
    for kind, (due, scheduled) in statements(page).items():
        if kind in bills and due == bills[kind][1] and not scheduled:
            return click(find(page, "link", f"Pay {kind} bill")[0])
    return click(find(page, "link", "Sign out")[0])


def statements(page: str) -> dict[str, tuple[str, bool]]:
    """{kind: (amount due, whether a payment is scheduled)} of each account the accounts page lists: a heading
    'Water: Metro Water', then 'Account 4417. Amount due: $84.20 by 2026-12-15' and any 'Payment of ... scheduled'."""
    found, kind = {}, None
    for node in nodes(page):
        if node.role == "heading" and ": " in node.name:
            kind = node.name.split(":")[0]
        elif kind and (due := re.search(r"Amount due: \$(\d+\.\d\d)", node.name)):
            found[kind] = (due.group(1), False)
        elif kind in found and node.name.startswith("Payment of"):
            found[kind] = (found[kind][0], True)
    return found


EXPERTS = {"pay-bills": pay_bills}
