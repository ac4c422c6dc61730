"""The browser actions an agent may take on a task's page (MiniWoB's, a workflow's, a user's own), and how model
text becomes one of them.

The server executes actions and the client describes them to the model, so both read this one list.
It is BrowserGym's own action set, narrowed to what single-page tasks need: no navigation, no tabs,
no file uploads, one action at a time.
"""

import inspect

from browsergym.core.action import functions
from browsergym.core.action.highlevel import HighLevelActionSet
from browsergym.core.action.parsers import highlevel_action_parser

ACTION_FUNCTIONS = (
    functions.click,
    functions.dblclick,
    functions.hover,
    functions.fill,
    functions.clear,
    functions.press,
    functions.focus,
    functions.select_option,
    functions.drag_and_drop,
    functions.scroll,
    functions.noop,
)
ACTION_SET = HighLevelActionSet(
    subsets=["custom"], custom_actions=list(ACTION_FUNCTIONS), strict=True, multiaction=False
)
ALLOWED_ACTIONS = frozenset(ACTION_SET.action_set)
# The actions on an element, which their first argument names (drag_and_drop's: the element it drags).
ELEMENT_ACTIONS = frozenset(
    action.__name__
    for action in ACTION_FUNCTIONS
    if next(iter(inspect.signature(action).parameters)) in ("bid", "from_bid")
)

# One action is a short call; anything longer is not an action worth running.
MAX_ACTION_CHARS = 1000
# noop(wait_ms) is the one action whose cost the caller picks; a long wait would hold the session hostage.
MAX_WAIT_MS = 10_000


def action_code(action_str: str) -> str:
    """The Python code BrowserGym runs for one allowed action; ValueError, saying why, for anything else.

    The action is model output, so it is untrusted: it must be exactly one call, from the allowlist, with
    literal arguments (BrowserGym's strict grammar), short, and it may not wait for long.
    """
    if not action_str.strip():
        raise ValueError("empty action: write exactly one call, for example click('12')")
    if len(action_str) > MAX_ACTION_CHARS:
        raise ValueError(f"action of {len(action_str)} characters refused; the limit is {MAX_ACTION_CHARS}")
    try:
        code = ACTION_SET.to_python_code(action_str)
    except Exception as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(
            f"not a single call to an allowed action ({reason}); allowed: {', '.join(sorted(ALLOWED_ACTIONS))}"
        ) from None
    for name, args in highlevel_action_parser.parse_string(action_str).as_list():
        waits = [getattr(arg, "value", arg) for arg in args] if name == "noop" else []
        if any(isinstance(ms, (int, float)) and ms > MAX_WAIT_MS for ms in waits):
            raise ValueError(f"noop may wait at most {MAX_WAIT_MS} ms")
    return code


def describe_actions() -> str:
    """The action reference shown to the model: one line per allowed action, its signature written plainly (names
    and defaults, no types) and BrowserGym's first example of it. BrowserGym's own reference (ACTION_SET.describe:
    every type in full, up to three examples each) was 570 tokens of SmolLM2's, this one is 229: a prompt's tokens
    are paid by every episode's every forward and backward pass (docs/real_model.md)."""
    lines = []
    for function in ACTION_FUNCTIONS:
        parameters = inspect.signature(function).parameters.values()
        plain = ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in parameters)
        example = ACTION_SET.action_set[function.__name__].examples[0]
        lines.append(f"{function.__name__}({plain}), e.g. {example}")
    return "Actions:\n" + "\n".join(lines)


def acted_on(action_str: str) -> str | None:
    """The bid of the element an allowed action acts on; None for an action on no element (scroll, noop)."""
    ((name, args),) = highlevel_action_parser.parse_string(action_str).as_list()
    return str(args[0]) if name in ELEMENT_ACTIONS and args else None


def parse_action(text: str) -> str | None:
    """The first allowed action call in free model text, rewritten canonically; None if there is none.

    BrowserGym's grammar does the parsing, so quoting and escapes follow its rules exactly; rebuilding the
    call from the parsed arguments drops whatever the model wrote around it.
    """
    try:
        for tokens, _start, _end in highlevel_action_parser.scan_string(text):
            for name, args in tokens.as_list():
                if name in ALLOWED_ACTIONS:
                    return f"{name}({', '.join(repr(arg) for arg in args)})"
    except (SyntaxError, ValueError):  # the grammar evaluates string literals; a null byte in one breaks that
        return None
    return None
