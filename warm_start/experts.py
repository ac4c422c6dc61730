"""Scripted experts: for each task they know, the next action, read each turn off what the policy reads (the goal, and
the page as the prompt shows it: compacted and cut at max_page_chars) and the expert's own actions so far.

They record demonstrations (warm_start.record) for a warm-up before RL; bench/expert_success.py measures how often each
solves its task. An expert reacts to the page it is shown: an autocomplete's list, a date picker's month, a page
of results, a dialog that came up. Where what it needs is not on the page it is shown, it fails, as a policy would.
"""

import calendar
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path

from browser_rl.episode import Episode
from browser_rl.generation import reply_of_text
from browser_rl.prompts import ChatTurns
from browser_rl.rollout import Policy
from warm_start.page_tree import Node, find, nodes, quoted, texts_under

# The expert's actions so far, each with the error it raised ("" if none), as the policy's messages tell them.
History = list[tuple[str, str]]
# The goal, the page as the prompt shows it, the history -> the next action.
Expert = Callable[[str, str, History], str]


def succeeded(history: History) -> list[str]:
    return [action for action, error in history if not error]


def click(node: Node) -> str:
    return f"click('{node.bid}')"


def fill(node: Node, text: str) -> str:
    return f"fill('{node.bid}', {text!r})"


def submit(page: str, label: str = "Submit") -> str:
    return click(find(page, "button", label)[0])


# --- one-click tasks ---------------------------------------------------------------------------------------------


def click_test_2(goal: str, page: str, history: History) -> str:
    """The button, placed at random: where the other one covers its centre, the click fails, and Enter on it
    (a keyboard click) does the same."""
    (label,) = re.findall(r"Click button (\w+)\.", goal)
    button = find(page, "button", label)[0]
    return f"press('{button.bid}', 'Enter')" if history and history[-1][1] else click(button)


def click_dialog(goal: str, page: str, history: History) -> str:
    return click(find(page, "button", "Close")[0])


def click_dialog_2(goal: str, page: str, history: History) -> str:
    (label,) = quoted(goal)
    return click(find(page, "button", "Close" if label == "x" else label)[0])


def focus_text(goal: str, page: str, history: History) -> str:
    return f"focus('{find(page, 'textbox')[0].bid}')"


def focus_text_2(goal: str, page: str, history: History) -> str:
    (nth,) = re.findall(r"(\d+)(?:st|nd|rd|th) input", goal)
    return f"focus('{find(page, 'textbox')[int(nth) - 1].bid}')"


# --- forms -------------------------------------------------------------------------------------------------------


def fill_then_submit(fields: list[tuple[Node, str]], page: str, submit_label: str = "Submit") -> str:
    """The first field whose value is not yet its text (a password box shows one bullet a character), filled; then
    the submit button."""
    for node, text in fields:
        if node.value() not in (text, "\u2022" * len(text)):
            return fill(node, text)
    return submit(page, submit_label)


def enter_text(goal: str, page: str, history: History) -> str:
    (text,) = quoted(goal)
    return fill_then_submit([(find(page, "textbox")[0], text)], page)


def enter_text_2(goal: str, page: str, history: History) -> str:
    (text,) = quoted(goal)
    text = text.lower() if "lower case" in goal else text.upper()
    return fill_then_submit([(find(page, "textbox")[0], text)], page)


def enter_password(goal: str, page: str, history: History) -> str:
    (password,) = quoted(goal)
    return fill_then_submit([(box, password) for box in find(page, "textbox")[:2]], page)


def login_user(goal: str, page: str, history: History, submit_label: str = "Login") -> str:
    user, password = quoted(goal)
    boxes = find(page, "textbox")
    return fill_then_submit([(boxes[0], user), (boxes[1], password)], page, submit_label)


def login_user_popup(goal: str, page: str, history: History) -> str:
    """login-user, whose form a popup may cover and disable when a box is focused: the popup is cancelled, and the
    fill it stopped is done again."""
    if cancel := find(page, "button", "Cancel"):
        return click(cancel[0])
    return login_user(goal, page, history, submit_label="OK")


def enter_date(goal: str, page: str, history: History) -> str:
    month, day, year = re.findall(r"(\d\d)/(\d\d)/(\d{4})", goal)[0]
    return fill(find(page, "Date")[0], f"{year}-{month}-{day}") if not succeeded(history) else submit(page)


def enter_time(goal: str, page: str, history: History) -> str:
    hours, minutes, half = re.findall(r"(\d+):(\d\d) ([AP]M)", goal)[0]
    hours = int(hours) % 12 + (12 if half == "PM" else 0)
    return fill(find(page, "InputTime")[0], f"{hours:02d}:{minutes}") if not succeeded(history) else submit(page)


def click_checkboxes(goal: str, page: str, history: History) -> str:
    (listed,) = re.findall(r"Select (.*) and click Submit", goal)
    wanted = [] if listed == "nothing" else listed.split(", ")
    for box in find(page, "checkbox"):
        if (box.name in wanted) != ("checked='true'" in box.rest):
            return click(box)
    return submit(page)


def click_option(goal: str, page: str, history: History) -> str:
    (option,) = re.findall(r"Select (.*) and click Submit", goal)
    chosen = find(page, "radio", option)[0]
    return click(chosen) if "checked='true'" not in chosen.rest else submit(page)


def click_collapsible(goal: str, page: str, history: History) -> str:
    closed = [tab for tab in find(page, "tab") if tab.name.startswith("Section") and "expanded=False" in tab.rest]
    return click(closed[0]) if closed else submit(page)


