"""Data-parallel training under torchrun, on the CPU (gloo): two ranks, one model, one environment pool, one set
of figures per step, SFT phases under gradient accumulation, and a resume after the launcher is killed.
tests/ranked_train.py is train.py with each rank's weights, episodes and phase draws written down after every
step."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from browser_rl.metrics import METRICS_FILE, read_metrics
from browser_rl.trainer import last_complete_checkpoint
from helpers import RESUMABLE_WITH_PHASES, ROOT, weights

pytestmark = pytest.mark.slow

RANKS = 2
STEPS = 5
# RESUMABLE_WITH_PHASES with each rank's eight episodes a step in two micro-batches of four, as configs/book_flight.yaml
# accumulates: two GRPO steps, then a phase of two steps, then GRPO.
ACCUMULATED = (*RESUMABLE_WITH_PHASES, "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2")


def launch_command(model: str, output_dir: Path) -> list[str]:
    """torchrun with two ranks on ACCUMULATED's run: 5 steps; a GRPO step plays two groups of four episodes per
    rank, a phase step trains each rank on four buffered episodes per micro-batch."""
    return [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(RANKS)),
        str(ROOT / "tests" / "ranked_train.py"),
        *("--config", str(ROOT / "configs/smoke.yaml"), "--model_name_or_path", model),
        *("--output_dir", str(output_dir), *ACCUMULATED),
    ]


def ranks_of(output_dir: Path) -> list[psutil.Process]:
    """The live processes of a launch into output_dir, by their command lines."""
    running = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(output_dir) in " ".join(process.info["cmdline"] or []) and process.status() != "zombie":
                running.append(process)
    return running


def rank_rows(output_dir: Path) -> list[list[dict]]:
    return [
        [json.loads(line) for line in (output_dir / "ranks" / f"rank-{rank}.jsonl").read_text().splitlines()]
        for rank in range(RANKS)
    ]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, half_right_model):
    """An uninterrupted two-rank run of the half-right model: its output directory and its log."""
    output_dir = tmp_path_factory.mktemp("two-ranks")
    run = subprocess.run(
        launch_command(half_right_model, output_dir), cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-5000:]
    return output_dir, run.stdout + run.stderr


def test_two_ranks_train_one_model_on_one_pool_and_log_each_step_once(two_ranks):
    output_dir, log = two_ranks
    first, second = rank_rows(output_dir)
    assert [row["step"] for row in first] == [row["step"] for row in second] == list(range(1, STEPS + 1))
    # Gradients are averaged across the ranks, so their weights are one model's after every step; and it learns.
    assert [row["weights"] for row in first] == [row["weights"] for row in second]
    assert len({row["weights"] for row in first}) == STEPS
    rows = read_metrics(output_dir / METRICS_FILE)
    phase_steps = [row["step"] for row in rows if "sft_phase/loss" in row]
    assert len(phase_steps) == 2 and phase_steps[0] > 2 and phase_steps[1] == phase_steps[0] + 1
    for rank_first, rank_second in zip(first, second):
        if rank_first["step"] in phase_steps:
            # One buffer on both ranks (every rank's successes); in each micro-batch, each rank trains on four
            # buffered episodes of its own, and the second micro-batch draws others than the first.
            assert rank_first["phase"]["buffer"] == rank_second["phase"]["buffer"]
            trained = [rank_first["phase"]["trained"], rank_second["phase"]["trained"]]
            assert [len(places) for rank in trained for places in rank] == [4, 4, 4, 4]
            for micro_batch in (0, 1):
                assert set(trained[0][micro_batch]).isdisjoint(trained[1][micro_batch])
            assert trained[0][0] + trained[1][0] != trained[0][1] + trained[1][1]
            assert rank_first["episodes"] == rank_second["episodes"] == []  # a phase step plays no episode
            continue
        # Each rank played its own share of the step's episodes: two groups of four.
        assert len(rank_first["episodes"]) == len(rank_second["episodes"]) == 8
        seeds = [{seed for _, seed, _ in rank["episodes"]} for rank in (rank_first, rank_second)]
        assert seeds[0].isdisjoint(seeds[1])

    # One pool for both ranks: every environment server says so when it starts serving, whatever the rank that
    # started it logs.
    assert len(re.findall(r"env_server INFO serving MiniWoB", log)) == 1

    steps = [row for row in rows if "episodes/success_rate" in row]
    grpo_steps = [step for step in range(1, STEPS + 1) if step not in phase_steps]
    assert [row["step"] for row in steps] == grpo_steps  # one line per step, from one rank
    assert len(rows) == STEPS + 1  # and the run's closing line
    for row in steps:
        rank_first, rank_second = first[row["step"] - 1], second[row["step"] - 1]
        union = rank_first["episodes"] + rank_second["episodes"]
        assert row["episodes/count"] == len(union) == 16
        assert row["episodes/success_rate"] == pytest.approx(sum(solved for *_, solved in union) / len(union))
    for step in range(1, STEPS + 1):
        assert len(re.findall(rf"step {step}/{STEPS} \|", log)) == 1
    assert log.count("learning curve:") == 1 and (output_dir / "learning_curve.png").exists()


def test_a_killed_launch_resumes_on_both_ranks_and_ends_with_the_uninterrupted_weights(
    two_ranks, half_right_model, tmp_path
):
    command = launch_command(half_right_model, tmp_path)
    # The launcher, its ranks and the server they started: one process group, killed at once as a lost machine is.
    first = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "checkpoint-2" / "trainer_state.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # torchrun's ranks run in sessions of their own: they outlive this
    first.wait()
    deadline = time.monotonic() + 30
    while (left := ranks_of(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "ranks went on training after their launcher was killed"
    resumed_from = last_complete_checkpoint(tmp_path)
    assert resumed_from is not None and not (tmp_path / "model.safetensors").exists()
    done_before = int(resumed_from.rsplit("-", 1)[1])
    assert 2 <= done_before < STEPS
    # Each rank restores its own sampling: a checkpoint is whole only with every rank's RNG state.
    assert all((Path(resumed_from) / f"rng_state_{rank}.pth").exists() for rank in range(RANKS))

    logged_before = [len(rows) for rows in rank_rows(tmp_path)]
    second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-5000:]
    assert f"resuming from {resumed_from}" in second.stderr
    for rows, before in zip(rank_rows(tmp_path), logged_before):  # both ranks played the steps after the checkpoint
        assert [row["step"] for row in rows[before:]] == list(range(done_before + 1, STEPS + 1))
    at_checkpoint, resumed, whole = weights(Path(resumed_from)), weights(tmp_path), weights(two_ranks[0])
    assert any(not torch.equal(at_checkpoint[name], resumed[name]) for name in resumed)
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)
