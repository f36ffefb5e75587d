"""The analytic model of Leviathan et al. 2023 against the measurements, and per-position acceptance.

- expected tokens per step and speed-up for a per-token acceptance probability a, draft length k and
  cost ratio c (:func:`expected_tokens_per_step`, :func:`expected_speedup`), a and c fitted to the
  sweep (:func:`fit_acceptance`, :func:`fit_cost_ratio`), every point against them
  (:func:`analytic_comparison`);
- speed-ups of open-loop points at the same arrival rate (:func:`open_loop_speedups`);
- P(a step accepts at least i drafts), derived across draft lengths (:func:`per_position_from_sweep`)
  or measured from streamed steps (:func:`measured_per_position`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from ..bench.stats import clamp_probability, exceeds_speedup_bound, ratio_ci


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
    def baseline_disturbed(self) -> bool:
        """The measured speed-up exceeds the measured tokens per step, its upper bound, by more than
        5 % (:func:`~specbuild.bench.stats.exceeds_speedup_bound`): the k = 0 point ran on a
        slower machine than this one."""
        return exceeds_speedup_bound(self.speedup, self.tokens_per_step)

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
