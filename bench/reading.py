"""Can the tiny LFM2 learn to read the page at all? The question under the learning benchmark's start.

    python bench/reading.py     # about 45 minutes on 2 cores

GRPO can only sharpen what its starting policy already does some of the time: a policy that reads the goal and
the page and picks the right element a third of the time improves, one that guesses does not. So before asking
GRPO to teach reading, ask whether supervision can: each model here is fine-tuned (warm_up.fine_tune) on the
right action only, the most any warm-up can show it, of every turn of scripted episodes of the six page-reading
tasks (64 instances each, as the benchmark's warm-up). Then, on the turns of held-out instances (the seeds
evaluate.py uses) and on training ones, the probability it gives the right action and the plan's wrong one of
the same shape (teacher-forced, the whole reply). A model that reads puts its mass on the right one on held-out
pages; one that does not splits it between right and wrong alike, or learns the training pages by heart.
Two depths of the benchmark's 256-wide model: its own two layers (one attention) and four (two attention).
"""

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
from tiny_lfm2 import build_tiny_lfm2
from warm_up import fine_tune, scripted_turns, warm_up_dataset

log = logging.getLogger("reading")

TASKS = PRESETS["page-reading"]
WIDTH = 256
DEPTHS = [2, 4]
TRAIN_SEEDS = range(64)
HELD_OUT_SEEDS = range(1_000_000, 1_000_016)  # evaluate.py's first held-out seeds
STEPS, BATCH_SIZE, LEARNING_RATE = 120, 16, 1e-3  # 3 passes over the 640 turns


def right_only(plan: Plan, step: int) -> list[str]:
    return [plan.right[step]]


def reply_probability(model, tokenizer, context: list[int], reply: str) -> float:
    """The probability the model writes `reply` (and ends its turn) after `context`."""
    completion = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
    with torch.no_grad():
        logits = model(torch.tensor([context + completion])).logits[0, len(context) - 1 : -1]
    return logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None]).sum().exp().item()


def right_and_wrong(model_dir: str, turns: list[tuple[list[int], Plan, int]]) -> dict[str, float]:
    """The mean probability of each turn's right action and of its plan's wrong one."""
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)
    right = [reply_probability(model, tokenizer, context, plan.right[step]) for context, plan, step in turns]
    wrong = [reply_probability(model, tokenizer, context, plan.wrong[step]) for context, plan, step in turns]
    return {"right": sum(right) / len(right), "wrong": sum(wrong) / len(wrong), "turns": len(turns)}


def table(results: dict) -> str:
    header = f"{'p(right) / p(wrong)':<16}" + "".join(
        f"{f'{name}, held-out':>24}{f'{name}, training':>24}" for name in results
    )
    lines = [header]
    for task in TASKS:
        cells = [
            f"{r[split][task]['right']:.2f} / {r[split][task]['wrong']:.2f}"
            for r in results.values()
            for split in ("held-out", "training")
        ]
        lines.append(f"{task:<16}" + "".join(f"{cell:>24}" for cell in cells))
    lines.append(f"{'SFT wall':<16}" + "".join(f"{r['sft_seconds'] / 60:>23.1f}m{'':>24}" for r in results.values()))
    return "\n".join(lines)


def main(out: Path = Path("outputs/reading")) -> None:
    results = {}
    with LocalEnvServer(TASKS[0], max_sessions=16) as server:
        tokenizer = AutoTokenizer.from_pretrained(build_tiny_lfm2(out / "tokenizer"))  # the same for every depth
        dataset = warm_up_dataset(server.url, tokenizer, TASKS, right_only, len(TRAIN_SEEDS))
        turns = {
            split: {task: scripted_turns(server.url, tokenizer, task, seeds) for task in TASKS}
            for split, seeds in (("held-out", HELD_OUT_SEEDS), ("training", TRAIN_SEEDS[:16]))
        }
    for depth in DEPTHS:
        name = f"{depth} layers"
        base = str(build_tiny_lfm2(out / f"base-{depth}", WIDTH, depth))
        start = time.perf_counter()
        model_dir = fine_tune(base, out / f"sft-{depth}", dataset, STEPS, BATCH_SIZE, LEARNING_RATE)
        results[name] = {"sft_seconds": time.perf_counter() - start} | {
            split: {task: right_and_wrong(model_dir, task_turns) for task, task_turns in by_task.items()}
            for split, by_task in turns.items()
        }
        log.info("%s done:\n%s", name, table(results))
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"\nSFT on the right actions of {len(dataset)} turns, {STEPS} steps of {BATCH_SIZE}; the mean probability of the"
    )
    print(f"right action / the plan's wrong one, over the turns of {len(HELD_OUT_SEEDS)} instances per task:")
    print(table(results))


if __name__ == "__main__":
    setup_logging()
    main()
