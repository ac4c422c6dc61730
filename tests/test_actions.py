import pytest

from web_env.actions import ALLOWED_ACTIONS, describe_actions, parse_action


@pytest.mark.parametrize(
    "text, action",
    [
        ("click('13')", "click('13')"),
        ('click("13")', "click('13')"),
        ("I will click('13') now.", "click('13')"),
        ("Action:\nfill('5', 'hello world')\nThat should do it.", "fill('5', 'hello world')"),
        ("fill('4', 'it\\'s')", "fill('4', \"it's\")"),
        ("noop()", "noop()"),
        ("click('12', button='right')", "click('12', button='right')"),
        ("scroll(0, 200)", "scroll(0, 200)"),
        ("fill('5', 'a')\nclick('3')", "fill('5', 'a')"),  # only the first action is taken
        ("goto('http://evil.example') then click('4')", "click('4')"),  # disallowed calls are skipped
    ],
)
def test_parse_action_takes_the_first_allowed_call(text, action):
    assert parse_action(text) == action


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n ",
        "I don't know what to do.",
        "click('13'",  # unbalanced parenthesis
        "click('13)",  # unbalanced quote
        "goto('https://example.com')",
        "new_tab()",
        "upload_file('3', '/etc/passwd')",
        "__import__('os').system('rm -rf /')",
        "\x00\x01\x02",
        "click('1\x002')",  # a null byte inside a string literal, which BrowserGym's grammar fails to evaluate
        "fill('3', 'a\x00b')",
    ],
)
def test_parse_action_returns_none_without_an_allowed_call(text):
    assert parse_action(text) is None


def test_action_set_excludes_navigation_tabs_and_files():
    assert {"click", "fill", "press", "select_option", "noop"} <= ALLOWED_ACTIONS
    assert not {"goto", "go_back", "new_tab", "tab_focus", "upload_file", "send_msg_to_user"} & ALLOWED_ACTIONS


def test_action_description_lists_every_allowed_action():
    description = describe_actions()
    for name in ALLOWED_ACTIONS:
        assert f"{name}(" in description
