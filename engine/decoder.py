"""The engine's forward for Llama-architecture targets: transformers' modules, the engine's token layout.

:func:`~specbuild.engine.forward.forward_blocks` hands a pass here when :func:`supports` says the model
can take it (``model_type`` ``llama``, the engine's attention, on the CPU); anything else runs through
transformers' own ``LlamaModel.forward``. The weights, RMSNorm, rotary embedding, MLP activation and
lm_head are the model's own modules; what this replaces is the model-level loop and the attention
block, for two reasons measured on SmolLM2-135M (2-core Xeon, fp32, one-token step after 256 cached
positions):

- **Cost per op.** Decoding is a few rows, so every small op is overhead: transformers' layer loop,
  cache update, mask handling and attention dispatch. With the same oneDNN-packed layers a one-token
  step took 35.5 ms through transformers' forward and 32-34 ms through this loop; with the engine's
  fused kernels (:mod:`~specbuild.engine.rowgemm`), which need this loop, 24-27 ms.
- **Ragged rows.** The rows of a pass are concatenated (``[N, hidden]`` with ``N`` the sum of the
  rows' block widths, as vLLM and TensorRT-LLM pack tokens), not padded to the widest row: a batch of
  one 5-token verification and seven 1-token steps multiplies 12 rows by every weight, not 40. Each
  row attends over exactly its own slot's cached positions and block, which also makes a free slot in
  between cost nothing. PyTorch's SDPA took 54 us per layer for one query and 99 us for 8 after 256
  positions (one call per row); the engine's kernel takes 9 and 43 us, all rows in one call.

Every row's arithmetic depends only on the row itself: elementwise ops and per-row reductions, its own
attention, and linear layers that give a row the same bits whatever the rows beside it (the engine's
:mod:`~specbuild.engine.rowgemm` in float32, oneDNN-packed layers in bfloat16). With
``kernels="rowgemm"`` (float32) a layer is seven kernel calls: RMSNorm (transformers' ``LlamaRMSNorm``
arithmetic), the fused q/k/v projection, attention for every row at once
(:func:`~specbuild.engine.rowgemm.attention`: rotary embedding, cache writes, each query computed alone
in one fixed order, so a token's bits are the same in a one-token step as in a ``k + 1`` chain or a tree),
o_proj, RMSNorm, the fused gate/up projection with SwiGLU's gate (:func:`~specbuild.engine.rowgemm.silu_mul`)
and down_proj. Otherwise each row attends in its own PyTorch SDPA call (CPU flash attention), whose
rounding depends on the query length (~1e-7).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from . import rowgemm
from .attention import _HAS_ENABLE_GQA, ENGINE_ATTENTION
from .kernels import FUSED_GATE_UP, FUSED_QKV, OWN_KERNELS
from .kv_pool import KVCache

LEAN_MODEL_TYPES = ("llama",)


def unsupported_reason(model) -> str | None:
    """Why :func:`forward_rows` cannot run ``model`` (None: it can)."""
    config = model.config
    if getattr(config, "model_type", None) not in LEAN_MODEL_TYPES:
        return f"model_type {getattr(config, 'model_type', None)!r} is not one of {LEAN_MODEL_TYPES}"
    if getattr(config, "_attn_implementation", None) != ENGINE_ATTENTION:
        return f"attention {getattr(config, '_attn_implementation', None)!r} is not the engine's ({ENGINE_ATTENTION})"
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or any(not hasattr(inner, name) for name in needed) or not hasattr(model, "lm_head"):
        return "the model does not have LlamaForCausalLM's modules"
    if not _HAS_ENABLE_GQA:
        return f"torch {torch.__version__} has no grouped-query SDPA (enable_gqa, torch >= 2.5)"
    if next(model.parameters()).device.type != "cpu":
        return "the model is not on the CPU (transformers' forward runs CUDA passes)"
    layer = inner.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    if any(not hasattr(attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling", "head_dim")):
        return "its attention is not LlamaAttention"
    if any(not hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return "its MLP is not LlamaMLP"
    return None


def attention_kernel_unsupported(attn) -> str | None:
    """Why :func:`forward_rows` runs PyTorch's SDPA, not the engine's attention kernel, for a model whose first
    ``LlamaAttention`` is ``attn`` and whose linears are the engine's (None: the kernel runs)."""
    if not rowgemm.attention_supported(attn.head_dim) or attn.q_proj.out_features % attn.k_proj.out_features:
        return (f"the engine's attention kernel takes head sizes that are multiples of 16 up to 256 and whole query-head "
                f"groups; this model has head_dim {attn.head_dim}, q/k widths {attn.q_proj.out_features}/{attn.k_proj.out_features}")
    return None


