"""Client side of a specbuild deployment: a typed SDK (sync and asyncio), token-exact verification
with logit margins, a Hugging Face oracle, the sampling equivalence test, and ``bench`` / ``tune``.

Prompt sources are :mod:`specbuild.prompts` (shared with training; ``specbuild.client.prompts`` is
the same module). The names below are imported on first use (PEP 562), so importing the package does
not pull in the SDK, numpy and tritonclient. The ``verify`` function is
``specbuild.client.verify.verify``: ``specbuild.client.verify`` is its module.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "oracle": ("HFOracle", "OracleReport", "compare_with_oracle"),
    "prompts": ("Prompt", "PromptSourceError", "load_prompts"),
    "sdk": (
        "AsyncSpecClient", "ClientError", "GenerateOptions", "GenerateResult", "ModelNotReadyError", "RequestError",
        "RequestTimeoutError", "ResponseError", "RetryPolicy", "ServerUnavailableError", "SpecClient",
    ),
    "sampling": ("SamplingReport", "SamplingSettings", "verify_sampling"),
    "verify": (
        "Divergence", "PromptVerification", "VerifyReport", "find_divergence", "first_divergence",
        "render_report",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
