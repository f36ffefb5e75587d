"""Lookahead decoding (Fu et al. 2024), TensorRT-LLM ``LookaheadDecodingConfig``.

Jacobi iterations over a window of W future positions build an n-gram pool (n = N); up to G matching
n-grams are verified per step. Reference engine: :mod:`specbuild.methods.lookahead.engine`. TensorRT-LLM
engine path only.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from specbuild.util.strict import FieldProblem

from ..base import MethodParams, SpeculationMethod, TrtllmMapping

def lookahead_max_draft_len(window: int, ngram: int, verification_set: int) -> int:
    """TensorRT-LLM's engine budget for lookahead (W, N, G): (0 if N == 1 else N - 2) + (W - 1 + G) * (N - 1).

    Example: (W, N, G) = (7, 7, 7) -> 5 + 13 * 6 = 83.
    """
    return (0 if ngram == 1 else ngram - 2) + (window - 1 + verification_set) * (ngram - 1)


class LookaheadSpeculation(MethodParams):
    """Lookahead decoding (Fu et al. 2024): Jacobi iterations over a window of W future positions
    build an n-gram pool (n = N); up to G matching n-grams are verified per step. TensorRT-LLM:
    ``LookaheadDecodingConfig(max_window_size, max_ngram_size, max_verification_set_size)``; the
    engine's ``max_draft_len`` follows :func:`lookahead_max_draft_len`. Per request (w, n, g) may be
    smaller; (1, 1, 0) is plain decoding."""

    method: Literal["lookahead"]
    """The speculation method: this section's settings are chosen by it."""
    max_window_size: int = Field(4, ge=1, le=64)
    """W: Jacobi window positions guessed per step."""
    max_ngram_size: int = Field(3, ge=1, le=64)
    """N: n-gram size of the pool (draft length N - 1 per candidate)."""
    max_verification_set_size: int = Field(4, ge=0, le=64)
    """G: matching n-grams verified per step at most."""
    max_draft_len: int | None = Field(None, ge=0)  # derived; if given, it must equal the formula
    """Derived from (W, N, G); when given it must equal the formula."""

    @model_validator(mode="after")
    def _draft_len_matches_formula(self) -> "LookaheadSpeculation":
        expected = lookahead_max_draft_len(self.max_window_size, self.max_ngram_size, self.max_verification_set_size)
        if self.max_draft_len is None:
            object.__setattr__(self, "max_draft_len", expected)
        elif self.max_draft_len != expected:
            raise FieldProblem(
                ("max_draft_len",),
                f"max_draft_len {self.max_draft_len} does not match (W, N, G) = ({self.max_window_size}, "
                f"{self.max_ngram_size}, {self.max_verification_set_size}): TensorRT-LLM needs "
                f"(0 if N == 1 else N - 2) + (W - 1 + G) * (N - 1) = {expected}; omit max_draft_len to derive it"
            )
        return self

    @property
    def maxima(self) -> tuple[int, int, int]:
        """The engine's ``(W, N, G)``."""
        return (self.max_window_size, self.max_ngram_size, self.max_verification_set_size)

    def to_llm_api(self) -> dict[str, Any]:
        return self.llm_api_fields("max_window_size", "max_ngram_size", "max_verification_set_size")


def _engine_model(spec: LookaheadSpeculation) -> dict[str, Any]:
    return {"lookahead": spec.maxima}


METHOD = SpeculationMethod(
    name="lookahead",
    title="Lookahead",
    params=LookaheadSpeculation,
    trtllm=TrtllmMapping(
        decoding_type="Lookahead",
        speculative_decoding_mode="lookahead_decoding",
        decoding_mode="lookahead",
        unavailable={"pytorch": "TensorRT-LLM's PyTorch backend has no lookahead decoding"},
        engine_model=_engine_model,
        # (W, N, G) = (1, 1, 0) is plain decoding on the lookahead engine (TensorRT-LLM's per-request
        # lookahead_config; tensorrtllm_backend's lookahead_window_size / _ngram_size / _verification_set_size)
        off_switch={"lookahead_window_size": 1, "lookahead_ngram_size": 1, "lookahead_verification_set_size": 0},
    ),
    engine="specbuild.methods.lookahead.engine:ENGINE",  # the built (W, N, G) resolves each request's (w, n, g)
)
