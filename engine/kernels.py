"""CPU kernel path of the target's linear layers: the engine's own float32 GEMM, or oneDNN-prepacked weights.

A decoding step multiplies a few rows (one per request, or ``k + 1`` per verifying request) by every
weight of the model. PyTorch's eager ``F.linear`` on CPU picks a GEMM for the shape at hand, and with it
a summation order, so a row's bits change with the number of rows beside it. Two kernels that do not:

- ``"rowgemm"`` (float32, the default where a C compiler works): the engine's own kernel
  (:mod:`~specbuild.engine.rowgemm`), weights repacked into column blocks; a decoder layer's q/k/v and
  gate/up projections are fused into one call each. Fastest for decoding's few rows (SmolLM2-135M,
  2-core Xeon: 16.9 ms for every linear of a one-row step, against 23.4 ms with oneDNN).
- ``"onednn"`` (float32; bfloat16 on AVX-512 CPUs): oneDNN reorders ("prepacks") a weight once into the
  blocked layout its kernels stream best, which is what ``torch.compile`` with
  ``torch._inductor.config.freezing = True`` does for a frozen CPU model (it lowers ``nn.Linear`` to
  ``torch.ops.mkldnn._linear_pointwise`` on a ``torch.ops.mkldnn._reorder_linear_weight`` result).
  :func:`pack_linears` applies the same two ops in place, without compiling, so shapes may change
  freely from one iteration to the next (batch size, block width, context length).

Every pass of the engine, plain or speculative, alone or batched, goes through the same layers, and a
row gets the same bits whatever the number of rows in the pass. With ``"rowgemm"`` the layer loop's
attention is the engine's own kernel too (:func:`~specbuild.engine.rowgemm.attention`), which computes each
query alone in one fixed order: a token's logits are bitwise the same in a one-token step, inside a
``k + 1`` chain or a tree, so fp32 greedy speculative output equals plain decoding by construction. With
``"onednn"`` attention is PyTorch's CPU flash attention, which rounds by query length: a token's logits
alone and inside a ``k + 1`` block agree to ~1e-7, and greedy outputs can differ only at a logit near-tie
(verify reports its margin). Each kernel rounds
differently from eager ``F.linear`` (~1e-6 relative), which is why this is a choice made per engine
(``kernels`` in the engine directory's config), never mixed within one.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from . import rowgemm

KERNELS = ("eager", "onednn", "rowgemm")  # what pack_linears takes; recipes also say "auto" (resolve_kernels)


def onednn_available() -> bool:
    """oneDNN (mkldnn) linear kernels are compiled into this torch build and usable on this CPU."""
    ops = torch.ops.mkldnn
    return bool(torch.backends.mkldnn.is_available()) and all(
        hasattr(ops, name) for name in ("_linear_pointwise", "_reorder_linear_weight")
    )


class PackedLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` prepacked for oneDNN (CPU, float32 or bfloat16).

    Holds the packed copy; the original weight is released unless ``keep_weight`` (the lm_head, whose
    ``weight [vocab, hidden]`` draft heads read) or something else (tied embeddings) references it.
    Call with ``x [..., in_features]``; returns ``[..., out_features]``.
    """

    def __init__(self, linear: nn.Linear, *, keep_weight: bool = False, batch_hint: int = 8) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()
        if keep_weight:
            self.weight = linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn-packed"


def onednn_supports(dtype: torch.dtype) -> bool:
    """oneDNN packs this dtype here: float32 wherever oneDNN is built in; bfloat16 only on CPUs with
    AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT (``torch.ops.mkldnn._is_mkldnn_bf16_supported``)."""
    if not onednn_available():
        return False
    bf16_supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)  # absent in older torch
    return dtype == torch.float32 or (dtype == torch.bfloat16 and bf16_supported is not None and bool(bf16_supported()))


def rowgemm_unsupported(model: nn.Module) -> str | None:
    """Why ``kernels="rowgemm"`` cannot run ``model`` (None: it can): it needs a float32 model on the CPU
    and the compiled kernel (:mod:`~specbuild.engine.rowgemm`)."""
    param = next(model.parameters())
    return rowgemm_unavailable(param.dtype, param.device.type)


def rowgemm_unavailable(dtype: torch.dtype, device: str) -> str | None:
    """Why ``kernels="rowgemm"`` cannot run a ``dtype`` model on ``device`` (``"cpu"``, ``"cuda"``) here
    (None: it can); compiles the kernel if it is not cached yet (:mod:`~specbuild.engine.native`)."""
    if device != "cpu" or dtype != torch.float32:
        return f"rowgemm runs float32 models on the CPU, this is {dtype} on {device}"
    if rowgemm.library() is None:
        return f"the kernel could not be built: {rowgemm.unavailable_reason()}"
    return None


def resolve_kernels(kernels: str, model: nn.Module) -> str:
    """``"auto"`` -> ``"rowgemm"`` for a float32 CPU model where the kernel builds (:func:`rowgemm_unsupported`), else
    ``"onednn"`` for a CPU model whose dtype oneDNN packs here (:func:`onednn_supports`), else
    ``"eager"``; any other value is returned as it is (checked by :func:`pack_linears`)."""
    param = next(model.parameters())
    resolved = resolve_kernels_for(kernels, param.dtype, param.device.type)
    if kernels == "auto" and resolved != "rowgemm" and param.device.type == "cpu" and param.dtype == torch.float32:
        # where rowgemm would have run: say why not
        logging.getLogger(__name__).warning("kernels auto: not the engine's float32 kernel (%s); using %s",
                                            rowgemm_unavailable(param.dtype, "cpu"), resolved)
    return resolved


