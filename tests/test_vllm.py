"""The recipe's GPU shape, run here: TRL's GRPOTrainer with colocated vLLM generation, a real vLLM engine (its CPU
build) and the real environment server. Everything TRL does with the engine is TRL's own code; the one
difference from a GPU is that vLLM's CPU build keeps its weights as loaded
(generation.keep_vllm_cpu_weights_as_loaded).

The engine runs the tiny fp32 model in bf16 (vLLM's "auto" dtype downcasts fp32 checkpoints, and TRL does not
pass one), as the real recipe's engine runs bf16 against fp32 master weights. So its log-probabilities differ
from the trainer's by bf16 rounding, and how much depends on the token. On a near-certain token it is tiny: the
right reply's tokens before training differ by at most 0.022 (measured here with the CPU's vector units on and
off), and the tolerance is 0.05. The test's large learning rates can make those tokens unlikely within a step
(log-probabilities of -3 to -11 seen), where the difference reaches 0.03 to 0.08, so after a step the engine is
held to the weights of that step relative to how far the step moved them.
On a token sampled at middling probability it is the error of its logit itself: most are within 0.01, but one
in a hundred or so reaches 0.1 to 0.2 (0.19 on CI's machine, 0.14 here with the vector units off), so over
sampled episodes the test bounds the mean difference per token: 0.001 to 0.004 measured, tolerance 0.01,
against 5.8 that an unsynced LoRA adapter leaves and 0.24 to 0.79 that scoring each token one place off does.
"""

import logging
import os

import pytest
import torch
from transformers import AutoModelForCausalLM
from vllm import SamplingParams

import train
from browser_rl import generation
from browser_rl.rollout import model_policy
from helpers import (
    built_trainer,
    first_prompt,
    policy_turns,
    recomputed_logprobs,
    recorded_generation,
    scored_episodes,
    segments,
)
from warm_start.plans import plan

BF16_TOLERANCE = 0.05  # per-token log-probability of a near-certain token, engine (bf16) against trainer (fp32)
BF16_MEAN_TOLERANCE = 0.01  # the same, averaged over the tokens of sampled episodes; see above
VLLM = ("--use_vllm", "true", "--vllm_on_cpu", "true", "--vllm_mode", "colocate")

pytestmark = pytest.mark.slow  # a real vLLM engine in every test: 10 to 45 s each on two cores


@pytest.fixture(autouse=True)
def environment_restored():
    """TRL's colocated engine writes the variables of a one-process distributed group (RANK, WORLD_SIZE,
    MASTER_PORT, ...) into os.environ, and keeps its store on MASTER_PORT: a process a later test starts would
    inherit them, take itself for a rank, and fail to bind that port."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def small_cpu_kv_cache(monkeypatch):
    """vLLM's CPU engine sizes its KV cache as a share of the machine's memory (5 GiB of 17 here) less what the
    process already holds, which leaves nothing for a second engine in the same test process; 1 GiB is plenty."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")


def vllm_trainer(model, env_server, tokenizer, output_dir, *overrides):
    return built_trainer(
        tokenizer,
        env_server.url,
        *VLLM,
        *("--model_name_or_path", model, "--output_dir", str(output_dir)),
        *("--num_generations", "2", "--per_device_train_batch_size", "4", "--save_strategy", "no", *overrides),
    )


