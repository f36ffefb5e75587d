"""Choosing from a sweep: candidates, the throughput-latency Pareto frontier, recommendations for a
goal, the draft-length schedule by concurrency, and :func:`tune`, which gathers them (with the
analytic comparison of :mod:`specbuild.tune.analytic`) into a :class:`TuneReport`."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from specbuild.util.draft_len_schedule import schedule_from_measurements

from ..bench.stats import DISTURBED, overlaps
from .analytic import (
    AnalyticRow,
    analytic_comparison,
    measured_per_position,
    open_loop_speedups,
    per_position_from_sweep,
    per_position_warnings,
)
from .schedules import Schedule, engine_schedules


LATENCY_METRICS = {
    "p50": "latency_ms_p50",
    "p90": "latency_ms_p90",
    "p99": "latency_ms_p99",
    "tpot": "tpot_ms",
}


class TuneError(ValueError):
    """A goal no measured point can meet, or data that cannot answer the question; says what was measured."""


@dataclass(frozen=True)
class Candidate:
    """One configuration as the tuner sees it.

    Attributes:
        latency_ms: the chosen latency figure (request latency p50/p90/p99 or time per output token), ms.
        throughput: total output tokens/s over all requests in flight.
        request_rate: open-loop points: the arrival rate (requests/s; ``concurrency`` is then the
            cap, 0 = none); ``None`` for closed loop.
        latency_ci, throughput_ci: 95 % bootstrap intervals ``[low, high]`` from the bench point;
            ``None`` when not measured (one repeat for throughput, too few requests).
        small_sample: the point had too few requests for its percentiles to mean much.
        disturbed: its speed-up over k = 0 exceeds its tokens per step (bench's ``baseline_disturbed``,
            or the same test on the analytic table): not recommended, not in a schedule.
    """

    deployment: str
    method: str
    prompt_set: str
    draft_len: int
    concurrency: int
    latency_ms: float
    throughput: float
    request_rate: float | None = None
    latency_ci: list[float] | None = None
    throughput_ci: list[float] | None = None
    small_sample: bool = False
    disturbed: bool = False

    @property
    def load(self) -> str:
        """``C=4`` or ``2/s`` (open loop)."""
        return f"C={self.concurrency}" if self.request_rate is None else f"{self.request_rate:g}/s"

    @property
    def label(self) -> str:
        return f"{self.deployment} k={self.draft_len} {self.load}"


_EXPECTED = {"float": "a finite number >= 0", "int": "a whole number >= 0", "str": "a string", "bool": "true or false",
             "None": "null", "dict": "an object"}


def _split_top(spec: str, sep: str) -> list[str]:
    """``spec`` split at ``sep`` outside brackets: ``"list[float] | None"`` -> ``["list[float]", "None"]``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += ch == "["
        depth -= ch == "]"
        if depth == 0 and spec.startswith(sep, i):
            parts.append(spec[start:i].strip())
            start = i + len(sep)
    return parts + [spec[start:].strip()]


def _expected(spec: str) -> str:
    """Words for a field annotation: ``"float | None"`` -> ``"a finite number >= 0 or null"``."""
    words = []
    for alt in _split_top(spec, "|"):
        if alt.startswith("list["):
            words.append(f"a list (items: {_expected(alt[5:-1])})")
        elif alt.startswith("dict["):
            words.append(f"an object (values: {_expected(_split_top(alt[5:-1], ',')[1])})")
        else:
            words.append(_EXPECTED.get(alt, alt))
    return " or ".join(words)


def _mismatch(value, spec: str) -> tuple[str, object, str] | None:
    """``None`` when ``value`` (read from JSON) is what annotation ``spec`` allows, else ``(where, the
    value at fault, its annotation)``: ``where`` is ``""`` (the value itself), ``"[2]"`` (a list item) or
    ``"['x']"`` (an object's value). Numbers must be finite and >= 0: every figure of a bench point is a
    count, a time, a rate or a fraction."""
    for alt in _split_top(spec, "|"):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if (alt == "None" and value is None or alt == "str" and isinstance(value, str) or alt == "bool" and isinstance(value, bool)
                or alt == "dict" and isinstance(value, dict) or alt == "int" and number and isinstance(value, int) and value >= 0
                or alt == "float" and number and math.isfinite(value) and value >= 0):
            return None
        if alt.startswith(("list[", "dict[")) and isinstance(value, list if alt.startswith("list[") else dict):
            inner = alt[5:-1] if alt.startswith("list[") else _split_top(alt[5:-1], ",")[1]
            items = enumerate(value) if isinstance(value, list) else value.items()
            for key, item in items:
                if (bad := _mismatch(item, inner)) is not None:
                    return f"[{key!r}]{bad[0]}", bad[1], bad[2]
            return None
    return "", value, spec


