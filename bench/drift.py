"""Where training moved a policy away from its demonstrations: for each task and turn, the probability each model
gives the demonstrated reply and its first token (the action's name), models side by side (docs/real_model.md, the
train split's GRPO runs).

    python bench/drift.py --demonstrations outputs/demonstrations/smollm2_browsergym_train.jsonl \\
        --models outputs/real/browsergym-train-warm-up outputs/real/grpo-bgtrain-balanced-3 \\
        --tasks enter-password login-user

Each demonstration is rendered token for token as the warm-up trained on it (warm_start.demonstrations.replay, with
the episode settings it was recorded with) and scored by one forward pass of each model. A turn's figure is the mean,
over the task's demonstrations, of exp(the sum of the reply's token log-probabilities): the chance that sampling at
temperature 1 writes that reply exactly; and of its first token's probability, which chooses between, say, `fill` and
`click`. Greedy decoding writes the reply where each of its tokens is the most likely one; these figures show how
close those choices are, and which way training moved them.
"""

import argparse
from collections import defaultdict

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from browser_rl.prompts import ChatTurns
from warm_start.demonstrations import load, made_with, reply_probabilities


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demonstrations", required=True, help="a warm_start.record file, the warm-up's")
    parser.add_argument("--models", nargs="+", required=True, help="model directories, the warm-up's first")
    parser.add_argument("--tasks", nargs="*", default=[], help="only these tasks' demonstrations (default: all)")
    args = parser.parse_args()
    demonstrations = [d for d in load(args.demonstrations) if not args.tasks or d.task in args.tasks]
    settings = made_with(demonstrations, args.demonstrations)
    max_page_chars = settings.max_page_chars if settings else None
    figures = {}  # model -> (task, turn) -> [(reply, first token)]
    for path in args.models:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        chat = ChatTurns(AutoTokenizer.from_pretrained(path), max_page_chars)
        figures[path] = defaultdict(list)
        for demonstration in demonstrations:
            for turn, probabilities in enumerate(reply_probabilities(model, chat, demonstration), 1):
                figures[path][demonstration.task, turn].append(probabilities)
        print(f"scored {len(demonstrations)} demonstrations with {path}", flush=True)
    print("task, turn, the demonstrated reply (first episode's): P(reply) / P(first token), mean over the episodes")
    print("models: " + " | ".join(args.models))
    first_reply = {}
    for demonstration in demonstrations:
        for turn, t in enumerate(demonstration.turns, 1):
            first_reply.setdefault((demonstration.task, turn), t.reply)
    for key in sorted(figures[args.models[0]]):
        cells = []
        for path in args.models:
            pairs = figures[path][key]
            cells.append(f"{sum(p for p, _ in pairs) / len(pairs):.2f} / {sum(f for _, f in pairs) / len(pairs):.2f}")
        print(f"{key[0]} turn {key[1]} {first_reply[key]!r} (n={len(pairs)}): " + " | ".join(cells))


if __name__ == "__main__":
    main()
