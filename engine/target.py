"""The target model: loading, and a forward over a transformers ``DynamicCache`` (a draft model's private
cache; the engine's teacher-forced logit margins).

The forward pass is transformers' own model implementation; the engine's batched steps run through
:func:`specbuild.engine.forward.forward_blocks` over its KV pool.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from .attention import use_engine_attention

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def to_torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map ``"float32" | "float16" | "bfloat16"`` (or a ``torch.dtype``) to a ``torch.dtype``.

    Raises:
        ValueError: for any other name.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def load_target(
    checkpoint_dir: str | Path, *, dtype: str | torch.dtype, device: str, trust_remote_code: bool
) -> PreTrainedModel:
    """Load a local Hugging Face causal-LM checkpoint for inference (no hub download); a model on
    transformers' ``sdpa`` attention is switched to the engine's (:mod:`specbuild.engine.attention`).

    Raises:
        FileNotFoundError: if ``checkpoint_dir/config.json`` does not exist.
    """
    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / "config.json").is_file():
        raise FileNotFoundError(f"no Hugging Face checkpoint at {checkpoint_dir} (config.json missing)")
    model = AutoModelForCausalLM.from_pretrained(
        checkpoint_dir,
        dtype=to_torch_dtype(dtype),
        trust_remote_code=trust_remote_code,
        local_files_only=True,
    )
    use_engine_attention(model)  # one fused GQA attention for every block width (engine/attention.py)
    return model.to(device).eval()


def cache_keyword(model: PreTrainedModel) -> str:
    """The forward() keyword for the KV cache: ``cache`` (transformers >= 5.x) or ``past_key_values``.

    A model that ignored an unknown keyword would silently recompute without the cache, so the
    name is read from the signature rather than assumed.
    """
    parameters = inspect.signature(model.forward).parameters
    if "cache" in parameters:
        return "cache"
    if "past_key_values" in parameters:
        return "past_key_values"
    raise TypeError(f"{type(model).__name__}.forward takes neither cache= nor past_key_values=; cannot own its KV cache")


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """An empty per-request KV cache for ``model``."""
    return DynamicCache(config=model.config)


def forward_logits(
    model: PreTrainedModel, tokens: Sequence[int], cache: DynamicCache, *, num_logits: int
) -> torch.Tensor:
    """Run ``tokens`` through the model after the cached positions; logits of the last positions.

    Appends ``len(tokens)`` positions to ``cache``. Only the last ``num_logits`` positions go through the
    LM head (``logits_to_keep``), so a prefill computes one row of logits, not ``len(tokens)``.

    Args:
        tokens: ``T`` token ids at positions ``cache_len .. cache_len + T - 1``.
        num_logits: ``1 <= num_logits <= T``.

    Returns:
        ``[num_logits, vocab]``; row ``i`` scores the token after ``tokens[T - num_logits + i]``.
    """
    input_ids = torch.tensor([tokens], dtype=torch.long, device=model.device)  # [1, T]
    kwargs = {cache_keyword(model): cache, "use_cache": True, "logits_to_keep": num_logits}
    logits = model(input_ids=input_ids, **kwargs).logits  # [1, num_logits, vocab]
    return logits[0]
