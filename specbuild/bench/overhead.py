"""Serving overhead: what a recipe's deployment served at k = 0, against the same engine in-process
(``specbuild bench --serving-overhead``).

Speculation's speed-ups are ratios of served throughputs; when serving costs something per decoding
step (a streamed response per step), plain decoding pays it on every token and speculation on fewer,
so the served ratio overstates speculation. With ``--serving-overhead`` the sweep loads each recipe
deployment's engine directory in the bench process too (:class:`InProcessArm`) and runs every plain
closed-loop point there as well: the same prompts tokenized as the deployment's preprocessing does,
the same closed loop (C requests in flight, each worker sending its next when its previous returns;
one :class:`~specbuild.engine.scheduler.Scheduler`, in-flight batching as served), the same request
count, once per repeat **next to the served run** (served first in even repeats, in-process first in
odd ones), so both arms of a repeat see the same machine::

    overhead = 1 - served tok/s / in-process tok/s      (0.21: serving loses 21 % of plain throughput)

with a 95 % interval from the per-repeat pairs (:func:`~specbuild.bench.stats.paired_ratio`). Only
recipe targets of the reference backend have an engine directory here; open-loop points are left out
(their throughput follows the arrival rate, not the engine).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from specbuild.prompts import Prompt
from .plan import Deployment, SweepPlan
from .report import SweepResult
from .stats import paired_ratio

OVERHEAD_FILE = "serving_overhead.json"


@dataclass(frozen=True)
class OverheadRow:
    """One closed-loop level of one deployment and prompt set: served k = 0 against in-process.

    Attributes:
        streamed: the served requests were streamed (one response per decoding step), else unary.
        served_tok_s / in_process_tok_s: output tokens / wall seconds, one value per repeat.
    """

    deployment: str
    prompt_set: str
    concurrency: int
    streamed: bool
    served_tok_s: list[float]
    in_process_tok_s: list[float]
    stream_interval: int = 1  # the deployment's serve.stream_interval (decoding iterations per streamed response)

    @property
    def overhead(self) -> float:
        """``1 - mean(served) / mean(in-process)``: the fraction of plain throughput serving costs."""
        return 1.0 - statistics.fmean(self.served_tok_s) / statistics.fmean(self.in_process_tok_s)

    @property
    def interval(self) -> list[float] | None:
        """95 % interval of the overhead, ``1 - `` the paired ratio served / in-process over the repeats
        (:func:`~specbuild.bench.stats.paired_ratio`): ``[low, high]``, None with fewer than two repeats
        or unpaired lists."""
        if len(self.served_tok_s) != len(self.in_process_tok_s) or len(self.served_tok_s) < 2:
            return None
        _, ci = paired_ratio(self.served_tok_s, self.in_process_tok_s)
        return None if ci is None else [1.0 - ci[1], 1.0 - ci[0]]

    def to_json(self) -> dict:
        return {**asdict(self), "overhead": self.overhead, "overhead_ci": self.interval}


def engine_dir_of(deployment: Deployment) -> Path | None:
    """The engine directory of a reference recipe deployment: its tokenizer lives in
    ``<engine_dir>/tokenizer`` (the reference builder's layout); None for any other target."""
    if deployment.protocol == "openai" or deployment.tokenizer_dir is None:
        return None
    engine_dir = Path(deployment.tokenizer_dir).parent
    return engine_dir if (engine_dir / "config.json").is_file() and (engine_dir / "target").is_dir() else None


def in_process_tok_s(scheduler, prompts: Sequence[tuple[list[int], int]], *, concurrency: int, num_requests: int,
                     end_id: int | None) -> float:
    """Output tokens per second of ``num_requests`` plain requests (``prompts`` = (input ids, max
    tokens), cycled) from ``concurrency`` worker threads through ``scheduler``, closed loop."""
    from specbuild.engine.types import GenerationRequest

    jobs = [prompts[i % len(prompts)] for i in range(num_requests)]

    def one(job: tuple[list[int], int]) -> int:
        ids, max_tokens = job
        return len(scheduler.generate(GenerationRequest(ids, max_tokens, end_id=end_id, num_draft_tokens=0)).output_ids)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="in-process") as pool:
        tokens = sum(pool.map(one, jobs))
    return tokens / (time.perf_counter() - start)


class InProcessArm:
    """One recipe deployment's engine loaded in this process: the in-process side of
    ``--serving-overhead``, run by the sweep next to each served plain closed-loop run.

    Raises (construction):
        FileNotFoundError / ValueError: an engine directory that does not load
            (:meth:`~specbuild.runtime.ReferenceEngine.from_engine_dir`).
    """

    def __init__(self, engine_dir: Path, tokenizer_dir: str | Path, *, end_id: int | None, warmup: int = 1) -> None:
        from specbuild.runtime import ReferenceEngine
        from specbuild.engine.scheduler import Scheduler
        from specbuild.tokenizer import load_tokenizer

        self.engine = ReferenceEngine.from_engine_dir(engine_dir)
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.scheduler = Scheduler(self.engine)
        self.end_id, self.warmup, self.warm = end_id, warmup, False

    def tok_s(self, prompts: Sequence[tuple[Prompt, str]], *, max_tokens: int, concurrency: int, num_requests: int) -> float:
        """Output tokens per second of ``num_requests`` plain requests over ``prompts`` (the sweep's
        (prompt, text) pairs, cycled) at ``concurrency``, closed loop; the first call warms up first."""
        ids = [(self.tokenizer(text, add_special_tokens=True)["input_ids"], p.max_tokens or max_tokens) for p, text in prompts]
        if not self.warm:
            for job in ids[: self.warmup]:
                in_process_tok_s(self.scheduler, [job], concurrency=1, num_requests=1, end_id=self.end_id)
            self.warm = True
        return in_process_tok_s(self.scheduler, ids, concurrency=concurrency, num_requests=num_requests, end_id=self.end_id)

    def close(self) -> None:
        self.scheduler.close()


