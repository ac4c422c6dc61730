"""How much probability LoRA can ever put on one token, when it leaves the output layer and final norm frozen.

    python bench/lora_ceiling.py outputs/learning/warm-up [MODEL ...] [--token click]

LoRA adapts the layers below the final norm, so the most it can do is choose the hidden state that
enters that norm. The norm scales any hidden state to the same length before the frozen (here tied)
output layer scores it, which bounds how far one token's logit can stand above the other thousand. This
finds that bound by gradient ascent on a free hidden state. It is why the click-test benchmark's tiny LFM2
was 512 wide: the bound for click-test's right first token is about 51% at 64 wide and 99% at 512.
"""

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def ceiling(model, token_id: int, steps: int = 2000) -> float:
    """The highest probability of `token_id` over every input the final norm can receive."""
    norm, output_layer = model.model.embedding_norm, model.get_output_embeddings()
    hidden = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(0), requires_grad=True)
    optimizer = torch.optim.Adam([hidden], lr=0.05)
    for _ in range(steps):
        log_probs = torch.log_softmax(output_layer(norm(hidden)), dim=-1)
        optimizer.zero_grad()
        (-log_probs[token_id]).backward()
        optimizer.step()
    return log_probs[token_id].exp().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--token", default="click", help="text whose first token is scored")
    args = parser.parse_args()
    for path in args.models:
        model = AutoModelForCausalLM.from_pretrained(path).requires_grad_(False)
        token_id = AutoTokenizer.from_pretrained(path).encode(args.token, add_special_tokens=False)[0]
        bound = ceiling(model, token_id)
        print(f"{path}: {model.config.hidden_size} wide, at most {100 * bound:.4g}% on {args.token!r}")


if __name__ == "__main__":
    main()
