"""The engine's own float32 GEMM for decoding passes: row-invariant, at the speed of streaming the weights.

A decoding step multiplies a few rows (one per request, or ``k + 1`` per verifying request) by every
weight of the model, so it is bound by memory bandwidth, not arithmetic. For the engine's guarantee that
a request's tokens do not depend on the batch it shares, a row must also get the same bits whatever the
number of rows beside it. BLAS does not give that (MKL runs a GEMV at one row and blocked GEMMs at
more), and oneDNN's prepacked kernels do but stream the weights more slowly: on a 2-core Xeon (AVX-512)
all of SmolLM2-135M's linears took 24.6 ms for one row with oneDNN against 17.2 ms with this kernel,
and 29.8 against 23.1 ms for 8 rows (``docs/results/2026-12-03-rowgemm.md``). Draft-side layers may
hold their packed weights as bfloat16 (:func:`pack_weight`), half the bytes to stream, widened exactly to
float32 in the kernel (``docs/results/2026-12-04-draft-weights.md``). The same library has an
RMSNorm kernel (:func:`rms_norm`), an attention kernel (:func:`attention`) and SwiGLU's gate
(:func:`silu_mul`) for the engine's layer loop.

``csrc/rowgemm.c`` sums every output element in one order that depends on ``K`` only (see its header).
It is compiled once per CPU with the host's C compiler (:mod:`~specbuild.engine.native`: ``$CC`` where set,
else ``cc`` or ``gcc``; ``-O3 -march=native -fopenmp``) into ``<specbuild cache>/kernels/`` and loaded with
:mod:`ctypes`, each function's prototype declared once (:data:`~specbuild.engine.native.SIGNATURES`). It is linked to the
OpenMP runtime torch loaded (the same file, hence the same library in the process), so a pass runs on
the calling thread's OpenMP team with torch's thread count: a second runtime would keep a second
spinning pool on the same cores.
Where no compiler works, :func:`library` returns None and the engine uses oneDNN
(:mod:`specbuild.engine.kernels`); greedy equality then holds only up to logit near-ties, which the build
output, the engine's ``config.json`` and verify's ``report.json`` say (:class:`~specbuild.engine.native.KernelChoice`).
"""

from __future__ import annotations

import ctypes
import threading

import torch
from torch import nn

from . import native
from .kv_pool import KVAddressing

_lock = threading.Lock()
_state: dict[str, object] = {}


def library() -> ctypes.CDLL | None:
    """The compiled kernels (built on first use, then cached on disk and in the process; prototypes from
    :data:`~specbuild.engine.native.SIGNATURES`), or None where they cannot be built or loaded here
    (:func:`unavailable_reason` says why)."""
    with _lock:
        if "lib" not in _state:
            try:
                _state["lib"], _state["reason"] = native.load_library(native.build_library(native.openmp_runtime())), None
            except native.KernelBuildError as exc:
                _state["lib"], _state["reason"] = None, str(exc)
        return _state["lib"]  # type: ignore[return-value]


def unavailable_reason() -> str | None:
    """Why :func:`library` returned None (None when it loaded)."""
    library()
    return _state.get("reason")  # type: ignore[return-value]


