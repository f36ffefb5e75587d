"""The figures of one grid point, from its requests (pure; :func:`summarize_point`).

    latency_ms_p50/p90/p99   request latency, request sent -> last token received (milliseconds)
    ttft_ms_p50              time to first token: the first streamed response (``stream=True``: recipes
                             are served decoupled, one response per decoding step); None when not
                             streamed (one response per request: TTFT is not measured)
    tpot_ms                  time per output token: mean over requests of (latency - TTFT) / (tokens - 1)
                             when streamed, else latency / tokens (prefill included)
    user_tok_s               output tokens/s per user: mean over requests of tokens / latency
    total_tok_s              output tokens/s of the point: all output tokens / wall time of the point
    tokens_per_step          mean acceptance length (``mean_acceptance_length`` of
                             :class:`specbuild.interface.SpecDecodeMetrics`, pooled over the point's
                             requests): tokens per verification step after the prefill, bonus token
                             included, ``1 + sum(accepted) / sum(steps)`` with ``steps = n - 1 - accepted``
                             (1.0 for plain decoding; Leviathan et al.'s "expected tokens per step")
    acceptance_rate          accepted draft tokens / draft tokens, summed over the point's requests
    accepted_per_step, drafts_per_step
    per_position_acceptance  P(a step accepts at least i drafts), i = 1..k, counted from the streamed
                             steps (each carries its accepted drafts + 1); None without streaming: the
                             server reports per-request totals only, and ``specbuild tune`` derives it
                             from points at consecutive draft lengths
                             (see :func:`specbuild.tune.per_position_from_sweep`).

Intervals and small-sample flags: :mod:`specbuild.bench.stats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specbuild.interface import SpecDecodeMetrics

from .checks import check_request
from .records import RequestRecord
from .stats import MIN_REQUESTS, bootstrap_ci, meets_slo, parse_slo, percentile_statistic



@dataclass
class PointResult:
    """Measurements of one grid point (see the module docstring for each field's definition)."""

    deployment: str
    method: str
    prompt_set: str
    draft_len: int
    concurrency: int
    requests: int
    wall_s: float
    output_tokens: int
    latency_ms_p50: float
    latency_ms_p90: float
    latency_ms_p99: float
    ttft_ms_p50: float | None
    tpot_ms: float
    user_tok_s: float
    total_tok_s: float
    tokens_per_step: float
    acceptance_rate: float | None
    accepted_per_step: float
    drafts_per_step: float
    step_ms: float  # wall ms per target pass: decode steps after the first token when streamed, else prefill included
    per_position_acceptance: list[float] | None = None
    ids_match_baseline: float | None = None  # fraction of requests whose ids equal the k = 0 ids
    counters_checked: bool = False
    problems: list[str] = field(default_factory=list)
    # open loop (None: closed loop at `concurrency`; with a rate, `concurrency` is the cap, 0 = none)
    request_rate: float | None = None
    burstiness: float | None = None
    repeats: int = 1
    ttft_ms_p90: float | None = None
    ttft_ms_p99: float | None = None
    itl_ms_p50: float | None = None  # gaps between streamed chunks (vLLM's ITL), pooled over requests
    itl_ms_p90: float | None = None
    itl_ms_p99: float | None = None
    tpot_ms_p50: float | None = None  # per-request time per output token after the first (genai-perf's ITL)
    tpot_ms_p90: float | None = None
    tpot_ms_p99: float | None = None
    request_throughput: float | None = None  # completed requests/s (mean over repeats)
    goodput: float | None = None  # requests/s meeting every --slo (mean over repeats); None without --slo
    acceptance_length_histogram: list[int] | None = None  # [i] = streamed steps that emitted i + 1 tokens
    ci: dict[str, list[float] | None] = field(default_factory=dict)  # figure -> 95 % bootstrap [low, high]
    small_sample: bool = False  # fewer than stats.MIN_REQUESTS requests
    unstable: bool = False  # repeats' tokens/s spread past plan.stability_percentage
    notes: list[str] = field(default_factory=list)  # estimates marked unreliable, with the reason
    tpot_samples_ms: list[float] = field(default_factory=list)  # per request: the speed-up intervals resample these
    repeat_total_tok_s: list[float] = field(default_factory=list)
    # OpenAI targets: the server's own speculation figures over the point (openai_client.acceptance_over)
    server_acceptance: dict | None = None
    acceptance_source: str | None = None  # where the requests' draft counts came from: perf_metrics / derived / none
    # the speed-up over k = 0 at this level exceeds tokens_per_step (stats.exceeds_speedup_bound): the baseline
    # was measured on a slower machine; tune does not recommend from it
    baseline_disturbed: bool = False
    # --serving-overhead: k = 0 closed loop, the same requests on the same engine in the bench process, one per
    # repeat, each run next to the served repeat (specbuild/bench/overhead.py)
    in_process_tok_s: list[float] = field(default_factory=list)


def percentile_ms(latencies_s: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100, linear interpolation) of latencies in seconds, in milliseconds."""
    return float(np.percentile(np.asarray(latencies_s, dtype=float), q)) * 1000.0


def summarize_point(
    records: Sequence[RequestRecord], *, wall_s: float | Sequence[float], draft_len: int, max_tokens: int, slo: str = "",
    stability_percentage: float = 10.0, stream_interval: int = 1,
) -> dict:
    """The aggregate fields of :class:`PointResult` from a point's requests (pure; see module docstring).

    ``wall_s``: wall seconds of the point, or one per repeat (``records[i].repeat`` indexes it); the
    run-level figures (tokens/s, request throughput, goodput) are means over repeats, the request
    figures pool every repeat's requests. Intervals: :mod:`specbuild.bench.stats`.
    Raises ``ValueError`` when ``records`` is empty or a wall time is not positive.
    """
    walls = [wall_s] if isinstance(wall_s, (int, float)) else list(wall_s)
    if not records or not walls or any(w <= 0 for w in walls):
        raise ValueError("a point needs at least one request and a positive wall time")
    latencies = [r.latency_s for r in records]
    tokens = sum(r.num_tokens for r in records)
    pooled = SpecDecodeMetrics.pooled(r.metrics for r in records)
    accepted, drafts, steps = pooled.total_accepted_draft_tokens, pooled.total_draft_tokens, pooled.num_spec_steps
    streamed = all(r.ttft_s is not None for r in records)
    ttfts = [r.ttft_s for r in records] if streamed else []
    itls = [gap for r in records for gap in r.itl_s]
    tpots = [r.tpot_s for r in records]
    slo_ms = parse_slo(slo)
    per_repeat = _per_repeat(records, walls, slo_ms)
    ms = lambda values, q: percentile_ms(values, q) if values else None  # noqa: E731
    summary = {
        "requests": len(records),
        "wall_s": sum(walls),
        "output_tokens": tokens,
        "latency_ms_p50": percentile_ms(latencies, 50),
        "latency_ms_p90": percentile_ms(latencies, 90),
        "latency_ms_p99": percentile_ms(latencies, 99),
        "ttft_ms_p50": ms(ttfts, 50),
        "ttft_ms_p90": ms(ttfts, 90),
        "ttft_ms_p99": ms(ttfts, 99),
        "itl_ms_p50": ms(itls, 50),
        "itl_ms_p90": ms(itls, 90),
        "itl_ms_p99": ms(itls, 99),
        "tpot_ms": 1000.0 * float(np.mean(tpots)),
        "tpot_ms_p50": percentile_ms(tpots, 50),
        "tpot_ms_p90": percentile_ms(tpots, 90),
        "tpot_ms_p99": percentile_ms(tpots, 99),
        "user_tok_s": float(np.mean([r.num_tokens / r.latency_s if r.latency_s > 0 else 0.0 for r in records])),
        "total_tok_s": float(np.mean([t for t, _, _ in per_repeat])),
        "request_throughput": float(np.mean([q for _, q, _ in per_repeat])),
        "goodput": float(np.mean([g for _, _, g in per_repeat])) if slo_ms else None,
        "tokens_per_step": pooled.mean_acceptance_length or 1.0,
        "acceptance_rate": pooled.acceptance_rate,
        "accepted_per_step": accepted / steps if steps else 0.0,
        "drafts_per_step": drafts / steps if steps else 0.0,
        "step_ms": _step_ms(records, streamed),
        "per_position_acceptance": per_position_from_steps(records, draft_len) if streamed and draft_len else None,
        "acceptance_length_histogram": acceptance_length_histogram(records, draft_len) if streamed else None,
        "problems": [p for r in records for p in check_request(r, draft_len=draft_len, max_tokens=max_tokens,
                                                                stream_interval=stream_interval)],
        "repeats": len(walls),
        "small_sample": len(records) < MIN_REQUESTS,
        "tpot_samples_ms": [1000.0 * t for t in tpots],
        "repeat_total_tok_s": [t for t, _, _ in per_repeat],
    }
    summary["ci"] = _intervals(records, per_repeat, ttfts, tpots, bool(slo_ms))
    summary["unstable"], summary["notes"] = _stability(per_repeat, stability_percentage)
    if summary["small_sample"]:
        summary["notes"].append(f"{len(records)} requests (< {MIN_REQUESTS}): percentiles and intervals are rough")
    return summary


def _per_repeat(records: Sequence[RequestRecord], walls: Sequence[float], slo_ms: dict) -> list[tuple[float, float, float]]:
    """(output tokens/s, requests/s, good requests/s) of each repeat."""
    out = []
    for i, wall in enumerate(walls):
        mine = [r for r in records if r.repeat == i] if len(walls) > 1 else list(records)
        good = sum(meets_slo(ttft_ms=None if r.ttft_s is None else 1000 * r.ttft_s, tpot_ms=1000 * r.tpot_s,
                             e2el_ms=1000 * r.latency_s, slo=slo_ms) for r in mine) if slo_ms else 0
        out.append((sum(r.num_tokens for r in mine) / wall, len(mine) / wall, good / wall))
    return out


def _intervals(records, per_repeat, ttfts, tpots, with_goodput: bool) -> dict[str, list[float] | None]:
    """95 % bootstrap intervals of the point's figures (the stats module docstring says how)."""
    ci = {
        f"latency_ms_p{q}": _scaled(bootstrap_ci([r.latency_s for r in records], percentile_statistic(q))) for q in (50, 90, 99)
    }
    if ttfts:
        ci |= {f"ttft_ms_p{q}": _scaled(bootstrap_ci(ttfts, percentile_statistic(q))) for q in (50, 90, 99)}
    ci["tpot_ms"] = _scaled(bootstrap_ci(tpots))
    ci["total_tok_s"] = bootstrap_ci([t for t, _, _ in per_repeat])
    ci["request_throughput"] = bootstrap_ci([q for _, q, _ in per_repeat])
    if with_goodput:
        ci["goodput"] = bootstrap_ci([g for _, _, g in per_repeat])
    steps = np.array([r.decode_steps for r in records], dtype=float)
    if steps.sum() > 0:  # 1 + accepted / steps = (accepted + steps) / steps, resampled by request
        ci["tokens_per_step"] = ratio_of_sums_ci([r.accepted + r.decode_steps for r in records], steps)
    drafts = np.array([r.drafts for r in records], dtype=float)
    if drafts.sum() > 0:
        ci["acceptance_rate"] = ratio_of_sums_ci([r.accepted for r in records], drafts)
    return ci


def ratio_of_sums_ci(numerators: Sequence[float], denominators: Sequence[float]) -> list[float] | None:
    """Bootstrap interval of sum(numerators) / sum(denominators), resampling requests (pairs)."""
    from scipy.stats import bootstrap

    a, b = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if a.size < 2:
        return None
    if np.all(a == a[0]) and np.all(b == b[0]):
        return [float(a.sum() / b.sum())] * 2

    def ratio(x, y, axis):
        total = np.sum(y, axis=axis)
        return np.sum(x, axis=axis) / np.where(total == 0, np.nan, total)

    result = bootstrap((a, b), ratio, paired=True, vectorized=True, method="percentile", n_resamples=2000,
                       random_state=np.random.default_rng(0))
    low, high = result.confidence_interval
    return [float(low), float(high)] if np.isfinite(low) and np.isfinite(high) else None


def _scaled(interval: list[float] | None, factor: float = 1000.0) -> list[float] | None:
    return None if interval is None else [factor * v for v in interval]


def _stability(per_repeat, stability_percentage: float) -> tuple[bool, list[str]]:
    values = [t for t, _, _ in per_repeat]
    if len(values) < 2:
        return False, []
    mean = float(np.mean(values))
    spread = max(abs(v - mean) for v in values) / mean * 100 if mean else 0.0
    if spread > stability_percentage:
        return True, [f"unstable: a repeat's tokens/s is {spread:.0f}% from the mean (> {stability_percentage:g}%)"]
    return False, []


def acceptance_length_histogram(records: Sequence[RequestRecord], draft_len: int) -> list[int] | None:
    """Streamed steps by tokens emitted: ``[i]`` = steps (after the prefill) that emitted ``i + 1``
    tokens, i = 0..draft_len. Example at k = 2: steps [1 (prefill), 3, 1, 2] -> [1, 1, 1]. A last
    step clipped at max_tokens counts at its clipped size."""
    sizes = [n for r in records if r.step_tokens for n in r.step_tokens[1:]]
    if not sizes:
        return None
    counts = [0] * (max(draft_len, max(sizes) - 1) + 1)
    for n in sizes:
        counts[n - 1] += 1
    return counts


def _step_ms(records: Sequence[RequestRecord], streamed: bool) -> float:
    """Wall ms per target pass: streamed, the decode steps after the first token only; else every pass,
    the prefill's included (sum(latency) / sum(decode steps + 1))."""
    if streamed:
        steps = sum(r.decode_steps for r in records)
        if steps:
            return 1000.0 * sum(r.latency_s - r.ttft_s for r in records) / steps
    return 1000.0 * sum(r.latency_s for r in records) / max(1, sum(r.decode_steps + 1 for r in records))


def per_position_from_steps(records: Sequence[RequestRecord], draft_len: int) -> list[float] | None:
    """P(a verification step accepts at least i drafts), i = 1..draft_len, from streamed step sizes.

    A streamed step after the prefill carries its accepted drafts + 1 token. Example: steps of
    [1 (prefill), 3, 1, 2] tokens at k = 2 -> accepted [2, 0, 1] -> [2/3, 1/3]. The last step may be
    clipped at max_tokens or the end token, which can only lower the estimate.
    """
    accepted = [n - 1 for r in records if r.step_tokens for n in r.step_tokens[1:]]
    if not accepted:
        return None
    return [sum(a >= i for a in accepted) / len(accepted) for i in range(1, draft_len + 1)]
