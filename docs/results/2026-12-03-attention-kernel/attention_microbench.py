import torch, time, statistics, sys
from specbuild.engine import rowgemm
lib = rowgemm.library()
Hq, Hkv, D = 9, 3, 64
for L in (256, 1024):
  C = L + 16
  ck = torch.randn(1, Hkv, C, D); cv = torch.randn(1, Hkv, C, D)
  for T in (1, 8):
    rows = rowgemm.AttentionRows([0], [L], [T], [None], tuple(ck.shape), Hq)
    qkv = torch.randn(T, (Hq + 2*Hkv)*D); ang = torch.rand(T, D//2).repeat(1, 2); cos = ang.cos().contiguous(); sin = ang.sin().contiguous()
    out = torch.empty(T, Hq*D)
    f = lib.specbuild_attention_f32
    args = (qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), ck.data_ptr(), cv.data_ptr(), *rows._args, 0.125, out.data_ptr(), *rows._tail)
    ts = []
    for r in range(1000):
        t = time.perf_counter(); f(*args); ts.append(time.perf_counter() - t)
    m = statistics.median(ts)
    print(L, T, f"{m*1e6:.1f} us  {m*2.6e9/(T*Hq*(L+T)):.1f} cycles per head-key (x threads {rows._tail[-1]})")
