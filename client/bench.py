"""``specbuild bench``: sweep deployments x draft lengths x concurrency levels x prompt sets.

One deployment per speculation method (a recipe started here, or a server already running at a url);
on each, every point of the grid::

    prompt set P  x  concurrency C (C requests in flight, closed loop)  x  draft length k (0 = off)

sends ``requests`` greedy requests (the prompts of P, cycled) from C worker threads, each with its own
client, and measures, per point:

    latency_ms_p50/p90/p99   request latency, request sent -> last token received (milliseconds)
    ttft_ms_p50              time to first token: the first streamed response (``stream=True``: recipes
                             are served decoupled, one response per decoding step); None when not
                             streamed (one response per request: TTFT is not measured)
    tpot_ms                  time per output token: mean over requests of (latency - TTFT) / (tokens - 1)
                             when streamed, else latency / tokens (prefill included)
    user_tok_s               output tokens/s per user: mean over requests of tokens / latency
    total_tok_s              output tokens/s of the point: all output tokens / wall time of the point
    tokens_per_step          mean acceptance length: tokens emitted per target verification step after
                             the prefill, bonus token included, ``sum(n - 1) / sum(n - 1 - accepted)``
                             (1.0 for plain decoding; Leviathan et al.'s "expected tokens per step")
    acceptance_rate          accepted draft tokens / draft tokens, summed over the point's requests
    accepted_per_step, drafts_per_step
    per_position_acceptance  P(a step accepts at least i drafts), i = 1..k, counted from the streamed
                             steps (each carries its accepted drafts + 1); None without streaming: the
                             server reports per-request totals only, and ``specbuild tune`` derives it
                             from points at consecutive draft lengths
                             (see :func:`specbuild.client.tune.per_position_from_sweep`).

Cross-checks of the server's acceptance outputs against the client's own counts (``problems``):

- per request: ``0 <= accepted <= drafts``, ``accepted <= tokens - 1`` (the prefill token is never a
  draft), ``acceptance_rate == accepted / drafts``, no drafts when k = 0, ``tokens <= max_tokens``;
  streamed: the steps the client counted equal ``tokens - 1 - accepted`` (each step emits its accepted
  drafts + 1 bonus token), and the streamed chunks add up to the tokens;
- per point: the deltas of the server's Prometheus counters (``specbuild_generated_tokens_total``,
  ``specbuild_draft_tokens_total``, ``specbuild_accepted_draft_tokens_total``) over the point equal the
  sums of the per-request figures (when the metrics url is known and nothing else uses the server);
- per deployment: greedy output ids at every k equal the k = 0 output for the same prompt
  (``ids_match_baseline``: speculation must be lossless).

Example::

    targets = [Deployment.at_url("127.0.0.1:8001", name="ngram")]
    result = run_sweep(targets, SweepPlan(draft_lengths=(0, 2, 4), concurrencies=(1, 4)))
    result.write("bench-out")      # bench.json + bench.csv
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .bench_stats import MIN_REQUESTS, bootstrap_ci, meets_slo, parse_slo, percentile_statistic
from .prompts import CHAT_TEMPLATE_MODES, Prompt, apply_chat_template, load_prompts

URL = re.compile(r"^[\w.-]+:\d+$")  # host:port
COUNTERS = {
    "generated": "specbuild_generated_tokens_total",
    "draft": "specbuild_draft_tokens_total",
    "accepted": "specbuild_accepted_draft_tokens_total",
}
RATE_TOLERANCE = 1e-4  # acceptance_rate travels as fp32


class BenchError(ValueError):
    """A sweep that cannot run as asked; the message names the option at fault and the valid values."""


@dataclass(frozen=True)
class Deployment:
    """One deployment to benchmark: where it answers and how a draft length maps onto its requests.

    Attributes:
        name: label in tables and files (the recipe name, or ``--label`` for a url).
        method: speculation method (``ngram``, ``lookahead``, ...; ``"unknown"`` for a bare url).
        url: gRPC or HTTP ``host:port``.
        max_draft_len: the most draft tokens a request may ask for; ``None`` = unknown (not checked).
        lookahead: the built ``(W, N, G)`` of a Lookahead deployment, else ``None``. Its draft length k
            is the candidate length ``n - 1``: a request at k sends ``lookahead_config = (W, k + 1, G)``.
        metrics_url: Triton's metrics ``host:port`` for the counter cross-check; ``None`` = skip it.
        tokenizer_dir: the deployment's tokenizer, for chat templates; ``None`` = none applied.
        stream: stream every request (gRPC; required by a decoupled deployment).
        protocol: ``grpc`` / ``http`` (Triton) or ``openai`` (``url`` is then an OpenAI base URL).
        per_request_draft: the deployment takes a draft length per request (Triton deployments and
            specbuild's OpenAI front); ``False`` for other OpenAI servers, whose draft length is their
            own configuration: the sweep then runs one draft length, the label ``openai_draft_len``.
        openai_chat: OpenAI targets: send prompts to ``/chat/completions`` as one user message.
        openai_draft_len: the draft length a foreign OpenAI server was started with (a label; 0 = its
            speculation is off).
    """

    name: str
    url: str
    method: str = "unknown"
    protocol: str = "grpc"
    max_draft_len: int | None = None
    lookahead: tuple[int, int, int] | None = None
    metrics_url: str | None = None
    tokenizer_dir: str | None = None
    stream: bool = False  # send requests with SpecClient.generate_stream (TTFT, per-step tokens)
    per_request_draft: bool = True
    openai_chat: bool = False
    openai_draft_len: int | None = None

    def request_fields(self, draft_len: int) -> dict:
        """``SpecClient.generate`` keyword arguments for draft length ``draft_len`` (0 = plain decoding).

        Raises ``BenchError`` when ``draft_len`` is past what the deployment was built for.
        """
        if draft_len < 0:
            raise BenchError(f"draft length must be >= 0, got {draft_len}")
        if not self.per_request_draft:
            if draft_len != (self.openai_draft_len or 0):
                raise BenchError(
                    f"{self.name}: this OpenAI server takes no per-request draft length; it runs its own "
                    f"(--openai-draft-len {self.openai_draft_len or 0}); start one server per draft length"
                )
            return {}
        if draft_len == 0:
            return {"num_draft_tokens": 0}
        if self.lookahead is not None:
            w, n, g = self.lookahead
            if draft_len + 1 > n:
                raise BenchError(
                    f"{self.name}: lookahead draft length {draft_len} needs ngram size {draft_len + 1} > the built "
                    f"N = {n}; use --draft-lengths up to {n - 1}"
                )
            return {"lookahead_config": (w, draft_len + 1, g)}
        if self.max_draft_len is not None and draft_len > self.max_draft_len:
            raise BenchError(
                f"{self.name}: draft length {draft_len} > the deployment's max_draft_len {self.max_draft_len}; "
                f"use --draft-lengths up to {self.max_draft_len}"
            )
        return {"num_draft_tokens": draft_len}


@dataclass(frozen=True)
class SweepPlan:
    """The grid and the request shape.

    Attributes:
        draft_lengths: draft tokens per step to sweep, 0 = speculation off (run first: the baseline).
        concurrencies: requests in flight (closed loop: C workers, each sends its next request when
            the previous one returns).
        prompt_sets: ``load_prompts`` sources (``humaneval:N``, ``chat:N``, ``summarize:N``, files).
        max_tokens: new tokens per request.
        requests: requests per point; ``None`` = ``max(len(prompts), C)`` (every prompt at least once,
            every worker busy at least once).
        end_id: ``None`` = the deployment's end token; -1 = always generate ``max_tokens``.
        warmup: untimed requests per deployment and prompt set before its points.
        chat_template: ``auto`` = wrap the bundled chat/summarize prompts in the deployment's chat
            template when its tokenizer has one; ``always`` = every set; ``never``.
        request_rates: open loop instead of closed: requests arrive at these mean rates (requests/s),
            each level a point; inter-arrival times are gamma-distributed with shape ``burstiness``
            (1 = Poisson arrivals; < 1 burstier, > 1 more regular; vLLM's ``--burstiness``) and mean
            1 / rate. Empty = closed loop at ``concurrencies``.
        max_concurrency: open loop: at most this many requests in flight (later arrivals wait for a
            slot, as vLLM's ``--max-concurrency``); ``None`` = no cap.
        repeats: measure every point this many times, draft lengths interleaved within each repeat
            (k=0, 2, 4, k=0, 2, 4, ...) so slow drift of the machine lands on every k alike; the
            figures pool the repeats and carry bootstrap confidence intervals
            (:mod:`specbuild.client.bench_stats`).
        slo: goodput's service-level objectives, ``"ttft=500,tpot=50,e2el=5000"`` (ms; vLLM's
            ``--goodput`` keys); empty = goodput not computed.
        stability_percentage: repeats whose total tokens/s differ from their mean by more than this
            (percent) mark the point ``unstable`` (perf_analyzer's ``--stability-percentage``).
        seed: arrival-time seed of the open loop.
    """

    draft_lengths: tuple[int, ...] = (0, 2, 4)
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16)
    prompt_sets: tuple[str, ...] = ("humaneval:8",)
    max_tokens: int = 64
    requests: int | None = None
    end_id: int | None = None
    warmup: int = 1
    chat_template: str = "auto"
    request_rates: tuple[float, ...] = ()
    burstiness: float = 1.0
    max_concurrency: int | None = None
    repeats: int = 1
    slo: str = ""
    stability_percentage: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.draft_lengths or any(k < 0 for k in self.draft_lengths):
            raise BenchError(f"--draft-lengths must be integers >= 0 (0 = off), got {self.draft_lengths}")
        if not self.concurrencies or any(c < 1 for c in self.concurrencies):
            raise BenchError(f"--concurrency levels must be integers >= 1, got {self.concurrencies}")
        if not self.prompt_sets:
            raise BenchError("give at least one --prompts set")
        if self.max_tokens < 1:
            raise BenchError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.requests is not None and self.requests < 1:
            raise BenchError(f"--requests must be >= 1, got {self.requests}")
        if self.chat_template not in CHAT_TEMPLATE_MODES:
            raise BenchError(f"--chat-template must be one of {CHAT_TEMPLATE_MODES}, got {self.chat_template!r}")
        if any(not r > 0 for r in self.request_rates):
            raise BenchError(f"--request-rate values must be > 0 requests/s, got {self.request_rates}")
        if not self.burstiness > 0:
            raise BenchError(f"--burstiness must be > 0 (1 = Poisson), got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise BenchError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        if self.repeats < 1:
            raise BenchError(f"--repeats must be >= 1, got {self.repeats}")
        try:
            parse_slo(self.slo)
        except ValueError as exc:
            raise BenchError(str(exc)) from None

    @property
    def open_loop(self) -> bool:
        return bool(self.request_rates)

    def loads(self) -> list[Load]:
        """The load levels of the sweep, in order: request rates (open loop) or concurrencies."""
        if self.open_loop:
            return [Load(concurrency=self.max_concurrency or 0, request_rate=r) for r in sorted(set(self.request_rates))]
        return [Load(concurrency=c) for c in sorted(set(self.concurrencies))]

    def draft_lengths_for(self, deployment: Deployment) -> list[int]:
        """The draft lengths swept on ``deployment``: only 0 on a deployment without speculation, only
        the server's own on an OpenAI server without a per-request draft length."""
        if not deployment.per_request_draft:
            return [deployment.openai_draft_len or 0]
        return [0] if deployment.method == "none" else self.ordered_draft_lengths()

    def num_requests(self, num_prompts: int, concurrency: int) -> int:
        """Requests per point and repeat: ``requests``, else every prompt once and every worker busy
        (open loop: ``concurrency`` is the cap, 0 = none)."""
        return self.requests if self.requests is not None else max(num_prompts, concurrency)

    def ordered_draft_lengths(self) -> list[int]:
        """Sorted, without repeats: k = 0 first, so every later point can compare its ids to it."""
        return sorted(set(self.draft_lengths))


@dataclass(frozen=True)
class Load:
    """One load level: closed loop at ``concurrency`` requests in flight, or (``request_rate`` set)
    open loop at that mean rate with at most ``concurrency`` in flight (0 = no cap)."""

    concurrency: int
    request_rate: float | None = None

    @property
    def label(self) -> str:
        """``C=4`` (closed loop) or ``2/s`` / ``2/s<=4`` (open loop, capped at 4 in flight)."""
        if self.request_rate is None:
            return f"C={self.concurrency}"
        return f"{self.request_rate:g}/s" + (f"<={self.concurrency}" if self.concurrency else "")


@dataclass(frozen=True)
class RequestRecord:
    """One timed request and what the server said about it."""

    prompt_id: str
    latency_s: float
    num_tokens: int
    accepted: int  # total_accepted_draft_tokens
    drafts: int  # total_draft_tokens
    acceptance_rate: float | None
    ttft_s: float | None = None  # only when streamed
    step_tokens: tuple[int, ...] | None = None  # tokens per streamed step (prefill first), when streamed
    output_ids: tuple[int, ...] = ()
    finish_reason: str | None = None  # "stop" / "length" as the client reads it; None = unknown
    perf_reported: bool = True  # the server reported draft/accepted counts (OpenAI servers other than specbuild's: no)
    chunk_times_s: tuple[float, ...] | None = None  # streamed: arrival of each chunk, seconds after sending
    start_s: float = 0.0  # sent, seconds after the point (repeat) started
    repeat: int = 0
    max_tokens: int | None = None  # what the request asked for (None: the plan's)

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive streamed chunks (vLLM's inter-token latency: one gap per chunk,
        a chunk of a speculative step carries several tokens); [] when not streamed."""
        times = self.chunk_times_s or ()
        return [b - a for a, b in zip(times, times[1:])]

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (streamed; genai-perf's inter-token latency), else
        latency / tokens (prefill included)."""
        if self.ttft_s is not None and self.num_tokens > 1:
            return (self.latency_s - self.ttft_s) / (self.num_tokens - 1)
        return self.latency_s / max(1, self.num_tokens)

    @property
    def decode_steps(self) -> int:
        """Target verification steps after the prefill: each emits its accepted drafts + 1 token."""
        return max(0, self.num_tokens - 1 - self.accepted)


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
    small_sample: bool = False  # fewer than bench_stats.MIN_REQUESTS requests
    unstable: bool = False  # repeats' tokens/s spread past plan.stability_percentage
    notes: list[str] = field(default_factory=list)  # estimates marked unreliable, with the reason
    tpot_samples_ms: list[float] = field(default_factory=list)  # per request: the speed-up intervals resample these
    repeat_total_tok_s: list[float] = field(default_factory=list)
    # OpenAI targets: the server's own speculation figures over the point (openai_client.acceptance_over)
    server_acceptance: dict | None = None


SCHEMA_VERSION = "specbuild.bench/2"  # 2: repeats, intervals, open loop, environment, requests.jsonl
# bench.csv: one row per point, these columns (docs/bench.md maps them to genai-perf's and vLLM's names).
CSV_COLUMNS = (
    "deployment", "method", "prompt_set", "draft_len", "concurrency", "request_rate", "burstiness", "repeats", "requests",
    "wall_s", "output_tokens", "total_tok_s", "request_throughput", "goodput", "user_tok_s",
    "latency_ms_p50", "latency_ms_p90", "latency_ms_p99", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99",
    "itl_ms_p50", "itl_ms_p90", "itl_ms_p99", "tpot_ms", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99",
    "tokens_per_step", "acceptance_rate", "accepted_per_step", "drafts_per_step", "step_ms",
    "per_position_acceptance", "acceptance_length_histogram", "ids_match_baseline", "small_sample", "unstable",
)
CSV_INTERVALS = ("total_tok_s", "request_throughput", "latency_ms_p50", "latency_ms_p99", "ttft_ms_p50", "tpot_ms",
                 "tokens_per_step", "acceptance_rate")


@dataclass
class SweepResult:
    """Every point of a sweep plus the plan, the deployments it ran on and every request
    (``requests``: :func:`request_row` dicts, written as ``requests.jsonl``)."""

    plan: SweepPlan
    deployments: list[Deployment]
    points: list[PointResult]
    started_at: str = ""
    wall_s: float = 0.0
    requests: list[dict] = field(default_factory=list)
    environment: dict | None = None

    def to_json(self) -> dict:
        from .environment import environment

        if self.environment is None:
            self.environment = environment()
        return {
            "schema_version": SCHEMA_VERSION,
            "plan": asdict(self.plan),
            "deployments": [asdict(d) for d in self.deployments],
            "points": [asdict(p) for p in self.points],
            "started_at": self.started_at,
            "wall_s": self.wall_s,
            "environment": self.environment,
            "ttft_measured": any(p.ttft_ms_p50 is not None for p in self.points),
            "requests_file": "requests.jsonl",
        }

    def write(self, out_dir: str | Path) -> tuple[Path, Path]:
        """Write ``bench.json`` (everything but the requests), ``bench.csv`` (one row per point) and
        ``requests.jsonl`` (one line per request); return the paths of the first two. Strict JSON:
        a non-finite number raises ``ValueError`` rather than being written as NaN."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        json_path, csv_path = out / "bench.json", out / "bench.csv"
        json_path.write_text(json.dumps(self.to_json(), indent=1, allow_nan=False))
        with (out / "requests.jsonl").open("w") as f:
            for row in self.requests:
                f.write(json.dumps(row, allow_nan=False) + "\n")
        columns = list(CSV_COLUMNS) + [f"{name}_ci_{end}" for name in CSV_INTERVALS for end in ("low", "high")]
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            for point in self.points:
                row = {name: getattr(point, name) for name in CSV_COLUMNS}
                row["per_position_acceptance"] = _join(row["per_position_acceptance"])
                row["acceptance_length_histogram"] = " ".join(map(str, row["acceptance_length_histogram"] or []))
                for name in CSV_INTERVALS:
                    interval = point.ci.get(name)
                    row[f"{name}_ci_low"], row[f"{name}_ci_high"] = interval if interval else ("", "")
                writer.writerow(row)
        return json_path, csv_path


def load_result(path: str | Path) -> SweepResult:
    """Read back a ``bench.json`` (this schema or the first one, which had no version). Raises
    ``BenchError`` naming the file when it is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        plan = SweepPlan(**{k: tuple(v) if isinstance(v, list) else v for k, v in data["plan"].items()})
        deployments = [Deployment(**{k: tuple(v) if k == "lookahead" and v else v for k, v in d.items()}) for d in data["deployments"]]
        points = [PointResult(**p) for p in data["points"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"{path}: not a bench.json written by `specbuild bench` ({exc})") from None
    return SweepResult(plan, deployments, points, data.get("started_at", ""), data.get("wall_s", 0.0),
                       environment=data.get("environment"))


# --- measurement ---------------------------------------------------------------------------------


def percentile_ms(latencies_s: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100, linear interpolation) of latencies in seconds, in milliseconds."""
    return float(np.percentile(np.asarray(latencies_s, dtype=float), q)) * 1000.0


def summarize_point(
    records: Sequence[RequestRecord], *, wall_s: float | Sequence[float], draft_len: int, max_tokens: int, slo: str = "",
    stability_percentage: float = 10.0,
) -> dict:
    """The aggregate fields of :class:`PointResult` from a point's requests (pure; see module docstring).

    ``wall_s``: wall seconds of the point, or one per repeat (``records[i].repeat`` indexes it); the
    run-level figures (tokens/s, request throughput, goodput) are means over repeats, the request
    figures pool every repeat's requests. Intervals: :mod:`specbuild.client.bench_stats`.
    Raises ``ValueError`` when ``records`` is empty or a wall time is not positive.
    """
    walls = [wall_s] if isinstance(wall_s, (int, float)) else list(wall_s)
    if not records or not walls or any(w <= 0 for w in walls):
        raise ValueError("a point needs at least one request and a positive wall time")
    latencies = [r.latency_s for r in records]
    tokens = sum(r.num_tokens for r in records)
    accepted = sum(r.accepted for r in records)
    drafts = sum(r.drafts for r in records)
    steps = sum(r.decode_steps for r in records)
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
        "tokens_per_step": (tokens - len(records)) / steps if steps else 1.0,
        "acceptance_rate": accepted / drafts if drafts else None,
        "accepted_per_step": accepted / steps if steps else 0.0,
        "drafts_per_step": drafts / steps if steps else 0.0,
        "step_ms": _step_ms(records, streamed),
        "per_position_acceptance": per_position_from_steps(records, draft_len) if streamed and draft_len else None,
        "acceptance_length_histogram": acceptance_length_histogram(records, draft_len) if streamed else None,
        "problems": [p for r in records for p in check_request(r, draft_len=draft_len, max_tokens=max_tokens)],
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
    """95 % bootstrap intervals of the point's figures (bench_stats' module docstring says how)."""
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
    if steps.sum() > 0:
        ci["tokens_per_step"] = ratio_of_sums_ci([r.num_tokens - 1 for r in records], steps)
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


def check_request(r: RequestRecord, *, draft_len: int, max_tokens: int) -> list[str]:
    """Inconsistencies between the server's acceptance outputs and the client's token count ([] if none)."""
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
    if r.step_tokens and r.perf_reported and len(r.step_tokens) - 1 != r.decode_steps:
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


# --- running ---------------------------------------------------------------------------------------


class _Clients:
    """One SpecClient per worker thread (tritonclient clients are not shared across threads)."""

    def __init__(self, deployment: Deployment, timeout_s: float):
        self.deployment, self.timeout_s = deployment, timeout_s
        self._local = threading.local()
        self._all: list = []
        self._lock = threading.Lock()

    def get(self):
        client = getattr(self._local, "client", None)
        if client is None:
            client = make_client(self.deployment, self.timeout_s)
            self._local.client = client
            with self._lock:
                self._all.append(client)
        return client

    def close(self) -> None:
        for client in self._all:
            client.close()


def make_client(deployment: Deployment, timeout_s: float):
    """A client for ``deployment``: SpecClient (Triton) or OpenAIClient (``protocol="openai"``)."""
    if deployment.protocol == "openai":
        from .openai_client import OpenAIClient

        tokenizer = None
        return OpenAIClient(deployment.url, chat=deployment.openai_chat, draft_field=deployment.per_request_draft,
                            tokenizer=tokenizer, timeout_s=timeout_s)
    from .sdk import SpecClient

    # retries=0: a silently retried request would count its back-off as latency.
    return SpecClient(deployment.url, protocol=deployment.protocol, timeout_s=timeout_s, retries=0)


def timed_request(
    client, prompt: Prompt, text: str, *, max_tokens: int, end_id: int | None, fields: dict, stream: bool = False
) -> RequestRecord:
    """Send one greedy request (streamed or not); the SDK's result becomes a :class:`RequestRecord`.
    A prompt with its own ``max_tokens`` (synthetic sets) asks for that many tokens."""
    max_tokens = prompt.max_tokens or max_tokens
    if stream:
        return _streamed_request(client, prompt, text, max_tokens=max_tokens, end_id=end_id, fields=fields)
    result = client.generate(text, max_tokens=max_tokens, end_id=end_id, **fields)
    return RequestRecord(
        prompt_id=prompt.id,
        latency_s=result.latency_s,
        num_tokens=len(result.output_ids),
        accepted=result.total_accepted_draft_tokens or 0,
        drafts=result.total_draft_tokens or 0,
        acceptance_rate=result.acceptance_rate,
        output_ids=tuple(result.output_ids),
        finish_reason=getattr(result, "finish_reason", None),
        perf_reported=result.total_draft_tokens is not None,
        max_tokens=max_tokens,
    )


def _streamed_request(client, prompt: Prompt, text: str, *, max_tokens: int, end_id: int | None, fields: dict) -> RequestRecord:
    """One request through ``generate_stream``: a chunk per decoding step, perf counters cumulative."""
    chunks = list(client.generate_stream(text, max_tokens=max_tokens, end_id=end_id, **fields))
    if not chunks:
        from .sdk import RequestError

        raise RequestError(f"streamed request for {prompt.id!r} returned no response with tokens")
    last = chunks[-1]
    output_ids = tuple(t for chunk in chunks for t in chunk.output_ids)
    return RequestRecord(
        prompt_id=prompt.id,
        latency_s=last.latency_s,
        num_tokens=len(output_ids),
        accepted=last.total_accepted_draft_tokens or 0,
        drafts=last.total_draft_tokens or 0,
        acceptance_rate=last.acceptance_rate,
        ttft_s=chunks[0].latency_s,
        step_tokens=tuple(len(chunk.output_ids) for chunk in chunks),
        output_ids=output_ids,
        perf_reported=last.total_draft_tokens is not None,
        chunk_times_s=tuple(chunk.latency_s for chunk in chunks),
        max_tokens=max_tokens,
    )


def arrival_times(num_requests: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send times (seconds after the start) of an open-loop point: the first at 0, then gaps drawn from
    a gamma distribution with shape ``burstiness`` and mean ``1 / rate`` (scale ``1 / (rate *
    burstiness)``), as vLLM's ``bench serve`` draws them; burstiness 1 = Poisson arrivals.
    Example: rate 2/s -> gaps average 0.5 s. Returns shape [num_requests]."""
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=max(0, num_requests - 1))
    return np.concatenate([[0.0], np.cumsum(gaps)])


def run_point(
    clients: _Clients,
    prompts: Sequence[tuple[Prompt, str]],
    *,
    concurrency: int,
    num_requests: int,
    max_tokens: int,
    end_id: int | None,
    fields: dict,
    on_done: Callable[[], None] = lambda: None,
    request_rate: float | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
) -> tuple[list[RequestRecord], float]:
    """``num_requests`` requests (prompts cycled); returns them and the wall seconds of the point.

    Closed loop (``request_rate`` None): ``concurrency`` threads, each sending its next request when
    the previous one returns. Open loop: requests are sent at :func:`arrival_times`, at most
    ``concurrency`` in flight (0 = no cap; a request arriving at a full cap waits for a slot and its
    latency counts from when it is sent, as in vLLM). Each record's ``start_s`` is its send time.
    """
    jobs = [prompts[i % len(prompts)] for i in range(num_requests)]
    start = time.perf_counter()

    def one(job: tuple[Prompt, str]) -> RequestRecord:
        sent = time.perf_counter() - start
        record = timed_request(
            clients.get(), job[0], job[1], max_tokens=max_tokens, end_id=end_id, fields=fields, stream=clients.deployment.stream
        )
        on_done()
        return dataclasses.replace(record, start_s=sent)

    workers = concurrency if request_rate is None or concurrency else num_requests
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="bench")
    try:
        if request_rate is None:
            futures = [pool.submit(one, job) for job in jobs]
        else:
            futures = []
            for job, at in zip(jobs, arrival_times(num_requests, request_rate, burstiness, seed)):
                delay = start + at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                futures.append(pool.submit(one, job))
        records = [f.result() for f in futures]
    finally:  # on Ctrl-C or a failed request: requests not yet sent are dropped, not run
        pool.shutdown(wait=True, cancel_futures=True)
    return records, time.perf_counter() - start


def prepare_prompts(source: str, deployment: Deployment, mode: str, tokenizer) -> list[tuple[Prompt, str]]:
    """The prompts of ``source`` with the text to send (chat-templated when ``mode`` says so; see
    :func:`~specbuild.client.prompts.apply_chat_template`).

    Raises:
        BenchError: the set wants the chat template and the deployment has no tokenizer (pass --tokenizer).
    """
    if source.startswith("synthetic") and tokenizer is not None:
        from .prompts import synthetic_prompts

        prompts = synthetic_prompts(source, tokenizer)  # exact input token counts with the deployment's tokenizer
    else:
        prompts = load_prompts(source)
    try:
        sent = apply_chat_template(prompts, source, mode, tokenizer)
    except ValueError as exc:
        raise BenchError(f"{deployment.name}: {exc}") from None
    return [(p, s.text) for p, s in zip(prompts, sent)]


def sweep_size(plan: SweepPlan, deployments: Sequence[Deployment], set_sizes: dict[str, int]) -> int:
    """Timed requests the whole sweep sends (for the progress bar); ``set_sizes``: prompts per set."""
    per_k = sum(plan.num_requests(n, load.concurrency) for n in set_sizes.values() for load in plan.loads())
    return sum(per_k * len(plan.draft_lengths_for(d)) * plan.repeats for d in deployments)


def run_sweep(
    deployments: Sequence[Deployment],
    plan: SweepPlan,
    *,
    timeout_s: float = 600.0,
    progress: Callable[[str, int], None] = lambda description, advance: None,
    log: Callable[[str], None] = lambda message: None,
) -> SweepResult:
    """Run ``plan`` on each deployment in turn (deployments must already answer; see :func:`serve_recipes`).

    ``progress(description, advance)`` is called as each request finishes. Order per deployment:
    prompt set -> load level -> repeat -> draft length, so the draft lengths compared at one load are
    measured next to each other in time, and repeats interleave them.

    Raises:
        BenchError: a draft length past a deployment's limits (before any request is sent), or a bad
            prompt set.
        specbuild.client.sdk.ClientError: a request failed.
    """
    for d in deployments:
        for k in plan.draft_lengths_for(d):
            d.request_fields(k)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    start = time.perf_counter()
    points: list[PointResult] = []
    rows: list[dict] = []
    for deployment in deployments:
        points += _sweep_deployment(deployment, plan, rows, timeout_s=timeout_s, progress=progress, log=log)
    return SweepResult(plan, list(deployments), points, started_at, time.perf_counter() - start, requests=rows)


def _sweep_deployment(deployment: Deployment, plan: SweepPlan, rows: list[dict], *, timeout_s, progress, log) -> list[PointResult]:
    synthetic = any(s.startswith("synthetic") for s in plan.prompt_sets)
    tokenizer = _tokenizer(deployment) if plan.chat_template != "never" or synthetic else None
    clients = _Clients(deployment, timeout_s)
    points = []
    try:
        clients.get().wait_ready(timeout_s=min(60.0, timeout_s))
        for source in plan.prompt_sets:
            prompts = prepare_prompts(source, deployment, plan.chat_template, tokenizer)
            for prompt, text in prompts[: plan.warmup]:
                timed_request(
                    clients.get(), prompt, text, max_tokens=plan.max_tokens, end_id=plan.end_id, fields={}, stream=deployment.stream
                )
            baseline: dict[str, tuple[int, ...]] = {}
            for load in plan.loads():
                for point in _measure_load(deployment, plan, clients, prompts, source, load, baseline, rows, progress):
                    points.append(point)
                    log(_point_line(point))
    finally:
        clients.close()
    return points


def _measure_load(deployment, plan, clients, prompts, source, load: Load, baseline, rows, progress) -> list[PointResult]:
    """Every draft length at one load level, ``plan.repeats`` times interleaved; one point per k."""
    ks = plan.draft_lengths_for(deployment)
    server = {k: [] for k in ks}  # OpenAI targets: (before, after) /metrics readings per repeat
    runs: dict[int, list[tuple[list[RequestRecord], float]]] = {k: [] for k in ks}
    checks: dict[int, list[str]] = {k: [] for k in ks}
    checked: dict[int, bool] = {k: True for k in ks}
    for repeat in range(plan.repeats):
        for k in ks:
            label = f"{deployment.name} {source} {load.label} k={k}" + (f" #{repeat + 1}" if plan.repeats > 1 else "")
            before = _try_counters(deployment.metrics_url)
            server_before = _server_acceptance(deployment)
            records, wall_s = run_point(
                clients, prompts, concurrency=load.concurrency,
                num_requests=plan.num_requests(len(prompts), load.concurrency), max_tokens=plan.max_tokens,
                end_id=plan.end_id, fields=deployment.request_fields(k), on_done=lambda label=label: progress(label, 1),
                request_rate=load.request_rate, burstiness=plan.burstiness, seed=plan.seed + repeat,
            )
            after = _try_counters(deployment.metrics_url) if before is not None else None
            if deployment.protocol == "openai":
                server[k].append((server_before, _server_acceptance(deployment)))
            if after is None:
                checked[k] = False
            else:
                checks[k] += counter_problems(before, after, records)
            runs[k].append(([dataclasses.replace(r, repeat=repeat) for r in records], wall_s))
    points = [_make_point(deployment, plan, source, load, k, runs[k], checks[k], checked[k], baseline, rows) for k in ks]
    for point in points:
        point.server_acceptance = _sum_over_repeats(server[point.draft_len])
    return points


def _server_acceptance(deployment: Deployment):
    """The speculation figures an OpenAI target's ``/metrics`` shows now; None when it has none."""
    if deployment.protocol != "openai":
        return None
    from .openai_client import metrics_url_of, read_server_acceptance
    from .sdk import ClientError

    try:
        return read_server_acceptance(metrics_url_of(deployment.url))
    except ClientError:
        return None


def _sum_over_repeats(readings) -> dict | None:
    """acceptance_over each repeat, counters summed over repeats (gauges: the last repeat's)."""
    from .openai_client import acceptance_over

    per_repeat = [acceptance_over(before, after) for before, after in readings]
    per_repeat = [r for r in per_repeat if r]
    if not per_repeat:
        return None
    if per_repeat[-1]["source"] == "sglang":
        return per_repeat[-1]
    total = {"source": per_repeat[-1]["source"]}
    for key in ("drafts", "draft_tokens", "accepted_tokens", "generated_tokens"):
        if any(key in r for r in per_repeat):
            total[key] = sum(r.get(key, 0.0) for r in per_repeat)
    if total.get("draft_tokens"):
        total["acceptance_rate"] = total.get("accepted_tokens", 0.0) / total["draft_tokens"]
    if total.get("drafts"):
        total["acceptance_length"] = 1.0 + total.get("accepted_tokens", 0.0) / total["drafts"]
    return total


def _make_point(deployment, plan, source, load: Load, k, runs, counter_checks, counters_checked, baseline, rows) -> PointResult:
    records = [r for recs, _ in runs for r in recs]
    summary = summarize_point(records, wall_s=[w for _, w in runs], draft_len=k, max_tokens=plan.max_tokens, slo=plan.slo,
                              stability_percentage=plan.stability_percentage)
    summary["problems"] += counter_checks
    if k == 0:
        baseline.update({r.prompt_id: r.output_ids for r in records})
    compared = [r for r in records if r.prompt_id in baseline]
    matches = [r.output_ids == baseline[r.prompt_id] for r in compared]
    summary["problems"] += [
        f"{r.prompt_id} (k={k}, {load.label}): output ids differ from k=0" for r, m in zip(compared, matches) if not m
    ]
    point = PointResult(
        deployment=deployment.name,
        method=deployment.method,
        prompt_set=source,
        draft_len=k,
        concurrency=load.concurrency,
        request_rate=load.request_rate,
        burstiness=plan.burstiness if load.request_rate is not None else None,
        ids_match_baseline=sum(matches) / len(matches) if matches else None,
        counters_checked=counters_checked,
        **summary,
    )
    rows += [request_row(point, r) for r in records]
    return point


def request_row(point: PointResult, r: RequestRecord) -> dict:
    """One line of ``requests.jsonl``: the point's coordinates and the request's timings and counts.

    Times in milliseconds: ``start_ms`` (sent, after its repeat began), ``ttft_ms``, ``e2e_ms``,
    ``itl_ms`` (gaps between streamed chunks), ``tpot_ms``.
    """
    return {
        "deployment": point.deployment, "method": point.method, "prompt_set": point.prompt_set, "draft_len": point.draft_len,
        "concurrency": point.concurrency, "request_rate": point.request_rate, "repeat": r.repeat, "prompt_id": r.prompt_id,
        "start_ms": 1000 * r.start_s, "ttft_ms": None if r.ttft_s is None else 1000 * r.ttft_s, "e2e_ms": 1000 * r.latency_s,
        "itl_ms": [1000 * g for g in r.itl_s], "tpot_ms": 1000 * r.tpot_s, "output_tokens": r.num_tokens,
        "accepted_draft_tokens": r.accepted if r.perf_reported else None, "draft_tokens": r.drafts if r.perf_reported else None,
        "decode_steps": r.decode_steps if r.perf_reported else None,
        "step_tokens": list(r.step_tokens) if r.step_tokens else None, "finish_reason": r.finish_reason,
    }


def _try_counters(metrics_url: str | None) -> dict[str, float] | None:
    if metrics_url is None:
        return None
    try:
        return read_counters(metrics_url)
    except (OSError, ValueError, urllib.error.URLError):
        return None


def _tokenizer(deployment: Deployment):
    if deployment.tokenizer_dir is None:
        return None
    from specbuild.triton_repo.models.tokenization import load_tokenizer

    return load_tokenizer(deployment.tokenizer_dir)


def load_label(p: PointResult) -> str:
    """``C=4`` (closed loop) or ``rate=2/s`` (``cap=4`` when capped)."""
    return Load(p.concurrency, p.request_rate).label


def _point_line(p: PointResult) -> str:
    rate = "-" if p.acceptance_rate is None else f"{p.acceptance_rate:.2f}"
    return (
        f"{p.deployment:>16s} {p.prompt_set:>12s} {load_label(p):<10s} k={p.draft_len:<2d} "
        f"p50 {p.latency_ms_p50:8.0f} ms  {p.total_tok_s:7.1f} tok/s  tokens/step {p.tokens_per_step:.2f}  "
        f"acc {rate}" + (f"  PROBLEMS {len(p.problems)}" if p.problems else "")
    )


def _join(values: list[float] | None) -> str:
    return "" if values is None else " ".join(f"{v:.4f}" for v in values)


# --- deployments from recipes ------------------------------------------------------------------------


def is_url(target: str) -> bool:
    """``host:port`` (a running server) rather than a recipe name or path."""
    return bool(URL.match(target)) and not Path(target).exists()


def deployment_for_recipe(loaded, paths, server, *, stream: bool = False) -> Deployment:
    """The :class:`Deployment` of a recipe served by ``server`` (a started TritonServer)."""
    spec = loaded.recipe.speculation
    lookahead = None
    if spec.method == "lookahead":
        lookahead = (spec.max_window_size, spec.max_ngram_size, spec.max_verification_set_size)
    return Deployment(
        name=loaded.recipe.name,
        method=spec.method,
        url=server.grpc_url,
        protocol="grpc",
        max_draft_len=getattr(spec, "max_draft_len", None) or 0,
        lookahead=lookahead,
        metrics_url=server.metrics_url,
        tokenizer_dir=str(paths.engine_dir / "tokenizer"),
        stream=stream,
    )


@contextmanager
def serve_recipes(
    recipes: Sequence[str], *, output_root: Path | None = None, stream: bool = True, log=print
) -> Iterator[list[Deployment]]:
    """Build (or reuse) each recipe's engine and repository, start one tritonserver per recipe on free
    ports, and yield their :class:`Deployment` s; every server is stopped on exit.

    ``stream``: serve decoupled (one response per decoding step, whatever the recipe's
    ``serve.decoupled``) and stream every request, so TTFT and per-step acceptance are measured.

    Servers start one after another and all run during the sweep (a sweep measures one at a time).
    Raises ``specbuild.builder.recipe.RecipeError`` for a recipe that cannot run here.
    """
    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine
    from specbuild.pipeline import RunPaths, check_runnable, default_output_dir
    from specbuild.triton_repo.reference_repository import spec_from_engine_dir, write_reference_repository
    from specbuild.triton_repo.tritonserver import TritonServer

    with ExitStack() as stack:
        deployments = []
        for recipe in recipes:
            loaded = load_recipe(recipe)
            paths = RunPaths(output_root / loaded.recipe.name if output_root else default_output_dir(loaded))
            check_runnable(loaded)
            build_reference_engine(loaded, paths.engine_dir, log=log)
            spec = spec_from_engine_dir(
                paths.engine_dir, instance_count=loaded.recipe.serve.instance_count, decoupled=stream
            )
            write_reference_repository(spec, paths.repo_dir)
            server = TritonServer(
                paths.repo_dir,
                host=loaded.recipe.serve.host,
                http_port=0,
                grpc_port=0,
                metrics_port=0,
                log_file=paths.output_dir / "logs" / "tritonserver-bench.log",
                startup_timeout_s=loaded.recipe.serve.startup_timeout_s,
            )
            log(f"starting tritonserver for {loaded.recipe.name} ({paths.repo_dir})")
            stack.enter_context(server)
            deployments.append(deployment_for_recipe(loaded, paths, server, stream=stream))
        yield deployments


# --- display -----------------------------------------------------------------------------------------


def points_table(points: Sequence[PointResult]):
    """A rich Table, one row per point; intervals and every other figure are in bench.json."""
    from rich.table import Table

    table = Table(title="specbuild bench (flags: F = fewer than 20 requests, U = repeats disagree)", show_lines=False)
    goodput = any(p.goodput is not None for p in points)
    names = ["deployment", "prompts", "load", "k", "p50 ms", "p99 ms", "TTFT p50", "ITL p50", "TPOT ms", "tok/s", "req/s"]
    names += (["goodput"] if goodput else []) + ["tok/step", "acc", "lossless", "checks", "flags"]
    for name in names:
        left = name in ("deployment", "prompts", "load")
        table.add_column(name, justify="left" if left else "right", no_wrap=True,
                         max_width=22 if name in ("deployment", "prompts") else None, overflow="ellipsis")
    ms = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    for p in points:
        row = [p.deployment, p.prompt_set, load_label(p), str(p.draft_len), f"{p.latency_ms_p50:.0f}", f"{p.latency_ms_p99:.0f}",
               ms(p.ttft_ms_p50), "-" if p.itl_ms_p50 is None else f"{p.itl_ms_p50:.1f}", f"{p.tpot_ms:.1f}",
               f"{p.total_tok_s:.1f}", "-" if p.request_throughput is None else f"{p.request_throughput:.2f}"]
        if goodput:
            row.append("-" if p.goodput is None else f"{p.goodput:.2f}")
        row += [
            f"{p.tokens_per_step:.2f}",
            "-" if p.acceptance_rate is None else f"{p.acceptance_rate:.2f}",
            "-" if p.ids_match_baseline is None else f"{100 * p.ids_match_baseline:.0f}%",
            ("ok" if not p.problems else f"[red]{len(p.problems)} problems[/red]") + ("" if p.counters_checked else " (no counters)"),
            ("F" if p.small_sample else "") + ("U" if p.unstable else ""),
        ]
        table.add_row(*row)
    return table


def notes(result: SweepResult) -> list[str]:
    """What the table cannot say by itself: what was not measured, and any cross-check problem."""
    lines = []
    if not any(p.ttft_ms_p50 is not None for p in result.points):
        lines.append("TTFT not measured: requests were not streamed (--no-stream); TPOT = latency / tokens includes the prefill.")
    if not any(p.per_position_acceptance for p in result.points) and any(p.draft_len for p in result.points):
        lines.append(
            "Per-position acceptance: the server reports per-request totals only; `specbuild tune` derives "
            "P(step accepts >= i drafts) from points at consecutive draft lengths."
        )
    for p in result.points:
        if p.server_acceptance and p.draft_len and p.server_acceptance.get("acceptance_rate") is not None:
            lines.append(f"{p.deployment} {p.prompt_set} {load_label(p)} k={p.draft_len}: the server's {p.server_acceptance['source']} "
                         f"metrics say acceptance rate {p.server_acceptance['acceptance_rate']:.2f}")
    problems = [q for p in result.points for q in p.problems]
    if problems:
        lines.append(f"{len(problems)} cross-check problems, first: {problems[0]}")
    return lines



# --- command-line driver -----------------------------------------------------------------------------


def url_deployments(urls: Sequence[str], *, labels: Sequence[str] = (), metrics_urls: Sequence[str] = (),
                    protocol: str = "grpc", tokenizer_dir: str | None = None, stream: bool = False) -> list[Deployment]:
    """Deployments for servers already running at ``urls``; ``labels`` / ``metrics_urls`` pair up with
    them in order. Raises ``BenchError`` when more labels or metrics urls than urls are given."""
    if len(labels) > len(urls) or len(metrics_urls) > len(urls):
        raise BenchError(f"{len(urls)} url targets but {len(labels)} --label and {len(metrics_urls)} --metrics-url")
    return [
        Deployment(
            name=labels[i] if i < len(labels) else url,
            url=url,
            protocol=protocol,
            metrics_url=metrics_urls[i] if i < len(metrics_urls) else None,
            tokenizer_dir=tokenizer_dir,
            stream=stream,
        )
        for i, url in enumerate(urls)
    ]


def openai_deployments(urls: Sequence[str], *, labels: Sequence[str] = (), chat: bool = False, stream: bool = True,
                       draft_len: int | None = None, tokenizer_dir: str | None = None, timeout_s: float = 30.0) -> list[Deployment]:
    """Deployments for OpenAI-compatible base URLs; each is asked (``/v1/models``) whether it is
    specbuild's front (then the sweep sets the draft length per request) or another server (then it
    runs at its own draft length ``draft_len``, a label). Raises ``BenchError`` when one does not answer."""
    from .openai_client import OpenAIClient
    from .sdk import ClientError

    out = []
    for i, url in enumerate(urls):
        with OpenAIClient(url, timeout_s=timeout_s) as probe:
            try:
                ours = probe.is_specbuild()
            except ClientError as exc:
                raise BenchError(f"--openai {url}: {exc}") from None
            base = probe.base_url
        out.append(Deployment(
            name=labels[i] if i < len(labels) else base, url=base, protocol="openai", method="specbuild" if ours else "unknown",
            tokenizer_dir=tokenizer_dir, stream=stream, per_request_draft=ours, openai_chat=chat,
            openai_draft_len=None if ours else (draft_len or 0),
            # specbuild's front publishes the specbuild_* counters on its own /metrics: cross-check them too
            metrics_url=urlparse(base).netloc if ours else None,
        ))
    return out


def run_bench(targets: Sequence[str], plan: SweepPlan, *, console, output_root: Path | None = None,
              timeout_s: float = 600.0, stream: bool | None = None, openai_urls: Sequence[str] = (),
              openai_chat: bool = False, openai_draft_len: int | None = None, labels: Sequence[str] = (),
              **url_options) -> SweepResult:
    """``specbuild bench``: serve the recipe targets, sweep every target with a progress bar, print
    the table and the notes. ``url_options`` go to :func:`url_deployments`; ``labels`` name the
    host:port targets, then the ``openai_urls`` (:func:`openai_deployments`), in order.

    ``stream``: ``None`` = stream the recipes (served decoupled) and the OpenAI targets, not the
    host:port targets (a deployment that is not decoupled refuses streamed requests, a decoupled one
    plain ones).

    Raises ``BenchError``, ``specbuild.builder.recipe.RecipeError``, ``specbuild.client.sdk.ClientError``.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    if not targets and not openai_urls:
        raise BenchError("give at least one target: a recipe name or path, a running server's host:port, or --openai URL")
    set_sizes = {s: len(load_prompts(s)) for s in plan.prompt_sets}  # fails fast on a bad set
    urls = [t for t in targets if is_url(t)]
    recipes = [t for t in targets if not is_url(t)]
    openai = openai_deployments(openai_urls, labels=list(labels)[len(urls):], chat=openai_chat, stream=stream is not False,
                                draft_len=openai_draft_len, tokenizer_dir=url_options.get("tokenizer_dir"))
    log = lambda message: console.print(f"[dim]{message}[/dim]")  # noqa: E731
    with serve_recipes(recipes, output_root=output_root, stream=stream is not False, log=log) as served:
        deployments = served + url_deployments(urls, stream=bool(stream), labels=list(labels)[: len(urls)], **url_options) + openai
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console, transient=False) as bar:
            task = bar.add_task("bench", total=sweep_size(plan, deployments, set_sizes))
            result = run_sweep(
                deployments, plan, timeout_s=timeout_s,
                progress=lambda description, advance: bar.update(task, description=description, advance=advance),
                log=lambda line: bar.console.print(line, highlight=False),
            )
    console.print(points_table(result.points))
    for line in notes(result):
        console.print(f"note: {line}")
    return result