def in_process_arm(deployment: Deployment, plan: SweepPlan, *, log: Callable[[str], None] = lambda message: None
                   ) -> InProcessArm | None:
    """An :class:`InProcessArm` for a reference recipe deployment, None for any other target."""
    engine_dir = engine_dir_of(deployment)
    if engine_dir is None:
        return None
    log(f"serving overhead: {deployment.name}'s engine also in-process ({engine_dir}), next to each plain closed-loop run")
    return InProcessArm(engine_dir, deployment.tokenizer_dir, end_id=plan.end_id, warmup=max(1, plan.warmup))


def overhead_rows(result: SweepResult) -> list[OverheadRow]:
    """An :class:`OverheadRow` per plain closed-loop point measured in-process too (the sweep ran with
    an :class:`InProcessArm`), in the sweep's order."""
    streams = {d.name: (d.stream, d.stream_interval) for d in result.deployments}
    return [OverheadRow(p.deployment, p.prompt_set, p.concurrency, streams[p.deployment][0],
                        list(p.repeat_total_tok_s or [p.total_tok_s]), list(p.in_process_tok_s), streams[p.deployment][1])
            for p in result.points if p.in_process_tok_s]


ADVISE_ABOVE = 0.05  # a streamed overhead above 5 % gets the stream_interval advice


def advised_interval(overhead: float, stream_interval: int) -> int:
    """The ``serve.stream_interval`` to try for a streamed ``overhead`` (fraction of in-process plain
    throughput) measured at ``stream_interval``: the smallest power of two at least
    ``2 * stream_interval * overhead / ADVISE_ABOVE``. The cost per response stays, so the overhead
    falls with the interval, but on a machine whose cores the engine's threads fill it falls by less
    than the interval while responses are frequent, hence the factor 2. Measured on 2 cores
    (docs/results/2026-12-06-serving-tax-paired.md: interval 1; 2026-12-06-serving-tax-interval.md: 4
    and 8), C=8: +20 % at 1, +7.5 % at 4, +2.5 % at 8 -> advised 8; C=1: +10 % at 1, +2.9 % at 4 -> 4.

    Raises:
        ValueError: ``stream_interval`` < 1.
    """
    if stream_interval < 1:
        raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
    wanted = 2 * stream_interval * max(0.0, overhead) / ADVISE_ABOVE
    interval = 1
    while interval < wanted:
        interval *= 2
    return max(interval, stream_interval)


def overhead_advice(rows: Sequence[OverheadRow]) -> list[str]:
    """One line per deployment whose streamed overhead exceeds :data:`ADVISE_ABOVE`: raise
    ``serve.stream_interval`` (TensorRT-LLM's ``LlmArgs.stream_interval``, whose description advises a
    larger value at large batch sizes) to :func:`advised_interval` of its worst level. Example: C=8 at
    20 % with a response per iteration -> "serve.stream_interval: 8"."""
    worst: dict[str, OverheadRow] = {}
    for r in rows:
        if r.streamed and r.overhead > ADVISE_ABOVE and (r.deployment not in worst or r.overhead > worst[r.deployment].overhead):
            worst[r.deployment] = r
    lines = []
    for name, r in worst.items():
        every = "per decoding iteration" if r.stream_interval == 1 else f"every {r.stream_interval} iterations"
        interval = advised_interval(r.overhead, r.stream_interval)
        lines.append(f"{name}: streaming a response {every} costs {100 * r.overhead:.0f}% of plain throughput at "
                     f"C={r.concurrency}; set serve.stream_interval: {interval} (TensorRT-LLM's stream_interval: a response "
                     f"every {interval} iterations, with the tokens since the last) and measure again (docs/bench.md)")
    return lines


def overhead_table(rows: Sequence[OverheadRow]):
    """A rich table: served against in-process tokens/s and the overhead, one row per level."""
    from rich.table import Table

    table = Table(title="serving overhead: plain decoding (k=0) served against the same engine in-process")
    for column in ("deployment", "prompts", "load", "requests", "served tok/s", "in-process tok/s", "overhead", "95% interval"):
        table.add_column(column, justify="left" if column in ("deployment", "prompts") else "right")
    for r in rows:
        table.add_row(r.deployment, r.prompt_set, f"C={r.concurrency}",
                      ("streamed" + (f" /{r.stream_interval}" if r.stream_interval > 1 else "")) if r.streamed else "unary",
                      f"{statistics.fmean(r.served_tok_s):.1f}", f"{statistics.fmean(r.in_process_tok_s):.1f}",
                      f"{100 * r.overhead:+.1f}%",
                      "-" if r.interval is None else f"[{100 * r.interval[0]:+.1f}, {100 * r.interval[1]:+.1f}]%")
    return table


__all__ = ["OVERHEAD_FILE", "InProcessArm", "OverheadRow", "advised_interval", "engine_dir_of", "in_process_arm", "in_process_tok_s",
           "overhead_advice", "overhead_rows", "overhead_table"]
