"""`specbuild bench --serving-overhead`: the k=0 points of a recipe deployment also on the same engine
in-process, next to each served repeat (specbuild/bench/overhead.py), on a tiny engine; once through a
real server and the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import write_recipe
from specbuild.cli import main
from specbuild.bench import Deployment, PointResult, RequestRecord, SweepPlan, SweepResult, summarize_point
from specbuild.bench import run as bench_run
from specbuild.bench.overhead import InProcessArm, OverheadRow, engine_dir_of, in_process_arm, overhead_rows
from specbuild.bench.plan import Load
from specbuild.prompts import load_prompts

PROMPTS = [{"id": "a", "text": "def add(a, b):"}, {"id": "b", "text": "for i in range(3):"}]


@pytest.fixture(scope="module")
def tiny_engine(tiny_checkpoint, tmp_path_factory):
    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine

    out = tmp_path_factory.mktemp("overhead")
    loaded = load_recipe(str(write_recipe(out / "r.yaml", tiny_checkpoint, method="none")))
    return build_reference_engine(loaded, out / "engine", log=lambda m: None).engine_dir


def _point(deployment: str, concurrency: int, draft_len: int, tok_s: list[float], prompt_set: str) -> PointResult:
    records = [RequestRecord("a", 1.0, 8, 0, 0, None, repeat=i) for i in range(len(tok_s))]
    summary = summarize_point(records, wall_s=[8 / t for t in tok_s], draft_len=draft_len, max_tokens=8)
    return PointResult(deployment=deployment, method="none", prompt_set=prompt_set, draft_len=draft_len,
                       concurrency=concurrency, **summary)


def _prompts_file(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return prompts


def test_the_arm_runs_the_same_plain_requests_on_the_recipe_engine(tiny_engine, tmp_path):
    prompts = _prompts_file(tmp_path)
    plan = SweepPlan(draft_lengths=(0,), concurrencies=(2,), prompt_sets=(str(prompts),), max_tokens=8, end_id=-1, warmup=1)
    served = Deployment("tiny", "127.0.0.1:1", method="none", tokenizer_dir=str(tiny_engine / "tokenizer"), stream=True)
    foreign = Deployment("other", "127.0.0.1:2", tokenizer_dir=str(tmp_path))  # a url target: no engine here
    assert in_process_arm(foreign, plan) is None and engine_dir_of(served) == tiny_engine
    arm = in_process_arm(served, plan)
    assert isinstance(arm, InProcessArm)
    try:
        pairs = [(p, p.text) for p in load_prompts(str(prompts))]
        assert arm.tok_s(pairs, max_tokens=8, concurrency=2, num_requests=4) > 0 and arm.warm
        job = (arm.tokenizer(PROMPTS[0]["text"], add_special_tokens=True)["input_ids"], 8)
        assert len(arm.scheduler.generate(_plain_request(job)).output_ids) == 8  # end_id -1: every token generated
    finally:
        arm.close()


def _plain_request(job):
    from specbuild.engine.types import GenerationRequest

    return GenerationRequest(job[0], job[1], end_id=-1, num_draft_tokens=0)


class _RecordingArm:
    def __init__(self, log):
        self.log = log

    def tok_s(self, prompts, *, max_tokens, concurrency, num_requests):
        self.log.append(("in-process", concurrency, num_requests))
        return 100.0 + len(self.log)


def test_in_process_runs_sit_next_to_each_served_repeat_abba(monkeypatch, tmp_path):
    """Repeat 0: served then in-process; repeat 1: in-process then served; ...: pairs share the machine's
    state, and drift over the sweep cancels between orders. Open-loop levels and k > 0 runs get none."""
    log: list = []

    def fake_run_point(clients, prompts, *, concurrency, num_requests, fields, request_rate=None, **kw):
        log.append(("served", fields.get("num_draft_tokens", 0), concurrency))
        return [RequestRecord("a", 1.0, 8, 0, 0, None)], 1.0

    monkeypatch.setattr(bench_run, "run_point", fake_run_point)
    monkeypatch.setattr(bench_run, "read_counters_or_none", lambda url: None)
    prompts = _prompts_file(tmp_path)
    plan = SweepPlan(draft_lengths=(0,), concurrencies=(2,), prompt_sets=(str(prompts),), max_tokens=8, end_id=-1, repeats=3)
    deployment = Deployment("tiny", "127.0.0.1:1", method="none", stream=True)
    pairs = [(p, p.text) for p in load_prompts(str(prompts))]
    points = bench_run._measure_load(deployment, plan, None, pairs, str(prompts), Load(concurrency=2), {}, [],
                                     lambda *a: None, arm=_RecordingArm(log))
    kinds = [entry[0] for entry in log]
    assert kinds == ["served", "in-process", "in-process", "served", "served", "in-process"]
    assert points[0].in_process_tok_s == [102.0, 103.0, 106.0] and len(points[0].repeat_total_tok_s) == 3

    log.clear()
    open_loop = bench_run._measure_load(deployment, plan, None, pairs, str(prompts), Load(concurrency=2, request_rate=1.0), {},
                                        [], lambda *a: None, arm=_RecordingArm(log))
    assert all(entry[0] == "served" for entry in log) and open_loop[0].in_process_tok_s == []


def test_overhead_rows_pair_each_repeat_and_give_an_interval():
    plan = SweepPlan(draft_lengths=(0,), concurrencies=(1, 8), prompt_sets=("p",), max_tokens=8, repeats=3)
    deployments = [Deployment("s", "127.0.0.1:1", method="none", stream=True, stream_interval=4),
                   Deployment("u", "127.0.0.1:2", method="none")]
    points = [_point("s", 1, 0, [40.0, 30.0, 20.0], "p"), _point("s", 8, 0, [90.0, 95.0, 92.0], "p"),
              _point("u", 1, 0, [10.0, 10.0, 10.0], "p")]
    points[0].in_process_tok_s = [41.0, 31.0, 20.5]  # drift shared by both arms of each repeat
    points[1].in_process_tok_s = [100.0, 100.0, 100.0]
    rows = overhead_rows(SweepResult(plan, deployments, points))
    assert [(r.deployment, r.concurrency, r.streamed, r.stream_interval) for r in rows] == [("s", 1, True, 4), ("s", 8, True, 4)]
    low, high = rows[0].interval
    assert 0.0 < low < rows[0].overhead < high < 0.05  # paired: the drift (40 -> 20 tok/s) does not widen it
    assert rows[1].overhead == pytest.approx(1 - 92.333333 / 100, rel=1e-4) and rows[1].interval[1] < 0.15
    assert rows[0].to_json()["overhead_ci"] == rows[0].interval
    assert OverheadRow("d", "p", 1, True, [30.0], [40.0]).interval is None  # one repeat: no interval


def test_overhead_is_the_fraction_of_in_process_throughput_lost():
    row = OverheadRow("d", "p", 1, True, served_tok_s=[30.0, 34.0], in_process_tok_s=[40.0, 40.0])
    assert row.overhead == pytest.approx(0.2)
    assert row.to_json()["overhead"] == pytest.approx(0.2)


def test_a_streamed_overhead_above_five_percent_advises_a_stream_interval_scaled_to_it():
    from specbuild.bench.overhead import OverheadRow, overhead_advice

    rows = [OverheadRow("d", "p", 1, True, [39.0], [40.0]), OverheadRow("d", "p", 8, True, [90.0], [100.0]),
            OverheadRow("u", "p", 8, False, [90.0], [100.0]),  # unary: no interval to raise
            OverheadRow("s4", "p", 8, True, [92.5], [100.0], stream_interval=4)]  # raised, still above 5 %
    advice = overhead_advice(rows)
    assert len(advice) == 2 and advice[0].startswith("d: ") and "10%" in advice[0] and "C=8" in advice[0]
    assert "per decoding iteration" in advice[0] and "serve.stream_interval: 4" in advice[0]
    assert advice[1].startswith("s4: ") and "every 4 iterations" in advice[1] and "serve.stream_interval: 16" in advice[1]
    assert overhead_advice(rows[:1]) == []  # 2.5 %: nothing to advise


@pytest.mark.parametrize(("overhead", "interval", "advised"), [
    (0.20, 1, 8), (0.10, 1, 4), (0.075, 4, 16), (0.06, 1, 4), (0.03, 1, 2), (0.0, 8, 8), (-0.02, 1, 1)])
def test_advised_interval_grows_with_the_measured_overhead(overhead, interval, advised):
    from specbuild.bench.overhead import advised_interval

    assert advised_interval(overhead, interval) == advised


def test_advised_interval_refuses_an_interval_below_one():
    from specbuild.bench.overhead import advised_interval

    with pytest.raises(ValueError, match="stream_interval must be >= 1"):
        advised_interval(0.1, 0)


def test_bench_reports_the_serving_overhead_of_a_recipe(tiny_checkpoint, tmp_path):
    recipe = write_recipe(tmp_path / "tiny.yaml", tiny_checkpoint, method="none")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    result = CliRunner().invoke(main, [
        "bench", str(recipe), "--concurrency", "2", "--prompts", str(prompts), "--max-tokens", "6", "--end-id", "-1",
        "--deploy-dir", str(tmp_path / "deploy"), "--results-dir", str(tmp_path / "out"), "--serving-overhead",
    ])
    assert result.exit_code == 0, result.output
    (row,) = json.loads((tmp_path / "out" / "serving_overhead.json").read_text())["rows"]
    assert row["deployment"] == "tiny-none" and row["concurrency"] == 2 and row["streamed"]
    assert row["served_tok_s"][0] > 0 and row["in_process_tok_s"][0] > 0
    assert "serving overhead" in result.output
    bench = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert bench["points"][0]["in_process_tok_s"] == row["in_process_tok_s"]  # measured in the sweep, recorded with the point
