import torch, time, statistics
from types import SimpleNamespace
from specbuild.engine.draft_linear import DraftProjection
from specbuild.engine import rowgemm
torch.manual_seed(0)
lin = torch.nn.Linear(576, 49152, bias=False)
ids = list(range(0, 49152, 12))[:4096]
proj = DraftProjection(lin, ids)
lib = rowgemm.library
rowgemm.library = lambda: None
proj_dnn = DraftProjection(lin, ids)
rowgemm.library = lib
print(type(proj.packed).__name__, type(proj_dnn.packed).__name__)
big = torch.randn(30_000_000)  # evict caches between calls
for rows in (1, 3, 8):
    x = torch.randn(rows, 576)
    res = {"rowgemm": [], "onednn": []}
    with torch.inference_mode():
        torch.testing.assert_close(proj(x), proj_dnn(x), atol=1e-4, rtol=1e-4)
        for r in range(40):
            for name, p in (("rowgemm", proj), ("onednn", proj_dnn)):
                big.mul_(1.0)
                t = time.perf_counter(); p(x); res[name].append(time.perf_counter() - t)
    print(rows, {k: f"{statistics.median(v)*1e3:.3f} ms" for k, v in res.items()})
