"""Which kernels a target will run, and so whether greedy speculative output equals plain decoding bitwise.

The engine's bitwise guarantee needs both of csrc/rowgemm.c's kernel families on the target's layer loop:
its linears (``kernels="rowgemm"``: a float32 model on the CPU, a working C compiler) and its attention
(a Llama-architecture model the engine's loop runs, head sizes a multiple of 16). Anything less (oneDNN or
eager linears, or PyTorch's SDPA) gives logits that agree to ~1e-6 relative: equality up to logit
near-ties. :func:`plan_kernels` says which, with the reason, before the linears are swapped; the builder
records it in the engine's ``config.json`` and the engine obeys that record when it loads.
"""

from __future__ import annotations

from torch import nn

from . import decoder
from .attention import use_engine_attention
from .kernels import KERNELS, resolve_kernels_for, rowgemm_unavailable
from .native import ENGINE_ATTENTION, KernelChoice


def plan_kernels(model: nn.Module, requested: str, device: str | None = None) -> KernelChoice:
    """What ``pack_linears(model, choice.linear)`` and the engine's forward will run for ``model``.

    Args:
        model: the target as loaded (linears not yet swapped). A model on transformers' ``sdpa`` attention is
            switched to the engine's (:func:`~specbuild.engine.attention.use_engine_attention`), as the engine's
            loader does.
        requested: ``build.kernels``: ``"auto"``, ``"rowgemm"``, ``"onednn"`` or ``"eager"``.
        device: where the engine will run it (``"cpu"``, ``"cuda"``); None: where ``model`` is.

    Raises:
        ValueError: an unknown ``requested``, or ``"rowgemm"`` where the bitwise kernels cannot run: the C
            library does not build (the message names the compiler and the fix), the model is not float32 on
            the CPU, or the engine's attention kernel does not take its architecture or head size.
    """
    if requested != "auto" and requested not in KERNELS:
        raise ValueError(f"kernels={requested!r} is not known; use 'auto' or one of {KERNELS}")
    param = next(model.parameters())
    device = device or param.device.type
    unavailable = rowgemm_unavailable(param.dtype, device)
    if requested == "rowgemm" and unavailable is not None:
        raise ValueError(f"build.kernels: rowgemm requires the engine's bitwise kernels, and {unavailable}")
    linear = resolve_kernels_for(requested, param.dtype, device)
    if linear != "rowgemm":
        reason = unavailable if requested == "auto" else f"build.kernels: {requested} chooses them"
        return KernelChoice(linear, "sdpa", reason)
    use_engine_attention(model)
    reason = decoder.unsupported_reason(model)
    if reason is None:
        reason = decoder.attention_kernel_unsupported(model.model.layers[0].self_attn)
    if reason is not None and requested == "rowgemm":
        raise ValueError(f"build.kernels: rowgemm requires the engine's bitwise kernels, and its attention kernel cannot "
                         f"run this target: {reason}; use build.kernels: auto (greedy equality up to logit near-ties)")
    if reason is not None:
        return KernelChoice(linear, "sdpa", f"the engine's attention kernel does not run: {reason}")
    return KernelChoice(linear, ENGINE_ATTENTION, None)
