"""CPU kernel path of the target's linear layers: oneDNN-prepacked weights (what inductor's freezing uses).

A decoding step multiplies a few rows (one per request, or ``k + 1`` per verifying request) by every
weight of the model. PyTorch's eager ``F.linear`` on CPU picks a GEMM for the shape at hand and reads
the weight in its stored layout each time; oneDNN can reorder ("prepack") a weight once into the
blocked layout its kernels stream best, which is what ``torch.compile`` with
``torch._inductor.config.freezing = True`` does for a frozen CPU model (it lowers ``nn.Linear`` to
``torch.ops.mkldnn._linear_pointwise`` on a ``torch.ops.mkldnn._reorder_linear_weight`` result).
:func:`pack_linears` applies the same two ops to the model in place, without compiling, so shapes may
change freely from one iteration to the next (batch size, block width, context length).

Every pass of the engine, plain or speculative, alone or batched, goes through the same packed layers.
A packed layer gives a row the same bits whatever the number of rows in the pass (eager ``F.linear``
does not: MKL picks another GEMM for another row count); attention still rounds by query and key
length (PyTorch's CPU flash attention), so a token's logits alone, in a ``k + 1`` block or in a batch
agree to ~1e-7, and greedy outputs can differ only at a logit near-tie (verify reports its margin).
The packed kernels round differently from eager ``F.linear`` (~1e-6 relative), which is why this is a
choice made per engine (``kernels`` in the engine directory's config), never mixed within one.
"""

from __future__ import annotations

import torch
from torch import nn

KERNELS = ("eager", "onednn")  # what pack_linears takes; recipes also say "auto" (resolve_kernels)


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


def resolve_kernels(kernels: str, model: nn.Module) -> str:
    """``"auto"`` -> ``"onednn"`` for a CPU model whose dtype oneDNN packs here (:func:`onednn_supports`),
    else ``"eager"``; any other value is returned as it is (checked by :func:`pack_linears`)."""
    if kernels != "auto":
        return kernels
    param = next(model.parameters())
    return "onednn" if param.device.type == "cpu" and onednn_supports(param.dtype) else "eager"


def pack_linears(model: nn.Module, kernels: str) -> int:
    """Swap the ``nn.Linear`` layers of a CPU model for :class:`PackedLinear` (``kernels="onednn"``).

    ``"eager"`` changes nothing. A tied lm_head gets a packed copy of the embedding matrix (the
    embedding lookup keeps the original): one more vocabulary-sized weight in memory.

    Returns:
        the number of layers swapped.

    Raises:
        ValueError: an unknown ``kernels``, ``"onednn"`` for a model not on the CPU or in another dtype
            than float32 / bfloat16, or a torch build without oneDNN.
    """
    if kernels not in KERNELS:
        raise ValueError(f"kernels={kernels!r} is not known; use one of {KERNELS}")
    if kernels == "eager":
        return 0
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
