"""The soak's bookkeeping (specbuild.soak.ledger): which requests count as lost, failed or
rejected, the interval windows and percentiles, and the RSS and p99-drift criteria."""

import errno
import json
import random

import pytest

from specbuild.soak.faults import LiveResults, check_complete
from specbuild.soak.ledger import (
    FaultWindow,
    Outcome,
    RequestRecord,
    classify,
    drift_windows,
    judge_lost,
    judge_outputs,
    judge_p99_drift,
    judge_rss,
    percentiles,
    summarize,
    totals,
)
from specbuild.soak.load import Mix, draw, prompt_pool, SoakPrompt

LIMITS = dict(timeout_s=10.0, grace_s=5.0)


def rec(start, end=None, status="ok", **kw) -> RequestRecord:
    return RequestRecord(id=kw.pop("id", 0), kind=kw.pop("kind", "triton-stream"), prompt="p", max_tokens=8,
                         start=start, end=end, status=status if end is not None else None, **kw)


def test_a_request_without_answer_is_in_flight_until_the_timeout_then_lost():
    r = rec(100.0)
    assert classify(r, now=114.0, **LIMITS) is None
    assert classify(r, now=115.5, **LIMITS) is Outcome.LOST


def test_an_answer_after_timeout_plus_grace_is_lost_even_if_it_came():
    assert classify(rec(0.0, 16.0), now=20.0, **LIMITS) is Outcome.LOST
    assert classify(rec(0.0, 14.0, status="error", error="RequestTimeoutError"), now=20.0, **LIMITS) is Outcome.FAILED


def test_bad_request_with_its_error_response_is_rejected_and_answered_bad_request_is_failed():
    assert classify(rec(0, 1, status="error", bad=True, expected_error=True), now=5, **LIMITS) is Outcome.REJECTED
    assert classify(rec(0, 1, status="error", bad=True, expected_error=False), now=5, **LIMITS) is Outcome.FAILED
    assert classify(rec(0, 1, status="ok", bad=True), now=5, **LIMITS) is Outcome.FAILED


def test_errors_inside_a_fault_window_plus_grace_are_fault_errors_outside_failed():
    fault = [FaultWindow("kill", start=50.0, end=60.0)]
    assert classify(rec(45, 52, status="error"), now=70, faults=fault, **LIMITS) is Outcome.FAULT_ERROR
    assert classify(rec(64, 65, status="error"), now=70, faults=fault, **LIMITS) is Outcome.FAULT_ERROR  # within grace
    assert classify(rec(66, 67, status="error"), now=70, faults=fault, **LIMITS) is Outcome.FAILED
    assert classify(rec(20, 21, status="error"), now=70, faults=fault, **LIMITS) is Outcome.FAILED
    open_fault = [FaultWindow("kill", start=50.0)]
    assert classify(rec(80, 81, status="error"), now=90, faults=open_fault, **LIMITS) is Outcome.FAULT_ERROR


def test_cancelled_and_completed():
    assert classify(rec(0, 1, status="cancelled", cancel=True), now=5, **LIMITS) is Outcome.CANCELLED
    assert classify(rec(0, 1), now=5, **LIMITS) is Outcome.COMPLETED


def test_summary_counts_each_outcome_in_the_interval_it_became_known():
    records = [rec(0, 5, id=1), rec(0, 12, id=2), rec(1, 3, status="error", bad=True, expected_error=True, id=3),
               rec(2, None, id=4)]  # id 4: lost at 2 + 15 = 17
    first = summarize(records, t0=0, t1=10, now=30, **LIMITS)
    second = summarize(records, t0=10, t1=20, now=30, **LIMITS)
    assert (first["completed"], first["rejected"], first["lost"]) == (1, 1, 0)
    assert (second["completed"], second["lost"]) == (1, 1)
    assert totals(records, now=30, **LIMITS) == {"completed": 2, "cancelled": 0, "rejected": 1, "fault_error": 0,
                                                 "failed": 0, "lost": 1, "in_flight": 0}
    assert totals(records, now=10, **LIMITS)["in_flight"] == 1  # id 4, not yet overdue


def test_summary_latency_percentiles_and_acceptance_use_completed_requests_only():
    records = [rec(0, float(i), tokens=10, accepted=6) for i in range(1, 101)]
    records.append(rec(0, 9.5, status="error"))
    s = summarize(records, t0=0, t1=200, now=300, timeout_s=200, grace_s=0)
    assert s["e2e_s"]["p50"] == pytest.approx(50.5)
    assert s["e2e_s"]["p99"] == pytest.approx(99.01)
    assert s["acceptance_length"] == pytest.approx(1 + 6 / 3)  # 10 tokens: 6 accepted in 10 - 1 - 6 steps


def test_percentiles_of_nothing_are_none():
    assert percentiles([None, None]) == {"p50": None, "p90": None, "p99": None}


def test_lost_and_outputs_criteria():
    assert judge_lost({"lost": 0, "in_flight": 0}).passed
    assert not judge_lost({"lost": 1, "in_flight": 0}).passed
    assert not judge_lost({"lost": 0, "in_flight": 2}).passed
    good, bad = rec(0, 1, match=True, id=1), rec(0, 1, match=False, id=7)
    assert judge_outputs([good, rec(0, 1)]).passed
    verdict = judge_outputs([good, bad])
    assert not verdict.passed and "7" in verdict.detail
    assert not judge_outputs([rec(0, 1)]).passed  # nothing sampled is not a pass


