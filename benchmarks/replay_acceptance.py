"""Greedy acceptance of model-free proposers (SA, n-gram), exactly, from one plain run per prompt.

A greedy request's output is the target's own greedy continuation whatever the drafts, and a step
accepts the longest draft prefix equal to it. So one plain (k = 0) generation per prompt fixes what
every model-free proposer would get accepted: replaying the request step by step (draft
``min(k, max_tokens - emitted - 1)`` tokens, accept the matching prefix, emit it + the bonus token,
``update``) gives the engine's own counters (tests/test_sa.py checks this against the engine). The plain
outputs are generated once, batched in the engine's scheduler; each method's replay then costs
microseconds, so SA and n-gram are compared on exactly the same outputs, free of the machine's load.

    OMP_NUM_THREADS=2 python benchmarks/replay_acceptance.py specbuild-out/smollm2-sa/engine \\
        --prompts humaneval:20 --prompts specbench:10 --max-tokens 64 --json out.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specbuild.methods.ngram.engine import NGramProposer
from specbuild.methods.sa.engine import SAPool, SAProposer
from specbuild.methods.ngram import NGramSpeculation
from specbuild.methods.sa import SASpeculation


@dataclass(frozen=True)
class Replay:
    """One request's counters, as the engine counts them: ``steps`` verification steps after the
    prefill, ``drafted`` draft tokens verified, ``accepted`` of them accepted."""

    steps: int
    drafted: int
    accepted: int


def replay(proposer, prompt: Sequence[int], output: Sequence[int], *, k: int, max_tokens: int) -> Replay:
    """Replay one greedy request whose plain output is ``output`` (its first token came from the prefill)."""
    context, pos = [*prompt, output[0]], 1
    steps = drafted = accepted = 0
    while pos < len(output):
        width = min(k, max_tokens - pos - 1)
        draft = proposer.propose(context, width) if width > 0 else []
        hits = next((i for i, (d, t) in enumerate(zip(draft, output[pos:])) if d != t), min(len(draft), len(output) - pos))
        emitted = min(hits + 1, len(output) - pos)
        context += output[pos : pos + emitted]
        pos += emitted
        steps, drafted, accepted = steps + 1, drafted + len(draft), accepted + emitted - 1  # the last kept token is the target's
        proposer.update(context, hits)
    return Replay(steps, drafted, accepted)


def replay_lockstep(make: Callable[[], object], prompts, outputs, *, k: int, max_tokens: int) -> list[Replay]:
    """Replay requests in flight together, one step each in turn (a shared pool sees the others' progress)."""
    proposers = [make() for _ in prompts]
    states = [[[*p, o[0]], 1, 0, 0, 0] for p, o in zip(prompts, outputs)]  # context, pos, steps, drafted, accepted
    while any(s[1] < len(o) for s, o in zip(states, outputs)):
        for proposer, state, output in zip(proposers, states, outputs):
            context, pos = state[0], state[1]
            if pos >= len(output):
                continue
            width = min(k, max_tokens - pos - 1)
            draft = proposer.propose(context, width) if width > 0 else []
            hits = next((i for i, (d, t) in enumerate(zip(draft, output[pos:])) if d != t), min(len(draft), len(output) - pos))
            emitted = min(hits + 1, len(output) - pos)
            context += output[pos : pos + emitted]
            state[1:] = [pos + emitted, state[2] + 1, state[3] + len(draft), state[4] + hits]
            proposer.update(context, hits)
    return [Replay(s[2], s[3], s[4]) for s in states]


def plain_outputs(engine_dir: Path, sources: list[str], max_tokens: int, batch: int):
    """Yield ``(source, [(prompt ids, plain greedy output ids)])`` set by set, the prompts tokenized as the
    bench sends them (chat template where the bench applies it, special tokens added)."""
    from transformers import AutoTokenizer

    from specbuild.engine import GenerationRequest
    from specbuild.runtime import ReferenceEngine
    from specbuild.engine.scheduler import Scheduler
    from specbuild.engine.stream import collect
    from specbuild.prompts import apply_chat_template, expand_prompt_sets, load_prompts

    engine = ReferenceEngine.from_engine_dir(engine_dir)
    tokenizer = AutoTokenizer.from_pretrained(engine_dir / "tokenizer")
    with Scheduler(engine, max_batch_size=batch) as scheduler:
        for source in expand_prompt_sets(sources):
            prompts = apply_chat_template(load_prompts(source), source, "auto", tokenizer)
            ids = [tokenizer(p.text, add_special_tokens=True)["input_ids"] for p in prompts]  # as the preprocessing model
            streams = [scheduler.stream(GenerationRequest(i, max_tokens, num_draft_tokens=0)) for i in ids]
            yield source, [(i, collect(s).output_ids) for i, s in zip(ids, streams)]


def summarize(replays: list[Replay], outputs) -> dict[str, float]:
    from specbuild.interface import acceptance_rate, mean_acceptance_length

    del outputs  # each replayed step emits its accepted drafts + 1: 1 + accepted / steps is the tokens per step
    steps = sum(r.steps for r in replays)
    drafted, accepted = sum(r.drafted for r in replays), sum(r.accepted for r in replays)
    return {"tokens_per_step": mean_acceptance_length(accepted, steps) or 1.0, "acceptance_rate": acceptance_rate(accepted, drafted) or 0.0,
            "drafted": drafted, "accepted": accepted, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine_dir", type=Path)
    parser.add_argument("--prompts", action="append", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    k = args.k
    methods: dict[str, Callable[[], object]] = {
        "ngram": lambda: NGramProposer(NGramSpeculation(method="ngram", max_draft_len=k, max_matching_ngram_size=3)),
        "sa": lambda: SAProposer(SAPool(SASpeculation(method="sa", max_draft_len=k))),
    }
    results: dict[str, dict[str, dict[str, float]]] = {}
    for source, pairs in plain_outputs(args.engine_dir, args.prompts, args.max_tokens, args.batch):
        prompts, outputs = [p for p, _ in pairs], [o for _, o in pairs]
        row = {name: summarize([replay(make(), p, o, k=k, max_tokens=args.max_tokens) for p, o in pairs], outputs)
               for name, make in methods.items()}
        pool = SAPool(SASpeculation(method="sa", max_draft_len=k, enable_global_pool=True), len(pairs))
        row["sa_global_pool"] = summarize(replay_lockstep(lambda: SAProposer(pool), prompts, outputs, k=k, max_tokens=args.max_tokens), outputs)
        results[source] = row
        print(f"{source:32s} " + "  ".join(f"{n} {v['tokens_per_step']:.2f} tok/step acc {v['acceptance_rate']:.2f}" for n, v in row.items()), flush=True)
        if args.json:  # after every set: a long run leaves what it has measured
            args.json.write_text(json.dumps({"k": k, "max_tokens": args.max_tokens, "prompts": args.prompts, "results": results}, indent=1))


if __name__ == "__main__":
    main()
