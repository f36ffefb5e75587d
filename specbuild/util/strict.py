"""The base of every recipe model: unknown keys refused, frozen, and no booleans where numbers go.

pydantic's lax mode reads ``true`` as ``1`` for an ``int`` field, so ``http_port: true`` would become
port 1; YAML also reads ``yes``, ``no``, ``on`` and ``off`` as booleans. :class:`StrictModel` refuses a
boolean for any field whose type has no ``bool`` in it, and leaves everything else to pydantic.
"""

from __future__ import annotations

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
            if isinstance(value, bool) and field is not None and _is_number(field.annotation) and not _allows_bool(field.annotation):
                raise FieldProblem(
                    (name,),
                    f"expected a number, got the boolean {str(value).lower()} (YAML reads true/false/yes/no/on/off "
                    "as booleans); write a number",
                )
        return data


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
