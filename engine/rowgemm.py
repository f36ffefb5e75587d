"""The engine's own float32 GEMM for decoding passes: row-invariant, at the speed of streaming the weights.

A decoding step multiplies a few rows (one per request, or ``k + 1`` per verifying request) by every
weight of the model, so it is bound by memory bandwidth, not arithmetic. For the engine's guarantee that
a request's tokens do not depend on the batch it shares, a row must also get the same bits whatever the
number of rows beside it. BLAS does not give that (MKL runs a GEMV at one row and blocked GEMMs at
more), and oneDNN's prepacked kernels do but stream the weights more slowly: on a 2-core Xeon (AVX-512)
all of SmolLM2-135M's linears took 24.6 ms for one row with oneDNN against 17.2 ms with this kernel,
and 29.8 against 23.1 ms for 8 rows (``docs/results/2026-12-03-rowgemm.md``). The same library has an
RMSNorm kernel (:func:`rms_norm`) for the engine's layer loop.

``csrc/rowgemm.c`` sums every output element in one order that depends on ``K`` only (see its header).
It is compiled once per CPU with the host's C compiler (``$CC`` where set, else ``cc`` or ``gcc``; ``-O3 -march=native
-fopenmp``) into ``<specbuild cache>/kernels/`` and loaded with :mod:`ctypes`. It is linked to the
OpenMP runtime torch loaded (the same file, hence the same library in the process), so a pass runs on
the calling thread's OpenMP team with torch's thread count: a second runtime would keep a second
spinning pool on the same cores.
Where no compiler works, :func:`library` returns None and the engine uses oneDNN
(:mod:`specbuild.engine.kernels`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
from torch import nn

SOURCE = Path(__file__).with_name("csrc") / "rowgemm.c"
_FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC")
_lock = threading.Lock()
_state: dict[str, object] = {}


def _cpu_signature() -> str:
    """The CPU's model and feature flags (``-march=native`` code runs on this CPU only)."""
    lines = []
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    lines.append(line.strip())
                if len(lines) >= 2:
                    break
    except OSError:
        pass
    return platform.machine() + "\n" + "\n".join(lines)


