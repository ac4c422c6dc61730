"""Demonstrations: a recorded episode renders offline token for token as it was played, and bad files fail clearly."""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from browser_rl.episode_settings import DEFAULTS, EpisodeSettings
from browser_rl.generation import reply_of_text
from browser_rl.prompts import ChatTurns
from browser_rl.rollout import EpisodeRunner
from browser_rl.servers import ServerPool
from warm_start.demonstrations import (
    Demonstration,
    DemonstrationsError,
    load,
    of_episode,
    replay,
    reply_probabilities,
    save,
    sft_dataset,
)
from warm_start.plans import plan_of

# Per task, what the policy writes turn by turn: wrong actions (an error, no action, a cut-off reply) before the
# plan's right ones, so that every kind of turn message is rendered.
DETOURS = {
    "login-user": [],
    "enter-text": ["click('9999')", "I will type the text.", None],
    "click-test": ["focus('9999')"],
}


def played_episodes(env_server, tokenizer, max_turns: int):
    def policy(episodes):
        replies = []
        for episode in episodes:
            steps = DETOURS[episode.task_name] + plan_of(episode).right
            step = steps[min(episode.turns, len(steps) - 1)]
            if step is None:  # cut off by the length limit: no end-of-turn token
                replies.append(reply_of_text(tokenizer, "click('1"))
                replies[-1].ids.pop()
                replies[-1].ended = False
            else:
                replies.append(reply_of_text(tokenizer, step))
        return replies

    settings = EpisodeSettings(max_turns=max_turns)
    runner = EpisodeRunner(ServerPool([env_server.url]), tokenizer, settings, lockstep=True)
    try:
        return runner.run([(task, seed) for task in DETOURS for seed in (2_000_000, 2_000_001)], policy)
    finally:
        runner.close()


def test_a_demonstration_renders_as_the_live_episode_that_played_it(env_server, tokenizer, tmp_path):
    episodes = played_episodes(env_server, tokenizer, max_turns=6)
    assert {(e.task_name, e.turns, e.solved) for e in episodes} == {
        ("login-user", 3, True),
        ("enter-text", 5, True),
        ("click-test", 2, True),
    }
    enter_text = next(e for e in episodes if e.task_name == "enter-text")
    assert "bid" in enter_text.errors[0] and enter_text.actions[1:3] == [None, None]
    demos = tmp_path / "outputs" / "demonstrations" / "demos.jsonl"  # its folder made as it is written
    save([of_episode(e, DEFAULTS) for e in episodes], demos)
    recorded = load(demos)
    chat = ChatTurns(tokenizer, DEFAULTS.max_page_chars)
    for episode, demonstration in zip(episodes, recorded, strict=True):
        offline = replay(demonstration, chat)
        assert offline.prompt_ids == episode.prompt_ids
        assert offline.completion_ids == episode.completion_ids
        assert offline.env_mask == episode.env_mask
        assert (offline.actions, offline.done, offline.env_reward) == (
            episode.actions,
            episode.done,
            episode.env_reward,
        )
    (row,) = sft_dataset(recorded[:1], chat, max_length=100_000)
    first = episodes[0]
    assert row["input_ids"] == first.context()
    assert row["completion_mask"] == [0] * len(first.prompt_ids) + first.env_mask


def test_an_episode_that_ran_out_of_turns_renders_without_a_message_after_its_last_reply(env_server, tokenizer):
    episodes = played_episodes(env_server, tokenizer, max_turns=1)
    chat = ChatTurns(tokenizer, DEFAULTS.max_page_chars)
    for episode in episodes:
        offline = replay(of_episode(episode, DEFAULTS), chat)
        assert (offline.context(), offline.env_mask) == (episode.context(), episode.env_mask)
        assert offline.completion_ids[-1] == tokenizer.eos_token_id


