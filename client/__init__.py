"""Client side of a specbuild deployment: a typed SDK, prompt sources, and token-exact verification."""

from .prompts import Prompt, PromptSourceError, load_prompts
from .sdk import (
    AsyncSpecClient,
    ClientError,
    GenerateResult,
    ModelNotReadyError,
    RequestError,
    RequestTimeoutError,
    ResponseError,
    ServerUnavailableError,
    SpecClient,
)
from .verify import (
    Divergence,
    PromptVerification,
    VerifyReport,
    find_divergence,
    first_divergence,
    render_report,
    verify,
)

__all__ = [
    "AsyncSpecClient",
    "ClientError",
    "ModelNotReadyError",
    "RequestTimeoutError",
    "ResponseError",
    "Divergence",
    "GenerateResult",
    "Prompt",
    "PromptSourceError",
    "PromptVerification",
    "RequestError",
    "ServerUnavailableError",
    "SpecClient",
    "VerifyReport",
    "find_divergence",
    "first_divergence",
    "load_prompts",
    "render_report",
    "verify",
]