def supports(model) -> bool:
    """:func:`forward_rows` can run ``model``."""
    return unsupported_reason(model) is None


def row_masks(sizes: Sequence[int], lengths: Sequence[int], allowed: Sequence[torch.Tensor | None], dtype: torch.dtype) -> list[torch.Tensor | None]:
    """Each row's additive mask ``[1, 1, T_b, L_b + T_b]``: the cached prefix visible, the block as
    ``allowed`` says (None: causal). A one-token row gets None (it sees everything)."""
    masks: list[torch.Tensor | None] = []
    for size, length, allow in zip(sizes, lengths, allowed):
        if size == 1 and (allow is None or bool(allow.all())):
            masks.append(None)
            continue
        block = torch.ones(size, size, dtype=torch.bool).tril() if allow is None else allow.to(torch.bool)
        mask = torch.zeros(size, length + size, dtype=dtype)
        mask[:, length:].masked_fill_(~block, torch.finfo(dtype).min)
        masks.append(mask[None, None])
    return masks


def forward_rows(
    model,
    pool: KVCache,
    *,
    slots: Sequence[int],
    lengths: Sequence[int],
    tokens: Sequence[Sequence[int]],
    offsets: Sequence[Sequence[int]],
    allowed: Sequence[torch.Tensor | None],
    logits_from: Sequence[int],
    hidden_states: bool,
) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, ...]] | None]:
    """One pass over ragged rows; row ``b`` writes its block into slot ``slots[b]`` of ``pool`` at ``lengths[b]`` on.

    Args:
        pool: the KV cache (:class:`~specbuild.engine.kv_pool.KVCache`), read and written through its
            interface only (the kernel gets its buffers, strides and the rows' slot and position tables).
        slots, lengths: each row's slot and its cached positions before this pass.
        tokens: each row's block ``[T_b]``; offsets: its position offsets from ``lengths[b]`` ``[T_b]``.
        allowed: each row's in-block visibility ``[T_b, T_b]`` (None: causal).
        logits_from: each row's first block index whose next-token logits are returned.
        hidden_states: also return transformers' hidden states per row (embeddings, each layer's
            output, the last after the final norm), each ``[T_b, hidden]``.

    Returns:
        (logits per row ``[T_b - logits_from[b], vocab]``, hidden states per row or None).
    """
    inner = model.model
    sizes = [len(t) for t in tokens]
    starts = [0]
    for size in sizes[:-1]:
        starts.append(starts[-1] + size)
    total = starts[-1] + sizes[-1]
    ids = torch.tensor([t for row in tokens for t in row], dtype=torch.long)
    positions = torch.tensor([length + o for length, row in zip(lengths, offsets) for o in row], dtype=torch.long)
    h = inner.embed_tokens(ids)[None]  # [1, N, hidden]
    cos, sin = inner.rotary_emb(h, positions[None])  # [1, N, head_dim]
    cos, sin = cos[0][:, None], sin[0][:, None]  # [N, 1, head_dim]
    own = getattr(model, OWN_KERNELS, False) and h.dtype == torch.float32
    attn0 = inner.layers[0].self_attn
    rows = None
    if own:
        from . import rowgemm

        if attention_kernel_unsupported(attn0) is None:
            rows = rowgemm.AttentionRows(slots, lengths, sizes, allowed, pool.addressing(), attn0.q_proj.out_features // attn0.head_dim)
            cos_sin = (cos[:, 0].contiguous(), sin[:, 0].contiguous())  # [N, head_dim]
    masks = None if rows is not None else row_masks(sizes, lengths, allowed, h.dtype)
    silu = own and getattr(model.config, "hidden_act", None) in ("silu", "swish")
    if own:
        from .rowgemm import rms_norm

        def norm(module, x: torch.Tensor) -> torch.Tensor:
            eps = getattr(module, "variance_epsilon", None)
            return module(x) if eps is None else rms_norm(x, module.weight, eps)
    else:

        def norm(module, x: torch.Tensor) -> torch.Tensor:
            return module(x)

    if own:
        from .rowgemm import RowLinear

        def residual(linear, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            """``h + linear(x)``: added in place by the GEMM where the layer is the engine's (one op less)."""
            return linear(x, accumulate_into=h) if isinstance(linear, RowLinear) else h + linear(x)

        h = h.contiguous()
    collected = [h.clone() if own else h] if hidden_states else None
    layers = inner.layers
    for index, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        x = norm(layer.input_layernorm, h)
        head_dim = attn.head_dim
        fused = getattr(attn, FUSED_QKV, None)
        if rows is not None:  # the engine's kernel: rotary embedding, cache writes and every row's attention
            qkv = fused(x)[0] if fused is not None else torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], -1)[0]
            out = rowgemm.attention(rows, qkv, *cos_sin, *pool.layer_buffers(index), attn.scaling)
            h = residual(attn.o_proj, out[None], h)
        else:
            h = h + _sdpa_rows(attn, x, fused, cos, sin, pool, index, slots, lengths, starts, sizes, masks, total)
        x = norm(layer.post_attention_layernorm, h)
        fused = getattr(mlp, FUSED_GATE_UP, None)
        if fused is not None:
            gate_up = fused(x)
            if silu:
                h = residual(mlp.down_proj, rowgemm.silu_mul(gate_up), h)
            else:
                gate, up = gate_up[..., : mlp.gate_proj.out_features], gate_up[..., mlp.gate_proj.out_features :]
                h = h + mlp.down_proj(mlp.act_fn(gate) * up)
        else:
            h = h + mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
        if collected is not None and index < len(layers) - 1:
            collected.append(h.clone() if own else h)  # the residual stream is added to in place
    h = norm(inner.norm, h)
    if collected is not None:
        collected.append(h)
    picks = [i for start, size, first in zip(starts, sizes, logits_from) for i in range(start + first, start + size)]
    last = h[0, picks] if len(picks) < total else h[0]
    logits = model.lm_head(last)  # [sum of kept, vocab]
    out_logits, at = [], 0
    for size, first in zip(sizes, logits_from):
        out_logits.append(logits[at : at + size - first])
        at += size - first
    out_hidden = None
    if collected is not None:
        out_hidden = [tuple(layer_h[0, start : start + size] for layer_h in collected) for start, size in zip(starts, sizes)]
    return out_logits, out_hidden


