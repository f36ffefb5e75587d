"""Speculative methods, one module each, looked up by TensorRT-LLM's ``decoding_type``.

Importing this registry stays torch-free (the recipe validator reads :data:`METHODS`): methods whose
module needs torch at import (Medusa, EAGLE, EAGLE-3, Lookahead) are registered through :func:`_lazy`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from .base import Draft, MethodContext, Proposer
from .draft_target import (
    DraftTargetConfig,
    DraftTargetProposer,
    check_prompt,
    load_draft,
)
from .ngram import NGramConfig, NGramProposer, find_ngram_draft

if TYPE_CHECKING:
    from ..eagle_decode import FeatureTreeProposer
    from ..medusa_decode import TreeProposer
    from .eagle3 import Eagle3Proposer
    from .lookahead import LookaheadConfig


def _no_load(config: Any, context: MethodContext) -> Any:
    del context
    return config


def _any_prompt(loaded: Any, input_ids: Sequence[int]) -> None:
    del loaded, input_ids


def _loaded_itself(loaded: Any) -> Any:
    """For methods without a proposer object (Lookahead: its per-request state lives in its decode loop)."""
    return loaded


def _lazy(module: str, attribute: str) -> Callable[..., Any]:
    """``specbuild.engine.methods.<module>.<attribute>`` (dotted, e.g. ``"Config.from_dict"``), imported on first call."""

    def call(*args: Any) -> Any:
        target = reduce(getattr, attribute.split("."), importlib.import_module(f"{__name__}.{module}"))
        return target(*args)

    call.__qualname__ = call.__name__ = f"{module}.{attribute}"
    return call


@dataclass(frozen=True)
class SpeculativeMethod:
    """How to parse one method's speculative_config, load what it needs, and make its per-request proposer.

    The engine calls ``parse_config`` then ``load`` once (``load`` returns what ``make_proposer`` and
    ``check_prompt`` take: the config itself, or e.g. a loaded draft model), ``check_prompt`` before a
    speculative request (raises InvalidRequestError), and ``make_proposer`` per request.

    Attributes:
        verification: ``"chain"``: the proposer is a :class:`Proposer` (k tokens in a row, verified by
            token matching or speculative sampling); ``"tree"``: it is a
            :class:`~specbuild.engine.medusa_decode.TreeProposer` filling a token tree from the target's
            hidden state, verified in one pass with a tree attention mask; ``"feature_tree"``: it is a
            :class:`~specbuild.engine.eagle_decode.FeatureTreeProposer` (EAGLE) fed with the target's
            features of every accepted position, verified like ``"tree"``; ``"feature_chain"``: it is an
            :class:`~specbuild.engine.methods.eagle3.Eagle3Proposer` (EAGLE-3) drafting a chain from features
            it captures from several target layers; ``"lookahead"``: no proposer, the loaded config
            resolves each request's ``(w, n, g)``. :meth:`ReferenceEngine._drafter
            <specbuild.engine.runtime.ReferenceEngine>` wraps each kind in its
            :class:`~specbuild.engine.drafters.Drafter`.
        greedy_only: sampled requests (``temperature > 0``) are refused, as TensorRT-LLM refuses them.
    """

    decoding_type: str
    parse_config: Callable[[Mapping[str, Any]], Any]
    make_proposer: Callable[[Any], Proposer | TreeProposer | FeatureTreeProposer | Eagle3Proposer | LookaheadConfig]
    load: Callable[[Any, MethodContext], Any] = _no_load
    check_prompt: Callable[[Any, Sequence[int]], None] = _any_prompt
    verification: Literal["chain", "tree", "feature_tree", "feature_chain", "lookahead"] = "chain"
    greedy_only: bool = False


METHODS: Mapping[str, SpeculativeMethod] = MappingProxyType(
    {
        "NGram": SpeculativeMethod("NGram", NGramConfig.from_dict, NGramProposer),
        "DraftTarget": SpeculativeMethod(
            "DraftTarget", DraftTargetConfig.from_dict, DraftTargetProposer, load=load_draft, check_prompt=check_prompt
        ),
        "Medusa": SpeculativeMethod(
            "Medusa",
            _lazy("medusa", "MedusaDecodingConfig.from_dict"),
            _lazy("medusa", "make_medusa_proposer"),
            load=_lazy("medusa", "load_medusa"),
            verification="tree",
            greedy_only=True,
        ),
        "Eagle": SpeculativeMethod(
            "Eagle",
            _lazy("eagle", "EagleDecodingConfig.from_dict"),
            _lazy("eagle", "make_eagle_proposer"),
            load=_lazy("eagle", "load_eagle"),
            verification="feature_tree",
            greedy_only=True,
        ),
        "Eagle3": SpeculativeMethod(
            "Eagle3",
            _lazy("eagle3", "Eagle3DecodingConfig.from_dict"),
            _lazy("eagle3", "make_eagle3_proposer"),
            load=_lazy("eagle3", "load_eagle3"),
            verification="feature_chain",
            greedy_only=True,
        ),
        "Lookahead": SpeculativeMethod(
            "Lookahead",
            _lazy("lookahead", "LookaheadConfig.from_dict"),
            _loaded_itself,
            verification="lookahead",
            greedy_only=True,
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
