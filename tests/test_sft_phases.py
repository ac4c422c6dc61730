"""SFT phases during GRPO (browser_rl/sft_phases.py): when a phase begins, what it trains on, and a run with phases
that resumes from a checkpoint inside a phase and ends bit-identical to the run that was not interrupted."""

import json
import re
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from browser_rl.metrics import METRICS_FILE, read_metrics
from browser_rl.sft_phases import STATE_FILE, SftPhases, reply_loss
from helpers import RESUMABLE_WITH_PHASES, built_trainer, click_the_button, train_here, weights


def phases(**settings) -> SftPhases:
    defaults = {"steps": 2, "every": 0, "entropy_below": 0.0, "buffer_size": 4, "episodes_per_step": 2}
    return SftPhases(**defaults | settings)


def test_a_phase_begins_every_n_grpo_steps_once_the_buffer_holds_a_steps_episodes():
    state = phases(every=2)
    state.grpo_step_done(1.0)
    state.grpo_step_done(1.0)
    assert not state.in_phase(2)  # due, but the buffer is empty
    state.keep([([1, 2], [0, 1])])
    assert not state.in_phase(2)
    state.keep([([3, 4], [0, 1]), ([5, 6], [0, 1])])
    assert [state.in_phase(step) for step in (2, 3)] == [True, True] and state.phases == 1
    assert not state.in_phase(4)  # two steps a phase, then GRPO
    state.grpo_step_done(1.0)
    assert not state.in_phase(5)


def test_a_phase_begins_when_a_grpo_steps_entropy_falls_below_the_threshold():
    state = phases(entropy_below=0.5)
    state.keep([([1, 2], [0, 1])] * 4)
    state.grpo_step_done(0.6)
    assert not state.in_phase(1)
    state.grpo_step_done(0.4)
    assert state.in_phase(2) and state.in_phase(3) and state.phases == 1
    # The entropy that began a phase does not begin another: the next one waits for a GRPO step's own.
    assert not state.in_phase(4)


def test_the_buffer_keeps_the_latest_successes_and_a_step_draws_from_the_step_number_alone():
    state = phases(buffer_size=3)
    state.keep([([i], [1]) for i in range(5)])
    assert state.buffer == [([2], [1]), ([3], [1]), ([4], [1])]
    drawn = [state.episodes(7, 0, rank, per_rank=1) for rank in (0, 1)]
    assert drawn == [state.episodes(7, 0, rank, per_rank=1) for rank in (0, 1)]
    assert drawn[0] != drawn[1]  # each rank its own share, without replacement
    # Another step, or another micro-batch of the step, draws other episodes.
    state = phases(buffer_size=20)
    state.keep([([i], [1]) for i in range(20)])
    assert state.episodes(7, 0, 0, per_rank=2) not in (
        state.episodes(8, 0, 0, per_rank=2),
        state.episodes(7, 1, 0, per_rank=2),
    )


