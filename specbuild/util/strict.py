"""The base of every recipe model: unknown keys refused, frozen, and no booleans where numbers go.

pydantic's lax mode reads ``true`` as ``1`` for an ``int`` field, so ``http_port: true`` would become
port 1; YAML also reads ``yes``, ``no``, ``on`` and ``off`` as booleans. :class:`StrictModel` refuses a
boolean for any field whose type has no ``bool`` in it, and leaves everything else to pydantic.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class FieldProblem(ValueError):
    """A cross-field problem that belongs to one field: ``loc`` is that field's path relative to the
    model that raises it (e.g. ``("max_draft_len",)``), so the error points at that key's own line."""

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


class StrictModel(BaseModel):
    """``extra="forbid"``, frozen, and booleans refused for number fields (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_for_number(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            field = cls.model_fields.get(name) if isinstance(name, str) else None
            problem = None if field is None else _wrong_scalar(field.annotation, value)
            if problem is not None:
                raise FieldProblem((name,), problem)
        return data


def _wrong_scalar(annotation: Any, value: Any) -> str | None:
    """Why ``value`` may not stand for ``annotation`` although pydantic's lax mode would convert it: a
    boolean for a number (``true`` -> 1), a string for a number (``"8000"``) or for a boolean
    (``"yes"`` -> true); looked for in dict keys and values and list items too. None: fine (pydantic
    checks the rest)."""
    args = _args(annotation)
    if isinstance(value, bool):
        if _is_number(annotation) and not _allows_bool(annotation):
            return (f"expected a number, got the boolean {str(value).lower()} (YAML reads true/false/yes/no/on/off "
                    "as booleans); write a number")
        return None
    if isinstance(value, str):
        if str in args or any(typing.get_origin(a) is typing.Literal for a in args):
            return None
        if _is_number(annotation):
            if re.fullmatch(r"[-+]?0[0-9_]+|[-+]?[0-9][0-9_]*(:[0-9_.]+)+", value):
                return (f"expected a number, got {value!r}: a leading 0 or a ':' is not a decimal number "
                        "(YAML 1.1 reads 010 as octal 8 and 1:20 as base-60 80); write it in plain decimal digits")
            return f"expected a number, got the string {value!r}; write the number without quotes"
        if _allows_bool(annotation):
            return f"expected true or false, got the string {value!r}; write true or false without quotes"
        return None
    for arg in args:
        origin = typing.get_origin(arg)
        if origin is dict and isinstance(value, dict):
            key_type, value_type = typing.get_args(arg) or (Any, Any)
            for key, item in value.items():
                problem = _wrong_scalar(key_type, key) or _wrong_scalar(value_type, item)
                if problem is not None:
                    return f"{key}: {problem}"
        elif origin in (list, tuple) and isinstance(value, (list, tuple)):
            item_types = typing.get_args(arg)
            for k, item in enumerate(value):
                item_type = item_types[0] if origin is list or (len(item_types) == 2 and item_types[1] is Ellipsis) else (
                    item_types[k] if k < len(item_types) else Any)
                problem = _wrong_scalar(item_type, item)
                if problem is not None:
                    return f"item {k}: {problem}"
    return None


def _args(annotation: Any) -> tuple[Any, ...]:
    """The members of a union (``int | None`` -> ``(int, NoneType)``), else ``(annotation,)``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return _args(typing.get_args(annotation)[0])
    return (annotation,)


def _is_number(annotation: Any) -> bool:
    return any(arg in (int, float) for arg in _args(annotation))


def _allows_bool(annotation: Any) -> bool:
    return any(arg is bool for arg in _args(annotation))
