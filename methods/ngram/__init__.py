"""N-gram (prompt lookup) speculation, TensorRT-LLM ``NGramDecodingConfig``.

Saxena 2023, "Prompt Lookup Decoding": draft tokens are copied from the context after an earlier
occurrence of its current suffix. Reference engine: :mod:`specbuild.methods.ngram.engine`. On
TensorRT-LLM's engine path the drafts are external (``draft_tokens_external``, examples/ngram/README.md):
specbuild's ensemble front proposes them and the target verifies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from ..base import MethodParams, SpeculationMethod, TrtllmMapping

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
        return self.llm_api_fields("max_draft_len", "max_matching_ngram_size", "is_use_oldest")


# --- prompt lookup (the reference engine's proposer and TensorRT-LLM's ensemble front both draft with it) ---


def find_ngram_draft(
    context: Sequence[int], *, max_ngram_size: int, num_draft_tokens: int, use_oldest: bool = True
) -> list[int]:
    """Prompt lookup: copy the tokens that followed an earlier occurrence of the context's suffix.

    For ``n`` from ``max_ngram_size`` down to 1, take the last ``n`` tokens of ``context`` and look for
    them at an earlier start position ``i`` (``i + n < len(context)``, so at least one token follows).
    The first ``n`` with a match wins; the draft is ``context[i + n : i + n + num_draft_tokens]``, which
    may be shorter than ``num_draft_tokens`` near the end of the context.

    Examples:
        context [1, 2, 3, 4, 2, 3], n=2, k=3: suffix [2, 3] matches at i=1 -> propose [4, 2, 3].
        context [1, 2, 3, 4, 2, 3], n=2, k=1 -> propose [4].
        context [7, 1, 8, 1, 9, 1], n=1, k=2: suffix [1] matches at i=1 and i=3;
            use_oldest=True -> [8, 1], use_oldest=False -> [9, 1].
        context [1, 2, 3], any n -> [] (no earlier occurrence of a suffix); k=0 -> [].

    Args:
        context: prompt + tokens emitted so far.
        max_ngram_size: longest suffix to try, ``>= 1``.
        num_draft_tokens: the most tokens to propose, ``>= 0``.
        use_oldest: earliest match (True) or latest match (False).

    Returns:
        Up to ``num_draft_tokens`` token ids; ``[]`` when nothing matches.
    """
    if num_draft_tokens <= 0:
        return []
    length = len(context)
    for n in range(min(max_ngram_size, length - 1), 0, -1):
        start = _match_start(context, n, use_oldest=use_oldest)
        if start is not None:
            return list(context[start + n : start + n + num_draft_tokens])
    return []


def _match_start(context: Sequence[int], n: int, *, use_oldest: bool) -> int | None:
    """Start of the earliest (or latest) earlier occurrence of ``context[-n:]``, or None."""
    suffix = list(context[-n:])
    starts = range(len(context) - n)  # i + n <= len - 1: excludes the suffix itself
    for i in starts if use_oldest else reversed(starts):
        if context[i] == suffix[0] and list(context[i : i + n]) == suffix:
            return i
    return None


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
    engine="specbuild.methods.ngram.engine:ENGINE",  # prompt lookup in the request's own context, a chain
    # The reference engine searches the request's own context each step: it behaves as is_keep_all=True,
    # is_public_pool=False whatever these say.
    ignored_config_keys=("is_keep_all", "is_public_pool"),
)
