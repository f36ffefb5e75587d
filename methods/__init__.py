"""The speculation methods: one module per method, each a :class:`SpeculationMethod`, in one registry.

A method module (``methods/medusa.py``) defines the method's settings model and its ``METHOD``; the
recipe schema, the reference engine, the TensorRT-LLM planner, training and the docs all read the
registry, so a new method is one module plus its tests (and, for the reference engine, its proposer
under ``engine/methods/``).

Built-in methods and plugins register the same way (simonw/llm's pattern: ``pm.register`` of the
default plugins, then ``pm.load_setuptools_entrypoints("llm")``): :func:`registered` adds the
built-ins of :func:`builtin_methods`, then every ``specbuild.methods`` entry point of the installed
distributions, each checked by :func:`add`. A plugin declares its method in its own
``pyproject.toml``::

    [project.entry-points."specbuild.methods"]
    my_method = "my_plugin.method:METHOD"      # a SpeculationMethod

and ``method: my_method`` then validates in recipes, appears in the recipe schema and, when the
method has an ``engine``, runs in the reference engine.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from types import MappingProxyType

from .base import (
    Conversion,
    DraftEngine,
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
    """Every method, built-ins first: ``name -> SpeculationMethod``, e.g. ``registered()["ngram"].decoding_type == "NGram"``.

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


__all__ = [
    "ENTRY_POINT_GROUP", "Conversion", "DraftEngine", "MethodParams", "ReferenceWeights", "SpeculationMethod", "Training",
    "TrtllmMapping", "Weights", "add", "builtin_methods", "method_for_decoding_type", "method_named", "registered",
]
