"""A sweep's results: ``bench.json``, ``bench.csv``, ``requests.jsonl`` (:class:`SweepResult`), read
back by :func:`load_result`, and the terminal table and notes."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specbuild.interface import SpecDecodeMetrics

from .plan import BenchError, Deployment, Load, SweepPlan
from .points import PointResult
from .records import RequestRecord



SCHEMA_VERSION = "specbuild.bench/2"  # 2: repeats, intervals, open loop, environment, requests.jsonl
# bench.csv: one row per point, these columns (docs/bench.md maps them to genai-perf's and vLLM's names).
CSV_COLUMNS = (
    "deployment", "method", "prompt_set", "draft_len", "concurrency", "request_rate", "burstiness", "repeats", "requests",
    "wall_s", "output_tokens", "total_tok_s", "request_throughput", "goodput", "user_tok_s",
    "latency_ms_p50", "latency_ms_p90", "latency_ms_p99", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99",
    "itl_ms_p50", "itl_ms_p90", "itl_ms_p99", "tpot_ms", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99",
    "tokens_per_step", "acceptance_rate", "accepted_per_step", "drafts_per_step", "step_ms",
    "per_position_acceptance", "acceptance_length_histogram", "ids_match_baseline", "small_sample", "unstable",
    "baseline_disturbed",
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
        from specbuild.client.environment import environment

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


def request_row(point: PointResult, r: RequestRecord) -> dict:
    """One line of ``requests.jsonl``: the point's coordinates and the request's timings and counts.

    Times in milliseconds: ``start_ms`` (sent, after its repeat began), ``ttft_ms``, ``e2e_ms``,
    ``itl_ms`` (gaps between streamed chunks), ``tpot_ms``. Speculation figures by
    :meth:`SpecDecodeMetrics.fields <specbuild.interface.SpecDecodeMetrics.fields>` (the OpenAI
    front's ``spec_decode`` keys, deprecated aliases included), null when the server reported no counts.
    """
    return {
        "deployment": point.deployment, "method": point.method, "prompt_set": point.prompt_set, "draft_len": point.draft_len,
        "concurrency": point.concurrency, "request_rate": point.request_rate, "repeat": r.repeat, "prompt_id": r.prompt_id,
        "start_ms": 1000 * r.start_s, "ttft_ms": None if r.ttft_s is None else 1000 * r.ttft_s, "e2e_ms": 1000 * r.latency_s,
        "itl_ms": [1000 * g for g in r.itl_s], "tpot_ms": 1000 * r.tpot_s, "output_tokens": r.num_tokens,
        **(r.metrics.fields() if r.perf_reported else SpecDecodeMetrics.unreported_fields(r.metrics.acceptance_source)),
        "step_tokens": list(r.step_tokens) if r.step_tokens else None, "finish_reason": r.finish_reason,
    }


def load_label(p: PointResult) -> str:
    """``C=4`` (closed loop) or ``rate=2/s`` (``cap=4`` when capped)."""
    return Load(p.concurrency, p.request_rate).label


def point_line(p: PointResult) -> str:
    """One progress line per finished point, short enough for 80 columns with usual names. Example:
    ``smollm2-ngram humaneval:4 C=1 k=4: p50 1611 ms, 21.3 tok/s, 1.68 tok/step, acc 0.17``."""
    rate = "-" if p.acceptance_rate is None else f"{p.acceptance_rate:.2f}"
    return (
        f"{p.deployment} {p.prompt_set} {load_label(p)} k={p.draft_len}: p50 {p.latency_ms_p50:.0f} ms, "
        f"{p.total_tok_s:.1f} tok/s, {p.tokens_per_step:.2f} tok/step, acc {rate}"
        + (f", PROBLEMS {len(p.problems)}" if p.problems else "")
    )


def _join(values: list[float] | None) -> str:
    return "" if values is None else " ".join(f"{v:.4f}" for v in values)


COMPACT_BELOW = 150  # terminal columns under which the bench table drops to COMPACT_COLUMNS


def points_table(points: Sequence[PointResult], *, width: int | None = None):
    """A rich Table, one row per point; intervals and every other figure are in bench.json.

    ``width``: the terminal's columns; under :data:`COMPACT_BELOW` the compact layout
    (:func:`compact_points_table`) that fits 80. Names are never cut.
    """
    if width is not None and width < COMPACT_BELOW:
        return compact_points_table(points)
    from rich.table import Table

    table = Table(title="specbuild bench (flags: F = fewer than 20 requests, U = repeats disagree, D = baseline disturbed)",
                  show_lines=False)
    goodput = any(p.goodput is not None for p in points)
    names = ["deployment", "prompts", "load", "k", "p50 ms", "p99 ms", "TTFT p50", "ITL p50", "TPOT ms", "tok/s", "req/s"]
    names += (["goodput"] if goodput else []) + ["tok/step", "acc", "lossless", "checks", "flags"]
    # the columns that say which point a row is keep their full width when the table is squeezed
    whole = {"deployment": [p.deployment for p in points], "prompts": [p.prompt_set for p in points],
             "load": [load_label(p) for p in points], "k": [str(p.draft_len) for p in points]}
    for name in names:
        left = name in ("deployment", "prompts", "load")
        min_width = max(map(len, [name, *whole[name]])) if name in whole else None
        table.add_column(name, justify="left" if left else "right", no_wrap=True, min_width=min_width)
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
            _flags(p),
        ]
        table.add_row(*row)
    return table


def compact_points_table(points: Sequence[PointResult]):
    """The bench table in 80 columns: where, latency p50, throughput, tokens per step, acceptance rate,
    and one check column (``ok``; ``F``/``U`` flags; problems; outputs not equal to k=0). Every other
    figure is in bench.csv and bench.json."""
    from rich import box
    from rich.table import Table

    table = Table(title="specbuild bench (k: num_draft_tokens; F: < 20 requests, U: repeats disagree, D: baseline disturbed)",
                  caption="every column: bench.csv, bench.json, or a terminal 150 columns wide", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, collapse_padding=True)
    whole = {"deployment": [p.deployment for p in points], "prompts": [p.prompt_set for p in points],
             "load": [load_label(p) for p in points]}  # never cut: they say which point a row is
    for name in ("deployment", "prompts", "load", "k", "p50 ms", "tok/s", "tok/step", "acc", "checks"):
        table.add_column(name, justify="left" if name in ("deployment", "prompts", "load", "checks") else "right", no_wrap=True,
                         min_width=max(map(len, [name, *whole[name]])) if name in whole else None)
    for p in points:
        check = "ok" if not p.problems else f"[red]{len(p.problems)} problems[/red]"
        if p.ids_match_baseline is not None and p.ids_match_baseline < 1:
            check += f" [red]{100 * p.ids_match_baseline:.0f}% = k=0[/red]"
        flags = _flags(p)
        table.add_row(p.deployment, p.prompt_set, load_label(p), str(p.draft_len), f"{p.latency_ms_p50:.0f}", f"{p.total_tok_s:.1f}",
                      f"{p.tokens_per_step:.2f}", "-" if p.acceptance_rate is None else f"{p.acceptance_rate:.2f}",
                      check + (f" {flags}" if flags else ""))
    return table


def _flags(p: PointResult) -> str:
    """F (few requests), U (repeats disagree), D (baseline disturbed: speed-up above its tokens/step)."""
    return ("F" if p.small_sample else "") + ("U" if p.unstable else "") + ("D" if p.baseline_disturbed else "")


def notes(result: SweepResult) -> list[str]:
    """What the table cannot say by itself: what was not measured, and any cross-check problem."""
    lines = []
    if not any(p.ttft_ms_p50 is not None for p in result.points):
        lines.append("TTFT not measured: requests were not streamed (pass --streaming to a decoupled deployment); TPOT = latency / tokens includes the prefill.")
    if not any(p.per_position_acceptance for p in result.points) and any(p.draft_len for p in result.points):
        lines.append(
            "Per-position acceptance: the server reports per-request totals only; `specbuild tune` derives "
            "P(step accepts >= i drafts) from points at consecutive draft lengths."
        )
    for p in result.points:
        if p.server_acceptance and p.draft_len and p.server_acceptance.get("acceptance_rate") is not None:
            lines.append(f"{p.deployment} {p.prompt_set} {load_label(p)} k={p.draft_len}: the server's {p.server_acceptance['source']} "
                         f"metrics say acceptance rate {p.server_acceptance['acceptance_rate']:.2f}")
    sources = {(p.deployment, p.acceptance_source) for p in result.points if p.draft_len}
    if sources:
        meaning = {"perf_metrics": "the engine's counters",
                   "derived": "from decoding iterations (TensorRT-LLM 1.2.1's PyTorch path reports no counters)"}
        used = sorted({s for _, s in sources if s in meaning})
        lines.append("Acceptance counts from: " + ", ".join(f"{d} {s or 'none'}" for d, s in sorted(sources, key=str))
                     + (" (" + "; ".join(f"{s}: {meaning[s]}" for s in used) + ")" if used else ""))
    disturbed = [p for p in result.points if p.baseline_disturbed]
    if disturbed:
        from .stats import DISTURBED

        where = ", ".join(f"{p.deployment} {p.prompt_set} {load_label(p)} k={p.draft_len}" for p in disturbed)
        lines.append(f"{DISTURBED} at {where} (flag D): the machine changed speed during the sweep; "
                     "do not tune from these points: rerun with --repeats 3 (on a quieter machine)")
    load = busy_machine(result.environment)
    if load:
        lines.append(load)
    problems = [q for p in result.points for q in p.problems]
    if problems:
        lines.append(f"{len(problems)} cross-check problems, first: {problems[0]}")
    return lines


def busy_machine(environment: dict | None) -> str | None:
    """A note when the 1-minute load average, at the start or the end of the sweep (bench.json's
    environment block), exceeded the CPU count: timings then include waiting for a CPU."""
    cpu = (environment or {}).get("cpu") or {}
    cores = cpu.get("logical_cores")
    loads = [v[0] for v in (cpu.get("load_average_1_5_15"), cpu.get("load_average_1_5_15_at_end")) if v]
    if not cores or not loads or max(loads) <= cores:
        return None
    return (f"the machine was busy: 1-minute load average up to {max(loads):.1f} on {cores} CPUs; timings include "
            "waiting for a CPU (compare points of one run only, with --repeats)")
