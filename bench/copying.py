"""Can the tiny LFM2 learn, from generic text, the copying that reading a page takes?

    python bench/copying.py                     # 30 minutes on 2 cores; the model goes to outputs/copying/model
    python bench/copying.py --skills lookup     # one skill alone: all the batches, the same 30 minutes
    python bench/learning.py --start outputs/copying/model   # the full learning benchmark from this model

Supervision on the page-reading tasks' right actions (docs/page-reading-experiments.md) found that the tiny model,
shown only right actions, never writes the goal's text into a box and does not match a button's label: it would have
to copy, and the randomly initialised model does not learn to. A real language model arrives able to, from
pretraining. This asks whether the tiny one can be given that ability
first, cheaply, on synthetic text that holds no MiniWoB page, goal or action, only MiniWoB's words and element ids
(warm_start/tiny_lfm2.py's `miniwob_vocabulary`), with every answer token supervised so that each sequence teaches
many times:

- repeat: random words and ids, then the same again; every token of the repeat needs the model to find where the
  current token appeared before and write what came after it (the induction mechanism of pretrained LMs).
- quote: `Say "w1 w2": 'w1 w2'`, several lines; the first word needs the model to find the latest quote and
  write what follows it (how a fill copies the goal's text). A third of the quotes are random letters and digits,
  as MiniWoB writes passwords, which fall apart into several tokens each.
- lookup: lines of `[id] role 'label'`, then `Click "label": click('id')` for some of them; the id needs the model
  to find the label in the list and write the id written before it (how a click reads the page).

Each skill's accuracy is the share of its supervised tokens that the model's most likely next token gets right,
on fixed held-out sequences, printed as training goes. The full learning benchmark (bench/learning.py) starts from
this model; docs/page-reading-experiments.md has what it did and did not learn.
"""

import argparse
import json
import random
import time
from pathlib import Path

import torch

from warm_start.copying_text import SKILLS, accuracy, batch, tokenizer
from warm_start.tiny_lfm2 import build_model

WIDTH, LAYERS = 256, 4  # the full learning benchmark's model
BATCH_SIZE, LEARNING_RATE, WARMUP_STEPS = 32, 1e-3, 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--skills", nargs="+", choices=list(SKILLS), default=list(SKILLS), help="trained on")
    parser.add_argument("--output_dir", default="outputs/copying")
    args = parser.parse_args()
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    held_out_rng, rng = random.Random(1), random.Random(0)
    held_out = {name: [make(held_out_rng) for _ in range(64)] for name, make in SKILLS.items()}
    model = build_model(tokenizer(), WIDTH, LAYERS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS))
    makers = [SKILLS[name] for name in args.skills]
    history, start, step = [], time.perf_counter(), 0
    while time.perf_counter() - start < args.minutes * 60:
        input_ids, attention_mask, labels = batch([rng.choice(makers)(rng) for _ in range(BATCH_SIZE)])
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        warmup.step()
        step += 1
        if step % 100 == 0:
            model.eval()
            row = {"step": step, "minutes": round((time.perf_counter() - start) / 60, 1), "loss": round(loss.item(), 3)}
            row |= {name: round(accuracy(model, examples), 3) for name, examples in held_out.items()}
            model.train()
            history.append(row)
            print(json.dumps(row), flush=True)
    model.save_pretrained(output_dir / "model")
    tokenizer().save_pretrained(output_dir / "model")
    (output_dir / "history.jsonl").write_text("".join(json.dumps(row) + "\n" for row in history))


if __name__ == "__main__":
    main()