def check_points(points: Sequence) -> None:
    """Refuse bench points whose figures are not what a sweep writes (a ``bench.json`` edited by hand or
    by another tool): each field of :class:`~specbuild.bench.points.PointResult` present must have its
    type, numbers finite and >= 0 (``"fast"``, ``null`` latency, ``-5`` or ``NaN`` tokens/s), so tune
    never ranks on them or fails with a ``TypeError``. ``points``: ``PointResult`` or dicts.

    Raises:
        TuneError: naming the row (``points[3]``, with its deployment, prompt set, load and draft
            length), the field, its value and what it must be.
    """
    from dataclasses import fields as dataclass_fields

    from ..bench.points import PointResult

    specs = {f.name: str(f.type) for f in dataclass_fields(PointResult)}
    for i, point in enumerate(points):
        row = point if isinstance(point, dict) else asdict(point)
        for name, spec in specs.items():
            bad = _mismatch(row[name], spec) if name in row else None
            if bad is None:
                continue
            where, value, expected = bad
            shown = repr(value) if isinstance(value, float) and not math.isfinite(value) else json.dumps(value, default=str)
            label = f"{row.get('deployment', '?')} {row.get('prompt_set', '?')} C={row.get('concurrency', '?')} k={row.get('draft_len', '?')}"
            raise TuneError(f"points[{i}] ({label}): {name}{where} is {shown}; expected {_expected(expected)}. Fix that row "
                            "or measure it again with `specbuild bench`")


def candidates(points: Iterable, latency: str = "p50") -> list[Candidate]:
    """Candidates from bench points (``PointResult`` or dicts with the same keys).

    Raises ``TuneError`` for an unknown latency metric.
    """
    if latency not in LATENCY_METRICS:
        raise TuneError(f"latency metric must be one of {sorted(LATENCY_METRICS)}, got {latency!r}")
    key = LATENCY_METRICS[latency]
    out = []
    for p in points:
        d = p if isinstance(p, dict) else asdict(p)
        ci = d.get("ci") or {}
        out.append(
            Candidate(d["deployment"], d["method"], d["prompt_set"], d["draft_len"], d["concurrency"], d[key], d["total_tok_s"],
                      request_rate=d.get("request_rate"), latency_ci=ci.get(key), throughput_ci=ci.get("total_tok_s"),
                      small_sample=bool(d.get("small_sample")), disturbed=bool(d.get("baseline_disturbed")))
        )
    return out


def dominates(a: Candidate, b: Candidate) -> bool:
    """``a`` is no worse than ``b`` on latency and throughput, and better on at least one."""
    no_worse = a.latency_ms <= b.latency_ms and a.throughput >= b.throughput
    return no_worse and (a.latency_ms < b.latency_ms or a.throughput > b.throughput)


def pareto_front(cands: Sequence[Candidate]) -> list[Candidate]:
    """The candidates no other candidate dominates, by increasing latency.

    Example: (latency, throughput) = (10, 5), (20, 9), (15, 4), (30, 9) -> (10, 5), (20, 9):
    (15, 4) is beaten by (10, 5) on both, (30, 9) by (20, 9) on latency.
    """
    front = [c for c in cands if not any(dominates(o, c) for o in cands)]
    return sorted(front, key=lambda c: (c.latency_ms, -c.throughput))


SpeedupIntervals = Mapping[tuple[str, str, int, int], Sequence[float]]
"""``(deployment, prompt set, k, concurrency)`` -> the 95 % interval of k's speed-up over k = 0 there
(the analytic table's, from per-request time per output token)."""


