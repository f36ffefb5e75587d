"""The engine's attention: PyTorch's fused SDPA with grouped-query heads and the engine's 4D mask.

transformers' own ``sdpa`` attention takes a different path for each case the engine mixes in one
batch: with a custom mask and grouped-query attention (GQA: fewer key/value heads than query heads,
SmolLM2-135M has 9 and 3) it copies every layer's keys and values ``num_key_value_groups`` times
(``repeat_kv``) when a block has several tokens, and folds the groups into the query length
(``pack_gqa``) when it has one. So a plain step (1 token) and a verification step (``k + 1``) ran
different computations, and the copy cost grew with the batch (measured on a 2-core CPU, 30 layers,
320 cached positions: 12 ms per step at batch 8 with one fused kernel against 92 ms with the copy).

This function hands every block, whatever its width, to ``torch.nn.functional.scaled_dot_product_attention``
with ``enable_gqa=True`` (PyTorch >= 2.5, on CPU; on CUDA a masked GQA call would fall back to the math
kernel, so there the keys and values are repeated once, for every width alike) and the mask as given, registered in transformers' attention
registry (``AttentionInterface``, the hook vLLM's Transformers backend uses for its own kernels) under
:data:`ENGINE_ATTENTION`. :func:`use_engine_attention` switches a loaded model to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ENGINE_ATTENTION = "specbuild_sdpa"
ROWS_KWARG = "specbuild_rows"
"""The keyword (passed through transformers to the attention) that lists each batch row's ``(tokens,
kv_len)``: its unpadded block size and the cached positions it attends to, block included."""
_HAS_ENABLE_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


def engine_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention-interface signature.

    Args:
        query: ``[B, H_q, T, D]``. key, value: ``[B, H_kv, L, D]`` with ``H_q`` a multiple of ``H_kv``.
        attention_mask: ``[B, 1, T, L]`` additive float mask (the engine's; ``None`` means causal when
            ``T > 1``, for callers outside the engine).
        specbuild_rows: per row ``(T_b, L_b)`` (:data:`ROWS_KWARG`, from the engine's forward): with
            ``B > 1`` each row attends in its own call over its first ``T_b`` queries and ``L_b`` keys,
            so a row gets the same bits in any batch as alone; padding rows' outputs are zeros.

    Returns:
        ``([B, T, H_q, D]`` contiguous, ``None)``: no attention weights.

    Raises:
        ValueError: ``softcap`` or ``output_attentions`` asked for (use ``eager``).
    """
    if kwargs.get("softcap") is not None or kwargs.get("output_attentions"):
        raise ValueError(f"{ENGINE_ATTENTION} attention has no softcap or attention weights; use attn_implementation='eager'")
    groups = query.shape[1] // key.shape[1]
    extra = {}
    if groups > 1:
        if _HAS_ENABLE_GQA and query.device.type == "cpu":
            extra["enable_gqa"] = True
        else:  # CUDA (a masked GQA call would fall back to the math kernel) or older torch: one copy, every width
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    rows = kwargs.get(ROWS_KWARG)
    if rows is not None and attention_mask is not None and query.shape[0] > 1:
        # one call per row over exactly its own tokens and cached positions: the shapes a row has alone,
        # so its bits do not depend on the batch (a padded call's kernel blocks and sums differ with kv_len)
        out = query.new_zeros(query.shape)  # padding rows: zeros
        for b, (size, kv_len) in enumerate(rows):
            out[b : b + 1, :, :size] = F.scaled_dot_product_attention(
                query[b : b + 1, :, :size], key[b : b + 1, :, :kv_len], value[b : b + 1, :, :kv_len],
                attn_mask=attention_mask[b : b + 1, :, :size, :kv_len], dropout_p=dropout, scale=scaling, **extra,
            )
        return out.transpose(1, 2).contiguous(), None
    causal = attention_mask is None and query.shape[2] > 1 and bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal, **extra
    )
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register :func:`engine_sdpa_attention` with transformers (idempotent); returns its name. Its masks
    are made as for ``sdpa`` where transformers makes them (the engine always passes its own 4D mask)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ENGINE_ATTENTION, engine_sdpa_attention)
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

        AttentionMaskInterface.register(ENGINE_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    except (ImportError, KeyError):  # older transformers: 4D masks pass through without a mask function
        pass
    return ENGINE_ATTENTION


def use_engine_attention(model) -> bool:
    """Switch a model that uses transformers' ``sdpa`` to :data:`ENGINE_ATTENTION` (in place).

    Returns True if switched; ``eager`` and anything else are left as they are."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(register())
    return True