GOOD = {
    "version": 1,
    "task": "click-test",
    "seed": 2_000_000,
    "goal": "Click the button.",
    "turns": [{"page": "[13] button 'Click Me!'", "reply": "click('13')", "error": ""}],
    "done": True,
    "reward": 1.0,
}


def write_rows(path, rows) -> None:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))


def test_every_bad_row_is_named_by_its_line_and_field(tmp_path):
    path = tmp_path / "demos.jsonl"
    write_rows(
        path,
        [
            GOOD,
            "{not json",
            {**GOOD, "version": 2},
            {**GOOD, "task": "click-tset"},
            {**GOOD, "turns": []},
            {**GOOD, "turns": [{"page": "p"}]},
            {**GOOD, "seed": -1},
            {**GOOD, "extra": 1},
        ],
    )
    with pytest.raises(DemonstrationsError) as error:
        load(path)
    message = str(error.value)
    for line, says in [
        (2, "Invalid JSON"),
        (3, "version: Input should be 1"),
        (4, "task: Value error, unknown task 'click-tset'"),
        (5, "turns: List should have at least 1 item"),
        (6, "turns[0].reply: Field required"),
        (7, "seed: Input should be greater than or equal to 0"),
        (8, "extra: Extra inputs are not permitted"),
    ]:
        assert f"demos.jsonl line {line}: " in message and says in message
    assert "line 1:" not in message and message.startswith("7 error(s)")


def test_unsuccessful_episodes_are_left_out_unless_asked_for(tmp_path):
    path = tmp_path / "demos.jsonl"
    write_rows(path, [GOOD, {**GOOD, "reward": 0.0}, {**GOOD, "done": False}])
    assert len(load(path)) == 1 and len(load(path, keep_failed=True)) == 3
    write_rows(path, [{**GOOD, "reward": 0.0}])
    with pytest.raises(DemonstrationsError, match="no successful episode to learn from"):
        load(path)
    with pytest.raises(DemonstrationsError, match="No such file"):
        load(tmp_path / "missing.jsonl")


def test_an_episode_too_long_for_the_model_is_an_error_not_a_cut(tokenizer, tmp_path):
    path = tmp_path / "demos.jsonl"
    write_rows(path, [GOOD])
    chat = ChatTurns(tokenizer, DEFAULTS.max_page_chars)
    (row,) = sft_dataset(load(path), chat, max_length=100_000)
    assert sum(row["completion_mask"]) == len(tokenizer.encode("click('13')", add_special_tokens=False)) + 1
    with pytest.raises(DemonstrationsError, match=f"longer than {len(row['input_ids']) - 1} tokens"):
        sft_dataset(load(path), chat, max_length=len(row["input_ids"]) - 1)


def test_bench_drift_scores_each_reply_as_a_token_by_token_sampler_would(tiny_model, tokenizer):
    demonstration = Demonstration.model_validate(
        GOOD
        | {
            "turns": [
                {"page": "[13] button 'Click Me!'", "reply": "click('9')", "error": "no element with bid 9"},
                {"page": "[13] button 'Click Me!'", "reply": "click('13')", "error": ""},
            ]
        }
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    chat = ChatTurns(tokenizer, DEFAULTS.max_page_chars)
    context = replay(demonstration, chat).context()
    expected, searched_from = [], 0
    for turn in demonstration.turns:
        reply = reply_of_text(tokenizer, turn.reply).ids  # with its end-of-turn token
        start = next(p for p in range(searched_from, len(context)) if context[p : p + len(reply)] == reply)
        searched_from = start + len(reply)
        probabilities = []
        for position, token in enumerate(reply, start):
            with torch.no_grad():
                next_token = model(torch.tensor([context[:position]])).logits[0, -1].softmax(-1)
            probabilities.append(next_token[token].item())
        expected.append((math.prod(probabilities), probabilities[0]))
    scored = reply_probabilities(model, chat, demonstration)
    assert [p for pair in scored for p in pair] == pytest.approx([p for pair in expected for p in pair], rel=1e-4)