def engine_logprobs(trainer, ids: list[int]) -> torch.Tensor:
    """The engine's log-probability of each token of `ids` after the first."""
    (out,) = trainer.vllm_generation.llm.generate(
        [{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )
    return torch.tensor([position[token].logprob for position, token in zip(out.prompt_logprobs[1:], ids[1:])])


def trainer_logprobs(trainer, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "LoRA"])
def test_multi_turn_episodes_sampled_by_vllm_are_scored_against_the_context_they_were_sampled_from(
    half_right_model, env_server, tokenizer, tmp_path, monkeypatch, lora
):
    sampled = recorded_generation(monkeypatch, "vllm_generate")
    trainer, runner = vllm_trainer(
        half_right_model,
        env_server,
        tokenizer,
        tmp_path,
        "--max_turns",
        "3",
        "--per_device_train_batch_size",
        "2",
        *(["--use_peft"] if lora else []),
    )
    out = scored_episodes(trainer, runner, lora_std=0.3 if lora else None)  # the rollout syncs the adapter, merged

    # env_mask is 1 on exactly the tokens vLLM sampled, each run after the very context it was sampled from.
    turns = [turn for row in range(2) for turn in policy_turns(out, row)]
    assert sorted(turns) == sorted((context, reply.ids) for context, reply in sampled)
    for _, reply in sampled:
        assert reply.ended == (reply.ids[-1] in trainer.eos_token_ids)  # vLLM returns the end-of-turn token

    recomputed = recomputed_logprobs(trainer, out)
    policy_tokens = (out["completion_mask"] * out["tool_mask"]).bool()
    difference = (recomputed[policy_tokens] - out["sampling_per_token_logps"][policy_tokens]).abs()
    assert difference.mean() < BF16_MEAN_TOLERANCE, (difference.mean(), difference.max())
    if lora:  # the adapter is in the engine too, not only in the trainer
        with trainer.model.disable_adapter():
            base = recomputed_logprobs(trainer, out)
        without_adapter = (base[policy_tokens] - out["sampling_per_token_logps"][policy_tokens]).abs()
        assert without_adapter.mean() > 10 * BF16_MEAN_TOLERANCE


@pytest.mark.parametrize("lora", [False, True], ids=["full", "LoRA"])
def test_after_each_optimizer_step_vllm_samples_from_the_updated_weights(
    half_right_model, env_server, tokenizer, tmp_path, monkeypatch, lora
):
    # A fixed first page and its right reply; both sides score the reply's tokens at every rollout.
    page, prompt = first_prompt(env_server, tokenizer, "click-test", seed=0)
    reply = tokenizer.encode(plan("click-test", "", page.axtree_txt).right[0], add_special_tokens=False)
    sequence, scored = prompt + reply + [tokenizer.eos_token_id], len(reply) + 1
    engine, trainer_side = [], []

    def comparing(make_generate):
        def make(trainer):
            # By the time train.py asks for a generator, TRL has synced the weights of the last optimizer step.
            engine.append(engine_logprobs(trainer, sequence)[-scored:])
            trainer_side.append(trainer_logprobs(trainer, sequence)[-scored:])
            return make_generate(trainer)

        return make

    monkeypatch.setattr(generation, "vllm_generate", comparing(generation.vllm_generate))
    # Two groups of four episodes a step: with a policy right half the time, some group disagrees nearly always.
    trainer, runner = vllm_trainer(
        half_right_model,
        env_server,
        tokenizer,
        tmp_path,
        "--max_turns",
        "1",
        "--max_steps",
        "3",
        "--num_generations",
        "4",
        "--per_device_train_batch_size",
        "8",
        # LoRA's update starts from a zero B matrix, so it takes a higher rate to move as far in a step.
        "--learning_rate",
        "5e-2" if lora else "1e-2",
        "--lr_scheduler_type",
        "constant",
        *(["--use_peft"] if lora else []),
    )
    try:
        trainer.train()
    finally:
        runner.close()

    assert len(engine) == 3  # rollouts before step 1 and after steps 1 and 2
    # Before any step the right reply's tokens are near-certain, where bf16 rounding is small.
    assert (engine[0] - trainer_side[0]).abs().max() < BF16_TOLERANCE
    # A step can make them unlikely, where bf16's error grows with the token's distance from the top (0.08 seen at
    # a log-probability of -7.7), so after each step the engine must be far nearer the weights of that step than
    # the weights before it, which an engine that missed the step's sync would still hold.
    for step in (1, 2):
        to_this_step = (engine[step] - trainer_side[step]).abs().max()
        to_the_step_before = (engine[step] - trainer_side[step - 1]).abs().max()
        assert to_this_step < to_the_step_before / 4, (step, to_this_step, to_the_step_before)


def test_a_reply_cut_off_by_the_length_limit_is_never_acted_on(half_right_model, env_server, tokenizer, tmp_path):
    # Room for the right action, click('13'), but not for the end-of-turn token after it: vLLM stops every reply
    # at the limit, and the right action, written in full, must still not be taken.
    right = tokenizer.encode("click('13')", add_special_tokens=False)
    trainer, runner = vllm_trainer(
        half_right_model,
        env_server,
        tokenizer,
        tmp_path,
        "--max_turns",
        "2",
        "--max_completion_length",
        str(len(right)),
    )
    try:
        episodes = runner.run([("click-test", 0)] * 4, model_policy(generation.vllm_generate(trainer)))
    finally:
        runner.close()
    replies = [tokens for episode in episodes for tokens in reply_tokens(episode)]
    assert right in replies  # the policy wrote the right action at least once...
    assert all(len(tokens) == len(right) and not set(tokens) & set(trainer.eos_token_ids) for tokens in replies)
    for episode in episodes:  # ...and no action was taken
        assert episode.actions == [None, None] and not episode.done and not episode.solved
        assert "Your reply was cut off before it ended" in tokenizer.decode(episode.completion_ids)


def test_replies_end_on_every_token_trl_stops_on_not_only_the_tokenizers_eos(
    half_right_model, env_server, tokenizer, tmp_path, monkeypatch
):
    # A model that declares a second end-of-turn id, the first token of "click" (which every reply of this
    # model starts with): vLLM and TRL both stop on it, and so must the rule for cut-off replies.
    model = AutoModelForCausalLM.from_pretrained(half_right_model)
    click = tokenizer.encode("click", add_special_tokens=False)[0]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, click]
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    sampled = recorded_generation(monkeypatch, "vllm_generate")
    trainer, runner = vllm_trainer(str(tmp_path / "model"), env_server, tokenizer, tmp_path / "run", "--max_turns", "2")
    try:
        assert trainer.eos_token_ids == [tokenizer.eos_token_id, click]
        episodes = runner.run([("click-test", 0)] * 4, model_policy(generation.vllm_generate(trainer)))
    finally:
        runner.close()
    assert sampled and all(reply.ids == [click] and reply.ended for _, reply in sampled)
    assert all(
        episode.turns == 2 and "no valid action" in tokenizer.decode(episode.completion_ids) for episode in episodes
    )


