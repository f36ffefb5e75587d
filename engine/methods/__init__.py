"""Speculative methods, one module each, looked up by TensorRT-LLM's ``decoding_type``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .base import Draft, MethodContext, Proposer
from .draft_target import (
    DraftTargetConfig,
    DraftTargetProposer,
    check_prompt,
    load_draft,
)
from .ngram import NGramConfig, NGramProposer, find_ngram_draft


def _no_load(config: Any, context: MethodContext) -> Any:
    del context
    return config


def _any_prompt(loaded: Any, input_ids: Sequence[int]) -> None:
    del loaded, input_ids


@dataclass(frozen=True)
class SpeculativeMethod:
    """How to parse one method's speculative_config, load what it needs, and make its per-request proposer.

    The engine calls ``parse_config`` then ``load`` once (``load`` returns what ``make_proposer`` and
    ``check_prompt`` take: the config itself, or e.g. a loaded draft model), ``check_prompt`` before a
    speculative request (raises InvalidRequestError), and ``make_proposer`` per request.
    """

    decoding_type: str
    parse_config: Callable[[Mapping[str, Any]], Any]
    make_proposer: Callable[[Any], Proposer]
    load: Callable[[Any, MethodContext], Any] = _no_load
    check_prompt: Callable[[Any, Sequence[int]], None] = _any_prompt


METHODS: Mapping[str, SpeculativeMethod] = MappingProxyType(
    {
        "NGram": SpeculativeMethod("NGram", NGramConfig.from_dict, NGramProposer),
        "DraftTarget": SpeculativeMethod(
            "DraftTarget", DraftTargetConfig.from_dict, DraftTargetProposer, load=load_draft, check_prompt=check_prompt
        ),
    }
)


def get_method(speculative_config: Mapping[str, Any]) -> SpeculativeMethod:
    """The method named by ``speculative_config["decoding_type"]``.

    Raises:
        ValueError: if ``decoding_type`` is missing or not one of :data:`METHODS`.
    """
    decoding_type = speculative_config.get("decoding_type")
    if decoding_type not in METHODS:
        raise ValueError(
            f"speculative_config.decoding_type {decoding_type!r} is not supported by the reference engine; "
            f"use one of {sorted(METHODS)}"
        )
    return METHODS[decoding_type]


__all__ = [
    "METHODS",
    "Draft",
    "DraftTargetConfig",
    "DraftTargetProposer",
    "MethodContext",
    "NGramConfig",
    "NGramProposer",
    "Proposer",
    "SpeculativeMethod",
    "find_ngram_draft",
    "get_method",
]
