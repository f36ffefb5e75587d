"""The soak's bookkeeping: one :class:`RequestRecord` per request, its :class:`Outcome`, per-interval
summaries and the pass criteria. No I/O; times are seconds since the run started (monotonic).

Outcomes (``classify``)::

    completed    an answer within timeout_s + grace_s (the one kind whose output is compared)
    cancelled    the client closed its stream after the first chunk, as it meant to
    rejected     a deliberately bad request answered with an error response (the expected error)
    fault_error  an error while a fault was active (between its injection and its recovery + grace)
    failed       any other error, or a bad request that was answered as if it were good
    lost         neither an answer nor an error within timeout_s + grace_s: the client hung

Pass criteria (issue 35): no request lost; every sampled output equals its plain reference; server
RSS grows by less than 5 % after warm-up; p99 end-to-end latency of the last window is at most 20 %
above that of the first window after warm-up (windows of 10 minutes, a third of the post-warm-up
time for shorter runs).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum

import numpy as np

from specbuild.interface import SpecDecodeMetrics


class Outcome(str, Enum):
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    FAULT_ERROR = "fault_error"
    FAILED = "failed"
    LOST = "lost"


@dataclass
class RequestRecord:
    """One request: what was sent, when, and what came back.

    ``start`` / ``end``: seconds since the run started (``end`` None while in flight); ``status``:
    ``"ok"``, ``"cancelled"`` or ``"error"`` as the client saw it; ``expected_error``: the error is the
    one a bad request should get (an error response: HTTP 4xx / gRPC INVALID_ARGUMENT / a rejection);
    ``ttft_s``: streamed requests only; ``itl_s``: mean seconds between tokens after the first;
    ``match``: output equals the plain reference (None: not sampled).
    """

    id: int
    kind: str
    prompt: str
    max_tokens: int
    start: float
    bad: bool = False
    cancel: bool = False
    reconnect: bool = False
    end: float | None = None
    status: str | None = None
    error: str | None = None
    expected_error: bool = False
    ttft_s: float | None = None
    itl_s: float | None = None
    tokens: int = 0
    accepted: int | None = None
    output_ids: list[int] | None = field(default=None, repr=False)
    match: bool | None = None

    @property
    def e2e_s(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass(frozen=True)
class FaultWindow:
    """A fault's span: ``start`` (injected) to ``end`` (recovered; None while not yet)."""

    name: str
    start: float
    end: float | None = None


def in_fault(record: RequestRecord, faults: Sequence[FaultWindow], grace_s: float) -> bool:
    """The request overlaps a fault window widened by ``grace_s`` at its end."""
    end = record.end if record.end is not None else float("inf")
    return any(record.start <= (f.end if f.end is not None else float("inf")) + grace_s and end >= f.start for f in faults)


def classify(record: RequestRecord, *, now: float, timeout_s: float, grace_s: float,
             faults: Sequence[FaultWindow] = ()) -> Outcome | None:
    """The record's outcome at time ``now`` (seconds), or None while it is in flight and not yet overdue."""
    limit = timeout_s + grace_s
    if record.end is None:
        return Outcome.LOST if now - record.start > limit else None
    if record.end - record.start > limit:
        return Outcome.LOST
    if record.status == "error":
        if record.bad and record.expected_error:
            return Outcome.REJECTED
        return Outcome.FAULT_ERROR if in_fault(record, faults, grace_s) else Outcome.FAILED
    if record.bad:
        return Outcome.FAILED
    if record.status == "cancelled":
        return Outcome.CANCELLED
    return Outcome.COMPLETED


def percentiles(values: Iterable[float | None], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float | None]:
    """``{"p50": ..., "p90": ..., "p99": ...}`` of the non-None ``values`` (linear interpolation); None when empty."""
    data = np.array([v for v in values if v is not None], dtype=float)
    return {f"p{q:g}": (float(np.percentile(data, q)) if data.size else None) for q in qs}


class Ledger:
    """Thread-safe list of request records; ``add`` when sent, ``finish`` when answered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: list[RequestRecord] = []

    def add(self, record: RequestRecord) -> RequestRecord:
        with self._lock:
            self.records.append(record)
        return record

    def snapshot(self) -> list[RequestRecord]:
        with self._lock:
            return list(self.records)


def outcome_time(record: RequestRecord, outcome: Outcome, limit_s: float) -> float:
    """When the outcome became known: the answer's time, or (lost) start + the limit."""
    if outcome is Outcome.LOST:
        return record.start + limit_s
    return record.end  # type: ignore[return-value]


