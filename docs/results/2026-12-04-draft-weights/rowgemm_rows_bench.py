import torch, time, statistics
from specbuild.engine import rowgemm
torch.manual_seed(0)
lin = torch.nn.Linear(576, 3072, bias=False)
f = rowgemm.RowLinear.from_linear(lin); b = rowgemm.RowLinear.from_linear(lin, dtype=torch.bfloat16)
for rows in (1, 8, 256):
    x = torch.randn(rows, 576); r = {}
    for name, l in (("f32", f), ("bf16", b)):
        for _ in range(5): l(x)
        ts = []
        for _ in range(50):
            t = time.perf_counter(); l(x); ts.append(time.perf_counter() - t)
        r[name] = statistics.median(ts) * 1e3
    print(rows, {k: round(v, 3) for k, v in r.items()})
