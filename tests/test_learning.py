"""The learning benchmark's short version (GRPO must raise a weak policy's success rate on the real task), the
supervised fine-tuning its warm-ups use, and the synthetic text (warm_start/copying_text.py) from which the full
benchmark's model learns to copy."""

import json
import random
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from browser_rl.episode_settings import DEFAULTS
from browser_rl.options import ModelOptions
from helpers import ROOT
from warm_start.copying_text import SKILLS, accuracy
from warm_start.copying_text import tokenizer as copying_tokenizer
from warm_start.tiny_lfm2 import build_tiny_lfm2, build_tokenizer, miniwob_words
from warm_start.warm_up import fine_tune
from warm_start.weak_starts import weak_start_config


@pytest.mark.slow
def test_grpo_raises_the_success_rate_of_a_weak_policy(tmp_path):
    result = subprocess.run(
        [sys.executable, "bench/learning.py", "--quick", "--output_dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    before, after = results["starting policy"], results["GRPO, full"]
    assert 0.05 <= before["success_rate"] <= 0.45  # weak, but not hopeless: GRPO needs some successes
    assert after["success_rate"] >= before["success_rate"] + 0.1
    assert after["episodes"] == before["episodes"] == 48
    assert (tmp_path / "learning_curves.png").exists() and (tmp_path / "grpo-full" / "learning_curve.png").exists()


def reply_probability(model, tokenizer, context: list[int], reply: str) -> float:
    """The probability the model writes `reply` (and ends its turn) after `context`."""
    completion = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
    with torch.no_grad():
        logits = model(torch.tensor([context + completion])).logits[0, len(context) - 1 : -1]
    return logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None]).sum().exp().item()


def test_fine_tuned_on_one_reply_a_model_gives_it_nearly_all_its_probability(tiny_model, tokenizer, tmp_path):
    """warm_start.warm_up.fine_tune, the warm-ups' supervised step, after it has shown the model one reply again and
    again."""
    prompt = [{"role": "user", "content": "Goal: Click the button.\n\nPage:\n[13] button 'OK'"}]
    context = tokenizer.encode(
        tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )
    completion = tokenizer.encode("click('13')", add_special_tokens=False) + [tokenizer.eos_token_id]
    dataset = Dataset.from_dict(
        {"input_ids": [context + completion] * 8, "completion_mask": [[0] * len(context) + [1] * len(completion)] * 8}
    )
    untrained = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert reply_probability(untrained, tokenizer, context, "click('13')") < 1e-6  # a dozen tokens of about 600

    config = weak_start_config(tmp_path, 40, 4, 3e-3)
    trained = AutoModelForCausalLM.from_pretrained(
        fine_tune(ModelOptions(model_name_or_path=tiny_model), config, dataset, DEFAULTS)
    )
    assert reply_probability(trained, tokenizer, context, "click('13')") > 0.8
    assert reply_probability(trained, tokenizer, context, "click('14')") < 0.05
    assert reply_probability(trained, tokenizer, context, "click('13') now") < 0.05  # the turn must end there


def test_deeper_tiny_models_alternate_convolution_and_attention_with_the_same_tokenizer(tokenizer, tmp_path):
    config = AutoModelForCausalLM.from_pretrained(build_tiny_lfm2(tmp_path, layers=4)).config
    assert config.layer_types == ["conv", "full_attention", "conv", "full_attention"]
    assert AutoTokenizer.from_pretrained(tmp_path).get_vocab() == tokenizer.get_vocab()


def test_the_tiny_tokenizer_with_miniwob_vocabulary_holds_names_words_and_element_ids_whole(tokenizer):
    """So that copying a name or an id into a reply, or matching a label to the goal, is one token's work."""
    assert len(tokenizer.encode("cierra", add_special_tokens=False)) > 1  # the default tokenizer's letters
    tokenizer = build_tokenizer(miniwob_vocabulary=True)
    for text in ["Myron", "cierra", "faucibus", "Faucibus", "13", "187"]:
        assert len(tokenizer.encode(text, add_special_tokens=False)) == 1, text
    in_a_reply = tokenizer.encode("fill('14', 'cierra')", add_special_tokens=False)
    assert {"14", "cierra"} <= {tokenizer.decode([token]) for token in in_a_reply}


def test_copying_supervises_exactly_the_tokens_that_can_only_be_copied():
    """The synthetic copying text: the supervised tokens of each skill are the answer, and nothing else."""
    rng = random.Random(0)
    quoted = []
    for _ in range(20):
        tokens, supervised = SKILLS["repeat"](rng)
        answer = [t for t, s in zip(tokens, supervised) if s]
        assert (
            tokens[1 : 1 + len(answer)] == answer
            and tokens[-len(answer) :] == answer
            and not supervised[-len(answer) - 1]
        )

        tokens, supervised = SKILLS["quote"](rng)
        said = re.findall(r"Say \"([^\"]+)\": '", copying_tokenizer().decode(tokens))
        spans = [copying_tokenizer().decode(tokens[i : i + n]) for i, n in supervised_spans(supervised)]
        assert spans == said
        quoted += said

        tokens, supervised = SKILLS["lookup"](rng)
        text = copying_tokenizer().decode(tokens)
        ids = {label: bid for bid, label in re.findall(r"\[(\d+)\] \w+ '([^']+)'", text)}
        asked = re.findall(r"Click \"([^\"]+)\": click\('", text)
        answers = [copying_tokenizer().decode(tokens[i : i + n]) for i, n in supervised_spans(supervised)]
        assert len(asked) >= 2 and answers == [ids[label] for label in asked]
    words = set(miniwob_words())
    passwords = [text for text in quoted if not set(text.split()) <= words]
    assert 0.2 < len(passwords) / len(quoted) < 0.5 and all(re.fullmatch("[A-Za-z0-9]{2,6}", p) for p in passwords)


def test_copying_accuracy_scores_each_supervised_token_against_the_prediction_before_it():
    examples = [SKILLS["lookup"](random.Random(seed)) for seed in range(3)]

    class Oracle(torch.nn.Module):
        """Predicts token t+1 at position t, plus `shift` places."""

        def __init__(self, shift: int):
            super().__init__()
            self.shift = shift

        def forward(self, input_ids, attention_mask):
            following = torch.roll(input_ids, -1 - self.shift, dims=1)
            return SimpleNamespace(logits=torch.nn.functional.one_hot(following, len(copying_tokenizer())).float())

    assert accuracy(Oracle(0), examples) == 1.0
    assert accuracy(Oracle(1), examples) < 0.1


def supervised_spans(supervised: list[bool]) -> list[tuple[int, int]]:
    """(start, length) of each run of supervised tokens."""
    spans, start = [], None
    for i, s in enumerate(supervised + [False]):
        if s and start is None:
            start = i
        elif not s and start is not None:
            spans.append((start, i - start))
            start = None
    return spans
