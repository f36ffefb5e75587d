"""The target model: loading it, and the keyword its forward takes the KV cache by.

The forward pass is transformers' own model implementation; every engine pass (the target's, a draft
model's, the teacher-forced logit margins) runs through :func:`specbuild.engine.forward.forward_blocks`
over a :class:`~specbuild.engine.kv_pool.KVPool`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

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
