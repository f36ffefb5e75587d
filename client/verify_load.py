"""The greedy check under load: ``specbuild verify --concurrency 1,4,8,16``.

A draft-length schedule (TensorRT-LLM ``draft_len_schedule`` / ``max_concurrency``) changes the draft
length with the number of requests in flight, so an engine can be lossless alone and wrong when a
request's batch grows or shrinks under it. This check:

1. runs every prompt alone with ``num_draft_tokens=0``: the plain reference;
2. for each concurrency C, sends ``max(len(prompts), C)`` speculative requests (prompts cycled) from
   C workers, request i released ``i * stagger_s`` after the first (``stagger_s`` = the median
   reference latency / C unless given), so the number in flight climbs from 1 to C and falls back:
   requests start in a small batch and finish in a large one, or the reverse, and cross the
   schedule's thresholds while they decode;
3. compares every output with its prompt's reference (token ids, exactly); a divergence gets the
   target's logit margin there (:class:`specbuild.client.verify.MarginSource`, the single-request
   path's);
4. records per request the fewest and most requests in flight while it ran (from the requests'
   own start and end times) and whether that changed (it decoded across load levels).

Example::

    report = verify_under_load(lambda: SpecClient(url), prompts, levels=(1, 4, 8), max_tokens=64)
    report.write("report.json")
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specbuild.interface import acceptance_rate
from specbuild.prompts import Prompt
from specbuild.util.atomic import write_json_atomic

from .sdk import GenerateResult
from .verify import Divergence, MarginSource, TokenDecoder, as_decoder, describe_divergence, find_divergence, result_to_json


@dataclass(frozen=True)
class LoadedRun:
    """One speculative request under load and how it compares with its prompt's reference.

    ``start_s`` / ``end_s``: seconds from the level's first release; ``in_flight``: the fewest and
    most requests in flight while it ran (itself included).
    """

    prompt_id: str
    result: GenerateResult
    start_s: float
    end_s: float
    in_flight: tuple[int, int] = (1, 1)
    divergence: Divergence | None = None
    near_tie: bool = False

    @property
    def match(self) -> bool:
        return self.divergence is None

    @property
    def crossed_load(self) -> bool:
        """The number of requests in flight changed while this request decoded."""
        return self.in_flight[0] != self.in_flight[1]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.prompt_id, "match": self.match, "near_tie": self.near_tie, "start_s": self.start_s, "end_s": self.end_s,
            "in_flight": list(self.in_flight), "crossed_load": self.crossed_load,
            "divergence": self.divergence.to_json() if self.divergence else None, "speculative": result_to_json(self.result),
        }


@dataclass(frozen=True)
class LoadLevel:
    """All requests of one concurrency level; aggregates are properties."""

    concurrency: int
    stagger_s: float
    wall_s: float
    runs: list[LoadedRun]

    @property
    def num_match(self) -> int:
        return sum(r.match for r in self.runs)

    @property
    def num_near_ties(self) -> int:
        return sum(r.near_tie for r in self.runs)

    @property
    def num_crossed(self) -> int:
        return sum(r.crossed_load for r in self.runs)

    @property
    def max_in_flight(self) -> int:
        return max((r.in_flight[1] for r in self.runs), default=0)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens over the level's requests; ``None`` without counters or drafts."""
        known = [r.result for r in self.runs if r.result.total_draft_tokens is not None and r.result.total_accepted_draft_tokens is not None]
        return acceptance_rate(sum(g.total_accepted_draft_tokens for g in known), sum(g.total_draft_tokens for g in known))

    @property
    def tokens_per_s(self) -> float:
        """All output tokens of the level / its wall time (first release to last response)."""
        return sum(r.result.num_tokens for r in self.runs) / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        names = ("concurrency", "stagger_s", "wall_s", "num_match", "num_near_ties", "num_crossed", "max_in_flight",
                 "acceptance_rate", "tokens_per_s")
        return {"requests": len(self.runs)} | {n: getattr(self, n) for n in names}


