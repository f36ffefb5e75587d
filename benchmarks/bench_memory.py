"""Resident memory of the reference engine with a full batch of long sequences: the KV slots sized from the build.

Loads an engine directory (``specbuild build RECIPE`` writes one), runs ``--batch`` requests at once
whose prompt + new tokens fill ``--seq-len`` positions each, and prints the process's resident set
size (RSS) after loading and at the peak, next to the KV pool's reserved size (``max_batch_size`` x
``(max_seq_len + widest step)`` positions, committed by the OS as slots are written). Writes JSON.

    python benchmarks/bench_memory.py specbuild-out/smollm2-ngram/engine          # 8 x 2048 tokens
    python benchmarks/bench_memory.py ENGINE_DIR --batch 16 --seq-len 1024 --json mem.json
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time
from pathlib import Path

from rich.console import Console

from specbuild.runtime import ReferenceEngine
from specbuild.engine.scheduler import Scheduler
from specbuild.engine.stream import collect
from specbuild.engine.types import GenerationRequest


def rss_mib() -> float:
    """Current resident set size of this process in MiB (``/proc/self/status`` VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine_dir", type=Path)
    parser.add_argument("--batch", type=int, default=8, help="requests in flight at once")
    parser.add_argument("--seq-len", type=int, default=2048, help="prompt + new tokens per request")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--json", type=Path, default=Path("bench_memory.json"))
    args = parser.parse_args()
    console = Console()
    before = rss_mib()
    engine = ReferenceEngine.from_engine_dir(args.engine_dir)
    limits = engine.limits
    prompt_len = min(args.seq_len - args.new_tokens, limits.max_input_len)
    new_tokens = min(args.seq_len, limits.max_seq_len) - prompt_len
    rng = random.Random(0)
    vocab = engine.vocab_size
    requests = [GenerationRequest([rng.randrange(vocab) for _ in range(prompt_len)], new_tokens, end_id=-1) for _ in range(args.batch)]
    with Scheduler(engine, max_batch_size=max(args.batch, limits.max_batch_size)) as scheduler:
        loaded = rss_mib()
        start = time.perf_counter()
        results = [collect(s) for s in [scheduler.stream(r) for r in requests]]
        elapsed = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        pool_gib = scheduler.worker.pool.nbytes / 2**30
    report = {
        "engine_dir": str(args.engine_dir), "batch": args.batch, "prompt_tokens": prompt_len, "new_tokens": new_tokens,
        "rss_before_load_mib": before, "rss_loaded_mib": loaded, "rss_peak_mib": peak,
        "kv_pool_reserved_gib": pool_gib, "kv_slots": max(args.batch, limits.max_batch_size),
        "kv_bytes_per_token": scheduler.worker.pool.shape.bytes_per_token(engine.model.dtype),
        "seconds": elapsed, "tokens_generated": sum(len(r.output_ids) for r in results),
    }
    console.print(
        f"{args.batch} requests x ({prompt_len} prompt + {new_tokens} new) tokens: RSS {before:.0f} MiB before load, "
        f"{loaded:.0f} MiB loaded (pool reserved {pool_gib:.2f} GiB, committed as written), peak {peak:.0f} MiB; "
        f"{elapsed:.1f} s"
    )
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