def test_rss_criterion_starts_after_warmup_and_fails_at_five_percent():
    mib = 2**20
    warm = [(0.0, 500 * mib), (30.0, 1000 * mib)]
    assert judge_rss(warm + [(60.0, 1000 * mib), (600.0, 1049 * mib)], warmup_s=30).passed
    assert not judge_rss(warm + [(600.0, 1050 * mib)], warmup_s=30).passed
    assert judge_rss(warm, warmup_s=30).passed is None  # one sample after warm-up: not judged


def test_drift_windows_are_ten_minutes_or_a_third_of_a_short_run():
    assert drift_windows(warmup_s=300, end_s=3600) == ((300, 900), (3000, 3600))
    assert drift_windows(warmup_s=30, end_s=300) == ((30, 120), (210, 300))


def test_p99_drift_passes_within_twenty_percent_and_fails_beyond():
    def run(late_factor):
        early = [rec(t, t + 1.0 + (t % 7) / 10) for t in range(60, 150)]
        late = [rec(t, t + late_factor * (1.0 + (t % 7) / 10)) for t in range(240, 330)]
        return judge_p99_drift(early + late, warmup_s=60, end_s=330, now=400, timeout_s=60, grace_s=0)

    assert run(1.15).passed
    assert not run(1.3).passed


def test_draw_fractions_follow_the_mix():
    rng = random.Random(0)
    pool = [SoakPrompt("a", "x", 1)]
    plans = [draw(rng, pool, Mix()) for _ in range(20000)]
    assert sum(p.bad for p in plans) / len(plans) == pytest.approx(0.05, abs=0.01)
    assert sum(p.cancel for p in plans) / len(plans) == pytest.approx(0.10, abs=0.01)
    assert all(p.kind.endswith("stream") for p in plans if p.cancel)
    assert not any(p.bad and p.cancel for p in plans)


class CharTokenizer:
    """One token per character (enough to check the pool's cut lengths)."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def test_prompt_pool_adds_a_long_and_a_near_max_prompt_within_the_limit():
    pool = prompt_pool([("a", "def f(x):\n    return x\n"), ("huge", "y" * 1000)], CharTokenizer(), max_input_len=200)
    sizes = {p.name: p.tokens for p in pool}
    assert "huge" not in sizes  # longer than the server takes: left out
    assert sizes["long"] == 100 and 180 <= sizes["near-max"] <= 184


def test_live_results_on_a_full_disk_keep_the_last_complete_file(tmp_path):
    live = LiveResults(tmp_path)
    assert live.write({"n": 1})
    live._fail_with = errno.ENOSPC
    assert not live.write({"n": 2})
    assert live.failures == ["ENOSPC: No space left on device"]
    assert json.loads((tmp_path / "soak-live.json").read_text()) == {"n": 1}
    assert check_complete(tmp_path) == {"json_files": 1, "incomplete": [], "temporaries": []}


def test_open_loop_is_bounded_in_count_and_sheds_beyond_max_in_flight():
    import threading
    import time

    from specbuild.soak.load import OpenLoop

    release = threading.Event()
    sent: list[int] = []
    t0 = time.monotonic()
    loop = OpenLoop(rate_per_s=500.0, duration_s=5.0, max_requests=30, max_in_flight=4, seed=1)

    def send(i):
        sent.append(i)
        release.wait(5)

    clock = lambda: time.monotonic() - t0  # noqa: E731
    runner = threading.Thread(target=lambda: loop.run(send, clock, end_at=lambda: 0.3))
    runner.start()
    runner.join(3)
    release.set()
    assert not runner.is_alive()
    assert loop.sent == len(sent) == 4  # the other arrivals found 4 in flight
    assert loop.shed > 0
    loop = OpenLoop(rate_per_s=500.0, duration_s=5.0, max_requests=30, max_in_flight=100, seed=1)
    loop.run(lambda i: None, clock)
    assert loop.sent == 30


def test_fault_criterion_needs_recovery_errors_in_time_and_completions_after():
    from specbuild.soak.faults import FaultResult
    from specbuild.soak.harness import fault_clients, fault_criterion

    fault = FaultResult("kill", start=50.0, end=70.0, recovery_s=20.0)
    windows = [FaultWindow("kill", 50.0, 70.0)]
    records = [rec(48, 51, status="error", error="ServerUnavailableError: no answer", id=1),
               rec(55, 55.1, status="error", error="ServerUnavailableError: refused", id=2),
               rec(80, 81, id=3)]
    fault.clients = fault_clients(records, fault, now=100, faults=windows, **LIMITS)
    assert fault.clients["during"] == {"fault_error": 2}
    assert fault.clients["completed_after"] == 1 and fault.clients["slowest_error_s"] == pytest.approx(3.0)
    assert fault_criterion(fault, 15.0).passed
    fault.clients = fault_clients(records[:2], fault, now=100, faults=windows, **LIMITS)
    assert not fault_criterion(fault, 15.0).passed  # nothing succeeded after the restart
    fault.recovery_s = None
    assert not fault_criterion(fault, 15.0).passed
