"""The reference engine's core: readable PyTorch speculative decoding (worker, block, acceptance, forward,
the KV pool and the drafter contract). It imports no method; :mod:`specbuild.runtime` (``ReferenceEngine``,
``EngineLimits``) loads a method through the registry and drives this core.

``types`` (requests, results, errors) imports without torch.
"""

from __future__ import annotations

from .types import GenerationRequest, GenerationResult, InvalidRequestError

__all__ = ["GenerationRequest", "GenerationResult", "InvalidRequestError"]
