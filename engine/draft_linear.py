"""Draft-side linear layers: the packed vocabulary projection and packed layers of draft heads and draft
models, and the dtype their weights are packed as (``build.draft_weights``).

Only drafts run through these: the target's logits always come from the model's own forward, so
verification, and greedy equality with plain decoding, never depend on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from . import rowgemm
from .kernels import PackedLinear, onednn_supports, pack_linears, resolve_kernels

DRAFT_WEIGHTS = ("auto", "float32", "bfloat16")


def draft_weight_dtype(setting: str, target: Any) -> Any:
    """The dtype draft-side weights are packed as (``build.draft_weights``), or None to keep them as loaded.

    ``"auto"``: ``torch.bfloat16`` for a float32 target on the CPU where the engine's kernel builds
    (:mod:`~specbuild.engine.rowgemm`), else None. ``"bfloat16"``: bfloat16 wherever that kernel runs a
    draft's layers (elsewhere they stay as loaded). ``"float32"``: None.

    Halving the bytes matters because a draft token is memory-bound: SmolLM2's 2-layer draft with a
    4096-token map, one token after a target step, 2 threads: 2.3 -> 1.9 ms (``benchmarks/bench_step_cost.py
    --draft``, side by side; ``docs/results/2026-12-04-draft-weights.md``). Only draft weights
    are rounded (the draft model, EAGLE/Medusa heads, their vocabulary projections): the target's
    logits, hence acceptance and the output, are untouched; sampled drafts return the ``q`` they were
    drawn from, so rejection sampling stays exact.

    Raises:
        ValueError: ``setting`` is not one of :data:`DRAFT_WEIGHTS`.
    """
    if setting not in DRAFT_WEIGHTS:
        raise ValueError(f"draft_weights={setting!r} is not one of {DRAFT_WEIGHTS}")
    if setting == "float32":
        return None
    if setting == "bfloat16":
        return torch.bfloat16
    param = next(target.parameters())
    on_kernel = param.device.type == "cpu" and param.dtype == torch.float32 and rowgemm.library() is not None
    return torch.bfloat16 if on_kernel else None


class DraftProjection:
    """A draft-side vocabulary projection ``x @ W^T + b`` of an ``nn.Linear`` ``[vocab, hidden]``, fast on CPU,
    optionally over a hot-token map only.

    Drafting projects one to a few rows per request and step (EAGLE's tree nodes of one depth, each
    Medusa head's last hidden state), for all the requests of a batch at once. On CPU this keeps a
    packed copy of the weight (one more weight's memory): the engine's float32 kernel
    (:mod:`~specbuild.engine.rowgemm`), else oneDNN's. For so few rows either is several times faster
    than PyTorch's GEMM (SmolLM2's 49152 x 576 lm_head, 2 threads: 8 rows 12.5 ms oneDNN-packed vs
    62 ms against the weight stored transposed, one row about the same), and it gives a row the same
    bits whatever the number of rows in the call, so a request drafts the same tokens alone or in a
    batch. Without either it keeps a transposed copy; on other devices the weight as it is.

    With ``token_ids`` (a hot-token map, :mod:`specbuild.methods.token_map`; FR-Spec, Zhao et al. 2025,
    §3) only those ``V'`` rows of the weight are kept and computed; every other token gets ``-inf``, so
    softmax gives it probability 0 and top-k never picks it. The draft then proposes hot tokens only;
    the cost of the projection falls by ``vocab / V'``.

    Only drafts are projected this way: the target's own logits always come from the model's forward,
    so verification, and greedy equality with plain decoding, never depend on this kernel choice or
    the map. The copy is taken once: build it from weights that no longer change (an engine's loaded
    model).

    Args:
        linear: the projection (``weight [vocab, hidden]``, optional ``bias [vocab]``).
        token_ids: ``V'`` distinct token ids in ``[0, vocab)``; None: the whole vocabulary.
        weight_dtype: ``torch.bfloat16`` packs a float32 weight for the engine's kernel as bfloat16 (half
            the bytes to stream; :func:`~specbuild.engine.rowgemm.pack_weight`); None or float32 keeps it.
            Only where the float32 kernel runs; elsewhere it is ignored.

    Call with ``x [..., hidden]``; returns ``[..., vocab]`` logits in the weight's dtype.

    Raises (on construction):
        ValueError: a token id outside ``[0, vocab)`` or repeated.
    """

    def __init__(self, linear: Any, token_ids: Sequence[int] | None = None, weight_dtype: Any = None) -> None:
        weight = linear.weight.detach()
        bias = None if getattr(linear, "bias", None) is None else linear.bias.detach()
        self.linear = linear
        self.vocab_size = weight.shape[0]
        self.hot: torch.Tensor | None = None
        if token_ids is not None:
            ids = torch.tensor(list(token_ids), dtype=torch.long)
            if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size or ids.unique().numel() != ids.numel():
                raise ValueError(f"a token map must list distinct token ids in [0, {self.vocab_size}); got {ids.numel()} id(s)")
            self.hot = ids.to(weight.device)
            weight = weight[self.hot]  # [V', hidden]
            bias = None if bias is None else bias[self.hot]
        self.bias = bias
        self.dtype = weight.dtype
        self.packed = self.weight_t = self.weight = None
        if weight.device.type != "cpu":
            self.weight = weight
        elif weight.dtype == torch.float32 and rowgemm.library() is not None:
            # the engine's float32 kernel (rowgemm): streams the weight faster than oneDNN for a few rows, and a
            # row's bits do not depend on the rows beside it either (a 49152 x 576 head, one row with the weight
            # out of cache, 2 threads: 0.55 ms vs 0.72 ms through oneDNN)
            self.packed = rowgemm.RowLinear(rowgemm.pack_weight(weight, weight_dtype or torch.float32), weight.shape[0],
                                            None if bias is None else bias.float())
        elif onednn_supports(weight.dtype):
            # oneDNN-packed [V', hidden]: the rows of a few tree nodes at once (3 rows x 4096 tokens: 0.5 ms vs
            # 1.6 ms transposed, 1 thread), and a row's bits do not depend on how many rows share the call,
            # which batched drafting needs (the transposed GEMM's do from 4 or 5 rows on)
            self.packed = PackedLinear(SimpleNamespace(weight=weight, bias=bias, in_features=weight.shape[1], out_features=weight.shape[0]))
        else:
            self.weight_t = weight.t().contiguous()  # [hidden, V']

    def __call__(self, x: Any) -> Any:
        x = x.to(self.dtype)
        if self.packed is not None:
            logits = self.packed(x)
        elif self.weight_t is not None:
            logits = x @ self.weight_t
            logits = logits if self.bias is None else logits + self.bias
        elif self.hot is None:
            return self.linear(x)
        else:
            logits = torch.nn.functional.linear(x, self.weight, self.bias)
        if self.hot is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.hot, logits)


def pack_draft_linears(module: Any, weight_dtype: Any = None) -> Any:
    """Prepack a draft head's ``nn.Linear`` layers for this CPU (:func:`~specbuild.engine.kernels.pack_linears`
    with ``"auto"``: the engine's float32 kernel, else oneDNN), in place; returns ``module``.

    A drafting step runs a head on one to a few rows; the packed kernel is 3-4x faster than eager
    ``F.linear`` at three rows here. Drafts only: the target's logits, hence the output, never depend
    on it. The module can no longer be trained or saved afterwards; the engine does neither.
    ``weight_dtype=torch.bfloat16`` packs the weights as bfloat16 where the float32 kernel runs
    (:func:`draft_weight_dtype`); None keeps them as they are.
    """
    if next(module.parameters(), None) is not None:  # e.g. Medusa heads without residual blocks have none
        kernels = resolve_kernels("auto", module)
        dtype = weight_dtype if kernels == "rowgemm" and weight_dtype is not None else torch.float32
        pack_linears(module, kernels, weight_dtype=dtype)
    return module
