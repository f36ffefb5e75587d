"""What drafting costs per step: the SA proposer (per request, and with the global pool) next to n-gram
prompt lookup, on token streams shaped like SmolLM2 decoding (no model needed).

Each request is a prompt of ``--prompt-len`` tokens followed by ``--steps`` steps; a step appends
``1 + accepted`` tokens (accepted drawn 0..k) and asks for k drafts, as the engine's ``update`` then
``propose`` do. Tokens come from a Zipf-like vocabulary of 49152 ids with repeated spans, so matches
exist. Prints microseconds per step (propose + update), median over requests.

    OMP_NUM_THREADS=1 python benchmarks/bench_sa_draft_cost.py --prompt-len 1000 --steps 200
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from specbuild.methods.ngram.engine import NGramProposer
from specbuild.methods.sa.engine import SAPool, SAProposer
from specbuild.methods.ngram import NGramSpeculation
from specbuild.methods.sa import SASpeculation

VOCAB = 49152


def stream(rng: random.Random, length: int) -> list[int]:
    """Tokens with a heavy head and copied spans (code and chat repeat themselves)."""
    out: list[int] = []
    while len(out) < length:
        if len(out) > 20 and rng.random() < 0.3:
            start = rng.randrange(len(out) - 10)
            out.extend(out[start : start + rng.randrange(3, 10)])
        else:
            out.append(min(int(rng.paretovariate(1.1)), VOCAB - 1))
    return out[:length]


def run(make, prompts: list[list[int]], continuations: list[list[int]], k: int, steps: int, rng: random.Random) -> float:
    """Median microseconds per step over requests; the requests interleave as in a batch."""
    proposers = [make() for _ in prompts]
    contexts = [list(p) for p in prompts]
    cursors = [0] * len(prompts)
    times: list[list[float]] = [[] for _ in prompts]
    for _ in range(steps):
        for i, proposer in enumerate(proposers):
            start = time.perf_counter()
            proposer.propose(contexts[i], k)
            emitted = 1 + rng.randrange(k + 1)
            contexts[i].extend(continuations[i][cursors[i] : cursors[i] + emitted])
            cursors[i] += emitted
            proposer.update(contexts[i], emitted - 1)
            times[i].append(time.perf_counter() - start)
    return statistics.median(statistics.mean(t) for t in times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-len", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    rng = random.Random(0)
    prompts = [stream(rng, args.prompt_len) for _ in range(args.requests)]
    continuations = [stream(rng, args.steps * (args.k + 1)) for _ in range(args.requests)]
    ngram = NGramSpeculation(method="ngram", max_draft_len=args.k, max_matching_ngram_size=3)
    private = SAPool(SASpeculation(method="sa", max_draft_len=args.k))
    shared = SAPool(SASpeculation(method="sa", max_draft_len=args.k, enable_global_pool=True), args.requests)
    makers = {
        "ngram (max_matching_ngram_size 3)": lambda: NGramProposer(ngram),
        "sa (longest match)": lambda: SAProposer(private),
        f"sa + global pool ({args.requests} requests)": lambda: SAProposer(shared),
    }
    print(f"prompt {args.prompt_len} tokens, {args.steps} steps, k={args.k}, {args.requests} requests interleaved")
    for name, make in makers.items():
        print(f"{name:40s} {run(make, prompts, continuations, args.k, args.steps, random.Random(1)):8.1f} us/step")


if __name__ == "__main__":
    main()