def resolve_kernels_for(kernels: str, dtype: torch.dtype, device: str) -> str:
    """:func:`resolve_kernels` for a ``dtype`` model on ``device`` (``"cpu"``, ``"cuda"``), before it is loaded;
    logs nothing (:func:`~specbuild.engine.guarantee.plan_kernels` says why, where it matters)."""
    if kernels != "auto":
        return kernels
    if rowgemm_unavailable(dtype, device) is None:
        return "rowgemm"
    return "onednn" if device == "cpu" and onednn_supports(dtype) else "eager"


def pack_linears(model: nn.Module, kernels: str, *, weight_dtype: torch.dtype = torch.float32) -> int:
    """Swap the ``nn.Linear`` layers of a CPU model for :class:`PackedLinear` (``kernels="onednn"``) or
    :class:`~specbuild.engine.rowgemm.RowLinear` (``kernels="rowgemm"``, q/k/v and gate/up fused).

    ``weight_dtype`` (``"rowgemm"`` only): what the packed weights hold, float32, or bfloat16 for half
    the bytes per pass (:func:`~specbuild.engine.rowgemm.pack_weight`; sums stay float32). Draft models
    and heads only: it rounds the weights, so a target packed so would no longer be the checkpoint.

    ``"eager"`` changes nothing. A tied lm_head gets a packed copy of the embedding matrix (the
    embedding lookup keeps the original): one more vocabulary-sized weight in memory.

    Returns:
        the number of layers swapped.

    Raises:
        ValueError: an unknown ``kernels``, ``"onednn"`` for a model not on the CPU or in another dtype
            than float32 / bfloat16, or a torch build without oneDNN; ``"rowgemm"`` for a model that is
            not float32 on the CPU, or where the kernel could not be built.
    """
    if kernels not in KERNELS:
        raise ValueError(f"kernels={kernels!r} is not known; use one of {KERNELS}")
    if weight_dtype != torch.float32 and kernels != "rowgemm":
        raise ValueError(f"weight_dtype={weight_dtype} is for kernels='rowgemm' only, not {kernels!r}")
    if kernels == "eager":
        return 0
    if kernels == "rowgemm":
        reason = rowgemm_unsupported(model)
        if reason is not None:
            raise ValueError(f"kernels='rowgemm': {reason}; use kernels='onednn', 'eager' or 'auto'")
        return _swap_rowgemm(model, weight_dtype)
    param = next(model.parameters())
    if param.device.type != "cpu" or not onednn_supports(param.dtype):
        raise ValueError(
            f"kernels='onednn' packs float32 (and bfloat16 on AVX-512 CPUs) models on the CPU with oneDNN; "
            f"this is {param.dtype} on {param.device} (CPU capability {torch.backends.cpu.get_cpu_capability()}): "
            "use kernels='eager' or 'auto'"
        )
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    swapped = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, PackedLinear(child, keep_weight=child is head))
                swapped += 1
    return swapped


OWN_KERNELS = "specbuild_own_kernels"
"""Set (True) on a model by :func:`pack_linears` with ``"rowgemm"``: the engine's layer loop also runs its
RMSNorms through the engine's kernel (:func:`~specbuild.engine.rowgemm.rms_norm`)."""
FUSED_QKV = "specbuild_qkv_proj"
FUSED_GATE_UP = "specbuild_gate_up_proj"
"""Attributes a decoder layer's attention / MLP gets from :func:`pack_linears` with ``"rowgemm"`` when
its projections can be fused (:func:`~specbuild.engine.rowgemm.fuse_linears`): one call for
``q_proj | k_proj | v_proj`` and for ``gate_proj | up_proj`` (:mod:`~specbuild.engine.decoder` uses them)."""


def _swap_rowgemm(model: nn.Module, weight_dtype: torch.dtype) -> int:
    """``kernels="rowgemm"``: every ``nn.Linear`` becomes a :class:`~specbuild.engine.rowgemm.RowLinear`
    packed as ``weight_dtype``; a decoder layer's q/k/v and gate/up projections share one fused packed
    weight (each keeps a view)."""
    from .rowgemm import RowLinear, fuse_linears

    swapped = 0
    for module in list(model.modules()):
        for names, fused_name in ((("q_proj", "k_proj", "v_proj"), FUSED_QKV), (("gate_proj", "up_proj"), FUSED_GATE_UP)):
            linears = [getattr(module, name, None) for name in names]
            if all(type(lin) is nn.Linear for lin in linears):
                fused = fuse_linears(linears, weight_dtype)
                if fused is not None:
                    setattr(module, fused_name, fused[0])
                    for name, part in zip(names, fused[1]):
                        setattr(module, name, part)
                    swapped += len(names)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, RowLinear.from_linear(child, keep_weight=child is head, dtype=weight_dtype))
                swapped += 1
    setattr(model, OWN_KERNELS, True)
    return swapped
