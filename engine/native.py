"""The engine's C kernels, without torch: where the library comes from, its C signatures, and what it guarantees.

``csrc/rowgemm.c`` holds the float32 kernels of the engine's layer loop (GEMM, RMSNorm, attention, SwiGLU's
gate; :mod:`~specbuild.engine.rowgemm` wraps them for torch). With them, fp32 greedy speculative output
equals plain decoding bitwise: every output element is summed in one order that depends on its own row
only. Without them (no C compiler, a bfloat16 target, CUDA, ``build.kernels: onednn``) the target runs
oneDNN or eager linears and PyTorch's SDPA, whose rounding depends on how many tokens a pass holds, so the
two agree only up to logit near-ties. :class:`KernelChoice` says which of the two an engine runs; the
build writes it into the engine's ``config.json`` and verify's ``report.json``.

The library is compiled with the host's C compiler (:func:`find_compiler`: ``$CC`` where set, else ``cc``
or ``gcc``; ``-O3 -march=native -fopenmp``) into ``<specbuild cache>/kernels/rowgemm-<key>.so`` (the key
hashes the source, compiler, flags, CPU and OpenMP runtime), under a file lock so concurrent processes
(Triton's model instances, ``specbuild build`` beside a serve) compile it once, and written atomically
(:func:`~specbuild.util.atomic.write_file_atomic`), so a reader finds no library or a whole one.

:data:`SIGNATURES` declares every exported C function's ctypes prototype once; :func:`load_library`
applies it, and ``tests/test_kernel_guarantee.py`` parses the C declarations and checks them against it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from specbuild.util.atomic import write_file_atomic
from specbuild.cache import cache_dir

SOURCE = Path(__file__).with_name("csrc") / "rowgemm.c"
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC")
FIX = "install a C compiler with OpenMP (e.g. `apt-get install gcc`) or set $CC to one"

_PTR, _LONG, _INT, _FLOAT = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
SIGNATURES: dict[str, tuple[type | None, tuple[type, ...]]] = {
    # name: (restype, argtypes), in the order of the C declarations in csrc/rowgemm.c
    # (x, wp, bias, y, M, N, K, num_threads, accumulate)
    "specbuild_rowgemm_f32": (None, (_PTR,) * 4 + (_LONG,) * 3 + (_INT,) * 2),
    "specbuild_rowgemm_bf16w": (None, (_PTR,) * 4 + (_LONG,) * 3 + (_INT,) * 2),
    # (x, w, y, M, H, eps)
    "specbuild_rmsnorm_f32": (None, (_PTR,) * 3 + (_LONG,) * 2 + (_FLOAT,)),
    # (qkv, cos, sin, cache_k, cache_v, slot_stride, head_stride, pos_stride, N, Hq, Hkv, D, capacity, B, slot,
    #  length, start, size, allowed, allowed_off, scale, out, scratch, scratch_idx, room, num_threads): the KV pool
    #  enters as its buffers, its strides (KVPool.addressing) and the rows' slot and position tables
    "specbuild_attention_f32": (None, (_PTR,) * 5 + (_LONG,) * 9 + (_PTR,) * 6 + (_FLOAT,) + (_PTR,) * 3 + (_LONG, _INT)),
    # (gate_up, y, M, I, num_threads)
    "specbuild_silu_mul_f32": (None, (_PTR,) * 2 + (_LONG,) * 2 + (_INT,)),
}
"""Every function ``csrc/rowgemm.c`` exports, as ctypes ``(restype, argtypes)``: the one declaration of the
Python side of each call (pointers are ``c_void_p``, given ``tensor.data_ptr()``)."""


class KernelBuildError(RuntimeError):
    """The engine's C kernels cannot be built or loaded here; the message names the compiler and the fix."""


def find_compiler() -> str:
    """The C compiler to build with: ``$CC`` where set (resolved on ``PATH``; never silently swapped for
    another), else ``cc``, else ``gcc``. Milliseconds, no torch.

    Raises:
        KernelBuildError: ``$CC`` names no executable, or there is no ``cc``/``gcc`` on ``PATH``.
    """
    chosen = os.environ.get("CC")
    if chosen:
        compiler = shutil.which(chosen)
        if compiler is None:
            raise KernelBuildError(f"$CC={chosen!r} is not an executable on PATH: fix or unset $CC, or {FIX}")
        return compiler
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise KernelBuildError(f"no C compiler (neither cc nor gcc on PATH, $CC unset): {FIX}")
    return compiler


