"""``specbuild tune``: pick a method and draft length from a bench sweep.

From the points of :mod:`specbuild.client.bench` (one per deployment x prompt set x concurrency x
draft length) this module computes, per prompt set (a workload):

- the throughput-latency Pareto frontier (:func:`pareto_front`): points no other point beats on both
  total output tokens/s (higher is better) and latency (lower is better);
- a recommendation for a stated goal: the lowest latency at concurrency C
  (:func:`recommend_lowest_latency`), or the highest throughput under a latency bound
  (:func:`recommend_highest_throughput`);
- a draft-length schedule by concurrency per deployment (:func:`draft_len_schedule`), in TensorRT-LLM's
  terms: ``draft_len_schedule`` {batch-size threshold: draft length} (a batch of b requests uses the
  entry of the largest threshold <= b), valid by TensorRT-LLM's own rules
  (:mod:`specbuild.builder.draft_len_schedule`), and ``max_concurrency`` (speculation off above it);
- the analytic expectation of Leviathan et al. 2023 (:func:`analytic_comparison`) and how close each
  point comes to it;
- PNG plots of the frontier and of speed-up vs concurrency per method (:func:`plot_frontier`,
  :func:`plot_speedup`).

The pure functions take plain data and are unit-tested on hand-made points.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specbuild.builder.draft_len_schedule import schedule_from_measurements
from .bench_stats import clamp_probability, overlaps, ratio_ci

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

    @property
    def load(self) -> str:
        """``C=4`` or ``2/s`` (open loop)."""
        return f"C={self.concurrency}" if self.request_rate is None else f"{self.request_rate:g}/s"

    @property
    def label(self) -> str:
        return f"{self.deployment} k={self.draft_len} {self.load}"


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
                      small_sample=bool(d.get("small_sample")))
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


def indistinguishable(best: Candidate, cands: Sequence[Candidate], goal: str) -> list[Candidate]:
    """The other candidates the measurements cannot tell from ``best`` on the goal's axis: their 95 %
    interval (latency for ``latency``, throughput for ``throughput``) overlaps ``best``'s. Only
    candidates at the same load level for the latency goal. Empty when ``best`` has no interval.
    Example: best 100 ms [90, 110], other 105 ms [95, 120] -> [other]; other 130 ms [120, 140] -> []."""
    axis = "latency_ci" if goal == "latency" else "throughput_ci"
    same_level = lambda c: (c.concurrency, c.request_rate) == (best.concurrency, best.request_rate)  # noqa: E731
    return [
        c for c in cands
        if c is not best and (goal != "latency" or same_level(c)) and overlaps(getattr(best, axis), getattr(c, axis))
    ]


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


@dataclass(frozen=True)
class Schedule:
    """Draft length by concurrency for one deployment and prompt set.

    Attributes:
        best: measured concurrency -> the draft length with the lowest latency there.
        draft_len_schedule: TensorRT-LLM's ``{threshold: draft_len}`` for the levels where speculation
            is on (a batch of b requests uses the largest threshold <= b), with ``schedule[1] ==
            max_draft_len``; ``{}`` when TensorRT-LLM cannot express ``best`` (``note`` says why).
            Deploy it as the recipe's ``build.draft_len_schedule`` with ``speculation.max_draft_len``.
        max_concurrency: speculation off above it (TensorRT-LLM ``max_concurrency``); ``None`` = on at
            every measured level; 0 = off at every level.
        max_draft_len: ``draft_len_schedule[1]`` (``None`` without a schedule).
        note: why there is no schedule ("" when there is one).
    """

    deployment: str
    prompt_set: str
    best: dict[int, int]
    draft_len_schedule: dict[int, int]
    max_concurrency: int | None
    max_draft_len: int | None = None
    note: str = ""


def draft_len_schedule(cands: Sequence[Candidate], *, min_gain: float = 0.0) -> list[Schedule]:
    """Per (deployment, prompt set): the best draft length at each measured concurrency, and the
    threshold above which speculation stays off.

    ``min_gain``: a draft length k > 0 is chosen at a level only when its latency is below
    ``(1 - min_gain)`` x the k = 0 latency there (e.g. 0.05: at least 5 % faster), so that noise on a
    busy machine does not switch speculation on. Example: k=0 1000 ms, k=2 980 ms -> k = 2 with
    min_gain 0, k = 0 with min_gain 0.05.

    ``max_concurrency`` is the largest level below the tail of levels where k = 0 wins; a k = 0 win
    followed by a k > 0 win at a higher level is not a tail, so speculation stays on there.
    Example: best {1: 4, 4: 2, 8: 0, 16: 0} -> draft_len_schedule {1: 4, 4: 2}, max_concurrency 4;
    best {1: 0, 4: 3} -> no schedule: TensorRT-LLM requires schedule[1] = max_draft_len >= every entry.
    """
    groups: dict[tuple[str, str], list[Candidate]] = defaultdict(list)
    for c in cands:
        if c.request_rate is None:  # a schedule by batch size comes from closed-loop points
            groups[(c.deployment, c.prompt_set)].append(c)
    schedules = []
    for (deployment, prompt_set), group in sorted(groups.items()):
        levels = sorted({c.concurrency for c in group})
        best = {level: _best_draft_len(group, level, min_gain) for level in levels}
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
        schedule, note = schedule_from_measurements(on)
        schedules.append(Schedule(deployment, prompt_set, best, schedule or {}, max_concurrency,
                                  None if schedule is None else schedule[1], note))
    return schedules


def _best_draft_len(group: Sequence[Candidate], level: int, min_gain: float) -> int:
    """The best k at ``level``; 0 unless k beats k = 0 by ``min_gain`` and, where both have
    intervals, k's latency interval lies wholly below k = 0's (a significant gain)."""
    best = recommend_lowest_latency(group, level)
    base = [c for c in group if c.concurrency == level and c.draft_len == 0]
    if best.draft_len and base and best.latency_ms > (1.0 - min_gain) * base[0].latency_ms:
        return 0
    if best.draft_len and base and overlaps(best.latency_ci, base[0].latency_ci):
        return 0
    return best.draft_len


# --- analytic model (Leviathan et al. 2023) ----------------------------------------------------------


def expected_tokens_per_step(a: float, k: int) -> float:
    """Leviathan et al. 2023, eq. (1): E[tokens per step] = (1 - a^(k+1)) / (1 - a).

    ``a``: per-token acceptance probability in [0, 1] (i.i.d. across positions); ``k``: draft length.
    Computed as sum_{i=0..k} a^i, which equals the formula and stays finite at a = 1 (k + 1).
    Raises ``ValueError`` for ``a`` outside [0, 1] or ``k < 0``.
    """
    if not 0.0 <= a <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= a <= 1 and k >= 0, got a={a}, k={k}")
    return sum(a**i for i in range(k + 1))


def expected_speedup(a: float, k: int, c: float) -> float:
    """Leviathan et al. 2023, Theorem 3.8: walltime improvement (1 - a^(k+1)) / ((1 - a)(k c + 1)).

    ``c``: cost ratio, the time of one draft step relative to one target step (>= 0).
    Raises ``ValueError`` for ``c < 0`` (and as :func:`expected_tokens_per_step`).
    """
    if c < 0:
        raise ValueError(f"cost ratio c must be >= 0, got {c}")
    return expected_tokens_per_step(a, k) / (k * c + 1.0)


def fit_acceptance(tokens_per_step: Sequence[tuple[int, float]]) -> float:
    """Least-squares a in [0, 1] with expected_tokens_per_step(a, k) closest to the measured values.

    ``tokens_per_step``: (k, measured tokens per step) pairs with k >= 1. One pair inverts eq. (1)
    exactly. Example: [(2, 1.75)] -> 0.5 (1 + 0.5 + 0.25 = 1.75).
    Raises ``ValueError`` without a pair at k >= 1.
    """
    from scipy.optimize import minimize_scalar

    pairs = [(k, t) for k, t in tokens_per_step if k >= 1]
    if not pairs:
        raise ValueError("fit_acceptance needs at least one (k >= 1, tokens per step) pair")

    def loss(a: float) -> float:
        return sum((expected_tokens_per_step(a, k) - t) ** 2 for k, t in pairs)

    result = minimize_scalar(loss, bounds=(0.0, 1.0), method="bounded", options={"xatol": 1e-10})
    return float(min(1.0, max(0.0, result.x)))


def fit_cost_ratio(step_time_ratios: Sequence[tuple[int, float]]) -> float:
    """Least-squares c through the origin of T(k) / T(0) - 1 = c k (Leviathan's k c + 1 cost per step).

    ``step_time_ratios``: (k, T(k) / T(0)) pairs, T = wall time per target step. Example:
    [(2, 1.2), (4, 1.4)] -> 0.1. Raises ``ValueError`` without a pair at k >= 1.
    """
    pairs = [(k, r) for k, r in step_time_ratios if k >= 1]
    if not pairs:
        raise ValueError("fit_cost_ratio needs at least one (k >= 1, step time ratio) pair")
    return sum(k * (r - 1.0) for k, r in pairs) / sum(k * k for k, _ in pairs)


@dataclass(frozen=True)
class AnalyticRow:
    """One point against the model: measured vs expected tokens per step and speed-up."""

    deployment: str
    prompt_set: str
    draft_len: int
    concurrency: int
    a: float
    c: float
    tokens_per_step: float
    expected_tokens_per_step: float
    speedup: float
    expected_speedup: float
    speedup_ci: list[float] | None = None  # 95 % bootstrap, per-request TPOT of both points resampled
    request_rate: float | None = None  # open-loop points: the rate (concurrency is then the cap)

    @property
    def closeness(self) -> float:
        """Measured / expected speed-up (1.0 = the model is exact)."""
        return self.speedup / self.expected_speedup if self.expected_speedup else math.nan


def analytic_comparison(points: Iterable) -> list[AnalyticRow]:
    """Every point with k >= 1 against Leviathan et al.'s expectation, per (deployment, prompt set).

    How a and c are estimated (from the concurrency-1 points of the same deployment and prompt set;
    the lowest measured concurrency when 1 is absent):

    - a, the per-token acceptance probability: the least-squares fit of eq. (1) to the measured tokens
      per step (:func:`fit_acceptance`). Tokens per step, not accepted/proposed, because the latter is
      biased low under the model ((a - a^(k+1)) / ((1 - a) k) < a) and because drafters (n-gram) may
      propose fewer than k tokens.
    - c, the cost ratio: from the wall time per target pass T(k) (bench's ``step_ms``: decode steps
      after the first token when streamed, else sum(latency) / sum(target passes) with the prefill in
      both), T(k) / T(0) = k c + 1 fitted through the origin
      (:func:`fit_cost_ratio`), clamped at 0. c thus folds in everything a step with k drafts costs more
      than a plain step: drafting and, on a compute-bound CPU, verifying k + 1 tokens instead of 1.

    Measured speed-up at (k, C) = time per output token at k = 0 / at k, both at concurrency C. The
    model has no notion of concurrency: the same a and c predict every C, so the gap at C > 1 shows
    what batching (or, with a server that serves one request at a time, queueing) changes.
    Points without a k = 0 partner at the same concurrency are skipped. The model assumes one chain of
    k drafts per step; for tree/lookahead methods it is a reference line only.
    """
    rows: list[AnalyticRow] = []
    by_group: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for p in points:
        d = p if isinstance(p, dict) else asdict(p)
        by_group[(d["deployment"], d["prompt_set"])].append(d)
    for (deployment, prompt_set), group in sorted(by_group.items()):
        base = {d["concurrency"]: d for d in group if d["draft_len"] == 0 and d.get("request_rate") is None}
        if not base:
            continue
        fit_level = 1 if 1 in base else min(base)
        fit_points = [d for d in group if d["concurrency"] == fit_level and d["draft_len"] > 0]
        if not fit_points:
            continue
        a = fit_acceptance([(d["draft_len"], d["tokens_per_step"]) for d in fit_points])
        t0 = base[fit_level]["step_ms"]
        c = max(0.0, fit_cost_ratio([(d["draft_len"], d["step_ms"] / t0) for d in fit_points]))
        for d in sorted(group, key=lambda d: (d["concurrency"], d["draft_len"])):
            if d["draft_len"] == 0 or d["concurrency"] not in base or d.get("request_rate") is not None:
                continue
            k = d["draft_len"]
            b = base[d["concurrency"]]
            rows.append(
                AnalyticRow(
                    deployment, prompt_set, k, d["concurrency"], a, c, d["tokens_per_step"],
                    expected_tokens_per_step(a, k), b["tpot_ms"] / d["tpot_ms"],
                    expected_speedup(a, k, c),
                    speedup_ci=ratio_ci(b.get("tpot_samples_ms") or [], d.get("tpot_samples_ms") or []),
                )
            )
    return rows


def open_loop_speedups(points: Iterable) -> list[AnalyticRow]:
    """Speed-up (time per output token at k = 0 / at k) of open-loop points at the same rate; the
    analytic columns are not filled (a, c = nan-free zeros: the model is fitted on closed-loop points)."""
    rows = []
    dicts = [p if isinstance(p, dict) else asdict(p) for p in points]
    for d in dicts:
        if d.get("request_rate") is None or d["draft_len"] == 0:
            continue
        base = [b for b in dicts if b["draft_len"] == 0 and b.get("request_rate") == d["request_rate"]
                and (b["deployment"], b["prompt_set"], b["concurrency"]) == (d["deployment"], d["prompt_set"], d["concurrency"])]
        if not base:
            continue
        b = base[0]
        rows.append(AnalyticRow(d["deployment"], d["prompt_set"], d["draft_len"], d["concurrency"], 0.0, 0.0,
                                d["tokens_per_step"], d["tokens_per_step"], b["tpot_ms"] / d["tpot_ms"], 0.0,
                                speedup_ci=ratio_ci(b.get("tpot_samples_ms") or [], d.get("tpot_samples_ms") or []),
                                request_rate=d["request_rate"]))
    return rows


def per_position_from_sweep(points: Iterable) -> dict[tuple[str, str], list[tuple[int, int, float]]]:
    """P(a step accepts at least i drafts), derived from accepted drafts per step at consecutive k.

    E[accepted per step | k] = sum_{i=1..k} P(accepted >= i), so the difference between draft lengths
    k' < k is the acceptance summed over positions k'+1..k, reported as its mean per position
    (exact per position when k = k' + 1). Uses the concurrency-1 (else lowest) points and assumes
    the step mix does not depend on k. Returns, per (deployment, prompt set), (first position, last
    position, P) triples. Example: accepted/step 0 (k=0), 0.6 (k=1), 0.9 (k=2) -> [(1, 1, 0.6), (2, 2, 0.3)].
    A difference of two noisy means can leave [0, 1] (e.g. -0.08): such a P is clamped to [0, 1]
    and its reason recorded (:func:`per_position_warnings`).
    """
    by_group: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for p in points:
        d = p if isinstance(p, dict) else asdict(p)
        by_group[(d["deployment"], d["prompt_set"])].append(d)
    out = {}
    for key, group in sorted(by_group.items()):
        level = min(d["concurrency"] for d in group)
        per_k = {d["draft_len"]: d["accepted_per_step"] for d in group if d["concurrency"] == level}
        per_k.setdefault(0, 0.0)
        ks = sorted(per_k)
        if len(ks) < 2:
            continue
        out[key] = [(lo + 1, hi, clamp_probability((per_k[hi] - per_k[lo]) / (hi - lo), "")[0]) for lo, hi in zip(ks, ks[1:])]
    return out


def per_position_warnings(points: Iterable) -> list[str]:
    """Why derived per-position acceptances were clamped (one line per clamped span)."""
    lines = []
    dicts = [p if isinstance(p, dict) else asdict(p) for p in points]
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for d in dicts:
        groups[(d["deployment"], d["prompt_set"])].append(d)
    for (deployment, prompt_set), group in sorted(groups.items()):
        level = min(d["concurrency"] for d in group)
        per_k = {d["draft_len"]: d["accepted_per_step"] for d in group if d["concurrency"] == level}
        per_k.setdefault(0, 0.0)
        ks = sorted(per_k)
        for lo, hi in zip(ks, ks[1:]):
            _, reason = clamp_probability((per_k[hi] - per_k[lo]) / (hi - lo), f"{deployment} {prompt_set} positions {lo + 1}-{hi}")
            if reason:
                lines.append(reason)
    return lines


# --- report, plots -----------------------------------------------------------------------------------


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
    warnings: list[str] = field(default_factory=list)  # unreliable estimates, small samples, unstable points
    open_loop: list[AnalyticRow] = field(default_factory=list)  # speed-ups of open-loop points by rate

    def to_json(self) -> dict:
        return {
            "latency_metric": self.latency_metric,
            "goal": self.goal,
            "not_significantly_different": {s: [asdict(c) for c in t] for s, t in self.ties.items()},
            "warnings": self.warnings,
            "open_loop_speedups": [asdict(r) for r in self.open_loop],
            "schedule_min_gain": self.min_gain,
            "frontiers": {s: [asdict(c) for c in f] for s, f in self.frontiers.items()},
            "recommendations": {s: asdict(c) for s, c in self.recommendations.items()},
            "recommendation_errors": self.errors,
            "schedules": [asdict(s) for s in self.schedules],
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
    latency: str = "p50", min_gain: float = 0.05,
) -> TuneReport:
    """Frontier, recommendation, schedule and analytic comparison for bench ``points``.

    ``goal``: ``latency`` (lowest latency at ``concurrency``; default: the lowest measured level) or
    ``throughput`` (highest throughput with latency <= ``max_latency_ms``; required).
    ``min_gain``: the schedule's noise margin (:func:`draft_len_schedule`).
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
    if goal == "latency" and concurrency is None:
        concurrency = min(c.concurrency for c in cands)
    by_set: dict[str, list[Candidate]] = defaultdict(list)
    for c in cands:
        by_set[c.prompt_set].append(c)
    recommendations, errors = {}, {}
    for prompt_set, group in by_set.items():
        try:
            recommendations[prompt_set] = (
                recommend_lowest_latency(group, concurrency)
                if goal == "latency"
                else recommend_highest_throughput(group, max_latency_ms)
            )
        except TuneError as exc:
            errors[prompt_set] = str(exc)
    ties = {s: indistinguishable(c, by_set[s], goal) for s, c in recommendations.items()}
    goal_text = (
        f"lowest {latency} latency at concurrency {concurrency}"
        if goal == "latency"
        else f"highest throughput with {latency} latency <= {max_latency_ms:g} ms"
    )
    return TuneReport(
        latency_metric=latency,
        frontiers={s: pareto_front(g) for s, g in by_set.items()},
        recommendations=recommendations,
        goal=goal_text,
        schedules=draft_len_schedule(cands, min_gain=min_gain),
        analytic=analytic_comparison(points),
        per_position=per_position_from_sweep(points),
        errors=errors,
        measured_per_position=measured_per_position(points),
        min_gain=min_gain,
        ties={s: t for s, t in ties.items() if t},
        warnings=per_position_warnings(points) + point_warnings(points),
        open_loop=open_loop_speedups(points),
    )


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


def measured_per_position(points: Iterable) -> dict[tuple[str, str, int], list[float]]:
    """The streamed per-position acceptance of each (deployment, prompt set, k) at its lowest concurrency."""
    dicts = [p if isinstance(p, dict) else asdict(p) for p in points]
    lowest: dict[tuple[str, str], int] = {}
    for d in dicts:
        key = (d["deployment"], d["prompt_set"])
        lowest[key] = min(lowest.get(key, d["concurrency"]), d["concurrency"])
    return {
        (d["deployment"], d["prompt_set"], d["draft_len"]): list(d["per_position_acceptance"])
        for d in dicts
        if d.get("per_position_acceptance") and d["concurrency"] == lowest[(d["deployment"], d["prompt_set"])]
    }


def plot_frontier(points: Sequence, report: TuneReport, path: str | Path) -> Path:
    """PNG: total output tokens/s vs latency, one panel per prompt set.

    Every measured point is drawn (colour: deployment, marker: draft length) with its 95 % intervals as
    error bars and its load (``C=4`` or ``2/s``) written next to it; the frontier is the staircase
    through the points no other point beats on both axes (only points that exist; a step, not a
    straight line, between them). Both axes start at zero.
    """
    plt = _pyplot()
    cands = candidates(points, report.latency_metric)
    sets = sorted({c.prompt_set for c in cands})
    deployments = sorted({c.deployment for c in cands})
    colors = {d: f"C{i}" for i, d in enumerate(deployments)}
    markers = dict(zip(sorted({c.draft_len for c in cands}), "os^Dv<>ph*"))
    fig, axes = plt.subplots(1, len(sets), figsize=(7 * len(sets), 5.5), squeeze=False)
    for ax, prompt_set in zip(axes[0], sets):
        group = [c for c in cands if c.prompt_set == prompt_set]
        for c in group:
            xerr = _err(c.latency_ms, c.latency_ci)
            yerr = _err(c.throughput, c.throughput_ci)
            ax.errorbar(c.latency_ms, c.throughput, xerr=xerr, yerr=yerr, color=colors[c.deployment],
                        marker=markers[c.draft_len], ms=8, capsize=2, lw=0.8, elinewidth=0.8, mew=1.6,
                        mfc="white" if c.small_sample else colors[c.deployment], zorder=3)
            ax.annotate(c.load, (c.latency_ms, c.throughput), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=colors[c.deployment])
        front = report.frontiers.get(prompt_set, [])
        if front:
            xs = [c.latency_ms for c in front]
            ys = [c.throughput for c in front]
            ax.step(xs, ys, where="post", color="k", lw=1.2, ls="--", label="frontier (measured points only)")
            ax.scatter(xs, ys, s=160, facecolors="none", edgecolors="k", lw=1.2, zorder=3)
        recommended = report.recommendations.get(prompt_set)
        if recommended is not None:
            ax.scatter([recommended.latency_ms], [recommended.throughput], marker="*", s=260, color="gold",
                       edgecolors="k", zorder=4, label=f"recommended: {recommended.label}")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{prompt_set}")
        ax.set_xlabel(f"request latency {report.latency_metric} (ms)  (lower is better)")
        ax.set_ylabel("total output tokens/s  (higher is better)")
        ax.grid(alpha=0.3)
        for d in deployments:
            ax.plot([], [], color=colors[d], marker="o", ls="", label=d)
        for k, m in markers.items():
            ax.plot([], [], color="grey", marker=m, ls="", label=f"k={k}" + (" (speculation off)" if k == 0 else ""))
        if any(c.small_sample for c in group):
            ax.plot([], [], color="grey", marker="o", mfc="none", ls="", label="hollow: few requests")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Throughput vs latency per load level\n(error bars: 95% bootstrap intervals; dashed: the frontier)")
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_speedup(points: Sequence, report: TuneReport, path: str | Path) -> Path:
    """PNG: speed-up vs k = 0 (time per output token) against concurrency, one panel per deployment
    (rows: prompt sets). Measured speed-ups are lines with their 95 % intervals; Leviathan et al.'s
    expectation for the fitted (a, c) is drawn as hollow markers of the same colour; 1.0 (no gain)
    is the black line and the y axis starts at zero."""
    plt = _pyplot()
    rows_all = report.analytic + report.open_loop  # open-loop rows: x is the arrival rate, no model markers
    sets = sorted({r.prompt_set for r in rows_all}) or ["(no speculative points)"]
    deployments = sorted({(r.deployment, r.request_rate is not None) for r in rows_all}) or [("-", False)]
    fig, axes = plt.subplots(len(sets), len(deployments), figsize=(max(8.0, 6.5 * len(deployments)), 4.8 * len(sets)),
                             squeeze=False)
    for i, prompt_set in enumerate(sets):
        for j, (deployment, open_loop) in enumerate(deployments):
            ax = axes[i][j]
            rows = [r for r in rows_all if r.prompt_set == prompt_set and r.deployment == deployment
                    and (r.request_rate is not None) == open_loop]
            level = (lambda r: r.request_rate) if open_loop else (lambda r: r.concurrency)
            ks = sorted({r.draft_len for r in rows})
            for n, k in enumerate(ks):
                line = sorted((r for r in rows if r.draft_len == k), key=level)
                dodge = 1.0 + 0.05 * (n - (len(ks) - 1) / 2)  # side by side at each level (log axis)
                xs = [level(r) * dodge for r in line]
                ys = [r.speedup for r in line]
                errors = [_err(r.speedup, r.speedup_ci) for r in line]
                yerr = None if any(e is None for e in errors) else [[e[0][0] for e in errors], [e[1][0] for e in errors]]
                ax.errorbar(xs, ys, yerr=yerr, marker="o", color=f"C{n}", capsize=3, label=f"k={k} measured")
                if not open_loop:
                    ax.plot(xs, [r.expected_speedup for r in line], ls="", marker="D", mfc="none", mec=f"C{n}", ms=8,
                            label=f"k={k} expected (Leviathan et al.)")
            ax.axhline(1.0, color="k", lw=0.8)
            levels = sorted({level(r) for r in rows})
            if levels:
                ax.set_xscale("log", base=2)
                ax.set_xticks(levels, [f"{x:g}" for x in levels])
                ax.minorticks_off()
            top = max([1.2] + [r.speedup for r in rows] + [r.expected_speedup for r in rows]
                      + [r.speedup_ci[1] for r in rows if r.speedup_ci])
            ax.set_ylim(0, top * 1.1)
            ax.set_title(f"{deployment} -- {prompt_set}" + (" (open loop)" if open_loop else ""), fontsize=10)
            ax.set_xlabel("arrival rate (requests/s)" if open_loop else "concurrency (requests in flight)")
            ax.set_ylabel("speed-up vs k=0 (time per output token)")
            ax.grid(alpha=0.3)
            if rows:
                ax.legend(fontsize=7)
    model = any(r.request_rate is None for r in rows_all)
    fig.suptitle("Speed-up over speculation off\nmeasured (95% intervals)"
                 + (" vs the analytic expectation (hollow diamonds)" if model else ""))
    fig.tight_layout()
    return _save(fig, plt, path)


def _err(value: float, interval: list[float] | None):
    """matplotlib's asymmetric error ``[[below], [above]]`` from an interval; None without one."""
    if interval is None:
        return None
    return [[max(0.0, value - interval[0])], [max(0.0, interval[1] - value)]]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise TuneError("plots need matplotlib: pip install 'specbuild[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, plt, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report_tables(report: TuneReport) -> list:
    """Rich renderables: frontier, recommendation, schedule, speed-ups, analytic comparison, per position."""
    from rich.table import Table

    out = []
    for prompt_set, front in sorted(report.frontiers.items()):
        t = Table(title=f"Frontier: {prompt_set} (latency {report.latency_metric}; [95% interval])")
        for name in ("deployment", "k", "load", "latency ms", "tok/s total"):
            t.add_column(name, justify="left" if name == "deployment" else "right")
        for c in front:
            t.add_row(c.deployment, str(c.draft_len), c.load, _with_ci(c.latency_ms, c.latency_ci, "{:.0f}"),
                      _with_ci(c.throughput, c.throughput_ci, "{:.1f}") + (" (few requests)" if c.small_sample else ""))
        out.append(t)
    t = Table(title=f"Recommendation: {report.goal}")
    for name in ("prompts", "deployment", "method", "k", "load", "latency ms", "tok/s total", "cannot be told apart from"):
        t.add_column(name)
    for prompt_set, c in sorted(report.recommendations.items()):
        ties = report.ties.get(prompt_set, [])
        tie_text = ", ".join(f"{o.deployment} k={o.draft_len} {o.load}" for o in ties) or "-"
        t.add_row(prompt_set, c.deployment, c.method, str(c.draft_len), c.load, _with_ci(c.latency_ms, c.latency_ci, "{:.0f}"),
                  _with_ci(c.throughput, c.throughput_ci, "{:.1f}"), tie_text)
    for prompt_set, error in sorted(report.errors.items()):
        t.add_row(prompt_set, f"[red]{error}[/red]", "", "", "", "", "", "")
    out.append(t)
    t = Table(title=f"Draft-length schedule by concurrency (TensorRT-LLM draft_len_schedule / max_concurrency; "
                    f"k > 0 only when >= {100 * report.min_gain:.0f}% faster than k=0 and, with intervals, significantly)")
    for name in ("deployment", "prompts", "best k per C", "draft_len_schedule", "max_concurrency"):
        t.add_column(name)
    for s in report.schedules:
        mc = "always on" if s.max_concurrency is None else ("always off" if s.max_concurrency == 0 else str(s.max_concurrency))
        t.add_row(s.deployment, s.prompt_set, _fmt_map(s.best), _fmt_map(s.draft_len_schedule) or f"- ({s.note})", mc)
    out.append(t)
    t = Table(title="Against Leviathan et al. 2023: E[tokens/step] = (1-a^(k+1))/(1-a), speed-up = E/(kc+1); speed-up [95% interval]")
    for name in ("deployment", "prompts", "k", "C", "a", "c", "tok/step", "expected", "speed-up", "expected", "meas/exp"):
        t.add_column(name, justify="left" if name in ("deployment", "prompts") else "right")
    for r in report.analytic:
        t.add_row(r.deployment, r.prompt_set, str(r.draft_len), str(r.concurrency), f"{r.a:.3f}", f"{r.c:.3f}",
                  f"{r.tokens_per_step:.2f}", f"{r.expected_tokens_per_step:.2f}", _speedup_text(r),
                  f"{r.expected_speedup:.2f}", f"{r.closeness:.2f}")
    out.append(t)
    if report.open_loop:
        t = Table(title="Open loop: speed-up vs k=0 at the same arrival rate (time per output token) [95% interval]")
        for name in ("deployment", "prompts", "k", "rate /s", "cap", "tok/step", "speed-up"):
            t.add_column(name)
        for r in report.open_loop:
            t.add_row(r.deployment, r.prompt_set, str(r.draft_len), f"{r.request_rate:g}", str(r.concurrency or "-"),
                      f"{r.tokens_per_step:.2f}", _speedup_text(r))
        out.append(t)
    out.append(per_position_table(report))
    return out


def _with_ci(value: float, interval: list[float] | None, fmt: str) -> str:
    text = fmt.format(value)
    return text if interval is None else f"{text} [{fmt.format(interval[0])}, {fmt.format(interval[1])}]"


def _speedup_text(r: AnalyticRow) -> str:
    text = _with_ci(r.speedup, r.speedup_ci, "{:.2f}")
    if r.speedup_ci is not None and r.speedup_ci[0] <= 1.0 <= r.speedup_ci[1]:
        text += " (n.s.)"  # the interval contains 1: not significantly different from speculation off
    return text


def per_position_table(report: TuneReport):
    """Per-position acceptance at the lowest concurrency: measured from streamed steps where the bench
    streamed, else derived across draft lengths; next to the model's a^i for the fitted a."""
    from rich.table import Table

    fitted = {(r.deployment, r.prompt_set): r.a for r in report.analytic}
    t = Table(title="Per-position acceptance P(step accepts >= i drafts): measured (streamed) / derived (across k) / model a^i")
    for name in ("deployment", "prompts", "k", "source", "i = 1, 2, ...", "model a^i"):
        t.add_column(name)
    for (deployment, prompt_set, k), values in sorted(report.measured_per_position.items()):
        a = fitted.get((deployment, prompt_set))
        model = "" if a is None else " ".join(f"{a ** i:.2f}" for i in range(1, k + 1))
        t.add_row(deployment, prompt_set, str(k), "measured", " ".join(f"{v:.2f}" for v in values), model)
    for (deployment, prompt_set), spans in sorted(report.per_position.items()):
        text = " ".join(f"{p:.2f}" if lo == hi else f"[{lo}-{hi}] {p:.2f}" for lo, hi, p in spans)
        t.add_row(deployment, prompt_set, "-", "derived", text, "")
    return t


def _fmt_map(m: dict[int, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(m.items()))


def run_tune(points: Sequence, out_dir: str | Path, *, console, **goal) -> TuneReport:
    """``specbuild tune`` on bench points: print the tables, write tune.json, frontier.png, speedup.png.

    ``goal``: the keyword arguments of :func:`tune`. Raises ``TuneError``.
    """
    out = Path(out_dir)
    report = tune(points, **goal)
    report.plots = [str(plot_frontier(points, report, out / "frontier.png")), str(plot_speedup(points, report, out / "speedup.png"))]
    for table in report_tables(report):
        console.print(table)
    if any(r.speedup_ci for r in report.analytic + report.open_loop):
        console.print("(n.s.): the speed-up's 95% interval contains 1.0 -- not significantly different from speculation off")
    for prompt_set, ties in sorted(report.ties.items()):
        best = report.recommendations[prompt_set]
        console.print(f"note: {prompt_set}: the recommendation {best.label} is not significantly different from "
                      + ", ".join(o.label for o in ties) + " (95% intervals overlap); prefer the simpler or cheaper one")
    for line in report.warnings:
        console.print(f"warning: {line}", highlight=False)
    json_path = report.write(out / "tune.json")
    console.print(f"wrote {json_path}, {', '.join(report.plots)}")
    return report
