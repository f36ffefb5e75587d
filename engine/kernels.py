"""CPU kernel path of the target's linear layers: oneDNN-prepacked weights (what inductor's freezing uses).

A decoding step multiplies a few rows (one per request, or ``k + 1`` per verifying request) by every
weight of the model. PyTorch's eager ``F.linear`` on CPU picks a GEMM for the shape at hand and reads
the weight in its stored layout each time; oneDNN can reorder ("prepack") a weight once into the
blocked layout its kernels stream best, which is what ``torch.compile`` with
``torch._inductor.config.freezing = True`` does for a frozen CPU model (it lowers ``nn.Linear`` to
``torch.ops.mkldnn._linear_pointwise`` on a ``torch.ops.mkldnn._reorder_linear_weight`` result).
:func:`pack_linears` applies the same two ops to the model in place, without compiling, so shapes may
change freely from one iteration to the next (batch size, block width, context length).

Every pass of the engine, plain or speculative, alone or batched, goes through the same packed layers,
so fp32 greedy equality between speculative and plain decoding holds as before; the packed kernels
round differently from eager ``F.linear`` (~1e-6 relative), which is why this is a choice made per
engine (``kernels`` in the engine directory's config), never mixed within one.
"""

from __future__ import annotations

import torch
from torch import nn

KERNELS = ("eager", "onednn")


def onednn_available() -> bool:
    """oneDNN (mkldnn) linear kernels are compiled into this torch build and usable on this CPU."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` prepacked for oneDNN (CPU, float32 or bfloat16).

    Holds the packed copy only (the original weight is released unless something else, e.g. tied
    embeddings, still references it). Call with ``x [..., in_features]``; returns ``[..., out_features]``.
    """

    def __init__(self, linear: nn.Linear, *, batch_hint: int = 8) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn-packed"


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
    if param.device.type != "cpu" or param.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"kernels='onednn' needs a float32 or bfloat16 model on the CPU, got {param.dtype} on {param.device}")
    if not onednn_available():
        raise ValueError("kernels='onednn' needs a torch build with oneDNN (torch.backends.mkldnn); use kernels='eager'")
    swapped = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, PackedLinear(child))
                swapped += 1
    return swapped
