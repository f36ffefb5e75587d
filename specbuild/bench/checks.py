"""Cross-checks of the server's acceptance outputs against the client's own counts (``problems``).

- per request (:func:`check_request`): ``0 <= accepted <= drafts``, ``accepted <= tokens - 1`` (the
  prefill token is never a draft), ``acceptance_rate == accepted / drafts``, no drafts when k = 0,
  ``tokens <= max_tokens``; streamed: the steps the client counted equal ``tokens - 1 - accepted``
  (each step emits its accepted drafts + 1 bonus token), and the streamed chunks add up to the tokens;
- per point (:func:`counter_problems`): the deltas of the server's Prometheus counters
  (``specbuild_generated_tokens_total``, ``specbuild_draft_tokens_total``,
  ``specbuild_accepted_draft_tokens_total``) over the point equal the sums of the per-request
  figures (when the metrics url is known and nothing else uses the server);
- per deployment (in :mod:`specbuild.bench.run`): greedy output ids at every k equal the
  k = 0 output for the same prompt (``ids_match_baseline``: speculation must be lossless).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence

from .records import RequestRecord


COUNTERS = {
    "generated": "specbuild_generated_tokens_total",
    "draft": "specbuild_draft_tokens_total",
    "accepted": "specbuild_accepted_draft_tokens_total",
}
RATE_TOLERANCE = 1e-4  # acceptance_rate travels as fp32


def check_request(r: RequestRecord, *, draft_len: int, max_tokens: int, stream_interval: int = 1) -> list[str]:
    """Inconsistencies between the server's acceptance outputs and the client's token count ([] if none).

    ``stream_interval``: decoding iterations per streamed response; above 1 the streamed responses after
    the prefill number at most the decoding steps (the first, the last and every N-th answer), not exactly."""
    where = f"{r.prompt_id} (k={draft_len})"
    max_tokens = r.max_tokens or max_tokens
    problems = []
    if not 0 <= r.accepted <= r.drafts:
        problems.append(f"{where}: accepted {r.accepted} outside [0, drafts {r.drafts}]")
    if r.num_tokens and r.accepted > r.num_tokens - 1:
        problems.append(f"{where}: accepted {r.accepted} > tokens - 1 = {r.num_tokens - 1}")
    if not 1 <= r.num_tokens <= max_tokens:
        problems.append(f"{where}: {r.num_tokens} tokens, expected 1..{max_tokens}")
    if r.finish_reason == "length" and r.num_tokens != max_tokens:
        problems.append(f"{where}: finish reason 'length' with {r.num_tokens} of {max_tokens} tokens")
    if not r.perf_reported:
        return problems
    if draft_len == 0 and r.drafts:
        problems.append(f"{where}: {r.drafts} draft tokens with speculation off")
    if r.acceptance_rate is not None and r.drafts and abs(r.acceptance_rate - r.accepted / r.drafts) > RATE_TOLERANCE:
        problems.append(f"{where}: acceptance_rate {r.acceptance_rate:.6f} != accepted/drafts {r.accepted / r.drafts:.6f}")
    if r.step_tokens is not None and sum(r.step_tokens) != r.num_tokens:
        problems.append(f"{where}: streamed steps carry {sum(r.step_tokens)} tokens, the result {r.num_tokens}")
    responses = len(r.step_tokens) - 1 if r.step_tokens else None
    if responses is not None and stream_interval > 1 and not -(-r.decode_steps // stream_interval) <= responses <= r.decode_steps:
        problems.append(f"{where}: {responses} streamed responses after the prefill for {r.decode_steps} steps at "
                        f"stream_interval {stream_interval}")
    if responses is not None and stream_interval == 1 and r.perf_reported and responses != r.decode_steps:
        problems.append(
            f"{where}: {len(r.step_tokens) - 1} streamed steps after the prefill, but tokens - 1 - accepted "
            f"= {r.decode_steps}"
        )
    return problems


def read_counters(metrics_url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """The specbuild Prometheus counters (summed over labels) from ``http://metrics_url/metrics``.

    Raises ``OSError`` when the endpoint does not answer.
    """
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=timeout_s).read().decode()
    totals = dict.fromkeys(COUNTERS, 0.0)
    names = {v: k for k, v in COUNTERS.items()}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            totals[names[name]] += float(line.rsplit(" ", 1)[1])
    return totals


def counter_problems(before: dict[str, float], after: dict[str, float], records: Sequence[RequestRecord]) -> list[str]:
    """Server counter deltas that differ from the client's sums over ``records``."""
    expected = {
        "generated": sum(r.num_tokens for r in records),
        "draft": sum(r.drafts for r in records),
        "accepted": sum(r.accepted for r in records),
    }
    return [
        f"server counter {COUNTERS[k]} rose by {after[k] - before[k]:g}, the client counted {v}"
        for k, v in expected.items()
        if after[k] - before[k] != v
    ]


def read_counters_or_none(metrics_url: str | None) -> dict[str, float] | None:
    if metrics_url is None:
        return None
    try:
        return read_counters(metrics_url)
    except (OSError, ValueError, urllib.error.URLError):
        return None
