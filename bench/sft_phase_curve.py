"""SFT phases against entropy collapse, measured on the CPU: the smoke run (configs/smoke.yaml: the weak tiny LFM2 on
click-test) with and without phases, the same seeds, side by side.

    python bench/sft_phase_curve.py        # two runs of 30 steps, about 3 minutes on two cores

Prints, around each phase, the policy's entropy and success over the GRPO steps just before and just after it, the
same steps of the run without phases beside them, and draws docs/sft_phases.png: entropy and success per step,
the phases shaded.
"""

import argparse
import subprocess
import sys
from pathlib import Path

import matplotlib

from browser_rl.metrics import METRICS_FILE, read_metrics

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("--sft_phase_steps", "2", "--sft_phase_every", "8")
AROUND = 3  # GRPO steps before and after a phase that are averaged


def run(output_dir: Path, steps: int, *extra: str) -> list[dict]:
    command = [sys.executable, "train.py", "--config", "configs/smoke.yaml", "--output_dir", str(output_dir)]
    # In lock step both runs sample the same episodes until the first phase, so the curves part there.
    command += ["--max_steps", str(steps), "--save_steps", "1000", "--lockstep", "true", *extra]
    subprocess.run(command, cwd=ROOT, check=True)
    return read_metrics(output_dir / METRICS_FILE)


def mean(rows: list[dict], key: str) -> float:
    return sum(row[key] for row in rows) / len(rows)


def around_phases(with_phases: list[dict], without: list[dict]) -> list[str]:
    """A line per phase: entropy and success over the AROUND GRPO steps before it and after it, in both runs."""
    grpo = [row for row in with_phases if "reward" in row]
    baseline = {row["step"]: row for row in without if "reward" in row}
    phase_steps = [row["step"] for row in with_phases if "sft_phase/loss" in row]
    starts = [step for step in phase_steps if step - 1 not in phase_steps]
    lines = []
    for start in starts:
        end = max(s for s in phase_steps if s >= start and all(t in phase_steps for t in range(start, s + 1)))
        before = [row for row in grpo if row["step"] < start][-AROUND:]
        after = [row for row in grpo if row["step"] > end][:AROUND]
        if not before or not after:
            continue
        lines.append(
            f"phase at steps {start}-{end}: entropy {mean(before, 'entropy'):.3f} -> {mean(after, 'entropy'):.3f}, "
            f"success {mean(before, 'episodes/success_rate'):.2f} -> {mean(after, 'episodes/success_rate'):.2f}; "
            f"without phases, the same steps: entropy "
            f"{mean([baseline[r['step']] for r in before], 'entropy'):.3f} -> "
            f"{mean([baseline[r['step']] for r in after if r['step'] in baseline], 'entropy'):.3f}, success "
            f"{mean([baseline[r['step']] for r in before], 'episodes/success_rate'):.2f} -> "
            f"{mean([baseline[r['step']] for r in after if r['step'] in baseline], 'episodes/success_rate'):.2f}"
        )
    return lines


def plot(with_phases: list[dict], without: list[dict], image: Path) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for rows, label, style in ((without, "GRPO alone", "--"), (with_phases, "GRPO with SFT phases", "-")):
        grpo = [row for row in rows if "reward" in row]
        steps = [row["step"] for row in grpo]
        top.plot(steps, [row["entropy"] for row in grpo], style, marker=".", label=label)
        bottom.plot(steps, [row["episodes/success_rate"] for row in grpo], style, marker=".", label=label)
    for row in with_phases:
        if "sft_phase/loss" in row:
            for axis in (top, bottom):
                axis.axvspan(row["step"] - 0.5, row["step"] + 0.5, color="tab:orange", alpha=0.2, lw=0)
    top.set_ylabel("entropy of the replies")
    top.legend(fontsize="small")
    bottom.set_ylabel("success rate")
    bottom.set_ylim(-0.05, 1.05)
    bottom.set_xlabel("optimizer step (shaded: SFT phase steps)")
    top.set_title("configs/smoke.yaml, tiny LFM2 on click-test, CPU")
    fig.tight_layout()
    fig.savefig(image, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--output_dir", default="outputs/sft-phases")
    parser.add_argument("--image", default=str(ROOT / "docs" / "sft_phases.png"))
    args = parser.parse_args()
    out = Path(args.output_dir)
    with_phases = run(out / "with-phases", args.steps, *PHASES)
    without = run(out / "without", args.steps)
    print("\n".join(around_phases(with_phases, without)))
    plot(with_phases, without, Path(args.image))
    print(f"curves: {args.image}")


if __name__ == "__main__":
    main()
