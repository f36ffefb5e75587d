"""`specbuild bench --serving-overhead`: the k=0 points of a recipe deployment again on the same engine
in-process (specbuild/bench/overhead.py), on a tiny engine; once through a real server and the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import write_recipe
from specbuild.cli import main
from specbuild.bench import Deployment, PointResult, RequestRecord, SweepPlan, SweepResult, summarize_point
from specbuild.bench.overhead import OverheadRow, engine_dir_of, measure_serving_overhead

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


def test_each_plain_closed_loop_point_is_measured_in_process(tiny_engine, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    plan = SweepPlan(draft_lengths=(0,), concurrencies=(1, 2), prompt_sets=(str(prompts),), max_tokens=8, end_id=-1,
                     repeats=2, warmup=1)
    served = Deployment("tiny", "127.0.0.1:1", method="none", tokenizer_dir=str(tiny_engine / "tokenizer"), stream=True)
    foreign = Deployment("other", "127.0.0.1:2", tokenizer_dir=str(tmp_path))  # a url target: no engine here
    points = [_point("tiny", c, 0, [10.0, 12.0], str(prompts)) for c in (1, 2)] + [_point("other", 1, 0, [5.0], str(prompts))]
    rows = measure_serving_overhead(SweepResult(plan, [served, foreign], points))
    assert [(r.deployment, r.concurrency, r.streamed) for r in rows] == [("tiny", 1, True), ("tiny", 2, True)]
    for r in rows:
        assert r.served_tok_s == pytest.approx([10.0, 12.0]) and len(r.in_process_tok_s) == 2
        assert all(t > 0 for t in r.in_process_tok_s)
        assert r.overhead == pytest.approx(1 - 11.0 / (sum(r.in_process_tok_s) / 2))
    assert engine_dir_of(foreign) is None and engine_dir_of(served) == tiny_engine


def test_overhead_is_the_fraction_of_in_process_throughput_lost():
    row = OverheadRow("d", "p", 1, True, served_tok_s=[30.0, 34.0], in_process_tok_s=[40.0, 40.0])
    assert row.overhead == pytest.approx(0.2)
    assert row.to_json()["overhead"] == pytest.approx(0.2)


@pytest.mark.e2e
@pytest.mark.slow  # ~30 s on a busy 2-core machine, mostly the server start
def test_a_streamed_overhead_above_five_percent_advises_stream_interval():
    from specbuild.bench.overhead import OverheadRow, overhead_advice

    rows = [OverheadRow("d", "p", 1, True, [39.0], [40.0]), OverheadRow("d", "p", 8, True, [90.0], [100.0]),
            OverheadRow("u", "p", 8, False, [90.0], [100.0]),  # unary: no interval to raise
            OverheadRow("s4", "p", 8, True, [90.0], [100.0], stream_interval=4)]  # raised already
    advice = overhead_advice(rows)
    assert len(advice) == 1 and advice[0].startswith("d: ") and "10%" in advice[0] and "C=8" in advice[0]
    assert "serve.stream_interval: 4" in advice[0]
    assert overhead_advice(rows[:1]) == []  # 2.5 %: nothing to advise


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
