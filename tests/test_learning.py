"""The learning benchmark's short version: GRPO must raise a weak policy's success rate on the real task."""

import json
import subprocess
import sys

from helpers import ROOT


def test_grpo_raises_the_success_rate_of_a_weak_policy(tmp_path):
    result = subprocess.run(
        [sys.executable, "bench/learning.py", "--quick", "--output_dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    before, after = results["starting policy"], results["GRPO, full"]
    assert 0.05 <= before["success_rate"] <= 0.45  # weak, but not hopeless: GRPO needs some successes
    assert after["success_rate"] >= before["success_rate"] + 0.1
    assert after["episodes"] == before["episodes"] == 48
    assert (tmp_path / "learning_curves.png").exists() and (tmp_path / "full" / "learning_curve.png").exists()
