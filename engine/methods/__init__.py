"""The reference engine's side of each speculation method: one module per method (its proposer and, for
draft heads, their on-disk format).

The methods themselves are registered in :mod:`specbuild.methods`; a method that the reference engine
runs has an ``engine()`` function returning its :class:`EngineMethod`, which imports the module here.
:func:`method_for` finds the method a ``speculative_config`` names by TensorRT-LLM's ``decoding_type``.
Importing this package stays torch-free: the torch-needing modules (Medusa, EAGLE, EAGLE-3, Lookahead)
load when an engine asks for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .base import Draft, EngineMethod, MethodContext, Proposer
from .draft_target import DraftTargetProposer
from .ngram import NGramProposer, find_ngram_draft

if TYPE_CHECKING:
    from specbuild.methods import SpeculationMethod


def reference_methods() -> dict[str, SpeculationMethod]:
    """``decoding_type`` -> method, for every registered method the reference engine runs,
    e.g. ``{"NGram": <ngram>, "DraftTarget": <draft_target>, ...}``."""
    from specbuild.methods import registered

    return {m.decoding_type: m for m in registered().values() if m.engine is not None and m.decoding_type is not None}


def method_for(speculative_config: Mapping[str, Any]) -> SpeculationMethod:
    """The method named by ``speculative_config["decoding_type"]``.

    Raises:
        ValueError: ``decoding_type`` is missing or names no method the reference engine runs.
    """
    decoding_type = speculative_config.get("decoding_type")
    methods = reference_methods()
    if decoding_type not in methods:
        raise ValueError(
            f"speculative_config.decoding_type {decoding_type!r} is not supported by the reference engine; "
            f"use one of {sorted(methods)}"
        )
    return methods[decoding_type]


__all__ = [
    "Draft",
    "DraftTargetProposer",
    "EngineMethod",
    "MethodContext",
    "NGramProposer",
    "Proposer",
    "find_ngram_draft",
    "method_for",
    "reference_methods",
]
