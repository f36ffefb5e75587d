"""Suffix-automaton (SA) speculation, TensorRT-LLM ``SADecodingConfig`` (``decoding_type: SA``).

Each request keeps the suffix automaton of its context; the draft continues the longest earlier match
of the context's suffix (``max_matching_ngram_size: -1``) or of its last ``n`` tokens at most (``n > 0``).
With ``enable_global_pool`` a request also searches the automata of the other requests in flight and of
recently finished ones (at most ``global_pool_size``). Reference engine: :mod:`specbuild.methods.sa.engine`.

TensorRT-LLM runs SA on its PyTorch backend only, from the 1.3 line (1.2.1's
``DecodingBaseConfig.from_dict`` has no ``SA`` key; ``SADecodingConfig`` is in the 1.3.0rc and 1.4.0rc
API references). ``SAEnhancerConfig`` (``threshold``, ``enable_global_pool``) is the same automaton as an
``sa_config`` on Eagle3, MTP or PARD, overriding the neural drafts when the match is at least
``threshold`` tokens long (``_torch/speculative/sa_enhancer.py``); the reference engine runs both (the
enhancer on EAGLE-3 chains: ``specbuild.methods.eagle3.engine.SAOverride``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from specbuild.util.strict import FieldProblem

from ..base import MethodParams, SpeculationMethod, TrtllmMapping

if TYPE_CHECKING:
    from specbuild.builder.recipe import LoadedRecipe

# TensorRT-LLM's global search: "max_matching_ngram_size must be -1 (longest match) or in [1, 64] when
# enable_global_pool is True" (SADecodingConfig.validate_sa_config).
GLOBAL_NGRAM_LIMIT = 64


class SASpeculation(MethodParams):
    """Suffix-automaton speculation, TensorRT-LLM ``SADecodingConfig``: each request drafts up to
    ``max_draft_len`` tokens continuing the first earlier occurrence of the longest suffix of its context
    (``max_matching_ngram_size: -1``) or of its last ``n`` tokens at most (``n > 0``). With
    ``enable_global_pool`` it also searches the other requests' automata (in flight and recently
    finished, ``global_pool_size`` in all, default ``max(64, max_batch_size)``, at least
    ``max_batch_size``; the longest match wins, then the request's own). Validation as TensorRT-LLM's
    ``validate_sa_config``, plus ``max_matching_ngram_size >= -1``.
    """

    method: Literal["sa"]
    """The speculation method: this section's settings are chosen by it."""
    max_draft_len: int = Field(ge=1, le=64)  # TensorRT-LLM: "max_draft_len must be > 0 for SA"; no default there
    """Draft tokens per step, continuing the matched suffix (required: TensorRT-LLM has no default)."""
    max_matching_ngram_size: int = Field(-1, ge=-1)
    """-1: match the longest suffix of the context; n > 0: match at most the last n tokens."""
    enable_global_pool: bool = False
    """Also search the other requests' automata (in flight and recently finished); the longest match wins."""
    global_pool_size: int | None = Field(None, ge=1)
    """With enable_global_pool: automata kept in the pool [max(64, build.max_batch_size)]; at least max_batch_size."""

    @model_validator(mode="after")
    def _sa_rules(self) -> SASpeculation:
        size = self.max_matching_ngram_size
        if size == 0:
            raise FieldProblem(("max_matching_ngram_size",), "max_matching_ngram_size must be > 0 (fixed n-gram) or -1 (longest match); got 0")
        if self.enable_global_pool and size > GLOBAL_NGRAM_LIMIT:
            raise FieldProblem(
                ("max_matching_ngram_size",),
                f"max_matching_ngram_size must be -1 (longest match) or in [1, {GLOBAL_NGRAM_LIMIT}] when "
                f"enable_global_pool is true; got {size}"
            )
        if self.global_pool_size is not None and not self.enable_global_pool:
            raise FieldProblem(("global_pool_size",), "global_pool_size requires enable_global_pool: true; set it or remove global_pool_size")
        return self

    def to_llm_api(self) -> dict[str, Any]:
        """TensorRT-LLM LLM-API ``speculative_config`` (``decoding_type: SA``); ``global_pool_size`` only when set."""
        config = self.llm_api_fields("max_draft_len", "max_matching_ngram_size", "enable_global_pool")
        if self.global_pool_size is not None:
            config["global_pool_size"] = self.global_pool_size
        return config


def _check(loaded: LoadedRecipe, path: str) -> None:
    """TensorRT-LLM's rule for an explicit pool: ``global_pool_size >= max_batch_size`` (raises RecipeError)."""
    del path
    spec, batch = loaded.recipe.speculation, loaded.recipe.build.max_batch_size
    if spec.global_pool_size is not None and spec.global_pool_size < batch:
        raise loaded.error(("speculation", "global_pool_size"), f"global_pool_size {spec.global_pool_size} is below build.max_batch_size "
                           f"{batch}: every request in flight needs a slot; raise it or remove it (default max(64, max_batch_size))")


METHOD = SpeculationMethod(
    name="sa",
    title="suffix automaton",
    params=SASpeculation,
    trtllm=TrtllmMapping(
        decoding_type="SA",
        unavailable={"tensorrt": "SA (suffix automaton) exists only on TensorRT-LLM's PyTorch backend, from 1.3"},
        check=_check,
    ),
    engine="specbuild.methods.sa.engine:ENGINE",  # per-request suffix automata (and the global pool), a chain
)
