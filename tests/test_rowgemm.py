"""The engine's own float32 GEMM (engine/rowgemm.py, engine/csrc/rowgemm.c): a row gets the same bits
whatever the rows beside it, the thread count or the layer fusion, and a machine without a compiler
falls back to oneDNN instead of failing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from specbuild.engine import rowgemm
from specbuild.engine import target as target_model
from specbuild.engine.kernels import FUSED_GATE_UP, FUSED_QKV, pack_linears

needs_kernel = pytest.mark.skipif(rowgemm.library() is None, reason=f"rowgemm not built here: {rowgemm.unavailable_reason()}")


@needs_kernel
@pytest.mark.parametrize("shape", [(64, 96), (96, 1000), (77, 50), (16, 16), (1, 3)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_row_has_the_same_bits_whatever_the_rows_beside_it_and_the_threads(shape, bias, dtype):
    """float32 weights, or bfloat16 ones (draft-side layers), which the kernel widens exactly: the result is
    the float32 product with the rounded weight."""
    torch.manual_seed(0)
    linear = nn.Linear(*shape, bias=bias)
    layer = rowgemm.RowLinear.from_linear(linear, dtype=dtype)
    assert layer.packed.dtype == dtype
    x = torch.randn(40, shape[0])
    threads = torch.get_num_threads()
    with torch.inference_mode():
        full = layer(x)
        rounded = linear.weight.to(dtype).double()  # what the packed copy holds, summed exactly
        expected = x.double() @ rounded.T + (0 if linear.bias is None else linear.bias.double())
        torch.testing.assert_close(full, expected.float(), rtol=1e-4, atol=1e-4)
        for rows in range(1, 41):  # every tile shape: 1..6 rows, 7/8 rows, several tiles
            assert torch.equal(layer(x[:rows]), full[:rows]), rows
            assert torch.equal(layer(x[rows - 1 : rows]), full[rows - 1 : rows]), rows  # alone, at index 0
        assert torch.equal(layer(x.view(5, 8, -1)), full.view(5, 8, -1))  # a 3D batch
        try:
            for n in (1, 3):
                torch.set_num_threads(n)
                assert torch.equal(layer(x), full), n
        finally:
            torch.set_num_threads(threads)


@needs_kernel
def test_fused_layers_equal_their_parts_and_share_their_weight():
    torch.manual_seed(0)
    linears = [nn.Linear(48, 64), nn.Linear(48, 32), nn.Linear(48, 32)]
    fused, parts = rowgemm.fuse_linears(linears)
    x = torch.randn(7, 48)
    with torch.inference_mode():
        out = fused(x)
        assert out.shape == (7, 128)
        at = 0
        for linear, part in zip(linears, parts):
            assert torch.equal(part(x), out[:, at : at + linear.out_features])
            torch.testing.assert_close(part(x), linear(x), rtol=1e-4, atol=1e-4)
            at += linear.out_features
    assert all(part.packed.untyped_storage().data_ptr() == fused.packed.untyped_storage().data_ptr() for part in parts)
    assert rowgemm.fuse_linears([nn.Linear(48, 64), nn.Linear(48, 24)]) is None  # 24: not whole column blocks
    assert rowgemm.fuse_linears([nn.Linear(48, 64), nn.Linear(32, 64)]) is None  # different inputs


@needs_kernel
def test_bad_inputs_are_refused_with_what_is_wrong():
    packed = rowgemm.pack_weight(torch.randn(32, 8))
    with pytest.raises(ValueError, match="float32 CPU inputs"):
        rowgemm.rowgemm(torch.randn(2, 8, dtype=torch.float64), packed, 32)
    with pytest.raises(ValueError, match=r"inputs x \[..., K\]"):
        rowgemm.rowgemm(torch.randn(2, 9), packed, 32)
    with pytest.raises(ValueError, match=r"inputs x \[..., K\]"):
        rowgemm.RowLinear(packed, 32)(torch.randn(2, 9))  # the layer's fast path refuses it too
    with pytest.raises(ValueError, match="packed weight"):
        rowgemm.rowgemm(torch.randn(2, 8), packed, 40)  # more columns than the packed blocks hold
    with pytest.raises(ValueError, match="bias must be"):
        rowgemm.rowgemm(torch.randn(2, 8), packed, 32, torch.randn(31))
    with pytest.raises(ValueError, match="64-byte boundary"):
        rowgemm.rowgemm(torch.randn(2, 8), torch.zeros(3 * 8 * 16 + 1)[1:].view(3, 8, 16), 40)
    assert rowgemm.rowgemm(torch.randn(0, 8), packed, 32).shape == (0, 32)
    assert rowgemm.rowgemm(torch.randn(3, 8), rowgemm.pack_weight(torch.randn(0, 8)), 0).shape == (3, 0)


@needs_kernel
def test_bfloat16_weights_halve_the_bytes_and_are_refused_where_they_do_not_fit():
    torch.manual_seed(0)
    weight = torch.randn(40, 24)
    packed = rowgemm.pack_weight(weight, torch.bfloat16)
    assert packed.dtype == torch.bfloat16 and packed.shape == (3, 24, 16)
    assert packed.untyped_storage().nbytes() == rowgemm.pack_weight(weight).untyped_storage().nbytes() // 2
    # the packed copy is the weight rounded to nearest even, column block by column block
    assert torch.equal(packed.transpose(1, 2).reshape(48, 24)[:40], weight.to(torch.bfloat16))
    with pytest.raises(ValueError, match="rowgemm packs weights as one of"):
        rowgemm.pack_weight(weight, torch.float16)
    with pytest.raises(ValueError, match="32-byte boundary"):  # a bfloat16 vector load needs 32-byte alignment
        rowgemm.rowgemm(torch.randn(2, 8), torch.zeros(2 * 8 * 16 + 8, dtype=torch.bfloat16)[8:].view(2, 8, 16), 32)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        rowgemm.RowLinear(packed.half(), 40)
    for k in (48, 77):  # K = 77: a part's start moves by 77 * 32 bytes, 32-byte but not 64-byte aligned
        linears = [nn.Linear(k, 16), nn.Linear(k, 48), nn.Linear(k, 32)]
        fused, parts = rowgemm.fuse_linears(linears, torch.bfloat16)
        assert [part.packed.data_ptr() % 64 for part in parts] == ([0, 0, 0] if k == 48 else [0, 32, 0])
        x = torch.randn(9, k)
        with torch.inference_mode():
            assert torch.equal(torch.cat([part(x) for part in parts], -1), fused(x))
            for linear, part in zip(linears, parts):
                assert torch.equal(part(x), rowgemm.RowLinear.from_linear(linear, dtype=torch.bfloat16)(x))
    with pytest.raises(ValueError, match="rowgemm runs on the CPU: the packed weight is on meta"):
        rowgemm.rowgemm(torch.randn(2, 8), torch.empty(1, 8, 16, device="meta", dtype=torch.bfloat16), 16)
    with pytest.raises(ValueError, match="and the bias on meta"):
        rowgemm.rowgemm(torch.randn(2, 8), torch.zeros(1, 8, 16, dtype=torch.bfloat16), 16, torch.zeros(16, device="meta"))
    model = nn.Sequential(nn.Linear(8, 16))
    with pytest.raises(ValueError, match="weight_dtype=torch.bfloat16 is for kernels='rowgemm' only"):
        pack_linears(model, "onednn", weight_dtype=torch.bfloat16)
    assert pack_linears(model, "rowgemm", weight_dtype=torch.bfloat16) == 1 and model[0].packed.dtype == torch.bfloat16


@needs_kernel
def test_pack_linears_swaps_every_linear_fuses_projections_and_keeps_the_model_usable(tiny_checkpoint):
    reference = target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    model = target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert pack_linears(model, "rowgemm") == linears
    assert not any(type(m) is nn.Linear for m in model.modules())
    layer = model.model.layers[0]
    assert isinstance(getattr(layer.self_attn, FUSED_QKV), rowgemm.RowLinear)
    assert isinstance(getattr(layer.mlp, FUSED_GATE_UP), rowgemm.RowLinear)
    head = model.get_output_embeddings()
    assert isinstance(head, rowgemm.RowLinear) and head.weight.shape == (head.out_features, head.in_features)
    ids = torch.tensor([[5, 17, 3, 99, 42]])
    with torch.inference_mode():  # transformers' own forward still runs on the swapped layers
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("cc", "expected"), [
    ("false", "failed to build rowgemm.c"),  # a compiler that fails
    ("/nonexistent/cc", "$CC='/nonexistent/cc' is not an executable"),  # a typo: not silently replaced by gcc
])
def test_without_a_compiler_the_engine_falls_back_to_onednn_and_builds_nothing(tmp_path, cc, expected):
    """CC names a compiler that fails or does not exist: the kernel is unavailable (with the reason),
    ``auto`` picks oneDNN or eager, and the cache holds no half-built library."""
    code = (
        "import torch; from torch import nn\n"
        "from specbuild.engine import rowgemm\n"
        "from specbuild.engine.kernels import resolve_kernels, onednn_supports\n"
        "assert rowgemm.library() is None\n"
        "print(rowgemm.unavailable_reason())\n"
        "print(resolve_kernels('auto', nn.Linear(4, 4)))\n"
    )
    env = {**os.environ, "CC": cc, "SPECBUILD_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    reason, kernels = done.stdout.strip().splitlines()[-2:]
    assert expected in reason
    assert kernels in ("onednn", "eager")
    assert "not the engine's float32 kernel" in done.stderr  # the fallback is logged with its reason
    assert expected in done.stderr
    assert not list((tmp_path / "kernels").glob("*.so")) and not list((tmp_path / "kernels").glob("*.tmp"))


@needs_kernel
def test_the_kernel_runs_on_torchs_openmp_runtime_not_a_second_one():
    """A second OpenMP runtime would keep a second spinning thread pool on the same cores."""
    rowgemm.library()
    with open("/proc/self/maps") as maps:
        runtimes = {os.path.basename(line.split()[-1]) for line in maps if "libgomp" in line or "libiomp5" in line}
    assert len(runtimes) <= 1, runtimes


@needs_kernel
@pytest.mark.parametrize("hidden", [64, 576, 77])
def test_rms_norm_is_llamas_and_per_row(hidden):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    module = LlamaRMSNorm(hidden, eps=1e-5)
    with torch.no_grad():
        module.weight.normal_()
    x = torch.randn(12, hidden) * 3
    with torch.inference_mode():
        full = rowgemm.rms_norm(x, module.weight, module.variance_epsilon)
        torch.testing.assert_close(full, module(x), rtol=1e-5, atol=1e-5)
        for rows in (1, 2, 5, 12):
            assert torch.equal(rowgemm.rms_norm(x[:rows], module.weight, 1e-5), full[:rows])
        assert torch.equal(rowgemm.rms_norm(x[7:8], module.weight, 1e-5), full[7:8])
    with pytest.raises(ValueError, match="rms_norm takes float32"):
        rowgemm.rms_norm(x.double(), module.weight, 1e-5)


@needs_kernel
@pytest.mark.parametrize("bias", [True, False])
def test_accumulating_into_a_residual_equals_adding_the_output(bias):
    """The layer loop adds o_proj's and down_proj's outputs to the residual stream inside the GEMM: the same
    bits as ``h + linear(x)``, in place."""
    torch.manual_seed(0)
    layer = rowgemm.RowLinear.from_linear(nn.Linear(40, 48, bias=bias))
    x, h = torch.randn(1, 9, 40), torch.randn(1, 9, 48)
    with torch.inference_mode():
        expected = h + layer(x)
        stream = h.clone()
        assert layer(x, accumulate_into=stream) is stream
        assert torch.equal(stream, expected)
        for bad in (torch.zeros(1, 9, 47), torch.zeros(1, 9, 48, dtype=torch.float64), torch.zeros(1, 48, 9).transpose(1, 2)):
            with pytest.raises(ValueError, match="accumulate_into must be a contiguous float32 CPU tensor"):
                layer(x, accumulate_into=bad)
