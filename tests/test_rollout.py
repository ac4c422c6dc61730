"""Episodes through a real server: batched generation, token bookkeeping, and the trainer's view of them."""

import itertools
import os
import signal
import time

import pytest
import torch

from browser_rl import rollout
from browser_rl.episode_settings import EpisodeSettings
from browser_rl.errors import EnvironmentFailure
from browser_rl.generation import Reply, cached_generate, load_policy, model_generate, reply_of_text
from browser_rl.rollout import EpisodeRunner, model_policy
from browser_rl.servers import ServerPool
from env_client import LocalEnvServer
from helpers import (
    built_trainer,
    click_the_button,
    policy_turns,
    recomputed_logprobs,
    recorded_generation,
    scored_episodes,
    segments,
)
from warm_start.plans import following_plans, plan_of


def test_episodes_run_batched_and_record_exactly_what_the_policy_saw_and_wrote(env_server, tokenizer):
    # Episode 0 solves the task at once, episode 1 first writes no action, episode 2 never acts usefully,
    # episode 3's first reply is cut off by the length limit (no end-of-turn token) and is not acted on.
    scripts = [["CLICK"], ["hello", "CLICK"], ["noop(10)", "noop(10)", "noop(10)"], ["CUT CLICK", "CLICK"]]
    calls = []

    def scripted_policy(episodes):
        turn = len(calls)
        calls.append([episode.context() for episode in episodes])
        running = [i for i, script in enumerate(scripts) if len(script) > turn]
        replies = []
        for i, episode in zip(running, episodes, strict=True):
            text = scripts[i][turn]
            ended = not text.startswith("CUT ")
            if text.endswith("CLICK"):
                text = click_the_button(episode.observation.axtree_txt)
            ids = tokenizer.encode(text, add_special_tokens=False) + ([tokenizer.eos_token_id] if ended else [])
            replies.append(Reply(ids, [-1.0] * len(ids), ended))
        return replies

    runner = EpisodeRunner(ServerPool([env_server.url]), tokenizer, EpisodeSettings(max_turns=3), lockstep=True)
    try:
        episodes = runner.run([("click-test", 5)] * 4, scripted_policy)
    finally:
        runner.close()

    # One generation call per turn, over exactly the episodes still running.
    assert [len(c) for c in calls] == [4, 3, 1]
    assert [(e.done, e.env_reward, e.turns) for e in episodes] == [
        (True, 1.0, 1),
        (True, 1.0, 2),
        (False, 0.0, 3),
        (True, 1.0, 2),
    ]
    assert episodes[1].actions[0] is None and episodes[2].actions == ["noop(10)"] * 3
    assert episodes[3].actions[0] is None and episodes[3].replies[0].startswith("click(")
    assert "cut off" in tokenizer.decode(episodes[3].completion_ids)

    for i, episode in enumerate(episodes):
        # Each turn's context is the episode's own token sequence up to that point, nothing re-rendered.
        running_at = [[j for j, script in enumerate(scripts) if len(script) > t] for t in range(len(calls))]
        contexts = [calls[t][running_at[t].index(i)] for t in range(episode.turns)]
        runs = segments(episode.completion_ids, episode.env_mask)
        position, turn = 0, 0
        for bit, ids in runs:
            if bit == 1:
                assert contexts[turn] == episode.prompt_ids + episode.completion_ids[:position]
                turn += 1
            position += len(ids)
        # Environment tokens sit only between replies, never after the last one; their log-probs are placeholders.
        assert runs[-1][0] == 1 and [bit for bit, _ in runs] == [1, 0] * (episode.turns - 1) + [1]
        assert all(lp == 0.0 for lp, bit in zip(episode.logprobs, episode.env_mask) if bit == 0)
        for bit, ids in runs:
            if bit == 0:
                text = tokenizer.decode(ids)
                assert "<|im_start|>user\nStep " in text and text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("lora", [False, True], ids=["full", "LoRA"])
