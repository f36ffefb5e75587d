"""Speculation's speed-up by batch size, in-process: a recipe's reference engine, plain against speculative
decoding at each batch size, side by side in one run.

For each recipe (``--recipe``; its engine directory is built or reused as ``specbuild recipe`` does, under
``specbuild-out/<name>/engine``) and each batch size ``B``, the same prompts (``--prompts``, end token
disabled, ``--max-tokens`` new tokens each) go through a :class:`~specbuild.engine.scheduler.Scheduler`
with ``max_batch_size=B``, all submitted at once (closed loop), three ways:

    plain        num_draft_tokens = 0 (the same engine, no speculation)
    spec         the recipe's speculation (its verify.num_draft_tokens, else the build's max_draft_len); rows
                 of one draft model / Medusa / EAGLE head draft in one call per draft token or depth
    spec-rows    the same, but every row drafts alone (the worker before batched drafting), with --rows

Rounds are interleaved (every configuration once per round) so machine noise hits all alike; the table
shows the median round. Every configuration must give exactly the plain tokens.

    python benchmarks/bench_concurrency.py --recipe smollm2-eagle --rows
    python benchmarks/bench_concurrency.py --recipe smollm2-medusa smollm2-ngram --batch-sizes 1 8 --json c.json

Absolute tokens/s depend on the machine and its load; the ratios are measured side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from transformers import AutoTokenizer
from rich.table import Table

from specbuild.util.checkpoints import quiet_transformers
from specbuild.builder.recipe import load_recipe
from specbuild.builder.reference import build_reference_engine
from specbuild.engine import worker
from specbuild.runtime import ReferenceEngine
from specbuild.engine.scheduler import Scheduler
from specbuild.engine.stream import collect
from specbuild.engine.types import GenerationRequest
from specbuild.interface import mean_acceptance_length
from specbuild.prompts import load_prompts


@contextlib.contextmanager
def rows_draft_alone():
    """Every drafter drafts its row alone for the duration: the worker sees no group key
    (:func:`specbuild.engine.drafters.batch_key`)."""
    saved = worker.batch_key
    worker.batch_key = lambda drafter: None
    try:
        yield
    finally:
        worker.batch_key = saved


def run_round(engine: ReferenceEngine, prompts: list[list[int]], max_tokens: int, batch_size: int, *, plain: bool,
              num_draft_tokens: int | None = None):
    """Seconds to decode every prompt with ``batch_size`` requests in flight; outputs; iterations and
    accepted draft tokens. ``num_draft_tokens``: per request (None: the build's max_draft_len)."""
    extra = {"num_draft_tokens": 0} if plain else {} if num_draft_tokens is None else {"num_draft_tokens": num_draft_tokens}
    requests = [GenerationRequest(p, max_tokens, end_id=-1, **extra) for p in prompts]
    with Scheduler(engine, max_batch_size=batch_size) as scheduler:
        start = time.perf_counter()
        results = [collect(s) for s in [scheduler.stream(r) for r in requests]]
        elapsed = time.perf_counter() - start
    return elapsed, [r.output_ids for r in results], sum(r.num_decoding_iterations for r in results), \
        sum(r.total_accepted_draft_tokens for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", nargs="+", default=["smollm2-eagle"], help="bundled recipe names or YAML paths")
    parser.add_argument("--prompts", default="humaneval:8")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rows", action="store_true", help="also run spec with every row drafting alone")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("bench_concurrency.json"))
    args = parser.parse_args()
    console = Console()
    quiet_transformers()
    report = {"prompts": args.prompts, "max_tokens": args.max_tokens, "threads": torch.get_num_threads(),
              "torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "recipes": {}}
    for name in args.recipe:
        loaded = load_recipe(name)
        engine_dir = Path("specbuild-out") / loaded.recipe.name / "engine"
        build_reference_engine(loaded, engine_dir, log=console.print)
        engine = ReferenceEngine.from_engine_dir(engine_dir)
        tokenizer = AutoTokenizer.from_pretrained(engine_dir / "tokenizer")  # the build writes it
        prompts = [tokenizer(p.text)["input_ids"] for p in load_prompts(args.prompts)]
        kinds = ["plain", "spec", *(["spec-rows"] if args.rows else [])]
        configs = [(kind, b) for b in args.batch_sizes for kind in kinds]
        seconds: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
        outputs, steps, accepted = {}, {}, {}
        run_round(engine, prompts[:1], 4, 1, plain=False)  # warm-up
        for r in range(args.rounds):
            for kind, b in configs:
                with rows_draft_alone() if kind == "spec-rows" else contextlib.nullcontext():
                    elapsed, out, iterations, acc = run_round(engine, prompts, args.max_tokens, b, plain=kind == "plain",
                                                              num_draft_tokens=loaded.recipe.verify.num_draft_tokens)
                seconds[kind, b].append(elapsed)
                outputs[kind, b], steps[kind, b], accepted[kind, b] = out, iterations, acc
            console.print(f"{name} round {r + 1}: " + ", ".join(f"{k} B={b} {seconds[k, b][-1]:.1f} s" for k, b in configs))
        tokens = len(prompts) * args.max_tokens
        rate = {c: tokens / statistics.median(seconds[c]) for c in configs}
        reference = outputs["plain", args.batch_sizes[0]]
        table = Table(title=f"{name}: {len(prompts)} prompts x {args.max_tokens} tokens, {torch.get_num_threads()} threads")
        for col in ("B", "config", "tokens/s (total)", "vs plain at B", "plain vs plain B=1", "acceptance length", "same tokens"):
            table.add_column(col, justify="right")
        rows = []
        for kind, b in configs:
            same = sum(a == c for a, c in zip(outputs[kind, b], reference))
            # tokens per verification step after the prefill, bonus included (specbuild.interface)
            length = mean_acceptance_length(accepted[kind, b], steps[kind, b]) or 0.0
            row = {"batch_size": b, "config": kind, "tokens_per_s": rate[kind, b], "vs_plain": rate[kind, b] / rate["plain", b],
                   "plain_vs_batch_1": rate["plain", b] / rate["plain", args.batch_sizes[0]], "acceptance_length": length,
                   "accepted_draft_tokens": accepted[kind, b], "same_as_plain": same, "seconds": seconds[kind, b]}
            rows.append(row)
            table.add_row(str(b), kind, f"{rate[kind, b]:.1f}", f"{row['vs_plain']:.2f}x",
                          f"{row['plain_vs_batch_1']:.2f}x", f"{length:.2f}", f"{same}/{len(prompts)}")
        console.print(table)
        report["recipes"][name] = {"engine_dir": str(engine_dir), "speculative_config": engine.speculative_config, "rows": rows}
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
