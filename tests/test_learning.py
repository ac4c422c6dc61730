"""The learning benchmark's short version (GRPO must raise a weak policy's success rate on the real task),
and the bound on what LoRA can reach that chose the benchmark model's width."""

import json
import re
import subprocess
import sys

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from helpers import ROOT


def test_grpo_raises_the_success_rate_of_a_weak_policy(tmp_path):
    result = subprocess.run(
        [sys.executable, "bench/learning.py", "--quick", "--output_dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    before, after = results["starting policy"], results["GRPO, full"]
    assert 0.05 <= before["success_rate"] <= 0.45  # weak, but not hopeless: GRPO needs some successes
    assert after["success_rate"] >= before["success_rate"] + 0.1
    assert after["episodes"] == before["episodes"] == 48
    assert (tmp_path / "learning_curves.png").exists() and (tmp_path / "grpo-full" / "learning_curve.png").exists()


def test_the_lora_ceiling_bounds_what_lora_reaches_and_lora_gets_close(tiny_model, tokenizer):
    """bench/lora_ceiling.py's bound, against LoRA on every linear layer trained for nothing but that token."""
    printed = subprocess.run(
        [sys.executable, "bench/lora_ceiling.py", tiny_model, "--token", "click"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    bound = float(re.search(r"at most ([\d.]+)% on 'click'", printed).group(1)) / 100
    model = AutoModelForCausalLM.from_pretrained(tiny_model).requires_grad_(False)
    prompt = torch.tensor([tokenizer.encode("Goal: Click the button.")])
    click = tokenizer.encode("click", add_special_tokens=False)[0]
    assert bound < 0.05  # untrained and 64 wide: small, near-random embeddings leave every token far from certain
    assert torch.softmax(model(prompt).logits[0, -1], dim=-1)[click] < bound / 3

    model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear", lora_dropout=0.0))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(300):
        log_probs = torch.log_softmax(model(prompt).logits[0, -1], dim=-1)
        optimizer.zero_grad()
        (-log_probs[click]).backward()
        optimizer.step()
    reached = log_probs[click].exp().item()
    assert 0.9 * bound <= reached <= bound * 1.001