def test_trainer_scores_each_reply_against_the_context_it_was_sampled_from(
    env_server, tiny_model, tokenizer, monkeypatch, tmp_path, lora
):
    sampled = recorded_generation(monkeypatch, "transformers_generate")
    trainer, runner = built_trainer(
        tokenizer,
        env_server.url,
        *("--model_name_or_path", tiny_model, "--output_dir", str(tmp_path)),
        *("--max_turns", "3", "--num_generations", "2", "--per_device_train_batch_size", "2"),
        *(["--use_peft"] if lora else []),
    )
    out = scored_episodes(trainer, runner, lora_std=0.05 if lora else None)

    # env_mask marks exactly the sampled replies, each after the very context it was sampled from.
    turns = [turn for row in range(2) for turn in policy_turns(out, row)]
    assert sorted(turns) == sorted((context, reply.ids) for context, reply in sampled)
    # A random tiny model never solves click-test: every episode plays all 3 turns.
    assert len(turns) == 6

    recomputed = recomputed_logprobs(trainer, out)
    policy_tokens = (out["completion_mask"] * out["tool_mask"]).bool()
    torch.testing.assert_close(
        recomputed[policy_tokens], out["sampling_per_token_logps"][policy_tokens], atol=1e-4, rtol=0
    )
    if lora:
        with trainer.model.disable_adapter():
            base = recomputed_logprobs(trainer, out)
        assert (base[policy_tokens] - recomputed[policy_tokens]).abs().max() > 0.1  # the adapter is in both


def test_episodes_that_advance_on_their_own_are_the_episodes_of_lock_step(env_server, tokenizer):
    # A policy whose reply depends on the context alone: login-user's scripted plan, with a 300 ms wait first in
    # every other episode, so that in those turns the others' browsers answer long before theirs.
    def policy(episodes) -> list[Reply]:
        calls.append(len(episodes))
        replies = []
        for episode in episodes:
            waits = ["noop(300)"] if len(episode.first_observation.goal) % 2 else []
            steps = waits + plan_of(episode).right
            replies.append(reply_of_text(tokenizer, steps[min(episode.turns, len(steps) - 1)]))
        return replies

    runs = {}
    for lockstep in (True, False):
        calls = []
        runner = EpisodeRunner(ServerPool([env_server.url]), tokenizer, EpisodeSettings(max_turns=5), lockstep=lockstep)
        try:
            episodes = runner.run([("login-user", seed) for seed in range(6)], policy)
        finally:
            runner.close()
        runs[lockstep] = (
            calls,
            [(e.prompt_ids, e.completion_ids, e.env_mask, e.actions, e.done, e.env_reward) for e in episodes],
        )

    (lockstep_calls, lockstep_episodes), (free_calls, free_episodes) = runs[True], runs[False]
    assert free_episodes == lockstep_episodes  # token for token, mask for mask, reward for reward
    assert all(done and reward == 1.0 for *_, done, reward in lockstep_episodes)
    assert len(lockstep_calls) == 4 < len(free_calls)  # one batch a turn, or batches of whoever was ready


def test_an_episode_goes_to_a_session_whose_page_holds_its_task(env_server, tokenizer):
    runner = EpisodeRunner(ServerPool([env_server.url]), tokenizer, EpisodeSettings(max_turns=1))
    try:
        runner.run(
            [("click-test", 1), ("click-test", 2), ("enter-text", 1), ("enter-text", 2)], following_plans(tokenizer)
        )
        swapped = runner.run(
            [("enter-text", 3), ("enter-text", 4), ("click-test", 3), ("click-test", 4)], following_plans(tokenizer)
        )
    finally:
        runner.close()
    assert [episode.first_observation.metadata["restarted_in_page"] for episode in swapped] == [True] * 4


def test_the_wait_before_each_observation_a_run_picks_reaches_the_server(env_server, tokenizer):
    def noops(episodes):
        ids = tokenizer.encode("noop(0)", add_special_tokens=False) + [tokenizer.eos_token_id]
        return [Reply(ids, [-1.0] * len(ids), True) for _ in episodes]

    runner = EpisodeRunner(ServerPool([env_server.url]), tokenizer, EpisodeSettings(max_turns=2, settle_ms=2000))
    try:
        start = time.perf_counter()
        (episode,) = runner.run([("click-test", 3)], noops)
        assert time.perf_counter() - start >= 4.0  # two steps of 2 s each; without the wait, about 1 s in all
    finally:
        runner.close()
    assert episode.actions == ["noop(0)", "noop(0)"]


def test_a_server_failing_while_an_episode_waits_for_the_next_batch_fails_the_run_and_generates_no_more(
    tokenizer, monkeypatch
):
    # The server dies while the policy writes the first turn's replies. Episode 1 writes no action, so it waits for
    # the next batch at once, while episode 0's step meets the dead server: the failure must reach the caller as
    # the environment's (a replay, not a crash), and the cancelled episode must not get a generation of its own.
    monkeypatch.setattr(rollout, "BATCH_WAIT_S", 60.0)  # the batch waits for episode 0 well past its failure
    calls = []
    with LocalEnvServer(max_sessions=2, server_args=["--browsers", "1"]) as server:

        def policy(episodes):
            calls.append([episode.seed for episode in episodes])
            os.killpg(server.pid, signal.SIGKILL)
            texts = {0: click_the_button(episodes[0].observation.axtree_txt), 1: "hello"}
            return [reply_of_text(tokenizer, texts[episode.seed]) for episode in episodes]

        runner = EpisodeRunner(ServerPool([server.url]), tokenizer, EpisodeSettings(max_turns=2))
        try:
            with pytest.raises(EnvironmentFailure, match=f"\\(server {server.url}\\)"):
                runner.run([("click-test", 0), ("click-test", 1)], policy)
        finally:
            runner.close()
    assert calls == [[0, 1]]