def _sdpa_rows(attn, x, fused, cos, sin, pool: KVCache, layer: int, slots, lengths, starts, sizes, masks, total) -> torch.Tensor:
    """One layer's attention block through PyTorch's SDPA, one call per row (bfloat16, or a head size the
    engine's kernel does not take), with transformers' rotary arithmetic; returns o_proj's output ``[1, N, hidden]``."""
    from transformers.models.llama.modeling_llama import rotate_half  # transformers' own rotary helper

    head_dim = attn.head_dim
    if fused is not None:  # one call; rotary embedding on q and k together
        qkv = fused(x).view(total, -1, head_dim)  # [N, H_q + 2 H_kv, D]
        kv_heads = attn.k_proj.out_features // head_dim
        qk = qkv[:, : qkv.shape[1] - kv_heads]
        qk = qk * cos + rotate_half(qk) * sin
        q, k, v = qk[:, : qk.shape[1] - kv_heads], qk[:, qk.shape[1] - kv_heads :], qkv[:, qkv.shape[1] - kv_heads :]
    else:
        q = attn.q_proj(x).view(total, -1, head_dim)  # [N, H_q, D]
        k = attn.k_proj(x).view(total, -1, head_dim)  # [N, H_kv, D]
        v = attn.v_proj(x).view(total, -1, head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
    gqa = q.shape[1] != k.shape[1]
    out = torch.empty_like(q)
    for b, (slot, length, start, size) in enumerate(zip(slots, lengths, starts, sizes)):
        end = length + size
        pool.write(layer, slot, length, k[start : start + size].transpose(0, 1), v[start : start + size].transpose(0, 1))
        cache_k, cache_v = pool.read(layer, slot, end)  # [H_kv, end, D] views
        o = F.scaled_dot_product_attention(
            q[start : start + size].transpose(0, 1)[None], cache_k[None], cache_v[None],
            attn_mask=masks[b], scale=attn.scaling, enable_gqa=gqa,
        )  # [1, H_q, T_b, D]
        out[start : start + size] = o[0].transpose(0, 1)
    return attn.o_proj(out.view(1, total, -1))
