"""benchmarks/gpu_check.sh: a dry run lists its steps; without a CUDA device it skips every step,
says why in its JSON summary, and exits 0. (On a GPU it runs them: see the script.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def test_dry_run_shows_every_step_and_runs_nothing(tmp_path):
    run = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=30,
                         env={"OUT": str(tmp_path / "out"), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert [line.split("]")[0] for line in lines if line.startswith("[")] == [
        "[pytest-gpu", "[bench-batching-fp32", "[bench-batching-bf16", "[verify-cuda-deployment"]
    assert "-m gpu" in run.stdout and "--device cuda --dtype float32" in run.stdout and "--device cuda --dtype bfloat16" in run.stdout
    assert sum(int(line.split("timeout ")[1].split("s:")[0]) for line in lines if line.startswith("[")) <= 480  # 8 minutes
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the check would run")
def test_cpu_only_run_skips_cleanly(tmp_path):
    import os
    import sys

    out = tmp_path / "out"
    run = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OUT": str(out), "PYTHON": sys.executable})
    assert run.returncode == 0, run.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"] and summary["passed"] and summary["reason"].startswith("no CUDA device")
    assert [s["status"] for s in summary["steps"]] == ["skipped"] * 4
    recipe = (out / "smollm2-ngram-cuda.yaml").read_text()
    assert "  device: cuda" in recipe and "  http_port: 0" in recipe and "name: smollm2-ngram-cuda" in recipe
