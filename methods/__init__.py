"""The speculation methods: one folder per method, each declaring a :class:`SpeculationMethod`, in one registry.

A method's folder (``methods/medusa/``, the package ``specbuild.methods.medusa``) holds::

    __init__.py   the torch-free declaration: settings model, TensorRT-LLM mapping, weights checks, METHOD
    engine.py     the reference engine's side (torch): head model, proposer, drafter, ENGINE
    train.py      ``train-draft``'s trainer of its weights, where it has weights to train

The declaration names its torch side by entry strings (``engine="specbuild.methods.medusa.engine:ENGINE"``,
:class:`Entry`), imported when an engine or a trainer first needs it, so ``import specbuild.methods``
stays torch-free. The recipe schema, the reference engine, the TensorRT-LLM planner, training and the
docs all read the registry, so a new method is one folder plus its tests.

Built-in methods and plugins register the same way (simonw/llm's pattern: ``pm.register`` of the
default plugins, then ``pm.load_setuptools_entrypoints("llm")``): :func:`registered` adds the
built-ins of :func:`builtin_methods`, then every ``specbuild.methods`` entry point of the installed
distributions, each checked by :func:`add`. A plugin declares its method in its own
``pyproject.toml``::

    [project.entry-points."specbuild.methods"]
    my_method = "my_plugin.method:METHOD"      # a SpeculationMethod

and ``method: my_method`` then validates in recipes, appears in the recipe schema and, when the
method has an ``engine`` entry (an :class:`~specbuild.engine.drafters.EngineMethod` whose
``make_drafter`` may return a drafter of the plugin's own), runs in the reference engine.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from .base import (
    Conversion,
    DraftEngine,
    Entry,
    MethodParams,
    ReferenceWeights,
    SpeculationMethod,
    Training,
    TrtllmMapping,
    Weights,
)

ENTRY_POINT_GROUP = "specbuild.methods"


def builtin_methods() -> tuple[SpeculationMethod, ...]:
    """specbuild's own methods, in the order the schema and the docs list them."""
    from . import draft_target, eagle, eagle3, lookahead, medusa, mtp, ngram, plain, redrafter, sa

    return (
        plain.METHOD, ngram.METHOD, draft_target.METHOD, lookahead.METHOD, medusa.METHOD, eagle.METHOD,
        eagle3.METHOD, mtp.METHOD, redrafter.METHOD, sa.METHOD,
    )


def add(found: dict[str, SpeculationMethod], method: object, source: str) -> None:
    """Add ``method`` to ``found`` (name -> method), refusing a clash.

    Raises:
        TypeError: ``method`` is not a :class:`SpeculationMethod` (names ``source``).
        ValueError: its name or its ``decoding_type`` is already registered (names both sources).
    """
    if not isinstance(method, SpeculationMethod):
        raise TypeError(f"{source}: a {ENTRY_POINT_GROUP} entry point must name a SpeculationMethod, got {type(method).__name__}")
    if method.name in found:
        raise ValueError(f"{source}: speculation method {method.name!r} is already registered")
    taken = {m.decoding_type: m.name for m in found.values() if m.decoding_type is not None}
    if method.decoding_type in taken:
        raise ValueError(f"{source}: decoding_type {method.decoding_type!r} of {method.name!r} is already {taken[method.decoding_type]!r}'s")
    found[method.name] = method


def _entry_point_methods() -> Iterable[tuple[object, str]]:
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        yield point.load(), f"entry point {point.name} = {point.value}"


@functools.cache
def registered() -> Mapping[str, SpeculationMethod]:
    """Every method, built-ins first: ``name -> SpeculationMethod``, e.g. ``registered()["ngram"].decoding_type`` is ``"NGram"``.

    Read once per process (entry points are looked up on the first call).
    """
    found: dict[str, SpeculationMethod] = {}
    for method in builtin_methods():
        add(found, method, f"specbuild.methods.{method.name}")
    for method, source in _entry_point_methods():
        add(found, method, source)
    return MappingProxyType(found)


def method_named(name: str) -> SpeculationMethod:
    """The method whose recipe name is ``name``.

    Raises:
        KeyError: no such method (the message lists the registered ones).
    """
    try:
        return registered()[name]
    except KeyError:
        raise KeyError(f"no speculation method {name!r}; registered: {', '.join(registered())}") from None


def method_for_decoding_type(decoding_type: object) -> SpeculationMethod | None:
    """The method TensorRT-LLM calls ``decoding_type`` (e.g. ``"NGram"`` -> ngram), or None."""
    return next((m for m in registered().values() if m.decoding_type is not None and m.decoding_type == decoding_type), None)


def reference_methods() -> dict[str, SpeculationMethod]:
    """``decoding_type`` -> method, for every registered method the reference engine runs,
    e.g. ``{"NGram": <ngram>, "DraftTarget": <draft_target>, ...}``."""
    return {m.decoding_type: m for m in registered().values() if m.engine is not None and m.decoding_type is not None}


def method_for(speculative_config: Mapping[str, Any]) -> SpeculationMethod:
    """The method the reference engine runs for ``speculative_config["decoding_type"]``.

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
    "ENTRY_POINT_GROUP", "Conversion", "DraftEngine", "Entry", "MethodParams", "ReferenceWeights", "SpeculationMethod",
    "Training", "TrtllmMapping", "Weights", "add", "builtin_methods", "method_for", "method_for_decoding_type",
    "method_named", "reference_methods", "registered",
]