def tie_basis(best: Candidate, other: Candidate, speedup_ci: SpeedupIntervals | None = None) -> str | None:
    """Why the measurements cannot tell ``other`` from ``best`` at one load level, or ``None`` when they can.

    The same test the draft-length schedule applies (:func:`draft_len_schedule`), so the
    recommendation's note, the schedule and ``--write-recipe`` agree. Within one deployment, where
    the speed-up intervals over k = 0 exist (closed loop):

    - k = 0 against k > 0: tied when k's speed-up interval contains 1 (``"speed-up interval contains 1"``);
    - two k > 0: tied when their speed-up intervals overlap (``"speed-up intervals overlap"``).

    Otherwise (no speed-up interval, another deployment, open loop): tied when the 95 % latency
    intervals overlap (``"latency intervals overlap"``); ``None`` when either has no interval.
    Example: k=4 1.54 [1.15, 2.59], k=2 1.47 [1.17, 2.11]: k=0 is not tied with k=4 even when their
    p50 latency intervals overlap, and k=2 is (``"speed-up intervals overlap"``).
    """
    speedup_ci = speedup_ci or {}
    if other.deployment == best.deployment and best.request_rate is None and other.request_rate is None:
        key = lambda c: (c.deployment, c.prompt_set, c.draft_len, c.concurrency)  # noqa: E731
        if 0 in (best.draft_len, other.draft_len) and best.draft_len != other.draft_len:
            interval = speedup_ci.get(key(best if best.draft_len else other))
            if interval is not None:
                return "speed-up interval contains 1" if interval[0] <= 1.0 <= interval[1] else None
        elif best.draft_len and other.draft_len:
            a, b = speedup_ci.get(key(best)), speedup_ci.get(key(other))
            if a is not None and b is not None:
                return "speed-up intervals overlap" if overlaps(a, b) else None
    return "latency intervals overlap" if overlaps(best.latency_ci, other.latency_ci) else None


def indistinguishable(best: Candidate, cands: Sequence[Candidate], goal: str, speedup_ci: SpeedupIntervals | None = None) -> list[Candidate]:
    """The other candidates the measurements cannot tell from ``best`` on the goal's axis.

    ``latency`` goal: candidates at ``best``'s load level for which :func:`tie_basis` finds a tie
    (speed-up intervals over k = 0 where ``speedup_ci`` has them, else 95 % latency intervals).
    ``throughput`` goal: candidates whose 95 % throughput interval overlaps ``best``'s. Empty when
    ``best`` has no interval to compare.
    Example: best 100 ms [90, 110], other 105 ms [95, 120] -> [other]; other 130 ms [120, 140] -> []."""
    if goal != "latency":
        return [c for c in cands if c is not best and overlaps(best.throughput_ci, c.throughput_ci)]
    same_level = lambda c: (c.concurrency, c.request_rate) == (best.concurrency, best.request_rate)  # noqa: E731
    return [c for c in cands if c is not best and same_level(c) and tie_basis(best, c, speedup_ci) is not None]


def recommend_lowest_latency(cands: Sequence[Candidate], concurrency: int) -> Candidate:
    """The lowest-latency candidate at ``concurrency`` (ties: higher throughput); closed-loop points,
    or open-loop points capped at ``concurrency`` when the sweep was open loop.

    Raises ``TuneError`` listing the measured concurrency levels when none is at ``concurrency``.
    """
    at = [c for c in cands if c.concurrency == concurrency]
    if not at:
        levels = sorted({c.concurrency for c in cands})
        raise TuneError(f"no point measured at concurrency {concurrency}; measured: {levels}")
    return min(at, key=lambda c: (c.latency_ms, -c.throughput))


def recommend_highest_throughput(cands: Sequence[Candidate], max_latency_ms: float) -> Candidate:
    """The highest-throughput candidate with latency <= ``max_latency_ms`` (ties: lower latency).

    Raises ``TuneError`` naming the lowest latency measured when no candidate meets the bound.
    """
    within = [c for c in cands if c.latency_ms <= max_latency_ms]
    if not within:
        best = min(cands, key=lambda c: c.latency_ms)
        raise TuneError(
            f"no configuration meets latency <= {max_latency_ms:g} ms; the lowest measured is "
            f"{best.latency_ms:.0f} ms ({best.label}): raise --max-latency-ms or lower the concurrency"
        )
    return max(within, key=lambda c: (c.throughput, -c.latency_ms))


