"""Multi-token prediction (MTP): the prediction layers shipped with the target (e.g. DeepSeek-V3) draft.

TensorRT-LLM's PyTorch backend only (``MTPDecodingConfig``); not in the reference engine.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..base import MethodParams, SpeculationMethod, TrtllmMapping


class MTPSpeculation(MethodParams):
    """Multi-token prediction layers shipped with the target (e.g. DeepSeek-V3).
    TensorRT-LLM PyTorch backend only (``MTPDecodingConfig``)."""

    method: Literal["mtp"]
    """The speculation method: this section's settings are chosen by it."""
    num_nextn_predict_layers: int = Field(1, ge=1, le=8)
    """Multi-token-prediction layers of the checkpoint used as drafters (draft tokens per step)."""

    @property
    def max_draft_len(self) -> int:
        return self.num_nextn_predict_layers

    def to_llm_api(self) -> dict[str, Any]:
        return self.llm_api_fields("num_nextn_predict_layers")


METHOD = SpeculationMethod(
    name="mtp",
    title="MTP",
    params=MTPSpeculation,
    trtllm=TrtllmMapping(
        decoding_type="MTP",
        unavailable={"tensorrt": "MTP exists only on TensorRT-LLM's PyTorch backend"},  # no engine-path mode exists
        one_model=lambda params: True,
    ),
)
