"""Episodes through a real server: batched generation, token bookkeeping, and the trainer's view of them."""

import pytest
import torch

import train
from helpers import click_the_button, parse_config
from rollout import EpisodeRunner, Reply


def segments(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """Runs of equal mask value: [(mask value, token ids), ...]."""
    runs = []
    for token, bit in zip(ids, mask):
        if runs and runs[-1][0] == bit:
            runs[-1][1].append(token)
        else:
            runs.append((bit, [token]))
    return runs


def test_episodes_run_batched_and_record_exactly_what_the_policy_saw_and_wrote(env_server, tokenizer):
    # Episode 0 solves the task at once, episode 1 first writes no action, episode 2 never acts usefully,
    # episode 3's first reply is cut off by the length limit (no end-of-turn token) and is not acted on.
    scripts = [["CLICK"], ["hello", "CLICK"], ["noop(10)", "noop(10)", "noop(10)"], ["CUT CLICK", "CLICK"]]
    calls = []

    def scripted_policy(contexts):
        turn = len(calls)
        calls.append(contexts)
        running = [i for i, script in enumerate(scripts) if len(script) > turn]
        replies = []
        for i, context in zip(running, contexts):
            text = scripts[i][turn]
            ended = not text.startswith("CUT ")
            if text.endswith("CLICK"):
                text = click_the_button(tokenizer.decode(context))
            ids = tokenizer.encode(text, add_special_tokens=False) + ([tokenizer.eos_token_id] if ended else [])
            replies.append(Reply(ids, [-1.0] * len(ids), ended))
        return replies

    runner = EpisodeRunner(env_server.url, tokenizer, max_turns=3)
    try:
        episodes = runner.run([("click-test", 5)] * 4, scripted_policy)
    finally:
        runner.close()

    # One generation call per turn, over exactly the episodes still running.
    assert [len(c) for c in calls] == [4, 3, 1]
    assert [(e.done, e.env_reward, e.turns) for e in episodes] == [
        (True, 1.0, 1), (True, 1.0, 2), (False, 0.0, 3), (True, 1.0, 2)
    ]  # fmt: skip
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
    env_args, rollout_args, training_args, model_args = parse_config(
        "configs/smoke.yaml",
        *("--model_name_or_path", tiny_model, "--output_dir", str(tmp_path), "--env_url", env_server.url),
        *("--max_turns", "3", "--num_generations", "2", "--per_device_train_batch_size", "2"),
        *(["--use_peft"] if lora else []),
    )
    replies = []  # what the real generation returned, turn by turn

    def recording(make_generate):
        def make(trainer):
            generate = make_generate(trainer)

            def recorded(contexts):
                sampled = generate(contexts)
                replies.append([reply.ids for reply in sampled])
                return sampled

            return recorded

        return make

    monkeypatch.setattr(train, "transformers_generate", recording(train.transformers_generate))
    runner = EpisodeRunner(env_server.url, tokenizer, env_args.max_turns, env_args.max_page_chars)
    try:
        trainer = train.build_trainer(
            env_args, rollout_args, training_args, model_args, tokenizer, runner, recover=lambda: None
        )
        if lora:  # an adapter as after some updates: a fresh one (B = 0) changes nothing
            torch.manual_seed(0)
            with torch.no_grad():
                for name, param in trainer.model.named_parameters():
                    if "lora_B" in name:
                        param.normal_(0, 0.05)
        trainer.model.train()
        # The trainer's own path from dataset rows to the tensors its loss consumes.
        out = trainer._generate_and_score_completions([trainer.train_dataset[0]] * 2)
    finally:
        runner.close()

    completion_mask, env_mask = out["completion_mask"], out["tool_mask"]
    for row in range(2):
        length = int(completion_mask[row].sum())
        ids, mask = out["completion_ids"][row, :length].tolist(), env_mask[row, :length].tolist()
        runs = segments(ids, mask)
        # A random tiny model never solves click-test: every episode plays all 3 turns.
        assert [ids for bit, ids in runs if bit == 1] == [turn[row] for turn in replies]
        assert [bit for bit, _ in runs] == [1, 0, 1, 0, 1]

    input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    attention_mask = torch.cat([out["prompt_mask"], completion_mask], dim=1)
    with torch.no_grad():
        recomputed = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention_mask, out["completion_ids"].size(1)
        )[0]
    policy_tokens = (completion_mask * env_mask).bool()
    torch.testing.assert_close(recomputed[policy_tokens], out["sampling_per_token_logps"][policy_tokens], atol=1e-4, rtol=0)
    if lora:
        with torch.no_grad(), trainer.model.disable_adapter():
            base = trainer._get_per_token_logps_and_entropies(
                trainer.model, input_ids, attention_mask, out["completion_ids"].size(1)
            )[0]
        assert (base[policy_tokens] - recomputed[policy_tokens]).abs().max() > 0.1  # the adapter is in both
