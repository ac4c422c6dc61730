"""The scripted expert of book-clinic: the next action, read off the goal and the page as the policy reads it
(warm_start.experts, which records demonstrations with it, finds it here by the EXPERTS name)."""

import re

from warm_start.experts import History, click, fill_then_submit, submit
from warm_start.page_tree import find, nodes

GOAL = re.compile(
    r"Book the earliest (\w+) appointment on (\w+) starting between (\d\d:\d\d) and (\d\d:\d\d)"
    r"(?: with a (female|male) doctor| with a doctor who speaks (\w+))?, at a clinic that takes (\w+)\. "
    r"Patient: (.+), born (\S+), phone (\S+)\."
)
SLOT = re.compile(r"(\w+) (\d\d:\d\d) with Dr\. .+")


def book_clinic(goal: str, page: str, history: History) -> str:
    specialty, day, start, end, gender, language, insurance, name, birth_date, phone = GOAL.fullmatch(goal).groups()
    if find(page, "button", "Confirm appointment"):
        fields = [("Patient name", name), ("Date of birth (YYYY-MM-DD)", birth_date), ("Phone", phone)]
        return fill_then_submit(
            [(find(page, "textbox", label)[0], text) for label, text in fields], page, "Confirm appointment"
        )
    if find(page, "combobox", "Specialty"):
        for label, wanted in (("Specialty", specialty), ("Insurance", insurance), ("Day", day)):
            (box,) = find(page, "combobox", label)
            if box.value() != wanted:
                return f"select_option('{box.bid}', {wanted!r})"
        return submit(page, "Search")
    slots = fitting_slots(page, day, start, end, gender, language)
    if slots:
        return click(min(slots, key=lambda slot: slot[0])[1])
    return click(find(page, "link", "New search")[0])


def fitting_slots(page: str, day: str, start: str, end: str, gender: str | None, language: str | None):
    """(time, link) of each listed slot on the day, in the window, with a doctor the goal accepts; a slot's doctor is
    described by the text after its link: '(female; speaks English, Spanish)'."""
    tree, fitting = nodes(page), []
    for at, node in enumerate(tree):
        found = SLOT.fullmatch(node.name) if node.role == "link" and node.bid else None
        if not found or found.group(1) != day or not start <= found.group(2) <= end:
            continue
        doctor = tree[at + 1].name if at + 1 < len(tree) else ""
        if (gender and not doctor.startswith(f"({gender};")) or (language and language not in doctor):
            continue
        fitting.append((found.group(2), node))
    return fitting


EXPERTS = {"book-clinic": book_clinic}
