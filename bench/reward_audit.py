"""Every place a MiniWoB page of BrowserGym's 125 tasks ends an episode, and what it pays there: the ground of
docs/reward_audit.md, which says of each page that can pay a wrong ending what the ending is and how it is scored.

    python bench/reward_audit.py              # a line per task: its endEpisode calls, literal or computed
    python bench/reward_audit.py --computed   # only the pages whose reward is computed, with the lines that compute it

A page's call `core.endEpisode(reward, time_proportional)` sets its raw reward; BrowserGym pays float(raw > 0). A call
whose reward is a literal 1 or -1, or a variable set only to 1.0 or -1.0, pays right and wrong endings apart; the others
compute a reward, which can be positive for an ending that is not the task done right: those were read one by one.
"""

import argparse
import re
from pathlib import Path

import miniwob

from web_env.models import MINIWOB_TASKS

PAGES = Path(miniwob.__file__).parent / "html" / "miniwob"
CALL = re.compile(r"core\.endEpisode\(([^;]*?)\)\s*;?")
ONE_OR_MINUS_ONE = re.compile(r"^-?1(\.0)?$")


def calls(task: str) -> list[str]:
    """The first argument of each endEpisode call of a task's page."""
    return [call.split(",")[0].strip() for call in CALL.findall((PAGES / f"{task}.html").read_text())]


def binary(argument: str, page: str) -> bool:
    """Whether a call's reward can only be 1 or -1: a literal, or a variable every assignment of which is
    `condition ? 1.0 : -1.0` or a literal 1 or -1."""
    if ONE_OR_MINUS_ONE.match(argument) or re.fullmatch(r"correct == '\w+' \? 1\.0 : -1\.0", argument):
        return True
    if not re.fullmatch(r"\w+", argument):
        return False
    assigned = re.findall(rf"\b{argument}\s*[+\-*/]?=\s*([^;\n]+)", page)
    if not assigned:  # a closure's argument: the value each handler was made with
        assigned = re.findall(r"var \w+_reward = ([^;\n]+)", page)
    ternary = r".*\? ?1\.0 ?: ?-1\.0"
    return bool(assigned) and all(ONE_OR_MINUS_ONE.match(a.strip()) or re.fullmatch(ternary, a) for a in assigned)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--computed", action="store_true", help="only the pages whose reward is computed")
    args = parser.parse_args()
    computed = []
    for task in MINIWOB_TASKS:
        page = (PAGES / f"{task}.html").read_text()
        arguments = calls(task)
        open_ended = [a for a in arguments if not binary(a, page)]
        if open_ended:
            computed.append(task)
        if open_ended or not args.computed:
            pays = f"computed: {', '.join(sorted(set(open_ended)))}" if open_ended else "literal 1 or -1"
            print(f"{task:<28} {pays}")
    print(f"{len(MINIWOB_TASKS)} pages, {len(computed)} with a computed reward, read by hand: {', '.join(computed)}")


if __name__ == "__main__":
    main()