# --- book-flight ---------------------------------------------------------------------------------------------------

MONTHS = list(calendar.month_name)[1:]  # January ... December, as the date picker writes them


def book_flight(goal: str, page: str, history: History) -> str:
    """From and To through their autocomplete lists, the date through the date picker, Search, then the cheapest or
    the shortest of the results."""
    ((want, origin, destination, date),) = re.findall(
        r"Book the (\w+) one-way flight from: (.*) to: (.*) on (\S+)\.", goal
    )
    results = [button for button in find(page, "button") if button.name.startswith("Book flight for")]
    if results:
        return click(best_flight(page, results, want))
    for label, city in (("From:", origin), ("To:", destination)):
        (box,) = find(page, "textbox", label)
        if action := pick_airport(page, box, city, waited=bool(history) and history[-1][0].startswith("noop")):
            return action
    date_box = next(box for box in find(page, "textbox") if box.name == "")
    if date_box.value() != date:
        return pick_date(page, date, date_box)
    return click(find(page, "button", "Search")[0])


def pick_airport(page: str, box: Node, city: str, waited: bool) -> str | None:
    """The next action that makes `box` hold the airport of `city` (a city or an airport code), or None if it does.
    The autocomplete lists the airports that match what was typed, at once or (book-flight) 300 ms later: once typed,
    the expert waits for the list once before typing again. A list longer than its box scrolls, and a click on an
    item that needs the scroll misses it, so the box is filled with the item's whole text, which leaves one item."""
    listed = texts_under(page, "listitem")
    matching = [(item, text) for item, text in listed if city in text]
    if len(listed) == 1 and matching:
        return click(matching[0][0])
    if matching and box.value() != matching[0][1]:
        return fill(box, matching[0][1])
    value = box.value() or ""
    if city in value and value.endswith(")"):
        return None
    return "noop(500)" if value == city and not waited else fill(box, city)


def pick_date(page: str, date: str, date_box: Node) -> str:
    month, day, year = (int(part) for part in date.split("/"))
    shown = [n.name for n in nodes(page) if n.role == "StaticText" and n.name in MONTHS]
    years = [int(n.name) for n in nodes(page) if n.role == "StaticText" and re.fullmatch(r"\d{4}", n.name)]
    if not shown or not years:  # the picker is closed: clicking the box opens it
        return click(date_box)
    offset = (year - years[0]) * 12 + month - (MONTHS.index(shown[0]) + 1)
    if offset:
        return click(find(page, "link", "Prev" if offset < 0 else "Next")[0])
    return click(find(page, "link", str(day))[0])


def best_flight(page: str, bookings: list[Node], want: str) -> Node:
    """The booking button of the cheapest or the shortest flight; the duration ('5h 12m') is the text that comes
    before each booking button."""
    tree = nodes(page)
    durations = {}
    for booking in bookings:
        at = tree.index(booking)
        text = [n.name for n in tree[:at] if re.fullmatch(r"\d+h \d+m", n.name)][-1]
        hours, minutes = map(int, re.findall(r"\d+", text))
        durations[booking.bid] = hours * 60 + minutes
    if want == "cheapest":
        return min(bookings, key=lambda b: int(re.findall(r"\d+", b.name)[0]))
    return min(bookings, key=lambda b: durations[b.bid])


EXPERTS: dict[str, Expert] = {
    "book-flight": book_flight,
    "book-flight-nodelay": book_flight,
    "click-checkboxes": click_checkboxes,
    "click-checkboxes-large": click_checkboxes,
    "click-checkboxes-transfer": click_checkboxes,
    "click-collapsible": click_collapsible,
    "click-collapsible-nodelay": click_collapsible,
    "click-dialog": click_dialog,
    "click-dialog-2": click_dialog_2,
    "click-option": click_option,
    "click-test-2": click_test_2,
    "click-test-transfer": click_test_2,
    "enter-date": enter_date,
    "enter-password": enter_password,
    "enter-text": enter_text,
    "enter-text-2": enter_text_2,
    "enter-text-dynamic": enter_text,
    "enter-time": enter_time,
    "focus-text": focus_text,
    "focus-text-2": focus_text_2,
    "login-user": login_user,
    "login-user-popup": login_user_popup,
}


def known_experts(task_modules: list[str] = ()) -> dict[str, Expert]:
    """The experts above, and those beside `task_modules` (loaded: TaskArguments loads them): a task module's folder
    may hold an `expert.py` whose EXPERTS maps its tasks' ids to their experts (workflows/clinic/expert.py). They run
    here, on the recording side; the environment server, which loads the task modules, never imports them."""
    experts = dict(EXPERTS)
    for module in task_modules:
        beside = Path(module if module.endswith(".py") else sys.modules[module].__file__).with_name("expert.py")
        if beside.is_file():
            experts.update(_load_experts(beside))
    return experts


def _load_experts(path: Path) -> dict[str, Expert]:
    name = f"{path.parent.name}_expert"  # each folder's expert.py, a module of its own
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name].EXPERTS


def expert_policy(chat: ChatTurns, experts: dict[str, Expert]) -> Policy:
    """A policy that replies to each episode with its task's expert (of `experts`, by task), reading the page through
    `chat` exactly as the prompt shows it."""

    def reply(episode: Episode) -> str:
        history = list(zip(episode.actions, episode.errors, strict=True))
        return experts[episode.task_name](episode.observation.goal, chat.page(episode.observation), history)

    return lambda episodes: [reply_of_text(chat.tokenizer, reply(episode)) for episode in episodes]