def _openmp_runtime() -> str | None:
    """The OpenMP runtime torch loaded into this process (GNU ``libgomp*`` or Intel ``libiomp5*``), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        name = os.path.basename(path)
        if name.startswith(("libgomp", "libiomp5")) and ".so" in name:
            return path
    return None


def _build(compiler: str, target: Path, runtime: str | None) -> None:
    """Compile :data:`SOURCE` to ``target`` atomically (a temporary file renamed into place), linked to
    ``runtime`` (the OpenMP library torch loaded, so the kernel's threads are torch's team), else to the
    compiler's own OpenMP.

    Raises:
        RuntimeError: the compiler failed (its stderr in the message).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    obj = tmp + ".o"
    if runtime is None:
        commands = [[compiler, *_FLAGS, str(SOURCE), "-lm", "-o", tmp]]
    else:
        commands = [[compiler, *_FLAGS, "-c", str(SOURCE), "-o", obj], [compiler, "-shared", obj, runtime, "-lm", "-o", tmp]]
    try:
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise RuntimeError(f"{compiler} failed to build {SOURCE.name}: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        for leftover in (tmp, obj):
            if os.path.exists(leftover):
                os.unlink(leftover)


def library() -> ctypes.CDLL | None:
    """The compiled kernel (built on first use, then cached on disk and in the process), or None where it
    cannot be built or loaded here (:func:`unavailable_reason` says why)."""
    with _lock:
        if "lib" in _state:
            return _state["lib"]  # type: ignore[return-value]
        lib, reason = None, None
        chosen = os.environ.get("CC")
        if chosen:  # the user's choice is kept, never silently swapped for another compiler
            compiler = shutil.which(chosen)
            missing = f"$CC={chosen!r} is not an executable on PATH (fix or unset $CC)"
        else:
            compiler = shutil.which("cc") or shutil.which("gcc")
            missing = "no C compiler (install gcc, or set $CC)"
        if compiler is None:
            reason = missing
        else:
            from filelock import FileLock

            from specbuild.cache import cache_dir

            version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
            runtime = _openmp_runtime()
            key = hashlib.sha256("\n".join(
                [SOURCE.read_text(), compiler, version, " ".join(_FLAGS), _cpu_signature(), str(runtime)]
            ).encode()).hexdigest()[:16]
            target = cache_dir() / "kernels" / f"rowgemm-{key}.so"
            try:
                with FileLock(str(target) + ".lock"):
                    if not target.exists():
                        _build(compiler, target, runtime)
                lib = ctypes.CDLL(str(target))
                fn = lib.specbuild_rowgemm_f32
                fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
                fn.restype = None
                norm = lib.specbuild_rmsnorm_f32
                norm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 2 + [ctypes.c_float]
                norm.restype = None
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                lib, reason = None, str(exc)
        _state["lib"], _state["reason"] = lib, reason
        return lib


def unavailable_reason() -> str | None:
    """Why :func:`library` returned None (None when it loaded)."""
    library()
    return _state.get("reason")  # type: ignore[return-value]


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` -> the kernel's layout ``[ceil(N / 16), K, 16]`` (column blocks of 16, zero-padded past ``N``)."""
    n, k = weight.shape
    blocks = -(-n // 16)
    padded = torch.nn.functional.pad(weight.detach().float(), (0, 0, 0, blocks * 16 - n))
    return padded.view(blocks, 16, k).transpose(1, 2).contiguous()


def rowgemm(x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b`` with each row's bits independent of the other rows (float32, CPU).

    Args:
        x: ``[..., K]`` float32 (made contiguous if it is not).
        packed: ``W [N, K]`` in the kernel's layout (:func:`pack_weight`), ``[ceil(N / 16), K, 16]``, or
            a slice of such a tensor along its first dimension (a fused layer's part).
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
        lib.specbuild_rowgemm_f32(
            x.data_ptr(), packed.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(),
            rows, out_features, packed.shape[1], torch.get_num_threads(),
        )
    return out


def _kernel_library() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError(f"the engine's CPU kernels are not available: {unavailable_reason()}")
    return lib


def _check_packed(packed: torch.Tensor, out_features: int, bias: torch.Tensor | None) -> None:
    """Raises: ValueError unless ``packed`` is :func:`pack_weight`'s layout for ``out_features`` columns
    (64-byte aligned, contiguous) and ``bias`` is None or a contiguous float32 ``[out_features]``."""
    if packed.dim() != 3 or packed.shape[2] != 16 or packed.dtype != torch.float32 or not packed.is_contiguous() \
            or not 16 * (packed.shape[0] - 1) < out_features <= 16 * packed.shape[0]:
        raise ValueError(f"rowgemm needs a packed weight [ceil(N / 16), K, 16] for N = {out_features}, got {tuple(packed.shape)}")
    if packed.data_ptr() % 64:
        raise ValueError("rowgemm's packed weight must start on a 64-byte boundary (pack_weight's output, or a slice of it by whole column blocks)")
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
        self._kernel = _kernel_library().specbuild_rowgemm_f32
        self._bias_ptr = None if self.bias is None else self.bias.data_ptr()

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, keep_weight: bool = False) -> RowLinear:
        return cls(pack_weight(linear.weight), linear.out_features, linear.bias, linear.weight if keep_weight else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[-1] != self.in_features:
            return rowgemm(x, self.packed, self.out_features, self.bias)  # raises with what is wrong
        x = x.contiguous()
        out = torch.empty((*x.shape[:-1], self.out_features), dtype=torch.float32)
        rows = out.numel() // self.out_features if self.out_features else 0
        if rows and self.in_features:
            self._kernel(x.data_ptr(), self.packed.data_ptr(), self._bias_ptr, out.data_ptr(),
                         rows, self.out_features, self.in_features, torch.get_num_threads())
        elif rows:
            out.zero_()
            if self.bias is not None:
                out += self.bias
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rowgemm"


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


def fuse_linears(linears: list[nn.Linear]) -> tuple[RowLinear, list[RowLinear]] | None:
    """One :class:`RowLinear` over the concatenated outputs of ``linears`` (same input), and one per layer
    viewing its part of the fused weight (no copy): a pass calls the fused layer once instead of each.

    Returns None unless every layer has ``out_features`` a multiple of 16 (the kernel's column blocks),
    the same ``in_features`` and a bias if any has one.
    """
    if any(lin.out_features % 16 for lin in linears) or len({lin.in_features for lin in linears}) != 1:
        return None
    if len({lin.bias is None for lin in linears}) != 1:
        return None
    packed = pack_weight(torch.cat([lin.weight.detach() for lin in linears]))
    bias = None if linears[0].bias is None else torch.cat([lin.bias.detach() for lin in linears])
    fused = RowLinear(packed, packed.shape[0] * 16, bias)
    parts, block = [], 0
    for lin in linears:
        blocks = lin.out_features // 16
        parts.append(RowLinear(packed[block : block + blocks], lin.out_features, None if bias is None else bias[block * 16 : (block + blocks) * 16]))
        block += blocks
    return fused, parts
