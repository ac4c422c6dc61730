"""GRPO steps with colocated vLLM (its CPU build) and with transformers generation, side by side on this machine.

    python bench/vllm_steps.py                  # 6 steps each, the tiny LFM2, 10-turn click-test episodes
    python bench/vllm_steps.py --steps 10 --max_turns 5

Both runs build train.py's own trainer on the same model, server and seeds; one generates with transformers,
the other with a colocated vLLM engine. For each it prints the seconds per GRPO step (the first step, which
warms things up, apart; the engine's start-up is not a step). For the vLLM run it also prints how far the
engine's log-probabilities of the sampled tokens are from the trainer's, and what share of episodes and
tokens each of TRL's importance-sampling modes would mask or truncate at its default bound of 3: the evidence
behind config.yaml's `vllm_importance_sampling_mode`.

The random tiny model writes replies of the full 32 tokens, so its episodes carry up to 320 sampled tokens,
the long multi-turn case. The engine computes in bf16 and the trainer in fp32, as on a GPU with fp32 master
weights.
"""

import argparse
import math
import os
import statistics
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer

import train
from env_client import LocalEnvServer, ServerPool
from metrics import setup_logging
from rollout import EpisodeRunner
from tiny_lfm2 import build_tiny_lfm2

ROOT = Path(__file__).resolve().parents[1]
IS_BOUND = 3.0  # TRL's vllm_importance_sampling_clip_max


def run(model: str, env_url: str, output_dir: Path, args, vllm: bool) -> tuple[list[float], list[dict]]:
    """Trains `args.steps` GRPO steps; returns each step's seconds and, per step, what the trainer scored."""
    overrides = [
        *("--model_name_or_path", model, "--env_url", env_url, "--output_dir", str(output_dir)),
        *("--max_steps", str(args.steps), "--max_turns", str(args.max_turns), "--max_completion_length", "32"),
        *("--num_generations", "4", "--per_device_train_batch_size", "8", "--save_strategy", "no"),
        *(["--use_vllm", "true", "--vllm_on_cpu", "true", "--vllm_mode", "colocate"] if vllm else []),
    ]
    env_args, rollout_args, training_args, model_args = train.parse_args(
        ["--config", str(ROOT / "configs/smoke.yaml"), *overrides]
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    runner = EpisodeRunner(ServerPool.of(env_url), tokenizer, env_args.max_turns, env_args.max_page_chars)
    trainer = train.build_trainer(env_args, rollout_args, training_args, model_args, tokenizer, runner)
    scored = []
    generate_and_score = trainer._generate_and_score_completions

    def recording(inputs):
        out = generate_and_score(inputs)
        scored.append({k: out[k].detach() for k in ("old_per_token_logps", "sampling_per_token_logps") if k in out}
                      | {"mask": (out["completion_mask"] * out["tool_mask"]).bool()})  # fmt: skip
        return out

    trainer._generate_and_score_completions = recording
    try:
        trainer.train()
    finally:
        runner.close()
    seconds = [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry]
    return seconds, scored


def importance_sampling_effects(scored: list[dict]) -> dict[str, float]:
    """What each of TRL's modes would do to these episodes, from the trainer's and the engine's log-probabilities."""
    token_diffs, sequence_diffs, token_counts = [], [], []
    for step in scored:
        diff = (step["old_per_token_logps"] - step["sampling_per_token_logps"]).nan_to_num(0.0) * step["mask"]
        token_diffs += diff[step["mask"]].tolist()
        sequence_diffs += diff.sum(-1).tolist()
        token_counts += step["mask"].sum(-1).tolist()
    bound = math.log(IS_BOUND)
    return {
        "episodes": len(sequence_diffs),
        "sampled tokens per episode (mean)": statistics.mean(token_counts),
        "|log-prob difference| per token, mean": statistics.mean(abs(d) for d in token_diffs),
        "|log-prob difference| per token, max": max(abs(d) for d in token_diffs),
        "sequence_mask / sequence_truncate: episodes masked / truncated": sum(d > bound for d in sequence_diffs) / len(sequence_diffs),
        "token_mask / token_truncate: tokens masked / truncated": sum(d > bound for d in token_diffs) / len(token_diffs),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--max_turns", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; the default share of memory is far more than needed
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as scratch, LocalEnvServer("click-test", max_sessions=8) as server:
        model = str(build_tiny_lfm2(Path(scratch) / "tiny-lfm2"))
        results = {
            name: run(model, server.url, Path(scratch) / name, args, vllm)
            for name, vllm in (("transformers", False), ("vLLM, colocated", True))
        }
    print(f"\nGRPO steps of 8 episodes (2 task instances x 4), up to {args.max_turns} turns of up to 32 tokens, "
          f"tiny LFM2 on {os.cpu_count()} CPU cores; the first step is left out:")  # fmt: skip
    for name, (seconds, _) in results.items():
        steady = seconds[1:]
        print(f"  {name:<16} {statistics.mean(steady):6.2f} s per step (min {min(steady):.2f}, max {max(steady):.2f})")
    transformers_s, vllm_s = (statistics.mean(results[name][0][1:]) for name in results)
    print(f"  vLLM / transformers: x{transformers_s / vllm_s:.2f} the steps per second")
    print("\nvLLM's sampling log-probabilities against the trainer's, and TRL's importance-sampling modes (bound 3):")
    for name, value in importance_sampling_effects(results["vLLM, colocated"][1]).items():
        print(f"  {name:<64} {value:.4g}")


if __name__ == "__main__":
    setup_logging()
    main()