def test_an_episode_that_outgrows_the_engines_length_ends_unsolved_and_the_run_goes_on(
    half_right_model, env_server, tokenizer, tmp_path, caplog
):
    # Room for the first page and a reply, not for a second page: every episode that does not solve the task at
    # once ends at its second turn, unsolved, instead of the engine refusing the whole batch. A small learning
    # rate keeps the half-right policy about half right at step 2, and 8 episodes a step make it all but certain
    # that each step has such episodes (with 4, step 2 solved them all in two of a few runs here).
    first_prompt_tokens = len(first_prompt(env_server, tokenizer, "click-test", seed=0)[1])
    trainer, runner = vllm_trainer(
        half_right_model,
        env_server,
        tokenizer,
        tmp_path,
        "--max_turns",
        "3",
        "--max_steps",
        "2",
        "--vllm_max_model_length",
        str(first_prompt_tokens + 40),
        "--learning_rate",
        "1e-4",
        "--per_device_train_batch_size",
        "8",
    )
    try:
        with caplog.at_level(logging.WARNING, logger="rollout"):
            trainer.train()
    finally:
        runner.close()
    assert train.longest_context(trainer) == first_prompt_tokens + 40 - trainer.max_completion_length
    assert "ends unsolved after 1 turns: its context of" in caplog.text
    logged = [entry for entry in trainer.state.log_history if "episodes/out_of_context_share" in entry]
    assert len(logged) == 2 and all(entry["episodes/out_of_context_share"] > 0 for entry in logged)
    assert all(entry["episodes/success_rate"] == entry["reward"] for entry in logged)


def reply_tokens(episode) -> list[list[int]]:
    return [tokens for bit, tokens in segments(episode.completion_ids, episode.env_mask) if bit == 1]