def summarize(records: Sequence[RequestRecord], *, t0: float, t1: float, now: float, timeout_s: float,
              grace_s: float, faults: Sequence[FaultWindow] = ()) -> dict:
    """The interval [t0, t1): counts of each outcome known by ``now`` whose time falls in it, the
    latency percentiles (seconds) and acceptance length of its completed requests, sampled outputs
    and mismatches."""
    counts = {o.value: 0 for o in Outcome}
    done: list[RequestRecord] = []
    for r in records:
        outcome = classify(r, now=now, timeout_s=timeout_s, grace_s=grace_s, faults=faults)
        if outcome is None or not t0 <= outcome_time(r, outcome, timeout_s + grace_s) < t1:
            continue
        counts[outcome.value] += 1
        if outcome is Outcome.COMPLETED:
            done.append(r)
    pooled = SpecDecodeMetrics.pooled(SpecDecodeMetrics(r.tokens, None, r.accepted) for r in done if r.accepted is not None)
    sampled = [r for r in done if r.match is not None]
    return {
        "t0_s": t0, "t1_s": t1, **counts,
        "e2e_s": percentiles(r.e2e_s for r in done),
        "ttft_s": percentiles(r.ttft_s for r in done),
        "itl_s": percentiles(r.itl_s for r in done),
        "acceptance_length": None if pooled is None else pooled.mean_acceptance_length,
        "sampled": len(sampled),
        "mismatches": sum(1 for r in sampled if not r.match),
    }


def totals(records: Sequence[RequestRecord], *, now: float, timeout_s: float, grace_s: float,
           faults: Sequence[FaultWindow] = ()) -> dict[str, int]:
    """Count of each outcome over the whole run (in-flight requests under ``in_flight``)."""
    counts = {o.value: 0 for o in Outcome} | {"in_flight": 0}
    for r in records:
        outcome = classify(r, now=now, timeout_s=timeout_s, grace_s=grace_s, faults=faults)
        counts["in_flight" if outcome is None else outcome.value] += 1
    return counts


@dataclass(frozen=True)
class Criterion:
    """One pass criterion: ``passed`` None = not judged (``detail`` says why)."""

    name: str
    passed: bool | None
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


def judge_lost(counts: dict[str, int]) -> Criterion:
    lost = counts.get("lost", 0) + counts.get("in_flight", 0)
    return Criterion("no request lost", lost == 0, f"{lost} lost (neither answer nor error within the timeout)")


def judge_outputs(records: Sequence[RequestRecord]) -> Criterion:
    sampled = [r for r in records if r.match is not None]
    bad = [r.id for r in sampled if not r.match]
    if not sampled:
        return Criterion("sampled outputs equal their plain reference", False, "no completed request was sampled")
    return Criterion("sampled outputs equal their plain reference", not bad,
                     f"{len(sampled) - len(bad)}/{len(sampled)} equal" + (f"; differ: requests {bad[:10]}" if bad else ""))


def judge_rss(samples: Sequence[tuple[float, float]], *, warmup_s: float, limit: float = 0.05) -> Criterion:
    """``samples``: (time s, RSS bytes). Growth from the first sample at or after ``warmup_s`` to the
    last one must stay below ``limit`` (a fraction)."""
    after = [(t, rss) for t, rss in samples if t >= warmup_s]
    if len(after) < 2:
        return Criterion("RSS growth after warm-up < 5 %", None, f"{len(after)} RSS sample(s) after warm-up; need 2")
    base, last = after[0][1], after[-1][1]
    growth = last / base - 1
    return Criterion("RSS growth after warm-up < 5 %", growth < limit,
                     f"{base / 2**20:.1f} MiB at {after[0][0]:.0f} s -> {last / 2**20:.1f} MiB at {after[-1][0]:.0f} s ({growth:+.1%})")


def drift_windows(*, warmup_s: float, end_s: float, window_s: float = 600.0) -> tuple[tuple[float, float], tuple[float, float]]:
    """The first window after warm-up and the last window of the run, each ``window_s`` long, or a
    third of the post-warm-up time when that is shorter (they never overlap)."""
    w = min(window_s, max(0.0, end_s - warmup_s) / 3)
    return (warmup_s, warmup_s + w), (end_s - w, end_s)


def judge_p99_drift(records: Sequence[RequestRecord], *, warmup_s: float, end_s: float, now: float, timeout_s: float,
                    grace_s: float, window_s: float = 600.0, limit: float = 0.20) -> Criterion:
    """p99 end-to-end latency of the completed requests that started in the last window is at most
    ``limit`` above that of the first window after warm-up."""
    first, last = drift_windows(warmup_s=warmup_s, end_s=end_s, window_s=window_s)

    def p99(window: tuple[float, float]) -> tuple[float | None, int]:
        e2e = [r.e2e_s for r in records if window[0] <= r.start < window[1]
               and classify(r, now=now, timeout_s=timeout_s, grace_s=grace_s) is Outcome.COMPLETED]
        return percentiles(e2e, (99,))["p99"], len(e2e)

    (a, na), (b, nb) = p99(first), p99(last)
    name = "p99 E2E of the last window within 20 % of the first after warm-up"
    span = f"windows [{first[0]:.0f}, {first[1]:.0f}) s and [{last[0]:.0f}, {last[1]:.0f}) s"
    if a is None or b is None:
        return Criterion(name, None, f"{span}: {na} and {nb} completed requests; need some in both")
    return Criterion(name, b <= a * (1 + limit), f"{span}: p99 {a:.2f} s ({na} req) -> {b:.2f} s ({nb} req), {b / a - 1:+.1%}")
