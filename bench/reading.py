"""Can the tiny LFM2 learn to read the page at all? The question under the learning benchmark's start.

    python bench/reading.py                                 # about 40 minutes on 2 cores
    python bench/reading.py --start MODEL --rounds 1        # from a given model (bench/copying.py's)

GRPO can only sharpen what its starting policy already does some of the time: a policy that reads the goal and
the page and picks the right element a third of the time improves, one that guesses does not. So before asking
GRPO to teach reading, ask whether supervision can: each model here is fine-tuned (warm_up.fine_tune) on the
right action only, the most any warm-up can show it, of every turn of scripted episodes of the six page-reading
tasks (64 instances each, as the benchmark's warm-up). Then, on the turns of held-out instances (the seeds
evaluate.py uses) and on training ones, the probability it gives the right action and the plan's wrong one of
the same shape (teacher-forced, the whole reply). A model that reads puts its mass on the right one on held-out
pages; one that does not splits it between right and wrong alike, or learns the training pages by heart.
The benchmark's 256-wide model, four layers deep (two of them attention), with a tokenizer that holds MiniWoB's
names, words and element ids whole (tiny_lfm2.py's `miniwob_vocabulary`), trained in three rounds, each
evaluated. `--start` measures from a given model of that tokenizer instead of a random one.
"""

import argparse
import json
import logging
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from env_client import LocalEnvServer
from metrics import setup_logging
from scripted_policy import Plan
from tasks import PRESETS
from tiny_lfm2 import build_tiny_lfm2, build_tokenizer
from warm_up import fine_tune, right_only, scripted_turns, warm_up_dataset

log = logging.getLogger("reading")

TASKS = PRESETS["page-reading"]
WIDTH = 256
LAYERS, ROUNDS = 4, 3  # rounds of STEPS steps, each evaluated, each going on from the one before
TRAIN_SEEDS = range(64)
HELD_OUT_SEEDS = range(1_000_000, 1_000_016)  # evaluate.py's first held-out seeds
STEPS, BATCH_SIZE, LEARNING_RATE = 120, 16, 1e-3  # a round: 3 passes over the 640 turns
SPLITS = ("held-out", "training")


def reply_probability(model, tokenizer, context: list[int], reply: str) -> float:
    """The probability the model writes `reply` (and ends its turn) after `context`."""
    completion = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
    with torch.no_grad():
        logits = model(torch.tensor([context + completion])).logits[0, len(context) - 1 : -1]
    return logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None]).sum().exp().item()


def right_and_wrong(model, tokenizer, turns: list[tuple[list[int], Plan, int]]) -> dict[int, dict]:
    """For each step of the plans: the mean probability of the right action and of the plan's wrong one."""
    by_step = {}
    for step in sorted({step for _, _, step in turns}):
        at_step = [(context, plan) for context, plan, s in turns if s == step]
        right = [reply_probability(model, tokenizer, context, plan.right[step]) for context, plan in at_step]
        wrong = [reply_probability(model, tokenizer, context, plan.wrong[step]) for context, plan in at_step]
        by_step[step] = {"right": sum(right) / len(right), "wrong": sum(wrong) / len(wrong), "turns": len(at_step)}
    return by_step


def table(results: dict) -> str:
    def row(label: str, cells: list[str]) -> str:
        return f"{label:<26}" + "".join(f"{cell:>22}" for cell in cells)

    lines = []
    for split in SPLITS:
        lines.append(row(f"{split} pages", list(results)))
        for task, by_step in next(iter(results.values()))[split].items():
            for step in by_step:
                label = task if len(by_step) == 1 else f"{task}, action {step + 1}"
                cells = [r[split][task][step] for r in results.values()]
                lines.append(row(label, [f"{cell['right']:.2f} / {cell['wrong']:.2f}" for cell in cells]))
    lines.append(row("SFT wall", [f"{r['sft_seconds'] / 60:.1f} min" for r in results.values()]))
    return "\n".join(lines)


def main(start: str | None, rounds: int, out: Path) -> None:
    results = {}
    tokenizer = build_tokenizer(miniwob_vocabulary=True)  # the models' own, built the same way
    if start and AutoTokenizer.from_pretrained(start).get_vocab() != tokenizer.get_vocab():
        raise SystemExit(f"{start}: its tokenizer is not tiny_lfm2.py's miniwob_vocabulary one, which the turns use")
    with LocalEnvServer(TASKS[0], max_sessions=16) as server:
        dataset = warm_up_dataset(server.url, tokenizer, TASKS, right_only, len(TRAIN_SEEDS))
        turns = {
            split: {task: scripted_turns(server.url, tokenizer, task, seeds) for task in TASKS}
            for split, seeds in zip(SPLITS, (HELD_OUT_SEEDS, TRAIN_SEEDS[:16]))
        }
    model_dir = start or str(build_tiny_lfm2(out / f"base-{LAYERS}", WIDTH, LAYERS, miniwob_vocabulary=True))
    seconds = 0.0
    for steps in range(STEPS, (rounds + 1) * STEPS, STEPS):
        began = time.perf_counter()
        model_dir = fine_tune(model_dir, out / f"sft-{steps}", dataset, STEPS, BATCH_SIZE, LEARNING_RATE)
        seconds += time.perf_counter() - began
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        results[f"{steps} steps"] = {"sft_seconds": seconds} | {
            split: {task: right_and_wrong(model, tokenizer, task_turns) for task, task_turns in by_task.items()}
            for split, by_task in turns.items()
        }
        log.info("%s steps done:\n%s", steps, table(results))
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nSFT on the right actions of {len(dataset)} turns, in steps of {BATCH_SIZE}; the mean probability of the")
    print(f"right action / the plan's wrong one, over the turns of {len(HELD_OUT_SEEDS)} instances per task:")
    print(table(results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--start", help="a model with tiny_lfm2.py's miniwob_vocabulary tokenizer; default: a random one"
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--output_dir", default="outputs/reading")
    args = parser.parse_args()
    setup_logging()
    main(args.start, args.rounds, Path(args.output_dir))
