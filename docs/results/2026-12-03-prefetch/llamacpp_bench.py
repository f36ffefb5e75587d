"""llama.cpp (llama-cpp-python) greedy decoding on given prompt token ids: plain and prompt lookup.
Usage: python llamacpp_bench.py MODEL.gguf PROMPTS.json OUT.json  (PROMPTS: list of token-id lists, from engine_side.py)

In its own virtual environment: pip install llama-cpp-python==0.3.36 (built from the sdist here). The F32 GGUF:
python vendor/llama.cpp/convert_hf_to_gguf.py CHECKPOINT_DIR --outtype f32 --outfile smollm2-f32.gguf, from the
sdist's tree with PYTHONPATH=vendor/llama.cpp/gguf-py (and sentencepiece importable), where CHECKPOINT_DIR is the
engine's materialized checkpoint (specbuild.util.checkpoints.materialize_checkpoint).
Output ids are compared with engine.json's: python -c "import json; a=json.load(open('engine.json'))['outputs'];
b=json.load(open('llamacpp.json'))['outputs']; print(sum(x == y for x, y in zip(a, b)))"."""
import json, sys, time
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

model, prompts_path, out_path = sys.argv[1:4]
prompts = json.load(open(prompts_path))
N = 128
configs = {"plain": None, "lookup k=10 n=2": (10, 2), "lookup k=4 n=2": (4, 2), "lookup k=4 n=3": (4, 3)}
llms = {name: Llama(model_path=model, n_threads=2, n_threads_batch=2, n_ctx=1024, verbose=False,
                    draft_model=None if c is None else LlamaPromptLookupDecoding(num_pred_tokens=c[0], max_ngram_size=c[1]))
        for name, c in configs.items()}

def run(llm, ids):
    llm.reset()
    out = []
    t = time.perf_counter()
    for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        out.append(tok)
        if len(out) == N:
            break
    return time.perf_counter() - t, out

for llm in llms.values():
    run(llm, prompts[0][:32])  # warm-up
secs = {n: 0.0 for n in llms}
outs = {n: [] for n in llms}
for i, ids in enumerate(prompts):
    names = list(llms)
    names = names[i % len(names):] + names[: i % len(names)]
    for n in names:
        s, o = run(llms[n], ids)
        secs[n] += s
        outs[n].append(o)
res = {n: {"tok_s": len(prompts) * N / secs[n], "same_as_plain": sum(a == b for a, b in zip(outs[n], outs["plain"]))} for n in llms}
for n, r in res.items():
    print(f"{n:18s} {r['tok_s']:6.1f} tok/s  same as plain {r['same_as_plain']}/{len(prompts)}")
json.dump({"results": res, "outputs": outs["plain"], "max_tokens": N, "threads": 2}, open(out_path, "w"))
