"""Client side of a specbuild deployment: a typed SDK (sync and asyncio), prompt sources, token-exact
verification with logit margins, a Hugging Face oracle, and the sampling equivalence test."""

from .oracle import HFOracle, OracleReport, compare_with_oracle
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
from .stats import SamplingReport, SamplingSettings, verify_sampling
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
    "verify_sampling",
    "HFOracle",
    "OracleReport",
    "SamplingReport",
    "SamplingSettings",
    "compare_with_oracle",
]
