"""Where a GRPO step of the real model goes on this machine, and what each lever saves: the same step (16 one-action
click-test episodes of SmolLM2-135M-Instruct, configs/smollm2_click_test_cpu.yaml) run with the recipe's earlier
settings, then with each lever added in turn, one after the other in one run.

    python bench/real_model_step.py --before 6491b12           # the table in docs/real_model.md
    python bench/real_model_step.py --before 6491b12 --only "before,LoRA (not kept)"

`--before` names the commit whose settings the first row plays (its prompt, transformers generation, a full fine-tune
of all 16 episodes in one micro-batch): its code runs from a git worktree of that commit, with this checkout's
Python environment. Each row after it adds one lever (ROWS); the last two are levers measured and not kept. Every
row is a real `train.py` process against a local environment server; a row gives the seconds of each step (TRL's
step time, split into generation, environment and training as the step's line splits it), the tokens of an episode
and the process's peak resident memory. Measure on an idle machine: the rows are compared with each other.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "smollm2_click_test_cpu.yaml"

# Each lever over the row before it: (name, overrides of configs/smollm2_click_test_cpu.yaml, where it runs). "before"
# runs the --before commit's train.py; "trl head" this checkout's with TRL's own LM head on the CPU, which projects
# every position (browser_rl.trainer.score_only_the_replies_on_cpu left out); "now" this checkout's as it is.
ONE_MICRO_BATCH = ["--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "1"]
LORA = ["--use_peft", "true", "--learning_rate", "1.0e-4"]
ROWS = [
    ("before", ONE_MICRO_BATCH, "before"),
    ("micro-batches of 4", [], "before"),
    ("compact action reference", [], "trl head"),
    ("LM head on the replies only", [], "now"),
    ("LoRA (not kept)", LORA, "now"),
    ("vLLM's CPU engine (not kept)", ["--use_vllm", "true", "--vllm_on_cpu", "true"], "now"),
]
# The zero-shot model solves nothing, so every advantage is zero and the trainer would run none of the step's
# micro-batches (browser_rl.trainer): this checkout's rows run them all, as a step whose every episode has an
# advantage, to measure what such a step costs.
EVERY_MICRO_BATCH = (
    "from browser_rl.trainer import RecipeTrainer; RecipeTrainer._adds_no_gradient = lambda self, inputs: False; "
    "import sys, train; sys.argv[0] = 'train.py'; "
)
NOW = EVERY_MICRO_BATCH + "train.run_from_command_line()"
TRL_HEAD = EVERY_MICRO_BATCH + "train.score_only_the_replies_on_cpu = lambda: None; train.run_from_command_line()"


def peak_rss(process: subprocess.Popen, peak: list[float]) -> None:
    """Polls the process's resident memory until it ends; peak[0] is the largest seen, in GiB."""
    try:
        watched = psutil.Process(process.pid)
        while process.poll() is None:
            peak[0] = max(peak[0], watched.memory_info().rss / 2**30)
            time.sleep(0.5)
    except psutil.NoSuchProcess:
        pass


def run_row(checkout: Path, code: str, model: str, overrides: list[str], steps: int, scratch: Path, log) -> dict:
    output_dir = scratch / "run"
    train = {"before": ["train.py"], "trl head": ["-c", TRL_HEAD], "now": ["-c", NOW]}[code]
    command = [sys.executable, *train, "--config", str(CONFIG), "--model_name_or_path", model]
    command += ["--max_steps", str(steps), "--save_steps", "1000", "--output_dir", str(output_dir), *overrides]
    start, peak = time.perf_counter(), [0.0]
    process = subprocess.Popen(command, cwd=checkout, stdout=log, stderr=subprocess.STDOUT)
    watcher = threading.Thread(target=peak_rss, args=(process, peak))
    watcher.start()
    process.wait()
    watcher.join()
    metrics_file = output_dir / "metrics.jsonl"
    metrics = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.exists() else []
    steps = [m for m in metrics if "step_time" in m]
    row = {"returncode": process.returncode, "peak_rss_gib": peak[0], "wall_s": time.perf_counter() - start}
    return row | {"steps": [step_figures(step, before) for step, before in zip(steps, [None, *steps])]}


def step_figures(step: dict, before: dict | None) -> dict:
    tokens = step["num_tokens"] - (before["num_tokens"] if before else 0)  # TRL's count runs on over the steps
    return {
        "step_s": step["step_time"],
        "generation_s": step["time/generation_s"],
        "environment_s": step["time/environment_s"],
        "training_s": step["time/training_s"],
        "tokens_per_episode": tokens / step["episodes/count"],
        "no_action_share": step["episodes/unparsed_share"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the commit whose settings the first row plays")
    parser.add_argument("--model", default=str(ROOT / ".cache" / "smollm2-135m-instruct"))
    parser.add_argument("--steps", type=int, default=2, help="steps per row; the last one is measured")
    parser.add_argument("--only", help="rows to run, by name, separated by commas (default: all)")
    parser.add_argument("--output", type=Path, default=ROOT / "outputs" / "real_model_step.json")
    args = parser.parse_args()
    rows = [row for row in ROWS if not args.only or row[0] in args.only.split(",")]
    results = {}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        old = Path(scratch) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), args.before], cwd=ROOT, check=True)
        try:
            with open(args.output.with_suffix(".log"), "w") as log:
                for name, overrides, code in rows:
                    print(f"{name}: running {args.steps} steps", flush=True)
                    with tempfile.TemporaryDirectory() as row_scratch:
                        checkout = old if code == "before" else ROOT
                        row = run_row(checkout, code, args.model, overrides, args.steps, Path(row_scratch), log)
                    results[name] = row
                    print(f"{name}: {json.dumps(results[name])}", flush=True)
                    args.output.write_text(json.dumps(results, indent=2) + "\n")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=True)
    print(table(results))


def table(results: dict) -> str:
    """A row per setting and step measured: the first step, and the later ones where the row ran them."""
    lines = [
        "| settings | step | seconds | generation | environment | training | tokens per episode | peak memory |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in results.items():
        for number, step in enumerate(row["steps"], 1):
            lines.append(
                f"| {name} | {number} | {step['step_s']:.0f} s | {step['generation_s']:.1f} s "
                f"| {step['environment_s']:.1f} s | {step['training_s']:.1f} s | {step['tokens_per_episode']:.0f} "
                f"| {row['peak_rss_gib']:.1f} GiB |"
            )
        if row["returncode"] != 0:
            lines.append(
                f"| {name} | {len(row['steps']) + 1} | exit {row['returncode']} | | | | | "
                f"{row['peak_rss_gib']:.1f} GiB |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
