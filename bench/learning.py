"""Proves that the recipe learns, on the CPU: a weak tiny LFM2, then GRPO alone, full and LoRA, on click-test.

    python bench/learning.py            # the benchmark: before/after table and learning curves (~25 min)
    python bench/learning.py --quick    # the short version CI runs: fails unless the success rate went up

1. A starting policy that is weak but not hopeless, built honestly: a randomly initialised tiny LFM2
   (tiny_lfm2.py, 512 wide) is fine-tuned with TRL's SFTTrainer on real first pages of click-test, each
   paired with eight well-formed replies of which one is right (click the button), six are valid actions
   that do not solve the task, and one holds no action. It learns to write actions, and picks the right one
   only about one time in four.
2. evaluate.py measures it on held-out seeds, sampling at temperature 1 (the distribution GRPO trains).
3. train.py trains it with GRPO against the real environment (configs/learning.yaml), once as a full
   fine-tune and once with LoRA, both from the same starting policy; the only reward is task success.
4. evaluate.py measures both. The table and the wall times are printed; results.json and a figure with
   both learning curves are written to the output directory.
"""

import argparse
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import yaml

from env_client import LocalEnvServer
from evaluate import EvalArguments, evaluate
from metrics import METRICS_FILE, logged_steps, moving_average, setup_logging
from rollout import EnvArguments
from tiny_lfm2 import build_tiny_lfm2
from warm_up import one_right_of_eight, warm_up

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

log = logging.getLogger("learning")

TASK = "click-test"
ROOT = Path(__file__).resolve().parents[1]
GRPO_CONFIG = ROOT / "configs" / "learning.yaml"

# 512 wide, not the tests' 64: LoRA leaves the token embeddings (tied to the output layer) and the final norm
# frozen, and those bound the probability any hidden state can put on one token (bench/lora_ceiling.py). For
# the right first token of click-test, after this warm-up: at most 51% at 64 wide, 70% at 128, 91% at 256,
# 99% at 512. LoRA plateaued near those bounds. A pretrained model's embeddings do not bind like that.
WIDTH = 512
# Adam moves each weight by about the learning rate per step, so the wider the layer, the more its output
# moves: a full fine-tune of the 512-wide model at 1e-3 collapsed into replies without an action within two
# steps. LoRA's low-rank update takes 1e-3; the full fine-tune has the config's 3e-4.
RUNS = {"GRPO, full": [], "GRPO, LoRA": ["--use_peft", "--learning_rate", "1e-3"]}
# CI's version: the tests' 64-wide model (its warm-up takes a minute, not ten), a full fine-tune only.
QUICK_WIDTH = 64
QUICK_RUNS = {"GRPO, full": ["--learning_rate", "1e-3", "--max_steps", "15"]}


def grpo(start_model: str, output_dir: Path, env_url: str, *overrides: str) -> float:
    """`python train.py` on configs/learning.yaml, from scratch; returns the wall time in seconds."""
    shutil.rmtree(output_dir, ignore_errors=True)  # train.py would resume from an earlier run's checkpoints
    command = [sys.executable, str(ROOT / "train.py"), "--config", str(GRPO_CONFIG), "--model_name_or_path", start_model,
               "--env_url", env_url, "--output_dir", str(output_dir), *overrides]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def measure(model: str, env_url: str, episodes: int, max_turns: int) -> dict:
    return evaluate(
        EvalArguments(model=model, episodes=episodes, temperature=1.0),
        EnvArguments(task_name=TASK, max_turns=max_turns, env_url=env_url),
    )


def table(results: dict) -> str:
    lines = [f"{'policy':<18} {'success (95% CI)':<24} {'turns to success':>16} {'no action':>10} {'GRPO wall':>10}"]
    for name, r in results.items():
        low, high = r["ci95"]
        success = f"{100 * r['success_rate']:.0f}% ({100 * low:.0f}-{100 * high:.0f}%)"
        turns = "-" if r["mean_turns_to_success"] is None else f"{r['mean_turns_to_success']:.2f}"
        wall = f"{r['grpo_seconds'] / 60:.1f} min" if "grpo_seconds" in r else "-"
        lines.append(f"{name:<18} {success:<24} {turns:>16} {100 * r['unparsed_share']:>9.0f}% {wall:>10}")
    return "\n".join(lines)


def plot(results: dict, run_dirs: dict[str, Path], image_file: Path) -> None:
    """Training success per step (moving average) of each run, with the evaluated rates before and after."""
    fig, ax = plt.subplots(figsize=(7, 4))
    before = results["starting policy"]["success_rate"]
    ax.axhline(before, color="grey", linestyle=":", label=f"starting policy, evaluated ({100 * before:.0f}%)")
    for (name, run_dir), color in zip(run_dirs.items(), ["tab:blue", "tab:orange"]):
        rows = logged_steps(run_dir / METRICS_FILE)
        steps = sorted(rows)
        window = 5
        smooth = moving_average([rows[s]["episodes/success_rate"] for s in steps], window)
        ax.plot(steps, smooth, color=color, label=f"{name}: training episodes ({window}-step average)")
        rate, (low, high) = results[name]["success_rate"], results[name]["ci95"]
        ax.errorbar([steps[-1]], [rate], yerr=[[rate - low], [high - rate]], fmt="o", color=color, capsize=4,
                    label=f"{name}, evaluated after ({100 * rate:.0f}%)")  # fmt: skip
    ax.set_xlabel("GRPO step (16 episodes each)")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"GRPO on MiniWoB {TASK}, tiny LFM2 on 2 CPU cores")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(image_file, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI's version: a 64-wide model, 15 steps, full only")
    parser.add_argument("--output_dir", default="outputs/learning")
    parser.add_argument("--episodes", type=int, default=None, help="evaluation episodes (default 100, quick 48)")
    args = parser.parse_args()
    out = Path(args.output_dir)
    episodes = args.episodes or (48 if args.quick else 100)
    width, runs = (QUICK_WIDTH, QUICK_RUNS) if args.quick else (WIDTH, RUNS)
    max_turns = yaml.safe_load(GRPO_CONFIG.read_text())["max_turns"]

    with LocalEnvServer(TASK, max_sessions=32) as server:
        start = time.perf_counter()
        base_model = str(build_tiny_lfm2(out / "tiny-lfm2", width))
        starting_policy = warm_up(base_model, out / "warm-up", server.url, TASK, one_right_of_eight)
        log.info("warm-up done in %.0fs", time.perf_counter() - start)
        results = {"starting policy": measure(starting_policy, server.url, episodes, max_turns)}
        for name, extra in runs.items():
            run_dir = out / name.split()[-1].lower()
            seconds = grpo(starting_policy, run_dir, server.url, *extra)
            results[name] = measure(str(run_dir), server.url, episodes, max_turns) | {"grpo_seconds": seconds}

    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, {name: out / name.split()[-1].lower() for name in runs}, out / "learning_curves.png")
    print(f"\nclick-test, {episodes} held-out episodes each, sampled at temperature 1, up to {max_turns} turns:")
    print(table(results))
    print(f"results.json and learning_curves.png in {out}")
    before = results["starting policy"]["success_rate"]
    if args.quick and not results["GRPO, full"]["success_rate"] >= before + 0.1:
        sys.exit(f"GRPO did not raise the success rate: {100 * before:.0f}% before, "
                 f"{100 * results['GRPO, full']['success_rate']:.0f}% after")  # fmt: skip


if __name__ == "__main__":
    setup_logging()
    main()
