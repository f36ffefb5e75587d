"""The reference engine: readable PyTorch speculative decoding behind the CPU Triton backend.

``types`` (requests, results, errors) imports without torch; ``ReferenceEngine`` and ``EngineLimits``
load ``runtime`` (torch + transformers) on first use.
"""

from __future__ import annotations

from typing import Any

from .types import GenerationRequest, GenerationResult, InvalidRequestError

_RUNTIME_NAMES = ("EngineLimits", "ReferenceEngine")


def __getattr__(name: str) -> Any:
    if name in _RUNTIME_NAMES:
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["EngineLimits", "GenerationRequest", "GenerationResult", "InvalidRequestError", "ReferenceEngine"]
