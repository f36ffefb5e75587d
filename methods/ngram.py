"""N-gram (prompt lookup) speculation, TensorRT-LLM ``NGramDecodingConfig``.

Saxena 2023, "Prompt Lookup Decoding": draft tokens are copied from the context after an earlier
occurrence of its current suffix. Reference engine: :mod:`specbuild.engine.methods.ngram`. On
TensorRT-LLM's engine path the drafts are external (``draft_tokens_external``, examples/ngram/README.md):
specbuild's ensemble front proposes them and the target verifies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from .base import MethodParams, SpeculationMethod, TrtllmMapping

if TYPE_CHECKING:
    from specbuild.engine.methods.base import EngineMethod


class NGramSpeculation(MethodParams):
    """N-gram (prompt lookup) speculation, TensorRT-LLM ``NGramDecodingConfig``.

    Draft tokens are copied from the context after the most recent (or oldest) earlier occurrence
    of its last ``n <= max_matching_ngram_size`` tokens; the target verifies up to
    ``max_draft_len`` of them in one forward pass.
    """

    method: Literal["ngram"]
    """The speculation method: this section's settings are chosen by it."""
    max_draft_len: int = Field(4, ge=1, le=64)  # >= 1: the target needs a draft budget (tensorrtllm_backend#473)
    """Most draft tokens verified per step (TensorRT-LLM's per-deployment name; requests send num_draft_tokens <= it)."""
    max_matching_ngram_size: int = Field(3, ge=1, le=32)
    """Longest suffix of the context looked up for an earlier occurrence."""
    is_use_oldest: bool = True
    """Copy the draft after the oldest earlier occurrence instead of the most recent."""

    def to_llm_api(self) -> dict[str, Any]:
        """TensorRT-LLM LLM-API ``speculative_config`` (``decoding_type: NGram``)."""
        return {
            "decoding_type": self.decoding_type,
            "max_draft_len": self.max_draft_len,
            "max_matching_ngram_size": self.max_matching_ngram_size,
            "is_use_oldest": self.is_use_oldest,
        }


def engine() -> EngineMethod:
    """Prompt lookup in the request's own context, verified as a chain."""
    from specbuild.engine.methods.base import EngineMethod
    from specbuild.engine.methods.ngram import NGramProposer

    return EngineMethod(make_proposer=NGramProposer, verification="chain")


def _front_parameters(spec: NGramSpeculation) -> dict[str, str]:
    """The ensemble front looks up drafts itself (:mod:`specbuild.triton_repo.models.trtllm_front`)."""
    return {"max_matching_ngram_size": str(spec.max_matching_ngram_size), "is_use_oldest": "true" if spec.is_use_oldest else "false"}


METHOD = SpeculationMethod(
    name="ngram",
    title="n-gram",
    params=NGramSpeculation,
    trtllm=TrtllmMapping(
        decoding_type="NGram",
        speculative_decoding_mode="draft_tokens_external",
        paged_context_fmha=True,
        front_parameters=_front_parameters,
    ),
    engine=engine,
    # The reference engine searches the request's own context each step: it behaves as is_keep_all=True,
    # is_public_pool=False whatever these say.
    ignored_config_keys=("is_keep_all", "is_public_pool"),
)
