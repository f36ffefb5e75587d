"""Serving overhead: what a recipe's deployment served at k = 0, against the same engine in-process
(``specbuild bench --serving-overhead``).

Speculation's speed-ups are ratios of served throughputs; when serving costs something per decoding
step (a streamed response per step), plain decoding pays it on every token and speculation on fewer,
so the served ratio overstates speculation. This module runs the plain points again without the
server: the recipe's engine directory loaded here, the same prompts tokenized as the deployment's
preprocessing does, the same closed loop (C requests in flight, each worker sending its next when
its previous returns; one :class:`~specbuild.engine.scheduler.Scheduler`, in-flight batching as
served) and the same repeats, right after the sweep::

    overhead = 1 - served tok/s / in-process tok/s      (0.21: serving loses 21 % of plain throughput)

Only recipe targets of the reference backend have an engine directory here; open-loop points are
left out (their throughput follows the arrival rate, not the engine).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from .plan import Deployment
from .report import SweepResult
from .run import prepare_prompts

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

    def to_json(self) -> dict:
        return {**asdict(self), "overhead": self.overhead}


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


def measure_serving_overhead(result: SweepResult, *, log: Callable[[str], None] = lambda message: None) -> list[OverheadRow]:
    """An :class:`OverheadRow` per closed-loop k = 0 point of every reference recipe deployment in
    ``result``, its engine run in this process with the sweep's prompts, loads and repeats.

    Raises:
        FileNotFoundError / ValueError: an engine directory that does not load
            (:meth:`~specbuild.runtime.ReferenceEngine.from_engine_dir`).
    """
    from specbuild.runtime import ReferenceEngine
    from specbuild.engine.scheduler import Scheduler
    from specbuild.tokenizer import load_tokenizer

    plan, rows = result.plan, []
    for deployment in result.deployments:
        engine_dir = engine_dir_of(deployment)
        points = [p for p in result.points if p.deployment == deployment.name and p.draft_len == 0 and p.request_rate is None]
        if engine_dir is None or not points:
            continue
        log(f"serving overhead: {deployment.name}'s engine in-process ({engine_dir})")
        engine = ReferenceEngine.from_engine_dir(engine_dir)
        tokenizer = load_tokenizer(deployment.tokenizer_dir)
        with Scheduler(engine) as scheduler:
            for source in plan.prompt_sets:
                prompts = [(tokenizer(text, add_special_tokens=True)["input_ids"], p.max_tokens or plan.max_tokens)
                           for p, text in prepare_prompts(source, deployment, plan.chat_template, tokenizer)]
                for ids, max_tokens in prompts[: plan.warmup]:
                    in_process_tok_s(scheduler, [(ids, max_tokens)], concurrency=1, num_requests=1, end_id=plan.end_id)
                for point in (p for p in points if p.prompt_set == source):
                    runs = [in_process_tok_s(scheduler, prompts, concurrency=point.concurrency, end_id=plan.end_id,
                                             num_requests=plan.num_requests(len(prompts), point.concurrency))
                            for _ in range(plan.repeats)]
                    rows.append(OverheadRow(deployment.name, source, point.concurrency, deployment.stream,
                                            list(point.repeat_total_tok_s or [point.total_tok_s]), runs,
                                            deployment.stream_interval))
    return rows


ADVISE_ABOVE = 0.05  # a streamed overhead above 5 % gets the stream_interval advice


def overhead_advice(rows: Sequence[OverheadRow]) -> list[str]:
    """One line per deployment whose streamed overhead exceeds :data:`ADVISE_ABOVE` while it answers
    every decoding iteration: raise ``serve.stream_interval`` (TensorRT-LLM's ``LlmArgs.stream_interval``,
    whose description advises a larger value at large batch sizes); the per-response cost divides
    by about the interval. Example: C=8 at 10 % -> "serve.stream_interval: 4"."""
    worst: dict[str, OverheadRow] = {}
    for r in rows:
        if r.streamed and r.stream_interval == 1 and r.overhead > ADVISE_ABOVE and (
                r.deployment not in worst or r.overhead > worst[r.deployment].overhead):
            worst[r.deployment] = r
    return [f"{name}: streaming a response per decoding iteration costs {100 * r.overhead:.0f}% of plain throughput at "
            f"C={r.concurrency}; set serve.stream_interval: 4 (TensorRT-LLM's stream_interval: a response every 4th "
            "iteration, with the tokens since the last) to divide that cost by about 4 (docs/bench.md)"
            for name, r in worst.items()]


def overhead_table(rows: Sequence[OverheadRow]):
    """A rich table: served against in-process tokens/s and the overhead, one row per level."""
    from rich.table import Table

    table = Table(title="serving overhead: plain decoding (k=0) served against the same engine in-process")
    for column in ("deployment", "prompts", "load", "requests", "served tok/s", "in-process tok/s", "overhead"):
        table.add_column(column, justify="left" if column in ("deployment", "prompts") else "right")
    for r in rows:
        table.add_row(r.deployment, r.prompt_set, f"C={r.concurrency}",
                      ("streamed" + (f" /{r.stream_interval}" if r.stream_interval > 1 else "")) if r.streamed else "unary",
                      f"{statistics.fmean(r.served_tok_s):.1f}", f"{statistics.fmean(r.in_process_tok_s):.1f}",
                      f"{100 * r.overhead:+.1f}%")
    return table


__all__ = ["OVERHEAD_FILE", "OverheadRow", "engine_dir_of", "in_process_tok_s", "measure_serving_overhead", "overhead_advice",
           "overhead_table"]
