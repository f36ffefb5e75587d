"""The soak harness end to end (CI's short version of ``benchmarks/soak.py``): the tiny n-gram recipe
served by ``specbuild serve --openai-port --restart on-failure``, an open-loop mix over Triton gRPC
and the OpenAI front (streamed and unary, cancelling, bad and reconnecting clients, a near
max_input_len prompt), and tritonserver SIGKILLed mid-load.

It must hold the issue's pass criteria: no request lost, every sampled output equal to its plain
reference, no unexpected error, and the kill recovered: clients got their errors within the timeout
and requests sent after the restart completed.
"""

import json

import pytest

from conftest import write_recipe
from specbuild.soak.harness import SoakConfig, run_soak
from specbuild.soak.load import Mix

pytestmark = pytest.mark.e2e


def test_short_soak_with_a_killed_server_loses_nothing_and_recovers(tiny_checkpoint, tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint)
    config = SoakConfig(
        recipe=str(recipe), results_dir=tmp_path / "soak", output_root=tmp_path / "build",
        duration_s=30, interval_s=10, warmup_s=5, fraction=0.15, concurrency=2, calibrate_s=3,
        timeout_s=15, grace_s=5, faults=("kill",), recovery_give_up_s=150,
        mix=Mix(max_tokens=(8, 16), sample=1.0),
    )
    report = run_soak(config, log=lambda line: None)

    criteria = {c["name"]: c for c in report["criteria"]}
    failed = [f"{c['name']}: {c['detail']}" for c in report["criteria"] if c["passed"] is False]
    assert not failed, failed
    assert report["totals"]["lost"] == 0 and report["totals"]["in_flight"] == 0
    assert report["totals"]["completed"] > 0 and report["totals"]["rejected"] > 0  # bad requests got their errors
    assert criteria["sampled outputs equal their plain reference"]["passed"]
    (kill,) = report["faults"]
    assert kill["name"] == "kill" and kill["recovery_s"] is not None
    assert kill["detail"]["new_pid"] not in (None, kill["detail"]["killed_pid"])
    assert kill["clients"]["completed_after"] > 0
    slowest = kill["clients"]["slowest_error_s"]
    assert slowest is None or slowest <= config.timeout_s + config.grace_s
    kinds = report["by_kind"]
    assert {"triton-stream", "triton-unary", "openai-stream", "openai-unary"} <= set(kinds)
    assert any(p["name"] == "near-max" for p in report["prompts"])
    saved = json.loads((config.results_dir / "soak.json").read_text())
    assert saved["complete"] and saved["passed"]
    assert (config.results_dir / "soak.png").stat().st_size > 0