def test_an_evaluations_episodes_prefill_each_turn_only_past_their_last_and_reply_as_a_whole_prefill_does(
    env_server, tiny_model
):
    # evaluate.py's generation (cached_generate) against one batched generate a turn over the whole streams.
    model, tokenizer = load_policy(tiny_model)
    fed = []  # the tokens of each forward pass: a prefill, or one sampled token
    model.register_forward_pre_hook(lambda _, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    # Lock step: both episodes in every batch, so that the whole prefill's batches do not vary with the browsers.
    runner = EpisodeRunner(ServerPool([env_server.url]), tokenizer, EpisodeSettings(max_turns=3), lockstep=True)
    contexts = {}  # the contexts each episode was continued from, turn by turn

    def recording(generate):
        def policy(episodes):
            for episode in episodes:
                contexts.setdefault(episode.seed, []).append(episode.context())
            return model_policy(generate)(episodes)

        return policy

    instances = [("click-button", 0), ("click-button", 1)]  # two pages
    try:
        whole = runner.run(instances, recording(model_generate(model, tokenizer, 0, 8)))
        contexts.clear()
        fed.clear()
        cached = runner.run(instances, recording(cached_generate(model, tokenizer, 0, 8)))
    finally:
        runner.close()

    assert [e.completion_ids for e in cached] == [e.completion_ids for e in whole]
    assert [e.turns for e in cached] == [3, 3]  # the tiny model writes no action: each turn's stream grows
    # A turn's prefill starts where the episode's cache of its last turn ends: its last reply's final token (never
    # fed while sampling) and the new page; the first turn's is the whole prompt, less what both first prompts begin
    # with (the system prompt and the page's first lines), which is prefilled once.
    first_prompts = [turns[0] for turns in contexts.values()]
    shared = next(i for i, (a, b) in enumerate(zip(*first_prompts)) if a != b)
    assert shared > 100
    expected = shared
    for turns in contexts.values():
        expected += len(turns[0]) - shared
        for before, now in itertools.pairwise(turns):
            reply = 8  # the tiny model's replies run to max_new_tokens
            expected += len(now) - (len(before) + reply - 1)
    assert sum(n for n in fed if n > 1) == expected


def test_a_groups_identical_first_prompts_are_prefilled_once_and_reply_as_a_whole_prefill_does(tiny_model):
    model, tokenizer = load_policy(tiny_model)
    fed = []  # the tokens of each forward pass: a prefill, or one sampled token
    model.register_forward_pre_hook(lambda _, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    page = tokenizer.encode("<|im_start|>user\nthe same first page for the group's four episodes<|im_end|>\n")
    replies = cached_generate(model, tokenizer, 0, 8)([page] * 4)
    assert sum(n for n in fed if n > 1) == len(page) - 1  # once; each episode then feeds the last token itself
    (expected,) = model_generate(model, tokenizer, 0, 8)([page])
    for reply in replies:
        assert reply.ids == expected.ids and reply.logprobs == pytest.approx(expected.logprobs, abs=1e-4)


def test_each_context_goes_on_from_its_own_episodes_cache_in_whatever_order_the_episodes_come(tiny_model):
    model, tokenizer = load_policy(tiny_model)
    cached, whole = cached_generate(model, tokenizer, 0, 8), model_generate(model, tokenizer, 0, 8)
    contexts = [tokenizer.encode(f"<|im_start|>user\nepisode {i}: {'page ' * i}<|im_end|>\n") for i in range(3)]
    for _ in range(2):
        replies, expected = cached(contexts), whole(contexts)
        assert [r.ids for r in replies] == [r.ids for r in expected]
        # The tiny model's tokens barely depend on the context; their log-probabilities do.
        for reply, other in zip(replies, expected):
            assert reply.logprobs == pytest.approx(other.logprobs, abs=1e-4)
        # The next turn: each stream goes on (its reply, a page), and the episodes come back in another order.
        contexts = [c + r.ids + tokenizer.encode("<|im_start|>user\nnext page") for c, r in zip(contexts, replies)]
        contexts.reverse()
