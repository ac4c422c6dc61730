from dataclasses import replace

import pytest

from browser_rl.episode_settings import DEFAULTS, SETTINGS_FILE, resolve, saved_with
from browser_rl.errors import ConfigError
from browser_rl.options import EpisodeArguments
from browser_rl.prompts import INSTRUCTIONS, SYSTEM_PROMPT, ChatTurns, feedback
from web_env.models import BrowserGymObservation

PAGE = "RootWebArea 'Click Test Task', focused\n\t[13] button 'Click Me!'"


def observation(**fields):
    return BrowserGymObservation(goal="Click the button.", axtree_txt=PAGE, text=PAGE, **fields)


def test_first_prompt_is_system_then_page_and_goal_then_assistant_header(tokenizer):
    text = tokenizer.decode(ChatTurns(tokenizer, DEFAULTS.max_page_chars).first_prompt(observation()))
    assert text.startswith("<|startoftext|><|im_start|>system\n" + SYSTEM_PROMPT + "<|im_end|>\n")
    user = "<|im_start|>user\nPage:\n" + PAGE + "\n\nGoal: Click the button.<|im_end|>\n"
    assert text.endswith(user + "<|im_start|>assistant\n")


def test_without_the_action_reference_the_system_prompt_is_the_instructions_alone(tokenizer):
    with_list, without = (
        ChatTurns(tokenizer, 2000, reference).first_prompt(observation()) for reference in (True, False)
    )
    text = tokenizer.decode(without)
    assert text.startswith("<|startoftext|><|im_start|>system\n" + INSTRUCTIONS + "<|im_end|>\n")
    assert "click(bid" in SYSTEM_PROMPT and "click(bid" not in text
    assert len(with_list) - len(without) > 200  # the list is most of the system prompt


def test_the_action_reference_is_an_episode_setting_saved_beside_the_model_and_on_by_default(tmp_path):
    (tmp_path / "old").mkdir()  # a model saved before the setting existed
    (tmp_path / "old" / SETTINGS_FILE).write_text('{"max_turns": 3, "max_page_chars": 2000, "settle_ms": 0}')
    assert saved_with(str(tmp_path / "old")).action_reference is True
    replace(DEFAULTS, action_reference=False).save(tmp_path / "new")
    assert saved_with(str(tmp_path / "new")).action_reference is False
    with pytest.raises(ConfigError, match="action_reference True, not the False it was made with"):
        resolve(EpisodeArguments(action_reference=True), saved_with(str(tmp_path / "new")), "the model")


def test_every_later_message_says_the_outcome_then_the_page_then_the_goal_again(tokenizer):
    chat = ChatTurns(tokenizer, DEFAULTS.max_page_chars)
    message = chat.observation_message(observation(), "Step 2. Action click('13') done.")
    assert message == "Step 2. Action click('13') done.\n\nPage:\n" + PAGE + "\n\nGoal: Click the button."


def test_page_is_truncated_to_the_configured_length(tokenizer):
    chat = ChatTurns(tokenizer, max_page_chars=20)
    page = chat.page(observation())
    assert page == "Page:\n" + PAGE[:20] + "\n[... page truncated]"


def test_next_turn_after_a_reply_that_ended_itself(tokenizer):
    chat = ChatTurns(tokenizer, DEFAULTS.max_page_chars)
    reply = tokenizer.encode("click('13')", add_special_tokens=False) + [tokenizer.eos_token_id]
    text = tokenizer.decode(chat.next_turn(reply, "Step 2."))
    # The model already wrote <|im_end|>; the environment adds only what follows it.
    assert text == "\n<|im_start|>user\nStep 2.<|im_end|>\n<|im_start|>assistant\n"


def test_next_turn_after_a_reply_cut_at_the_token_limit_closes_it(tokenizer):
    chat = ChatTurns(tokenizer, DEFAULTS.max_page_chars)
    reply = tokenizer.encode("click('1", add_special_tokens=False)
    text = tokenizer.decode(chat.next_turn(reply, "Step 2."))
    assert text == "<|im_end|>\n<|im_start|>user\nStep 2.<|im_end|>\n<|im_start|>assistant\n"


def test_turns_concatenate_to_what_the_chat_template_renders(tokenizer):
    chat = ChatTurns(tokenizer, DEFAULTS.max_page_chars)
    first = observation()
    reply = tokenizer.encode("click('13')", add_special_tokens=False) + [tokenizer.eos_token_id]
    ids = chat.first_prompt(first) + reply + chat.next_turn(reply, "Step 2.")
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{chat.page(first)}\n\nGoal: Click the button."},
        {"role": "assistant", "content": "click('13')"},
        {"role": "user", "content": "Step 2."},
    ]
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_feedback_says_what_happened():
    assert "no valid action" in feedback(0, None, observation())
    assert "cut off" in feedback(0, None, observation(), cut_off=True)
    failed = feedback(1, "click('99')", observation(error='ValueError: Could not find element with bid "99"'))
    assert failed.startswith("Step 2. Action click('99') failed: ValueError: Could not find element")
    assert feedback(2, "click('13')", observation()) == "Step 3. Action click('13') done."


def test_page_drops_repeated_text_and_urls_and_keeps_every_element(tokenizer):
    axtree = (
        "RootWebArea 'Click Button Task', focused, url='file:///home/user/miniwob/click-button.html'\n"
        "\tStaticText 'faucibus in nibh'\n"
        "\t\tInlineTextBox 'faucibus in nibh'\n"
        "\t[13] button 'no'\n"
        "\t\tInlineTextBox 'no'\n"
        "\tInlineTextBox ''\n"
        "\t[19] link 'Tab #1', url='file:///home/user/miniwob/click-tab.html#tabs-1'\n"
        "\t[21] textbox '', focused"
    )
    chat = ChatTurns(tokenizer, DEFAULTS.max_page_chars)
    page = chat.page(BrowserGymObservation(goal="", axtree_txt=axtree, text=axtree))
    assert page == (
        "Page:\nRootWebArea 'Click Button Task', focused\n"
        "\tStaticText 'faucibus in nibh'\n"
        "\t[13] button 'no'\n"
        "\t[19] link 'Tab #1'\n"
        "\t[21] textbox '', focused"
    )