def pack_weight(weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[N, K]`` -> the kernel's layout ``[ceil(N / 16), K, 16]`` (column blocks of 16, zero-padded past ``N``).

    ``dtype`` is what the packed copy holds: ``torch.float32``, or ``torch.bfloat16`` (rounded to nearest
    even) for half the bytes to stream, which the kernel widens back to float32 exactly before each
    multiply-add (:data:`WEIGHT_DTYPES`). Raises: ValueError for another dtype.
    """
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"rowgemm packs weights as one of {[str(d) for d in WEIGHT_DTYPES]}, not {dtype}")
    n, k = weight.shape
    blocks = -(-n // 16)
    padded = torch.nn.functional.pad(weight.detach().float(), (0, 0, 0, blocks * 16 - n))
    return padded.view(blocks, 16, k).transpose(1, 2).to(dtype).contiguous()


WEIGHT_DTYPES = (torch.float32, torch.bfloat16)
"""What a packed weight may hold. Activations, sums and outputs are float32 either way."""


def rowgemm(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b`` with each row's bits independent of the other rows (float32, CPU).

    Args:
        x: ``[..., K]`` float32 (made contiguous if it is not).
        packed: ``W [N, K]`` in the kernel's layout (:func:`pack_weight`), ``[ceil(N / 16), K, 16]`` float32
            or bfloat16, or a slice of such a tensor along its first dimension (a fused layer's part).
        out_features: ``N`` (at most ``16 * packed.shape[0]``).
        bias: ``[N]`` float32 or None.

    Returns:
        ``[..., N]`` float32.

    Raises:
        RuntimeError: the kernel is not available here (:func:`unavailable_reason`).
        ValueError: wrong dtype, device, shape or layout.
    """
    lib = _kernel_library()
    _check_packed(packed, out_features, bias)
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[-1] != packed.shape[1]:
        raise ValueError(f"rowgemm takes float32 CPU inputs x [..., K] for a packed weight {tuple(packed.shape)}, "
                         f"got {x.dtype} {tuple(x.shape)} on {x.device}")
    x = x.contiguous()
    if x.shape[-1] == 0:
        out = torch.zeros((*x.shape[:-1], out_features), dtype=torch.float32)
        return out if bias is None else out + bias
    out = torch.empty((*x.shape[:-1], out_features), dtype=torch.float32)
    rows = x.numel() // x.shape[-1]
    if rows:
        _gemm_kernel(lib, packed.dtype)(
            x.data_ptr(), packed.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(),
            rows, out_features, packed.shape[1], torch.get_num_threads(), 0,
        )
    return out


def _kernel_library() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError(f"the engine's CPU kernels are not available: {unavailable_reason()}")
    return lib


def _gemm_kernel(lib: ctypes.CDLL, dtype: torch.dtype):
    """The library's GEMM for packed weights of ``dtype`` (one of :data:`WEIGHT_DTYPES`)."""
    return lib.specbuild_rowgemm_f32 if dtype == torch.float32 else lib.specbuild_rowgemm_bf16w


def _check_packed(packed: torch.Tensor, out_features: int, bias: torch.Tensor | None) -> None:
    """Raises: ValueError unless ``packed`` is :func:`pack_weight`'s layout for ``out_features`` columns
    (float32 64-byte aligned or bfloat16 32-byte aligned, contiguous) and ``bias`` is None or a contiguous
    float32 ``[out_features]``."""
    if packed.dim() != 3 or packed.shape[2] != 16 or packed.dtype not in WEIGHT_DTYPES or not packed.is_contiguous() \
            or not 16 * (packed.shape[0] - 1) < out_features <= 16 * packed.shape[0]:
        raise ValueError(f"rowgemm needs a packed weight [ceil(N / 16), K, 16] (float32 or bfloat16) for N = {out_features}, "
                         f"got {packed.dtype} {tuple(packed.shape)}")
    align = 64 if packed.dtype == torch.float32 else 32
    if packed.device.type != "cpu" or (bias is not None and bias.device.type != "cpu"):
        raise ValueError(f"rowgemm runs on the CPU: the packed weight is on {packed.device}"
                         + ("" if bias is None else f" and the bias on {bias.device}"))
    if packed.data_ptr() % align:
        raise ValueError(f"rowgemm's packed {packed.dtype} weight must start on a {align}-byte boundary (pack_weight's output, "
                         "or a slice of it by whole column blocks)")
    if bias is not None and (bias.shape != (out_features,) or bias.dtype != torch.float32 or not bias.is_contiguous()):
        raise ValueError(f"rowgemm's bias must be a contiguous float32 [{out_features}], got {tuple(bias.shape)}")


class RowLinear(nn.Module):
    """``y = x W^T + b`` through :func:`rowgemm`: a row's bits never depend on the rows beside it.

    Holds ``W`` packed (:func:`pack_weight`); the original weight is released unless ``keep_weight``
    (a tied lm_head, whose ``weight`` draft heads read). Call with ``x [..., in_features]`` float32;
    returns ``[..., out_features]``. The packed weight and bias are checked once, here, so a call only
    allocates the output and runs the kernel.

    Raises:
        RuntimeError: the kernel is not available here. ValueError: a packed weight or bias :func:`rowgemm` refuses.
    """

    def __init__(self, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None,
                 weight: torch.Tensor | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = packed.shape[1], out_features
        self.packed = packed
        self.bias = None if bias is None else bias.detach().float().contiguous()
        if weight is not None:
            self.weight = weight
        _check_packed(packed, out_features, self.bias)
        self._kernel = _gemm_kernel(_kernel_library(), packed.dtype)
        self._bias_ptr = None if self.bias is None else self.bias.data_ptr()

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, keep_weight: bool = False, dtype: torch.dtype = torch.float32) -> RowLinear:
        """``linear`` packed as ``dtype`` (:func:`pack_weight`)."""
        return cls(pack_weight(linear.weight, dtype), linear.out_features, linear.bias, linear.weight if keep_weight else None)

    def forward(self, x: torch.Tensor, accumulate_into: torch.Tensor | None = None) -> torch.Tensor:
        """``x W^T + b``; with ``accumulate_into`` (a residual stream, ``[..., out_features]`` float32
        contiguous) adds it there in place, rounded as ``residual + linear(x)``, and returns that tensor.

        Raises:
            ValueError: ``accumulate_into`` of another shape, dtype or layout (and what :func:`rowgemm` refuses).
        """
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[-1] != self.in_features:
            return rowgemm(x, self.packed, self.out_features, self.bias)  # raises with what is wrong
        x = x.contiguous()
        shape = (*x.shape[:-1], self.out_features)
        if accumulate_into is None:
            out = torch.empty(shape, dtype=torch.float32)
        else:
            out = accumulate_into
            if tuple(out.shape) != shape or out.dtype != torch.float32 or out.device.type != "cpu" or not out.is_contiguous():
                raise ValueError(f"accumulate_into must be a contiguous float32 CPU tensor {list(shape)}, got "
                                 f"{out.dtype} {tuple(out.shape)} on {out.device}")
        rows = out.numel() // self.out_features if self.out_features else 0
        if rows and self.in_features:
            self._kernel(x.data_ptr(), self.packed.data_ptr(), self._bias_ptr, out.data_ptr(),
                         rows, self.out_features, self.in_features, torch.get_num_threads(), accumulate_into is not None)
        elif rows:
            add = torch.zeros(shape) if self.bias is None else self.bias.expand(shape)
            out.copy_(add) if accumulate_into is None else out.add_(add)
        return out

    def extra_repr(self) -> str:
        weights = "" if self.packed.dtype == torch.float32 else ", bfloat16 weights"
        return f"in_features={self.in_features}, out_features={self.out_features}, rowgemm{weights}"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm (Zhang and Sennrich 2019) as transformers' ``LlamaRMSNorm`` computes it in float32:
    ``weight * (x * rsqrt(mean(x^2, -1) + eps))``, one kernel call; each row's bits depend on that row only.

    Args:
        x: ``[..., H]`` float32 CPU. weight: ``[H]`` float32.

    Raises:
        RuntimeError: the kernel is not available here. ValueError: wrong dtype, device or shape.
    """
    lib = _kernel_library()
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu" or weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm takes float32 CPU x [..., H] and weight [H]; got x {x.dtype} {tuple(x.shape)}, weight {weight.dtype} {tuple(weight.shape)}")
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        lib.specbuild_rmsnorm_f32(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], float(eps))
    return out


def fuse_linears(linears: list[nn.Linear], dtype: torch.dtype = torch.float32) -> tuple[RowLinear, list[RowLinear]] | None:
    """One :class:`RowLinear` over the concatenated outputs of ``linears`` (same input), and one per layer
    viewing its part of the fused weight (no copy): a pass calls the fused layer once instead of each.
    ``dtype``: what the packed weight holds (:func:`pack_weight`).

    Returns None unless every layer has ``out_features`` a multiple of 16 (the kernel's column blocks),
    the same ``in_features`` and a bias if any has one.
    """
    if any(lin.out_features % 16 for lin in linears) or len({lin.in_features for lin in linears}) != 1:
        return None
    if len({lin.bias is None for lin in linears}) != 1:
        return None
    packed = pack_weight(torch.cat([lin.weight.detach() for lin in linears]), dtype)
    bias = None if linears[0].bias is None else torch.cat([lin.bias.detach() for lin in linears])
    fused = RowLinear(packed, packed.shape[0] * 16, bias)
    parts, block = [], 0
    for lin in linears:
        blocks = lin.out_features // 16
        parts.append(RowLinear(packed[block : block + blocks], lin.out_features, None if bias is None else bias[block * 16 : (block + blocks) * 16]))
        block += blocks
    return fused, parts


ATTENTION_GROUP = 4  # csrc/rowgemm.c MAX_GROUP: query heads that share one kv head's loads


def attention_supported(head_dim: int) -> bool:
    """:func:`attention` handles this head size (a multiple of 16, at most 256)."""
    return head_dim % 16 == 0 and 16 <= head_dim <= 256


class AttentionRows:
    """The rows of one pass, checked once and laid out for :func:`attention` in every layer: each row's slot,
    cached length, block size and in-block visibility, the pool's shape, and per-thread scratch.

    Args:
        slots, lengths, sizes: per row; distinct slots of the pool, ``lengths[b] + sizes[b] <= capacity``.
        allowed: per row ``[T_b, T_b]`` bool (block token ``i`` may see ``j``) or None (causal).
        cache_shape: the pool's geometry ``(num_slots, H_kv, capacity, D)``, or its
            :class:`~specbuild.engine.kv_pool.KVAddressing` (geometry and strides; a shape means the
            contiguous ``[num_slots, H_kv, capacity, D]`` layout).
        num_heads: ``H_q``, a multiple of ``H_kv``.

    Raises:
        ValueError: a slot outside the pool, an empty row or one past ``capacity``, an ``allowed`` of the
            wrong shape, or heads the kernel does not take (:func:`attention_supported`).
    """

    def __init__(self, slots, lengths, sizes, allowed, cache_shape, num_heads: int) -> None:
        if isinstance(cache_shape, KVAddressing):
            geo = cache_shape
            num_slots, kv_heads, capacity, head_dim = geo.num_slots, geo.num_kv_heads, geo.capacity, geo.head_dim
            strides = (geo.slot_stride, geo.head_stride, geo.pos_stride)
        else:
            num_slots, kv_heads, capacity, head_dim = cache_shape
            strides = (kv_heads * capacity * head_dim, capacity * head_dim, head_dim)
        if not attention_supported(head_dim) or num_heads % kv_heads:
            raise ValueError(f"attention takes head sizes that are multiples of 16 up to 256 and H_q a multiple of H_kv; "
                             f"got D = {head_dim}, H_q = {num_heads}, H_kv = {kv_heads}")
        if any(not 0 <= slot < num_slots for slot in slots) or len(set(slots)) != len(slots):
            raise ValueError(f"attention rows need distinct slots of the pool's {num_slots}, got {list(slots)}")
        if any(size < 1 for size in sizes) or any(length + size > capacity for length, size in zip(lengths, sizes)):
            raise ValueError(f"attention rows must hold 1 .. capacity - length tokens (capacity {capacity}): "
                             f"lengths {list(lengths)}, sizes {list(sizes)}")
        starts, at = [], 0
        for size in sizes:
            starts.append(at)
            at += size
        offsets, masks, used = [], [], 0
        for size, allow in zip(sizes, allowed):
            if allow is None:
                offsets.append(-1)
                continue
            if tuple(allow.shape) != (size, size):
                raise ValueError(f"a row's allowed mask must be [{size}, {size}], got {tuple(allow.shape)}")
            offsets.append(used)
            masks.append(allow.to(torch.uint8).reshape(-1))
            used += size * size
        self.tokens, self.rows = at, len(sizes)
        self.cache_shape, self.cache_strides = (num_slots, kv_heads, capacity, head_dim), (*strides, 1)
        self.num_heads, self.kv_heads, self.head_dim, self.capacity = num_heads, kv_heads, head_dim, capacity
        self.width = (num_heads + 2 * kv_heads) * head_dim
        meta = torch.tensor([list(slots), list(lengths), starts, list(sizes), offsets], dtype=torch.long)
        mask = torch.cat(masks) if masks else torch.zeros(1, dtype=torch.uint8)
        threads = max(1, torch.get_num_threads())
        room = -(-capacity // 16) * 16 + 16  # a query sees at most capacity positions; padded to 16 lanes
        self._keep = (meta, mask, scratch := torch.empty(threads * room * ATTENTION_GROUP, dtype=torch.float32),
                      scratch_idx := torch.empty(threads * room, dtype=torch.long))
        self._args = (*strides, at, num_heads, kv_heads, head_dim, capacity,
                      len(sizes), *(meta[i].data_ptr() for i in range(4)), mask.data_ptr(), meta[4].data_ptr())
        self._tail = (scratch.data_ptr(), scratch_idx.data_ptr(), room, threads)


def attention(rows: AttentionRows, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache_k: torch.Tensor,
              cache_v: torch.Tensor, scale: float) -> torch.Tensor:
    """One layer's attention for the ragged rows of a pass (Vaswani et al. 2017, sec. 3.2.1, with rotary position
    embeddings, Su et al. 2021, and grouped-query heads, Ainslie et al. 2023), in one kernel call: rotary
    embedding of q and k (transformers' Llama arithmetic, ``x cos + rotate_half(x) sin``), k and v written into
    each row's slot after its cached positions, then each query over its slot's cached positions and the block
    tokens it may see.

    A query's output is computed whole by one thread in one fixed order over its visible positions, so its
    bits depend on its own visible keys and values only: a token gets the same bits as a one-token step, in
    a ``k + 1`` chain, in a tree, alone or in any batch, with any thread count.

    Args:
        rows: the pass's rows (:class:`AttentionRows`).
        qkv: ``[N, (H_q + 2 H_kv) D]`` float32 contiguous, the fused q/k/v projection (rotary embedding is
            applied in place).
        cos, sin: ``[N, D]`` float32 contiguous, each token's rotary table.
        cache_k, cache_v: the layer's pool buffers (:meth:`~specbuild.engine.kv_pool.KVCache.layer_buffers`),
            float32, indexed ``[num_slots, H_kv, capacity, D]`` with the strides ``rows`` was made with (any
            strided layout, ``D`` contiguous).
        scale: the softmax scale (``D ** -0.5`` for Llama).

    Returns:
        ``[N, H_q D]`` float32.

    Raises:
        RuntimeError: the kernel is not available here. ValueError: shapes, dtypes or layouts it cannot take.
    """
    lib = _kernel_library()
    tensors = (qkv, cos, sin, cache_k, cache_v)
    caches = (cache_k, cache_v)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors) \
            or any(not t.is_contiguous() for t in (qkv, cos, sin)) \
            or any(tuple(c.shape) != rows.cache_shape or tuple(c.stride()) != rows.cache_strides for c in caches) \
            or qkv.shape != (rows.tokens, rows.width) or cos.shape != (rows.tokens, rows.head_dim) or sin.shape != cos.shape:
        raise ValueError(
            f"attention takes contiguous float32 CPU qkv [N, (H_q + 2 H_kv) D] = [{rows.tokens}, {rows.width}], "
            f"cos/sin [N, D] = [{rows.tokens}, {rows.head_dim}] and caches {list(rows.cache_shape)} with strides "
            f"{list(rows.cache_strides)}; got qkv "
            f"{tuple(qkv.shape)} {qkv.dtype}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}, caches {tuple(cache_k.shape)} "
            f"{tuple(cache_v.shape)} {cache_k.dtype}"
        )
    out = torch.empty(rows.tokens, rows.num_heads * rows.head_dim, dtype=torch.float32)
    lib.specbuild_attention_f32(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), cache_k.data_ptr(), cache_v.data_ptr(),
                                *rows._args, float(scale), out.data_ptr(), *rows._tail)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gate (Shazeer 2020), as transformers' ``LlamaMLP`` with SiLU: ``silu(g) * u`` for each row of
    the fused gate/up projection ``gate_up = (g | u)``, one kernel call.

    Args:
        gate_up: ``[..., 2 I]`` float32 CPU, ``I`` a multiple of 16.

    Returns:
        ``[..., I]`` float32.

    Raises:
        RuntimeError: the kernel is not available here. ValueError: wrong dtype, device or width.
    """
    lib = _kernel_library()
    if gate_up.dtype != torch.float32 or gate_up.device.type != "cpu" or gate_up.shape[-1] % 32:
        raise ValueError(f"silu_mul takes float32 CPU [..., 2 I] with I a multiple of 16, got {gate_up.dtype} {tuple(gate_up.shape)} on {gate_up.device}")
    gate_up = gate_up.contiguous()
    inner = gate_up.shape[-1] // 2
    out = torch.empty((*gate_up.shape[:-1], inner), dtype=torch.float32)
    if out.numel():
        lib.specbuild_silu_mul_f32(gate_up.data_ptr(), out.data_ptr(), out.numel() // inner, inner, torch.get_num_threads())
    return out
