"""Speculative methods, one module each, looked up by TensorRT-LLM's ``decoding_type``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .base import Proposer
from .ngram import NGramConfig, NGramProposer, find_ngram_draft


@dataclass(frozen=True)
class SpeculativeMethod:
    """How to parse one method's speculative_config and make its per-request proposer."""

    decoding_type: str
    parse_config: Callable[[Mapping[str, Any]], Any]
    make_proposer: Callable[[Any], Proposer]


METHODS: Mapping[str, SpeculativeMethod] = MappingProxyType(
    {"NGram": SpeculativeMethod("NGram", NGramConfig.from_dict, NGramProposer)}
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


__all__ = ["METHODS", "NGramConfig", "NGramProposer", "Proposer", "SpeculativeMethod", "find_ngram_draft", "get_method"]