def test_the_phase_loss_is_the_reply_tokens_likelihood_with_logits_taken_only_where_needed(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    episodes = [([1, 5, 6, 7, 8, 9, 10, 11], [0, 0, 0, 1, 1, 0, 1, 1]), ([1, 12, 13, 14, 15], [0, 0, 1, 1, 0])]
    loss, entropy = reply_loss(model, episodes, pad_token_id=0)
    ids = torch.tensor([ids + [0] * (8 - len(ids)) for ids, _ in episodes])
    attention = torch.tensor([[1] * len(ids) + [0] * (8 - len(ids)) for ids, _ in episodes])
    replies = torch.tensor([mask + [0] * (8 - len(mask)) for _, mask in episodes]).bool()[:, 1:]
    with torch.no_grad():
        logprobs = model(input_ids=ids, attention_mask=attention).logits[:, :-1].log_softmax(-1)
    expected = -logprobs.gather(-1, ids[:, 1:, None]).squeeze(-1)[replies].mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert entropy == pytest.approx((-(logprobs.exp() * logprobs).sum(-1))[replies].mean().item(), rel=1e-5)


def buffered_episodes(tokenizer) -> list[tuple[list[int], list[int]]]:
    """Six episodes as a run buffers them: a page's prompt, then the reply the policy wrote (the loss's tokens)."""
    episodes = []
    for bid in range(6):
        page = [{"role": "user", "content": f"Page: button 'Submit' [{bid + 10}]. Reply with one action."}]
        prompt = tokenizer.encode(
            tokenizer.apply_chat_template(page, tokenize=False, add_generation_prompt=True), add_special_tokens=False
        )
        reply = tokenizer.encode(f"click('{bid + 10}')<|im_end|>", add_special_tokens=False)
        episodes.append((prompt + reply, [0] * len(prompt) + [1] * len(reply)))
    return episodes


class FirstStepGradients(TrainerCallback):
    """The gradient an optimizer step is about to apply, at the run's first step."""

    def __init__(self):
        self.gradients = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            self.gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_a_phase_step_under_gradient_accumulation_descends_the_reply_loss_of_its_episodes(
    env_server, tiny_model, tokenizer, tmp_path
):
    trainer, runner = built_trainer(
        tokenizer,
        env_server.url,
        *("--model_name_or_path", tiny_model, "--output_dir", str(tmp_path), "--save_strategy", "no"),
        *("--num_generations", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2"),
        *("--max_steps", "2", "--sft_phase_steps", "2", "--sft_phase_every", "1", "--max_grad_norm", "0"),
    )
    episodes = buffered_episodes(tokenizer)
    trainer.phases.keep(episodes)
    trainer.phases.grpo_step_done(None)  # a phase is due: both steps are phase steps, and no episode is played
    initial = AutoModelForCausalLM.from_pretrained(tiny_model)  # the weights the run starts from
    gradients = FirstStepGradients()
    trainer.add_callback(gradients)
    try:
        trainer.train()
    finally:
        runner.close()

    # The first step's gradient is the mean of its two micro-batches' reply-loss gradients, each on its own draw.
    for micro_batch in (0, 1):
        drawn = trainer.phases.episodes(0, micro_batch, rank=0, per_rank=2)
        (reply_loss(initial, drawn, tokenizer.pad_token_id)[0] / 2).backward()
    expected = {name: p.grad for name, p in initial.named_parameters() if p.grad is not None}
    assert expected.keys() == gradients.gradients.keys()
    for name, gradient in expected.items():
        torch.testing.assert_close(gradients.gradients[name], gradient, rtol=1e-4, atol=1e-6)
    # The phase's two steps lowered the loss on the episodes it trained on (measured: 6.31 to 5.88 nats).
    before = reply_loss(initial, episodes, tokenizer.pad_token_id)[0].item()
    after = reply_loss(trainer.model, episodes, tokenizer.pad_token_id)[0].item()
    assert before - after > 0.2, (before, after)
    assert [row["sft_phase/number"] for row in trainer.state.log_history if "sft_phase/number" in row] == [1, 1]


@pytest.mark.slow
def test_a_phase_trains_on_the_runs_successes_and_is_logged(uninterrupted_run, tiny_model):
    """On conftest's uninterrupted run (RESUMABLE_WITH_PHASES), which test_modal_app.py also kills and resumes."""
    output_dir, log = uninterrupted_run, (uninterrupted_run / "run.log").read_text()
    rows = read_metrics(output_dir / METRICS_FILE)
    phase_steps = [row["step"] for row in rows if "sft_phase/loss" in row]
    grpo_steps = [row["step"] for row in rows if "reward" in row]
    assert phase_steps and len(phase_steps) + len(grpo_steps) == 5
    first_phase = phase_steps[0]
    assert grpo_steps[:2] == [1, 2] and phase_steps[:2] == [first_phase, first_phase + 1]
    assert re.search(rf"step {first_phase}/5 \| SFT phase 1 on \d+ successful episodes \| loss", log)
    # The buffer at the phase's first step holds every success of the GRPO steps before it, and nothing else.
    before = [row for row in rows if row["step"] < first_phase and "reward" in row]
    solved_before = sum(round(8 * row["episodes/success_rate"]) for row in before)
    state = json.loads((output_dir / f"checkpoint-{first_phase}" / STATE_FILE).read_text())
    assert len(state["buffer"]) == solved_before >= 8 and state["phases"] == 1
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    for ids, mask in state["buffer"]:
        reply = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m], skip_special_tokens=True)
        assert reply == click_the_button(tokenizer.decode(ids[: mask.index(1)]))
    # The phase moved the weights, as a step of the trainer (its optimizer, its step count).
    ahead, behind = (
        weights(output_dir / f"checkpoint-{first_phase}"),
        weights(output_dir / f"checkpoint-{first_phase - 1}"),
    )
    assert any(not torch.equal(behind[name], ahead[name]) for name in ahead)


@pytest.mark.slow
def test_a_run_resumed_inside_a_phase_plays_only_the_remaining_steps_and_ends_bit_identical(
    uninterrupted_run, half_right_model, tmp_path
):
    uninterrupted = uninterrupted_run
    rows = read_metrics(uninterrupted / METRICS_FILE)
    inside = next(row["step"] for row in rows if "sft_phase/loss" in row)  # after a phase's first step
    checkpoint = tmp_path / f"checkpoint-{inside}"
    shutil.copytree(uninterrupted / f"checkpoint-{inside}", checkpoint)
    state = json.loads((checkpoint / STATE_FILE).read_text())
    assert state["phase_end"] > inside  # the phase is not over at this checkpoint
    log = train_here(half_right_model, tmp_path, *RESUMABLE_WITH_PHASES, "--resume_from_checkpoint", str(checkpoint))
    played = re.findall(r"step (\d)/5 \|", log)
    assert played == [str(step) for step in range(inside + 1, 6)]  # the rest of the phase, then GRPO
    resumed, whole = weights(tmp_path), weights(uninterrupted)
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)
