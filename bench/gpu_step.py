"""Real GRPO steps of an LFM2-350M-shaped model through the recipe's own trainer, on a machine with a GPU and no
browser or network: peak GPU memory and seconds per step, split into generation and training.

    python bench/gpu_step.py                    # on a CUDA machine: full fine-tune and LoRA, config.yaml's settings
    python bench/gpu_step.py --steps 5 --vllm   # also with vLLM colocated, where it is installed
    python bench/gpu_step.py --tiny --steps 2 -- --num_generations 2 --gradient_accumulation_steps 2
                                                # on a CPU: the tiny LFM2 and a smaller step (what the tests run);
                                                # after --, train.py's options over config.yaml's

The model is LFM2-350M's architecture (bench/lfm2-350m.json) with random weights, so it writes no valid action and
every episode runs its full max_turns with its context growing: the longest step config.yaml's settings make. The
environment replays episodes recorded from the real server (bench/replay/episodes.jsonl, bench/record_replay.py)
behind OpenEnv's own server (tests/replay_environment.py, the tests' stand-in for the server), so train.py plays them
through its usual client. Each setup runs in a process of its own; a row gives peak memory
(torch.cuda.max_memory_allocated and max_memory_reserved), seconds per step after the first (generation, training)
and whether the peak fits a 24 GB card. With vLLM, its memory share is set to what config.yaml gives it on a 24 GB
card, so that the peak is the one an L4 would see.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import Lfm2Config, Lfm2ForCausalLM, TrainerCallback

from browser_rl.metrics import with_training_time
from warm_start.tiny_lfm2 import build_tiny_lfm2, build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
LFM2_350M = Path(__file__).parent / "lfm2-350m.json"
CARD_GIB = 24e9 / 2**30  # a 24 GB card (an L4, an A10G)
# config.yaml's vLLM share, of a 24 GB card (the GPU bench may run on a bigger one)
VLLM_SHARE_GIB = 0.15 * CARD_GIB


def build_policy(directory: Path, tiny: bool) -> str:
    """The tiny LFM2, or LFM2-350M's architecture with random weights and the tiny tokenizer (no hub here: the
    replies are noise either way, and a token id past the tokenizer's decodes to nothing)."""
    if tiny:
        return str(build_tiny_lfm2(directory))
    build_tokenizer().save_pretrained(directory)
    Lfm2ForCausalLM(Lfm2Config(**json.loads(LFM2_350M.read_text()))).save_pretrained(directory)
    return str(directory)


class StepTimes(TrainerCallback):
    """Each logged step's generation and training seconds, every micro-batch trained."""

    def __init__(self):
        self.steps = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "time/generation_s" in logs:
            logs = with_training_time(logs)
            self.steps.append({"generation_s": logs["time/generation_s"], "training_s": logs["time/training_s"]})
            assert not logs.get("training/skipped_share"), "a micro-batch went untrained: not the longest step"


def one_setup(setup: str, steps: int, tiny: bool, train_options: list[str]) -> dict:
    """One setup ("full" or "lora", "+vllm" for vLLM) in this process: train `steps` steps, return its figures."""
    # train.py is the checkout's command, beside bench/, not an installed module; the replay environment is the
    # tests' stand-in for the server where no browser runs, in tests/.
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import train  # here, in each setup's process: the process that starts them has no use for TRL's import
    from browser_rl.command_line import parse_command_line
    from browser_rl.trainer import RecipeTrainer
    from replay_environment import serve_replay

    # Random weights solve nothing, so every advantage is zero and the trainer would run none of the step's
    # micro-batches: run them all, as a step whose every episode has an advantage, the most a step costs.
    RecipeTrainer._adds_no_gradient = lambda self, inputs: False

    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as scratch:
        model = build_policy(Path(scratch) / "model", tiny)
        overrides = ["--model_name_or_path", model, "--output_dir", str(Path(scratch) / "run")]
        overrides += ["--max_steps", str(steps), "--save_strategy", "no", "--report_to", "none"]
        overrides += ["--use_peft"] * setup.startswith("lora")
        overrides += ["--use_vllm", str(setup.endswith("+vllm")).lower(), *train_options]
        if setup.endswith("+vllm") and cuda:
            total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
            overrides += ["--vllm_gpu_memory_utilization", f"{VLLM_SHARE_GIB / total_gib:.4f}"]
        tasks, episodes, servers, phases, training_args, model_args = parse_command_line(
            train.OPTIONS, ["--config", str(ROOT / "config.yaml"), *overrides]
        )
        servers.env_url = [serve_replay(training_args.generation_batch_size)]
        times = StepTimes()
        train.main(tasks, episodes, servers, phases, training_args, model_args, [times])
    measured = times.steps[1:] or times.steps  # the first step compiles and warms up
    row = {
        "setup": setup,
        "steps": len(times.steps),
        "generation_s": sum(s["generation_s"] for s in measured) / len(measured),
        "training_s": sum(s["training_s"] for s in measured) / len(measured),
        "episodes_per_step": training_args.generation_batch_size,
    }
    if cuda:
        row["max_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        row["max_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        row["fits_24gb"] = row["max_reserved_gib"] <= CARD_GIB
    return row


def print_table(rows: list[dict]) -> None:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    episodes = rows[0]["episodes_per_step"]
    print(f"\nGRPO steps through train.py on {device}, config.yaml's settings, {episodes} episodes a step:")
    print(f"{'setup':<12}{'s/step':>8}{'generation':>12}{'training':>10}{'allocated':>11}{'reserved':>10}  fits 24 GB")
    for row in rows:
        memory = (
            f"{row['max_allocated_gib']:>9.1f}G{row['max_reserved_gib']:>9.1f}G  {'yes' if row['fits_24gb'] else 'no'}"
            if "max_reserved_gib" in row
            else f"{'-':>10}{'-':>10}  -"
        )
        seconds = row["generation_s"] + row["training_s"]
        print(f"{row['setup']:<12}{seconds:>8.1f}{row['generation_s']:>11.1f}s{row['training_s']:>9.1f}s {memory}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="per setup; the first is left out of the seconds")
    parser.add_argument("--tiny", action="store_true", help="the tiny LFM2 instead of LFM2-350M's shape (CPU)")
    parser.add_argument("--vllm", action="store_true", help="also generate with vLLM colocated (where installed)")
    parser.add_argument("--setup", help=argparse.SUPPRESS)  # one setup, in the process the main one starts
    parser.add_argument("train_options", nargs="*", help="after --: train.py options over config.yaml's")
    args = parser.parse_args()
    if args.setup:
        print(json.dumps(one_setup(args.setup, args.steps, args.tiny, args.train_options)))
        return
    setups = ["full", "lora"] + (["full+vllm", "lora+vllm"] if args.vllm else [])
    rows = []
    for setup in setups:
        command = [sys.executable, __file__, "--setup", setup, "--steps", str(args.steps), *["--tiny"] * args.tiny]
        command += ["--", *args.train_options]
        print(f"{setup}: {args.steps} steps ...", flush=True)
        done = subprocess.run(command, capture_output=True, text=True, env=os.environ)
        if done.returncode != 0:
            sys.exit(f"{setup} failed:\n{done.stderr[-4000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print_table(rows)


if __name__ == "__main__":
    main()