@dataclass(frozen=True)
class LoadVerifyReport:
    """References (each prompt alone, num_draft_tokens=0) and one :class:`LoadLevel` per concurrency."""

    references: dict[str, GenerateResult]
    levels: list[LoadLevel]
    max_tokens: int
    num_draft_tokens: int | None = None
    end_id: int | None = None
    near_tie_margin: float | None = None
    provenance: dict | None = None  # client.verify.provenance

    @property
    def passed(self) -> bool:
        """Every request at every level matched its reference, or (with ``near_tie_margin``) is a near-tie."""
        return bool(self.levels) and all(r.match or r.near_tie for level in self.levels for r in level.runs)

    @property
    def all_match(self) -> bool:
        return bool(self.levels) and all(r.match for level in self.levels for r in level.runs)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": "greedy under load",
            "settings": {"max_tokens": self.max_tokens, "num_draft_tokens": self.num_draft_tokens, "end_id": self.end_id,
                         "near_tie_margin": self.near_tie_margin, "concurrency": [lv.concurrency for lv in self.levels]},
            "passed": self.passed,
            "provenance": self.provenance,
            "references": {pid: result_to_json(r) for pid, r in self.references.items()},
            "levels": [{**lv.summary(), "runs": [r.to_json() for r in lv.runs]} for lv in self.levels],
        }

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write ``to_json()`` as indented JSON, atomically (parent folders created); returns the path."""
        return write_json_atomic(path, self.to_json())


def verify_under_load(
    make_client: Callable[[], Any],
    prompts: Sequence[Prompt],
    *,
    levels: Sequence[int],
    max_tokens: int,
    num_draft_tokens: int | None = None,
    end_id: int | None = None,
    tokenizer: str | os.PathLike[str] | TokenDecoder | None = None,
    stagger_s: float | None = None,
    near_tie_margin: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> LoadVerifyReport:
    """The check in the module docstring. ``make_client()`` returns a new client (one per worker;
    used as a context manager). Raises what the client's ``generate`` raises, and ``ValueError``
    for no prompts, a level below 1 or a negative ``near_tie_margin``."""
    if not prompts:
        raise ValueError("verify under load needs at least one prompt")
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency levels must be >= 1, got {list(levels)}")
    if near_tie_margin is not None and not near_tie_margin >= 0:
        raise ValueError(f"near_tie_margin must be >= 0 logit units or None, got {near_tie_margin}")
    decoder = as_decoder(tokenizer)
    total = len(prompts) + sum(max(len(prompts), c) for c in levels)
    done = _Counter(progress, total)
    with make_client() as client:
        client.generate(prompts[0].text, max_tokens=1, num_draft_tokens=0, end_id=end_id)  # untimed warm-up
        references = {}
        for p in prompts:
            references[p.id] = client.generate(p.text, max_tokens=max_tokens, num_draft_tokens=0, end_id=end_id)
            done.add()
        typical_s = statistics.median(r.latency_s for r in references.values())
        margins = MarginSource(client)
        out = []
        for c in levels:
            stagger = typical_s / c if stagger_s is None else stagger_s
            level = _run_level(make_client, prompts, c, stagger, done, max_tokens=max_tokens, num_draft_tokens=num_draft_tokens, end_id=end_id)
            runs = [_compare(run, prompts, references, decoder, margins, near_tie_margin, max_tokens=max_tokens, end_id=end_id) for run in level.runs]
            out.append(replace(level, runs=runs))
    return LoadVerifyReport(references, out, max_tokens, num_draft_tokens, end_id, near_tie_margin)


class _Counter:
    def __init__(self, progress: Callable[[int, int], None] | None, total: int) -> None:
        self.progress, self.total, self.done, self.lock = progress, total, 0, threading.Lock()

    def add(self) -> None:
        with self.lock:
            self.done += 1
            if self.progress is not None:
                self.progress(self.done, self.total)


def _run_level(make_client, prompts, concurrency: int, stagger_s: float, done: _Counter, **request) -> LoadLevel:
    """``max(len(prompts), concurrency)`` speculative requests from ``concurrency`` workers, request i
    released ``i * stagger_s`` after the first."""
    jobs = [prompts[i % len(prompts)] for i in range(max(len(prompts), concurrency))]
    local = threading.local()
    clients: list = []
    lock = threading.Lock()
    t0 = time.perf_counter() + 0.05

    def run(i: int, prompt: Prompt) -> LoadedRun:
        if not hasattr(local, "client"):
            local.client = make_client().__enter__()
            with lock:
                clients.append(local.client)
        time.sleep(max(0.0, t0 + i * stagger_s - time.perf_counter()))
        start = time.perf_counter() - t0
        result = local.client.generate(prompt.text, **request)
        done.add()
        return LoadedRun(prompt.id, result, start, time.perf_counter() - t0)

    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            runs = list(pool.map(lambda job: run(*job), enumerate(jobs)))
    finally:
        for client in clients:
            client.__exit__(None, None, None)
    runs = [replace(r, in_flight=in_flight_range(r, runs)) for r in runs]
    return LoadLevel(concurrency, stagger_s, max(r.end_s for r in runs) - min(r.start_s for r in runs), runs)


def in_flight_range(run: LoadedRun, runs: Sequence[LoadedRun]) -> tuple[int, int]:
    """Fewest and most of ``runs`` in flight at any moment of ``run``'s life (``run`` included).

    Example: run [0, 10], others [2, 4] and [3, 12] -> (1, 3): alone at 0, three at 3.
    """
    moments = sorted({run.start_s} | {t for r in runs for t in (r.start_s, r.end_s) if run.start_s <= t < run.end_s})
    counts = [sum(r.start_s <= t < r.end_s for r in runs) for t in moments]
    return min(counts), max(counts)


def _compare(run: LoadedRun, prompts, references, decoder, margins: MarginSource, near_tie_margin, *, max_tokens, end_id) -> LoadedRun:
    reference = references[run.prompt_id]
    divergence = find_divergence(reference.output_ids, run.result.output_ids, decoder=decoder)
    if divergence is None:
        return run
    text = next(p.text for p in prompts if p.id == run.prompt_id)
    divergence = margins.annotate(divergence, text, reference, max_tokens=max_tokens, end_id=end_id)
    near_tie = near_tie_margin is not None and divergence.is_near_tie(near_tie_margin)
    return replace(run, divergence=divergence, near_tie=near_tie)


def render_load_tables(report: LoadVerifyReport) -> list:
    """Rich tables: the levels side by side, then one per concurrency with its requests."""
    from rich.table import Table

    overview = Table(title="specbuild verify under load: speculative (staggered arrivals) vs each prompt alone (num_draft_tokens=0), greedy")
    # two-line headers: the whole table fits 80 columns, no header cut
    for name in ("C", "requests", "match", "near-\nties", "crossed\nload", "max in\nflight", "acc.\nrate", "tok/s", "stagger\ns"):
        overview.add_column(name, justify="right", no_wrap=True)
    tables = [overview]
    for lv in report.levels:
        ok = lv.num_match == len(lv.runs)
        overview.add_row(str(lv.concurrency), str(len(lv.runs)), f"[{'green' if ok else 'red'}]{lv.num_match}/{len(lv.runs)}[/]",
                         str(lv.num_near_ties), str(lv.num_crossed), str(lv.max_in_flight), _fmt(lv.acceptance_rate),
                         f"{lv.tokens_per_s:.1f}", f"{lv.stagger_s:.2f}")
        t = Table(title=f"C={lv.concurrency}")
        for name in ("request", "match", "tokens", "in flight", "start s", "end s", "first divergence"):
            t.add_column(name, justify="left" if name in ("request", "first divergence") else "right")
        for i, r in enumerate(lv.runs):
            t.add_row(f"{i}:{r.prompt_id}", "[green]yes[/]" if r.match else "[red]NO[/]", str(r.result.num_tokens),
                      f"{r.in_flight[0]}-{r.in_flight[1]}", f"{r.start_s:.2f}", f"{r.end_s:.2f}",
                      describe_divergence(r.divergence, short=True))
        tables.append(t)
    return tables


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


__all__ = ["LoadLevel", "LoadVerifyReport", "LoadedRun", "in_flight_range", "render_load_tables", "verify_under_load"]
