"""The browser actions a MiniWoB agent may take, and how model text becomes one of them.

The server executes actions and the client describes them to the model, so both read this one list.
It is BrowserGym's own action set, narrowed to what MiniWoB tasks need: no navigation, no tabs,
no file uploads, one action at a time.
"""

from browsergym.core.action import functions
from browsergym.core.action.highlevel import HighLevelActionSet
from browsergym.core.action.parsers import highlevel_action_parser

ACTION_SET = HighLevelActionSet(
    subsets=["custom"],
    custom_actions=[
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
    ],
    strict=True,
    multiaction=False,
)
ALLOWED_ACTIONS = frozenset(ACTION_SET.action_set)


def describe_actions() -> str:
    """The action reference shown to the model, written by BrowserGym from the functions themselves."""
    return ACTION_SET.describe(with_long_description=False, with_examples=True)


def parse_action(text: str) -> str | None:
    """The first allowed action call in free model text, rewritten canonically; None if there is none.

    BrowserGym's grammar does the parsing, so quoting and escapes follow its rules exactly; rebuilding the
    call from the parsed arguments drops whatever the model wrote around it.
    """
    for tokens, _start, _end in highlevel_action_parser.scan_string(text):
        for name, args in tokens.as_list():
            if name in ALLOWED_ACTIONS:
                return f"{name}({', '.join(repr(arg) for arg in args)})"
    return None