def draft_len_schedule(
    cands: Sequence[Candidate], *, min_gain: float = 0.0, speedup_ci: SpeedupIntervals | None = None,
    lookahead: Mapping[str, Sequence[int]] | None = None,
) -> list[Schedule]:
    """Per (deployment, prompt set): the best draft length at each measured concurrency, and the
    threshold above which speculation stays off.

    ``min_gain``: a draft length k > 0 is chosen at a level only when its latency is below
    ``(1 - min_gain)`` x the k = 0 latency there (e.g. 0.05: at least 5 % faster), so that noise on a
    busy machine does not switch speculation on. Example: k=0 1000 ms, k=2 980 ms -> k = 2 with
    min_gain 0, k = 0 with min_gain 0.05.

    ``max_concurrency`` is the largest level below the tail of levels where k = 0 wins; a k = 0 win
    followed by a k > 0 win at a higher level is not a tail, so speculation stays on there.
    Example: best {1: 4, 4: 2, 8: 0, 16: 0} -> draft_len_schedule {1: 4, 2: 2} (:func:`batch_thresholds`),
    max_concurrency 4;
    best {1: 0, 4: 3} -> no schedule: TensorRT-LLM requires schedule[1] = max_draft_len >= every entry.

    ``speedup_ci``: ``(deployment, prompt set, k, concurrency)`` -> the 95 % interval of k's speed-up
    over k = 0 there (the analytic table's, from per-request time per output token): where one exists,
    k counts as significantly faster when the interval lies above 1 (the same test that marks a
    speed-up "n.s."); elsewhere when k's latency interval lies wholly below k = 0's.

    ``lookahead``: deployment -> its built ``(W, N, G)``. A lookahead k is the request's
    ``lookahead_config`` ``(W, k + 1, G)``, a shape, not a draft length an iteration can switch to:
    the engine runs a step either whole (the request's shape, draft length = its token budget
    ``(N - 2) + (W - 1 + G) * (N - 1)``) or plain (0). So such a schedule takes k1 = the best k at
    concurrency 1 as the shape to build (:attr:`Schedule.lookahead_ngram` = k1 + 1), chooses at every
    level between k1 and 0 only, and writes k1 as its token budget. Example: (4, 3, 4), best {1: 1,
    4: 0} -> lookahead_ngram 2, draft_len_schedule {1: 7}, max_concurrency 1.
    """
    groups: dict[tuple[str, str], list[Candidate]] = defaultdict(list)
    for c in cands:
        if c.request_rate is None:  # a schedule by batch size comes from closed-loop points
            groups[(c.deployment, c.prompt_set)].append(c)
    schedules = []
    for (deployment, prompt_set), group in sorted(groups.items()):
        levels = sorted({c.concurrency for c in group})
        best = {level: _best_draft_len(group, level, min_gain, speedup_ci or {}) for level in levels}
        shape = (lookahead or {}).get(deployment)
        if shape is not None and best.get(1):  # lookahead: one shape (k1) or plain at each level
            k1 = best[1]
            group = [c for c in group if c.draft_len in (0, k1)]
            best = {level: _best_draft_len(group, level, min_gain, speedup_ci or {}) for level in levels}
        off_tail = []
        for level in reversed(levels):
            if best[level] != 0:
                break
            off_tail.append(level)
        if not off_tail:
            max_concurrency = None
        elif len(off_tail) == len(levels):
            max_concurrency = 0
        else:
            max_concurrency = max(level for level in levels if level not in off_tail)
        on = {level: k for level, k in best.items() if max_concurrency is None or level <= max_concurrency}
        by_batch = batch_thresholds(on)
        schedule, note = schedule_from_measurements(by_batch)
        ngram = None
        if shape is not None and schedule:
            from specbuild.methods.lookahead import lookahead_max_draft_len

            w, _, g = shape
            ngram = schedule[1] + 1
            budget = lookahead_max_draft_len(w, ngram, g)
            schedule = {b: budget if k else 0 for b, k in schedule.items()}
            note = (f"lookahead: built as (W, N, G) = ({w}, {ngram}, {g}), the shape measured best at concurrency 1 "
                    f"(k = N - 1 = {ngram - 1}); each iteration runs it whole (draft length {budget}, its token budget) or plain")
        schedules.append(Schedule(deployment, prompt_set, best, schedule or {}, max_concurrency,
                                  None if schedule is None else schedule[1], note, ngram, by_batch))
    return schedules


