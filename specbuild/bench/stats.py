"""Statistics for bench points: bootstrap confidence intervals, goodput, small-sample flags.

Confidence intervals are percentile bootstrap intervals (``scipy.stats.bootstrap``, 95 %, 2000
resamples, fixed seed so a rerun of the same data gives the same interval):

- figures of requests (latency and TTFT percentiles, time per output token, acceptance, tokens per
  step) resample the point's requests, pooled over its repeats;
- figures of a whole run (total output tokens/s, request throughput, goodput) resample the
  repeats' values: one value per repeat, so ``--repeats 1`` gives no interval for them;
- a ratio of two points (a speed-up) resamples each side independently
  (``scipy.stats.bootstrap`` with two samples, ``paired=False``).

A point with fewer than :data:`MIN_REQUESTS` requests is flagged ``small_sample``: its p99 is then
close to its maximum and its interval wide. An interval is ``None`` where it cannot be computed
(fewer than 2 values); a zero-width interval means every resample gave the same value.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import numpy as np

CONFIDENCE = 0.95
N_RESAMPLES = 2000
MIN_REQUESTS = 20  # below this a point is flagged: p99 of 19 values is interpolated from the top two
SEED = 0
SLO_KEYS = {"ttft": "time to first token", "tpot": "time per output token", "e2el": "end-to-end request latency"}


def bootstrap_ci(values: Sequence[float], statistic: Callable[[np.ndarray], np.ndarray] = None, *,
                 confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES) -> list[float] | None:
    """``[low, high]`` percentile-bootstrap interval of ``statistic`` (default: the mean) of ``values``.

    ``statistic(x, axis)`` must be vectorized along ``axis`` (numpy reductions are). ``None`` for
    fewer than 2 values. Example: ``bootstrap_ci([1, 2, 3, 4])`` -> about ``[1.5, 3.5]``.
    """
    from scipy.stats import bootstrap

    data = np.asarray([v for v in values if v is not None], dtype=float)
    if data.size < 2:
        return None
    if np.all(data == data[0]):
        return [float(data[0]), float(data[0])]
    stat = statistic or (lambda x, axis: np.mean(x, axis=axis))
    result = bootstrap((data,), stat, confidence_level=confidence, n_resamples=n_resamples, method="percentile",
                       vectorized=True, random_state=np.random.default_rng(SEED))
    low, high = result.confidence_interval
    return [float(low), float(high)]


def percentile_statistic(q: float) -> Callable[[np.ndarray, int], np.ndarray]:
    """A vectorized statistic: the ``q``-th percentile (0..100) along ``axis``."""
    return lambda x, axis: np.percentile(x, q, axis=axis)


def ratio_ci(numerator: Sequence[float], denominator: Sequence[float], *, confidence: float = CONFIDENCE,
             n_resamples: int = N_RESAMPLES) -> list[float] | None:
    """``[low, high]`` interval of mean(numerator) / mean(denominator), each side resampled on its own.

    For a speed-up: numerator = per-request time per output token at k = 0, denominator = at k.
    ``None`` when a side has fewer than 2 values or a resampled denominator mean is 0.
    """
    from scipy.stats import bootstrap

    a = np.asarray(numerator, dtype=float)
    b = np.asarray(denominator, dtype=float)
    if a.size < 2 or b.size < 2 or np.mean(b) == 0:
        return None
    if np.all(a == a[0]) and np.all(b == b[0]):
        return [float(a[0] / b[0])] * 2

    def ratio(x, y, axis):
        return np.mean(x, axis=axis) / np.mean(y, axis=axis)

    result = bootstrap((a, b), ratio, confidence_level=confidence, n_resamples=n_resamples, method="percentile",
                       vectorized=True, paired=False, random_state=np.random.default_rng(SEED))
    low, high = result.confidence_interval
    if not (np.isfinite(low) and np.isfinite(high)):
        return None
    return [float(low), float(high)]


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float], *,
                 confidence: float = CONFIDENCE) -> tuple[float, list[float] | None]:
    """Geometric mean of the paired ratios ``numerators[i] / denominators[i]`` (e.g. per repeat, the
    two arms measured next to each other) and its Student-t interval on the log scale: ``(ratio,
    [low, high])``, the interval None with fewer than two pairs. Pairing removes the drift that both
    arms of a pair share (a shared machine getting slower or faster between repeats).

    Raises:
        ValueError: no pairs, lengths differ, or a value is not positive.
    """
    from scipy.stats import t

    if not numerators or len(numerators) != len(denominators):
        raise ValueError(f"paired_ratio needs pairs: got {len(numerators)} numerators, {len(denominators)} denominators")
    if min(*numerators, *denominators) <= 0:
        raise ValueError("paired_ratio needs positive values")
    logs = [math.log(a / b) for a, b in zip(numerators, denominators)]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), None
    half = float(t.ppf(0.5 + confidence / 2, len(logs) - 1)) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), [math.exp(mean - half), math.exp(mean + half)]


def overlaps(a: Sequence[float] | None, b: Sequence[float] | None) -> bool:
    """True when two ``[low, high]`` intervals share a value; False when either is missing."""
    if a is None or b is None:
        return False
    return a[0] <= b[1] and b[0] <= a[1]


def parse_slo(text: str | None) -> dict[str, float]:
    """``"ttft=500,tpot=50"`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds; vLLM's ``--goodput``
    keys: ttft, tpot, e2el). Raises ``ValueError`` naming a bad key or value."""
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"--slo takes key=milliseconds pairs with keys {', '.join(SLO_KEYS)}; got {part!r}")
        try:
            out[key] = float(value)
        except ValueError:
            raise ValueError(f"--slo {key}: {value!r} is not a number of milliseconds") from None
        if out[key] <= 0:
            raise ValueError(f"--slo {key} must be > 0 ms, got {value}")
    return out


def meets_slo(*, ttft_ms: float | None, tpot_ms: float, e2el_ms: float, slo: dict[str, float]) -> bool:
    """A request meets every SLO given (vLLM's goodput definition). A TTFT SLO on a request whose TTFT
    was not measured (not streamed) counts as met by its end-to-end latency when that is within it."""
    ttft = e2el_ms if ttft_ms is None else ttft_ms
    checks = {"ttft": ttft, "tpot": tpot_ms, "e2el": e2el_ms}
    return all(checks[key] <= bound for key, bound in slo.items())


DISTURBED_MARGIN = 0.05  # a speed-up more than 5 % above its tokens/step bound marks the baseline disturbed
DISTURBED = "baseline disturbed: measured speed-up above its upper bound (tokens/step)"


def exceeds_speedup_bound(speedup: float | None, tokens_per_step: float | None, margin: float = DISTURBED_MARGIN) -> bool:
    """Whether a measured speed-up over plain decoding exceeds ``tokens_per_step`` by more than ``margin``
    (0.05 = 5 %). Tokens per step bounds the speed-up: a speculative step emits that many tokens on
    average and costs at least one plain step (Leviathan et al. 2023, speed-up = E[tokens/step] /
    (k c + 1) with c >= 0). Beyond the bound the timing is wrong, most often a baseline measured
    while the machine was slower. Example: speed-up 3.12 at 1.41 tokens/step -> True; 1.45 -> False.
    False when either figure is missing."""
    return speedup is not None and tokens_per_step is not None and speedup > (1.0 + margin) * tokens_per_step


def disturbed_note(speedup: float, tokens_per_step: float, *, base_tpot_ms: float | None = None,
                   tpot_ms: float | None = None) -> str:
    """The note of a point flagged by :func:`exceeds_speedup_bound`, with what to do; with the two
    times per output token (ms, the table's TPOT column) the note says where the speed-up comes from."""
    source = "" if base_tpot_ms is None or tpot_ms is None else (
        f" (time per output token: k=0 {base_tpot_ms:.1f} ms / this point {tpot_ms:.1f} ms, the TPOT column)")
    return (f"{DISTURBED}: speed-up {speedup:.2f}x{source} at {tokens_per_step:.2f} tokens/step; the k=0 baseline ran "
            "on a slower machine than this point: do not tune from it; rerun with --repeats 3 on a quieter machine")


def clamp_probability(p: float, what: str) -> tuple[float, str | None]:
    """``p`` clamped to [0, 1], with the reason when it had to be (else None).

    Example: -0.08 -> (0.0, "... -0.08 is outside [0, 1] ...") -- a difference of two noisy means.
    """
    if 0.0 <= p <= 1.0:
        return p, None
    clamped = min(1.0, max(0.0, p))
    return clamped, f"{what}: estimate {p:.3f} is outside [0, 1] (a difference of noisy means); clamped to {clamped:g}, unreliable"
