"""``specbuild bench --ramp``: intervals and flags from streamed steps, and a short real ramp end to end."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.bench.ramp import RampReport, StepEvent, flag_intervals, intervals_of


def steps(t0: float, n: int, drafted: int, accepted: int, width: float = 1.0) -> list[StepEvent]:
    """``n`` decoding steps of one request spread over [t0, t0 + width), after its first (prefill) response."""
    first = [StepEvent(t0, 0, 1, 0, 0, first=True)]
    return first + [StepEvent(t0 + width * (i + 1) / (n + 1), 0, accepted + 1, drafted, accepted) for i in range(n)]


def test_intervals_read_tokens_draft_length_and_acceptance_from_the_steps_in_them():
    events = steps(0.0, 9, 4, 2) + steps(1.0, 9, 0, 0)
    first, second = intervals_of(events, [0.99, 1.99], [1, 2], 1.0)
    assert (first.tokens, first.tokens_per_s, first.steps) == (1 + 9 * 3, 28.0, 9)
    assert (first.draft_len_mean, first.draft_len_max, first.draft_lens) == (4.0, 4, {4: 9})
    assert first.acceptance_rate == 0.5 and first.requests_finished == 1 and first.speculating
    assert (second.draft_len_max, second.acceptance_rate, second.speculating) == (0, None, False)


def test_a_throughput_drop_as_load_rises_is_a_cliff_and_a_drop_as_it_falls_is_not():
    ivs = intervals_of(steps(0.0, 9, 4, 2) + steps(1.0, 3, 4, 2) + steps(2.0, 1, 4, 2), [], [1, 2, 1], 1.0)
    flag_intervals(ivs, 0.2)
    assert ivs[1].flags and "throughput cliff" in ivs[1].flags[0] and "28.0 -> 10.0 tok/s (-64%)" in ivs[1].flags[0]
    assert not ivs[2].flags  # load fell: fewer tokens/s is expected


def test_acceptance_below_the_interval_before_speculation_went_off_is_flagged():
    before = [e for k in range(4) for e in steps(k * 0.25, 3, 4, 3 if k % 2 else 4, width=0.25)]  # acceptance ~0.875, varied
    off = [StepEvent(1.0 + i / 100, 0, 1, 0, 0) for i in range(50)] + [StepEvent(1.9, 0, 1, 2, 1)]  # one drafted step
    stale = [StepEvent(2.0 + i / 10, 0, 1, 4, 0) for i in range(5)]  # drafts all rejected after re-enabling
    ivs = intervals_of(before + off + stale, [], [1, 8, 1], 1.0)
    flag_intervals(ivs)
    assert not ivs[1].speculating and ivs[2].speculating
    assert ivs[2].flags and "acceptance after re-enabling 0.000 is below" in ivs[2].flags[0]
    healthy = intervals_of(before + off + [StepEvent(2.0 + i / 10, 0, 4, 4, 3 if i % 2 else 4) for i in range(6)], [], [1, 8, 1], 1.0)
    flag_intervals(healthy)
    assert not healthy[2].flags


def test_report_writes_json_and_a_png(tmp_path):
    ivs = intervals_of(steps(0.0, 9, 4, 2) + steps(1.0, 3, 4, 2), [0.5], [1, 4], 1.0)
    flag_intervals(ivs)
    report = RampReport("d", "ngram", [1, 4], 1.0, ivs)
    path = report.write(tmp_path)
    data = json.loads(path.read_text())
    assert data["flags"] and "while load rises" in data["cliff_definition"] and "derived" in data["draft_len_source"]
    assert (tmp_path / "ramp.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.e2e
def test_a_short_ramp_through_triton(decoupled_server, tmp_path):
    triton, engine_dir = decoupled_server
    result = CliRunner().invoke(main, [
        "bench", triton.grpc_url, "--streaming", "--tokenizer", str(engine_dir / "tokenizer"), "--prompts", "humaneval:4",
        "--max-tokens", "12", "--end-id", "-1", "--ramp", "1,3,1", "--ramp-step-s", "3", "--results-dir", str(tmp_path),
    ])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "ramp.json").read_text())
    assert [iv["concurrency"] for iv in data["intervals"]] == [1, 3, 1]
    assert all(iv["tokens"] > 0 for iv in data["intervals"])
    drafted = [iv for iv in data["intervals"] if iv["steps"]]
    assert drafted and all(0 < iv["draft_len_max"] <= 4 for iv in drafted)  # the tiny n-gram deployment's max_draft_len 4
    assert all(0 <= iv["acceptance_rate"] <= 1 for iv in drafted if iv["acceptance_rate"] is not None)
    assert (tmp_path / "ramp.png").exists() and "Ramp" in result.output
