"""Reading a page as the policy reads it: BrowserGym's accessibility tree, one element a line (`[13] button 'OK'`),
as the scripted plans and the experts both read it, and the quoted strings of a goal."""

import re
from dataclasses import dataclass


@dataclass
class Node:
    """One line of the accessibility tree."""

    depth: int
    bid: str | None
    role: str
    name: str  # "" for an element without one (BrowserGym writes an unnamed `generic` without quotes)
    rest: str  # the properties after the name: value='...', checked='true', focused, ...

    def value(self) -> str | None:
        found = re.search(r"""value=(?:'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)")""", self.rest)
        return next(part for part in found.groups() if part is not None) if found else None


# A name is quoted with ' unless it holds one, then with ".
LINE = re.compile(r"""^(\t*)(?:\[(\w+)\] )?([^\s,]+)(?: (?:'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)"))?(.*)$""")


def nodes(page: str) -> list[Node]:
    """The tree's lines, in page order; `page` as the server sends it or as the prompt shows it (after "Page:")."""
    parsed = []
    for line in page.removeprefix("Page:\n").splitlines():
        if line.strip() and (match := LINE.match(line)):
            tabs, bid, role, single, double, rest = match.groups()
            name = single if single is not None else double if double is not None else ""
            parsed.append(Node(len(tabs), bid, role, name, rest))
    return parsed


def find(page: str, role: str, name: str | None = None) -> list[Node]:
    """The elements of a role (and name) that have a bid, in page order."""
    return [n for n in nodes(page) if n.role == role and n.bid and (name is None or n.name == name)]


def texts_under(page: str, role: str) -> list[tuple[Node, str]]:
    """Each element of a role with the text of the lines under it, joined by spaces."""
    tree, found = nodes(page), []
    for i, node in enumerate(tree):
        if node.role == role and node.bid:
            below = [n.name for n in tree[i + 1 :] if n.depth > node.depth]
            below = below[: next((k for k, n in enumerate(tree[i + 1 :]) if n.depth <= node.depth), len(below))]
            found.append((node, " ".join(t for t in below if t)))
    return found


def quoted(goal: str) -> list[str]:
    """The strings a goal quotes with double quotes."""
    return re.findall(r'"([^"]*)"', goal)
