"""Time the one teacher-forced target pass (features + EAGLE-3's captured layers) over the cached data."""
import sys, time, torch
from pathlib import Path
from specbuild.engine.target import load_target
from specbuild.train.data import load_distill_data, target_features
data = load_distill_data(Path(sys.argv[1]))
ckpt = sys.argv[2]
model = load_target(ckpt, dtype="float32", device="cpu", trust_remote_code=False)
seqs = [data.tokens[a:b].tolist() for a, b in map(data.span, range(data.num_sequences))]
t = time.perf_counter()
out = target_features(model, seqs, batch_size=32, layers=(1, 14, 26), log=lambda m: None)
print(f"one pass, {data.num_tokens} tokens, {len(seqs)} sequences: {time.perf_counter() - t:.1f} s")
print("max |features - cached|", float((out["features"] - data.features).abs().max()), "top1 equal", bool(torch.equal(out["top1"], data.top1)))
