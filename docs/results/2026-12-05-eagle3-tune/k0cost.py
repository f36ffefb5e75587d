"""In-process: what a schedule's K=0 iterations cost an EAGLE-3 chain engine, against plain requests.
C=8 closed loop, 16 HumanEval prompts x 64 tokens; arms interleaved, 3 rounds."""
import sys, time, statistics
from concurrent.futures import ThreadPoolExecutor
from specbuild.runtime import ReferenceEngine
from specbuild.engine.scheduler import Scheduler
from specbuild.engine.types import GenerationRequest
from specbuild.tokenizer import load_tokenizer
from specbuild.prompts import load_prompts, apply_chat_template

root = "/work/out/e3t/deploy-lazy"
tok = load_tokenizer(f"{root}/smollm2-eagle3-chain/engine/tokenizer")
prompts = [tok(p.text)["input_ids"] for p in load_prompts("humaneval:16")]

def run(scheduler, draft, conc=8, n=16):
    def one(ids):
        return len(scheduler.generate(GenerationRequest(ids, 64, end_id=-1, num_draft_tokens=draft)).output_ids)
    t = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        tokens = sum(pool.map(one, prompts[:n]))
    return tokens / (time.perf_counter() - t)

base = ReferenceEngine.from_engine_dir(f"{root}/smollm2-eagle3-chain/engine")
sched = ReferenceEngine.from_engine_dir(f"{root}/smollm2-eagle3-chain-scheduled/engine")
res = {"plain (num_draft_tokens 0)": [], "schedule K=0 at batch 8": []}
with Scheduler(base) as sb, Scheduler(sched) as ss:
    run(sb, 0, n=2); run(ss, None, n=2)
    for r in range(3):
        res["plain (num_draft_tokens 0)"].append(run(sb, 0))
        res["schedule K=0 at batch 8"].append(run(ss, None))
for k, v in res.items():
    print(f"{k:30s} {statistics.mean(v):6.1f} tok/s  {[round(x,1) for x in v]}")
print("ratio", statistics.mean(a / b for a, b in zip(res["schedule K=0 at batch 8"], res["plain (num_draft_tokens 0)"])))