def batch_thresholds(best: Mapping[int, int]) -> dict[int, int]:
    """Measured concurrency -> best k, as batch-size thresholds: a level's k governs the batch sizes above
    the level below it, ``(previous level, level]``, so the threshold of level ``L_i`` is ``L_{i-1} + 1``
    (level 1 stays 1). In a closed loop at concurrency C the batch never exceeds C, so a batch between
    two measured levels occurs only under the higher level's load, and the batch falls below C between
    one request and the next: measured on smollm2-ngram, a schedule {1: 4, 2: 4, 4: 2} ran batch 3 at k=4
    and was 2 % below fixed k=2 at C=4, where {1: 4, 2: 4, 3: 2} runs it at k=2.

    Example: ``{1: 4, 2: 4, 4: 2}`` -> ``{1: 4, 2: 4, 3: 2}``; ``{1: 4, 4: 2}`` -> ``{1: 4, 2: 2}``.
    """
    levels = sorted(best)
    return {(1 if i == 0 and level == 1 else levels[i - 1] + 1 if i else level): best[level] for i, level in enumerate(levels)}


def _best_draft_len(
    group: Sequence[Candidate], level: int, min_gain: float, speedup_ci: SpeedupIntervals,
) -> int:
    """The lowest-latency k at ``level`` among those that beat k = 0 by ``min_gain`` and significantly
    (their speed-up interval lies above 1 where there is one, else their latency interval lies wholly
    below k = 0's); 0 when none does. A k whose point estimate is lowest but whose gain is not
    significant does not hide a k whose gain is: at one level k=4 n.s. (1.04 [0.94, 1.17]) and k=2
    significant (1.14 [1.04, 1.26]) -> 2."""
    base = [c for c in group if c.concurrency == level and c.draft_len == 0]
    if not base:
        return recommend_lowest_latency(group, level).draft_len
    k0 = base[0]

    def wins(c: Candidate) -> bool:
        if c.latency_ms > (1.0 - min_gain) * k0.latency_ms:
            return False
        interval = speedup_ci.get((c.deployment, c.prompt_set, c.draft_len, level))
        if interval is not None:
            return interval[0] > 1.0
        return not overlaps(c.latency_ci, k0.latency_ci)

    winners = [c for c in group if c.concurrency == level and c.draft_len and wins(c)]
    return recommend_lowest_latency(winners, level).draft_len if winners else 0