def build_library(openmp_runtime: str | None) -> Path:
    """The compiled library for this CPU and compiler: found in the cache, else compiled there now
    (about a second).

    Args:
        openmp_runtime: the OpenMP library torch loaded into this process (linked in, so the kernels run on
            torch's thread team; :func:`openmp_runtime`), or None to link the compiler's own.

    Raises:
        KernelBuildError: no compiler (:func:`find_compiler`), it failed (its stderr in the message), or the
            cache folder is not writable.
    """
    compiler = find_compiler()
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelBuildError(f"{compiler} --version failed ({exc}): {FIX}") from None
    key = hashlib.sha256("\n".join(
        [SOURCE.read_text(), compiler, version, " ".join(FLAGS), _cpu_signature(), str(openmp_runtime)]
    ).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"rowgemm-{key}.so"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock"):
            if not target.exists():
                write_file_atomic(target, _compile(compiler, openmp_runtime))
    except OSError as exc:
        raise KernelBuildError(f"cannot write the kernel cache {target.parent} ({exc}); set $SPECBUILD_CACHE to a "
                               "writable folder") from None
    return target


def load_library(path: Path) -> ctypes.CDLL:
    """``path`` loaded, with every function's prototype set from :data:`SIGNATURES`.

    Raises:
        KernelBuildError: the library does not load or lacks a declared function (a stale or foreign file).
    """
    try:
        lib = ctypes.CDLL(str(path))
        for name, (restype, argtypes) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, list(argtypes)
    except (OSError, AttributeError) as exc:
        raise KernelBuildError(f"{path} does not load as the engine's kernels ({exc}); delete it to rebuild") from None
    return lib


def openmp_runtime() -> str | None:
    """The OpenMP runtime loaded into this process (GNU ``libgomp*`` or Intel ``libiomp5*``; torch's, once
    torch is imported), or None."""
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


def _compile(compiler: str, runtime: str | None) -> bytes:
    """:data:`SOURCE` compiled and linked (to ``runtime`` where given) in a scratch directory; the library's bytes.

    Raises:
        KernelBuildError: a compiler step failed or timed out.
    """
    with tempfile.TemporaryDirectory(prefix="specbuild-kernels-") as scratch:
        obj, lib = os.path.join(scratch, "rowgemm.o"), os.path.join(scratch, "rowgemm.so")
        if runtime is None:
            commands = [[compiler, *FLAGS, str(SOURCE), "-lm", "-o", lib]]
        else:
            commands = [[compiler, *FLAGS, "-c", str(SOURCE), "-o", obj], [compiler, "-shared", obj, runtime, "-lm", "-o", lib]]
        for command in commands:
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.SubprocessError) as exc:
                raise KernelBuildError(f"{compiler} could not build {SOURCE.name}: {exc}; {FIX}") from None
            if done.returncode != 0:
                raise KernelBuildError(f"{compiler} failed to build {SOURCE.name} (exit {done.returncode}): "
                                       f"{done.stderr.strip()[-2000:] or 'no output'}; {FIX} (GCC, or clang with libomp)")
        return Path(lib).read_bytes()


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


BITWISE = "bitwise"
NEAR_TIES = "near-ties"
ENGINE_ATTENTION = "specbuild"  # the attention kernel of csrc/rowgemm.c
LINEAR_KERNELS = ("rowgemm", "onednn", "eager")


@dataclass(frozen=True)
class KernelChoice:
    """The kernels an engine's target runs, and what greedy equality they give.

    Attributes:
        linear: the target's linear layers: ``"rowgemm"`` (csrc/rowgemm.c), ``"onednn"`` (prepacked) or
            ``"eager"`` (transformers' ``nn.Linear``; cuBLAS on CUDA).
        attention: ``"specbuild"`` (the attention kernel of csrc/rowgemm.c, each query alone in one fixed
            order) or ``"sdpa"`` (PyTorch's scaled-dot-product attention, through the engine's loop or transformers').
        fallback_reason: why the engine does not run its bitwise kernels (None when it does).

    Example: ``KernelChoice("rowgemm", "specbuild", None).greedy_equality == "bitwise"``;
    ``KernelChoice("onednn", "sdpa", "no C compiler ...").greedy_equality == "near-ties"``.
    """

    linear: str
    attention: str
    fallback_reason: str | None = None

    @property
    def greedy_equality(self) -> str:
        """``"bitwise"``: greedy speculative output equals plain decoding token for token by construction (a
        token's logits have the same bits in a one-token step, a ``k + 1`` chain or a tree, alone or batched).
        ``"near-ties"``: the logits agree to ~1e-6 relative, so the two can differ where the target's top two
        logits are that close."""
        return BITWISE if self.linear == "rowgemm" and self.attention == ENGINE_ATTENTION else NEAR_TIES

    @property
    def verify_note(self) -> str:
        """What verify does about it (verify always compares token ids exactly unless told otherwise)."""
        if self.greedy_equality == BITWISE:
            return "verify compares token ids exactly; any divergence is a bug"
        return ("verify still compares token ids exactly: a divergence at a logit near-tie fails the run and is shown "
                "with the target's top-two margin there; `specbuild verify --near-tie-margin M` lets such near-ties pass")

    def describe(self) -> str:
        """One line for the build output, e.g. ``kernels: rowgemm linears, specbuild attention: greedy equality bitwise``."""
        line = f"kernels: {self.linear} linears, {self.attention} attention: greedy equality {self.greedy_equality}"
        if self.fallback_reason is not None:
            line += f" (not the bitwise kernels: {self.fallback_reason})"
        return line

    def to_json(self) -> dict:
        """The ``kernel_guarantee`` object of config.json and report.json."""
        return {"linear": self.linear, "attention": self.attention, "greedy_equality": self.greedy_equality,
                "fallback_reason": self.fallback_reason, "verify": self.verify_note}

    @classmethod
    def from_json(cls, data: dict) -> KernelChoice:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: ``linear`` or ``attention`` is not one this engine knows.
        """
        linear, attention = data.get("linear"), data.get("attention")
        if linear not in LINEAR_KERNELS or attention not in (ENGINE_ATTENTION, "sdpa"):
            raise ValueError(f"kernel_guarantee names linear {linear!r} and attention {attention!r}; "
                             f"expected one of {LINEAR_KERNELS} and 'specbuild' or 'sdpa' (rebuild the engine)")
        return cls(linear, attention, data.get("fallback_reason"))
