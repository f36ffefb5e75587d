"""Plain decoding (``method: none``): the target alone, no speculation.

It is a method like the others so every stage reads it the same way: TensorRT-LLM builds the target
without ``--speculative_decoding_mode``, the reference engine runs with ``speculative_config: null``.
"""

from __future__ import annotations

from typing import Literal

from ..base import MethodParams, SpeculationMethod, TrtllmMapping


class NoSpeculation(MethodParams):
    """Plain decoding: the non-speculative engine."""

    method: Literal["none"]
    """The speculation method: this section's settings are chosen by it."""

    @property
    def max_draft_len(self) -> int:
        return 0


METHOD = SpeculationMethod(
    name="none",
    title="plain decoding",
    params=NoSpeculation,
    trtllm=TrtllmMapping(decoding_type=None),
)