@dataclass
class TuneReport:
    """Everything ``specbuild tune`` prints and writes."""

    latency_metric: str
    frontiers: dict[str, list[Candidate]]
    recommendations: dict[str, Candidate]
    goal: str
    schedules: list[Schedule]
    analytic: list[AnalyticRow]
    per_position: dict[tuple[str, str], list[tuple[int, int, float]]]
    plots: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    # (deployment, prompt set, k) -> P(>= i accepted), i = 1..k, from streamed steps at the lowest concurrency
    measured_per_position: dict[tuple[str, str, int], list[float]] = field(default_factory=dict)
    min_gain: float = 0.0
    # prompt set -> candidates the recommendation cannot be told from (overlapping 95 % intervals)
    ties: dict[str, list[Candidate]] = field(default_factory=dict)
    # prompt set -> why each of its ties is one (:func:`tie_basis`), in the order of ``ties``
    tie_bases: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # unreliable estimates, small samples, unstable points
    # points whose speed-up exceeds their tokens per step (baseline disturbed): never recommended or scheduled
    disturbed: list[Candidate] = field(default_factory=list)
    open_loop: list[AnalyticRow] = field(default_factory=list)  # speed-ups of open-loop points by rate
    engine_schedules: list = field(default_factory=list)  # schedules.EngineSchedules per schedule: TensorRT-LLM, vLLM, SGLang

    def to_json(self) -> dict:
        return {
            "latency_metric": self.latency_metric,
            "goal": self.goal,
            "not_significantly_different": {
                s: [asdict(c) | ({"basis": b} if b else {}) for c, b in zip(t, self.tie_bases.get(s) or [None] * len(t))]
                for s, t in self.ties.items()},
            "warnings": self.warnings,
            "baseline_disturbed": [asdict(c) for c in self.disturbed],
            "open_loop_speedups": [asdict(r) for r in self.open_loop],
            "schedule_min_gain": self.min_gain,
            "frontiers": {s: [asdict(c) for c in f] for s, f in self.frontiers.items()},
            "recommendations": {s: asdict(c) for s, c in self.recommendations.items()},
            "recommendation_errors": self.errors,
            "schedules": [asdict(s) for s in self.schedules],
            "engine_schedules": [e.to_json() for e in self.engine_schedules],
            "analytic": [asdict(r) | {"closeness": r.closeness} for r in self.analytic],
            "per_position_acceptance_derived": [
                {"deployment": d, "prompt_set": s, "positions": [{"from": a, "to": b, "p": p} for a, b, p in v]}
                for (d, s), v in self.per_position.items()
            ],
            "per_position_acceptance_measured": [
                {"deployment": d, "prompt_set": s, "draft_len": k, "p": v} for (d, s, k), v in self.measured_per_position.items()
            ],
            "plots": self.plots,
        }

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1))
        return path


