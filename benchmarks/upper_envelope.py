"""Is a scheduled deployment on the upper envelope of the fixed draft lengths? Side by side in one run.

Serves two recipes at once through real tritonservers: ``--base`` (the method with a fixed
``max_draft_len``; each request asks for one fixed ``num_draft_tokens`` k) and ``--scheduled`` (the
recipe ``specbuild tune --write-recipe`` writes: ``build.draft_len_schedule`` / ``max_concurrency``,
the draft length chosen by the engine every iteration from the batch size, as TensorRT-LLM's
PyTorch executor does; requests send no draft length: the engine's own). At every
concurrency (closed loop) and every repeat, the arms (fixed k in ``--draft-lengths``, and the
schedule) run next to each other in time, their order rotated by the repeat, so machine noise hits
every arm alike.

Per concurrency: the total output tokens/s of each arm (mean of the repeats), the best fixed k, and
the schedule's paired ratio to each fixed arm: the geometric mean of the per-repeat ratios with a 95 %
Student-t interval on their logarithms (``repeats - 1`` degrees of freedom). The schedule is **on the
envelope** at a concurrency when the interval of its ratio to the best fixed arm reaches 1 (not
significantly below). Every output of every arm is compared token for token with the base
deployment's k = 0 output of the same prompt (greedy, fp32: must be equal).

    python benchmarks/upper_envelope.py --base smollm2-ngram --scheduled ngram-scheduled.yaml \\
        --concurrency-sweep 1,2,4,8,16 --repeats 3 --prompts humaneval:16 --max-tokens 64 --json out.json

Prints a table and writes JSON. Absolute tokens/s depend on the machine; ratios are side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specbuild.bench.run import ThreadClients, prepare_prompts, run_point, serve_recipes
from specbuild.builder.recipe import load_recipe
from specbuild.bench.stats import paired_ratio as stats_paired_ratio
from specbuild.client.environment import environment
from specbuild.tokenizer import load_tokenizer

CONFIDENCE = 0.95


def paired_ratio(numerators: list[float], denominators: list[float]) -> dict:
    """``{"ratio", "ci"}``: :func:`specbuild.bench.stats.paired_ratio` (geometric mean of the paired
    ratios, Student-t interval on the log scale; ``ci`` None with fewer than two pairs)."""
    ratio, ci = stats_paired_ratio(numerators, denominators, confidence=CONFIDENCE)
    return {"ratio": ratio, "ci": ci}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="recipe with a fixed max_draft_len (name or path)")
    parser.add_argument("--scheduled", required=True, help="recipe with build.draft_len_schedule (tune --write-recipe)")
    parser.add_argument("--draft-lengths", default="0,2,4", help="fixed num_draft_tokens arms on --base")
    parser.add_argument("--concurrency-sweep", default="1,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", default="humaneval:16")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--output-root", type=Path, default=None, help="where the deployments are built [specbuild-out]")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    ks = [int(k) for k in args.draft_lengths.split(",")]
    levels = [int(c) for c in args.concurrency_sweep.split(",")]
    if 0 not in ks:
        raise SystemExit("--draft-lengths must include 0 (the reference outputs)")
    schedule = load_recipe(args.scheduled).recipe.build
    console = Console()
    env = environment()
    log = lambda m: console.print(f"[dim]{m}[/dim]")  # noqa: E731
    with serve_recipes([args.base, args.scheduled], output_root=args.output_root, stream=True, log=log) as (base, sched):
        sched_k = sched.max_draft_len
        tokenizer = load_tokenizer(base.tokenizer_dir)
        prompts = prepare_prompts(args.prompts, base, "auto", tokenizer)
        arms = {f"k={k}": (base, base.request_fields(k)) for k in ks}
        arms["schedule"] = (sched, {})  # the engine's defaults: its max_draft_len (lookahead: its built shape), capped per iteration
        clients = {name: ThreadClients(d, 600.0) for name, (d, _) in arms.items()}
        reference: dict[str, tuple[int, ...]] = {}
        mismatches: list[dict] = []
        tok_s: dict[int, dict[str, list[float]]] = {c: {name: [] for name in arms} for c in levels}
        steps: dict[int, dict[str, list[float]]] = {c: {name: [] for name in arms} for c in levels}
        # reference outputs (k=0, one at a time) and warm-up of every arm
        records, _ = run_point(clients["k=0"], prompts, concurrency=1, num_requests=len(prompts),
                               max_tokens=args.max_tokens, end_id=None, fields=arms["k=0"][1])
        reference = {r.prompt_id: r.output_ids for r in records}
        for name, (d, fields) in arms.items():
            run_point(clients[name], prompts[:1], concurrency=1, num_requests=1, max_tokens=args.max_tokens,
                      end_id=None, fields=fields)
        names = list(arms)
        started = time.time()
        for repeat in range(args.repeats):
            for c in levels:
                order = names[repeat % len(names):] + names[: repeat % len(names)]
                for name in order:
                    d, fields = arms[name]
                    records, wall = run_point(clients[name], prompts, concurrency=c, num_requests=max(len(prompts), c),
                                              max_tokens=args.max_tokens, end_id=None, fields=fields)
                    tok_s[c][name].append(sum(r.num_tokens for r in records) / wall)
                    spec_steps = sum(r.decode_steps for r in records)
                    steps[c][name].append(sum(r.num_tokens for r in records) / max(1, spec_steps + len(records)))
                    for r in records:
                        if r.output_ids != reference[r.prompt_id]:
                            mismatches.append({"arm": name, "concurrency": c, "repeat": repeat, "prompt": r.prompt_id})
                    console.print(f"repeat {repeat} C={c:<3} {name:<9} {tok_s[c][name][-1]:7.1f} tok/s")
        for cl in clients.values():
            cl.close()
    rows = []
    for c in levels:
        means = {name: statistics.fmean(v) for name, v in tok_s[c].items()}
        fixed = [n for n in names if n != "schedule"]
        best = max(fixed, key=means.get)
        vs = {n: paired_ratio(tok_s[c]["schedule"], tok_s[c][n]) for n in fixed}
        ci = vs[best]["ci"]
        rows.append({
            "concurrency": c, "tok_s": tok_s[c], "mean_tok_s": means, "tokens_per_step": steps[c], "best_fixed": best,
            "schedule_vs": vs, "on_envelope": ci is None or ci[1] >= 1.0,
        })
    table = Table(title=f"schedule vs fixed draft lengths ({args.prompts}, {args.max_tokens} tokens, {args.repeats} repeats)")
    table.add_column("C", justify="right")
    for n in names:
        table.add_column(f"{n} tok/s", justify="right")
    table.add_column("best fixed")
    table.add_column("sched / best [95%]", justify="right")
    table.add_column("on env.")
    for row in rows:
        v = row["schedule_vs"][row["best_fixed"]]
        ci = "" if v["ci"] is None else f" [{v['ci'][0]:.2f}, {v['ci'][1]:.2f}]"
        table.add_row(str(row["concurrency"]), *(f"{row['mean_tok_s'][n]:.1f}" for n in names), row["best_fixed"],
                      f"{v['ratio']:.2f}{ci}", "yes" if row["on_envelope"] else "NO")
    console.print(table)
    console.print(f"schedule: {schedule.draft_len_schedule} max_concurrency {schedule.max_concurrency} "
                  f"(requests send no num_draft_tokens: the engine's max_draft_len {sched_k})")
    console.print(f"outputs equal to k=0: {'all' if not mismatches else f'{len(mismatches)} MISMATCHES'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": "python benchmarks/upper_envelope.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
            "base": args.base, "scheduled": args.scheduled,
            "schedule": {"draft_len_schedule": schedule.draft_len_schedule, "max_concurrency": schedule.max_concurrency},
            "rows": rows, "mismatches": mismatches, "seconds": time.time() - started, "environment": env,
        }, indent=1, default=str))
    raise SystemExit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