def tune(
    points: Sequence, *, goal: str = "latency", concurrency: int | None = None, max_latency_ms: float | None = None,
    latency: str = "p50", min_gain: float = 0.05, lookahead: Mapping[str, Sequence[int]] | None = None,
) -> TuneReport:
    """Frontier, recommendation, schedule and analytic comparison for bench ``points``.

    ``goal``: ``latency`` (lowest latency at ``concurrency``; default: the lowest measured level) or
    ``throughput`` (highest throughput with latency <= ``max_latency_ms``; required).
    ``min_gain``: the schedule's noise margin (:func:`draft_len_schedule`); ``lookahead``: deployment ->
    built (W, N, G) of the lookahead deployments (their schedules, :func:`draft_len_schedule`).
    Raises ``TuneError`` for a bad goal or a missing bound; an unmeetable goal for one prompt set is
    recorded in ``errors`` and the others still get theirs.
    """
    if goal not in ("latency", "throughput"):
        raise TuneError(f"--goal must be 'latency' or 'throughput', got {goal!r}")
    if goal == "throughput" and max_latency_ms is None:
        raise TuneError("--goal throughput needs --max-latency-ms X (the latency bound in milliseconds)")
    cands = candidates(points, latency)
    if not cands:
        raise TuneError("no bench points to tune on")
    analytic = analytic_comparison(points)  # closed-loop speed-ups with their paired intervals
    flagged = {(r.deployment, r.prompt_set, r.draft_len, r.concurrency, r.request_rate)
               for r in analytic + open_loop_speedups(points) if r.baseline_disturbed}
    cands = [replace(c, disturbed=True) if (c.deployment, c.prompt_set, c.draft_len, c.concurrency, c.request_rate) in flagged
             else c for c in cands]
    trusted = [c for c in cands if not c.disturbed]  # recommendations and schedules come from these only
    if goal == "latency" and concurrency is None:
        concurrency = min(c.concurrency for c in cands)
    by_set: dict[str, list[Candidate]] = defaultdict(list)
    for c in cands:
        by_set[c.prompt_set].append(c)
    recommendations, errors = {}, {}
    for prompt_set, everything in by_set.items():
        group = [c for c in everything if not c.disturbed]
        try:
            if not group:
                raise TuneError(f"every point of {prompt_set} has its baseline disturbed (speed-up above tokens/step): "
                                "rerun with --repeats 3 on a quieter machine")
            pool = [c for c in everything if goal != "latency" or c.concurrency == concurrency]
            if any(c.draft_len > 0 for c in pool) and not any(c.draft_len > 0 and not c.disturbed for c in pool):
                # k = 0 would win only because every speculative point was set aside
                raise TuneError(f"every speculative point of {prompt_set}{f' at concurrency {concurrency}' if goal == 'latency' else ''} "
                                "has its baseline disturbed (speed-up above tokens/step), so speculation cannot be judged: "
                                "rerun with --repeats 3 on a quieter machine")
            recommendations[prompt_set] = (
                recommend_lowest_latency(group, concurrency)
                if goal == "latency"
                else recommend_highest_throughput(group, max_latency_ms)
            )
        except TuneError as exc:
            errors[prompt_set] = str(exc)
    speedup_ci = {(r.deployment, r.prompt_set, r.draft_len, r.concurrency): r.speedup_ci for r in analytic if r.speedup_ci}
    ties = {s: indistinguishable(c, by_set[s], goal, speedup_ci) for s, c in recommendations.items()}
    for s, c in list(recommendations.items()):  # speculation that cannot be told from off is not recommended
        off = [o for o in ties[s] if o.draft_len == 0 and (o.deployment, o.concurrency) == (c.deployment, c.concurrency)]
        if c.draft_len > 0 and off:
            recommendations[s] = off[0]
            ties[s] = [c] + [o for o in ties[s] if o is not off[0]]
    tie_bases = {s: [tie_basis(recommendations[s], o, speedup_ci) if goal == "latency" else "throughput intervals overlap"
                     for o in t] for s, t in ties.items() if t}
    goal_text = (
        f"lowest {latency} latency at concurrency {concurrency}"
        if goal == "latency"
        else f"highest throughput with {latency} latency <= {max_latency_ms:g} ms"
    )
    # a schedule needs every level judged: none for a (deployment, prompt set) with a disturbed point
    unjudged = sorted({(c.deployment, c.prompt_set) for c in cands if c.disturbed})
    schedules = draft_len_schedule([c for c in trusted if (c.deployment, c.prompt_set) not in unjudged],
                                   min_gain=min_gain, speedup_ci=speedup_ci, lookahead=lookahead)
    methods = {c.deployment: c.method for c in cands}
    return TuneReport(
        latency_metric=latency,
        frontiers={s: pareto_front(g) for s, g in by_set.items()},
        recommendations=recommendations,
        goal=goal_text,
        schedules=schedules,
        engine_schedules=[engine_schedules(s, methods[s.deployment]) for s in schedules],
        analytic=analytic,
        per_position=per_position_from_sweep(points),
        errors=errors,
        measured_per_position=measured_per_position(points),
        min_gain=min_gain,
        ties={s: t for s, t in ties.items() if t},
        tie_bases=tie_bases,
        warnings=per_position_warnings(points) + point_warnings(points) + [
            f"{c.label}: {DISTURBED} (from the speed-up table); not recommended"
            for c in cands if c.disturbed and not _bench_flagged(points, c)] + [
            f"{d} on {s}: no draft_len_schedule, some of its points have their baseline disturbed; "
            "rerun with --repeats 3 on a quieter machine" for d, s in unjudged],
        disturbed=[c for c in cands if c.disturbed],
        open_loop=open_loop_speedups(points),
    )


def _bench_flagged(points: Iterable, c: Candidate) -> bool:
    """Whether bench already flagged (and noted) ``c``'s point."""
    return any((d := p if isinstance(p, dict) else asdict(p)).get("baseline_disturbed")
               and (d["deployment"], d["prompt_set"], d["draft_len"], d["concurrency"], d.get("request_rate"))
               == (c.deployment, c.prompt_set, c.draft_len, c.concurrency, c.request_rate) for p in points)


def point_warnings(points: Iterable) -> list[str]:
    """One line per point flagged by bench: too few requests, or repeats that disagree."""
    lines = []
    for p in points:
        d = p if isinstance(p, dict) else asdict(p)
        where = f"{d['deployment']} {d['prompt_set']} k={d['draft_len']} " + (
            f"C={d['concurrency']}" if d.get("request_rate") is None else f"{d['request_rate']:g}/s")
        for note in d.get("notes") or []:
            lines.append(f"{where}: {note}")
    return lines
