"""Read an installed TensorRT-LLM's Python sources without importing it (importing needs a GPU's
driver library): locate the package with ``importlib.util.find_spec`` and parse files with ``ast``.

Used by tests/test_trtllm_source.py (``pytest -m trtllm_source``); the readers are tested on small
source texts in both layouts the LLM API has had (tests/test_trtllm_source.py too).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Callable


def package_dir() -> Path | None:
    """The installed ``tensorrt_llm`` package directory, or ``None``; nothing is imported."""
    spec = importlib.util.find_spec("tensorrt_llm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _is_classvar(annotation: ast.expr) -> bool:
    return "ClassVar" in ast.unparse(annotation)


def _annotated(source: str, name: str):
    """The ``name: type [= value]`` statements of class ``name`` and of its bases defined in the same module."""
    classes = _classes(ast.parse(source))
    todo = [name]
    while todo:
        cls = classes.get(todo.pop())
        if cls is None:
            continue
        yield from (n for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
        todo += [b.id for b in cls.bases if isinstance(b, ast.Name)]


def class_fields(source: str, name: str) -> set[str]:
    """The annotated fields of class ``name`` and of its bases defined in the same module
    (pydantic / dataclass fields: no ``ClassVar``, no ``_private``), ``decoding_type`` excluded."""
    fields = {n.target.id for n in _annotated(source, name)
              if not n.target.id.startswith("_") and not _is_classvar(n.annotation)}
    return fields - {"decoding_type"}


def _alias_names(call: ast.expr) -> list[str]:
    """The names in ``alias="x"`` / ``validation_alias="x"`` / ``validation_alias=AliasChoices("a", "b")``
    of a ``Field(...)`` call."""
    if not isinstance(call, ast.Call):
        return []
    names = []
    for kw in call.keywords:
        if kw.arg not in ("alias", "validation_alias"):
            continue
        if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
            names.append(kw.value.value)
        elif isinstance(kw.value, ast.Call):
            names += [a.value for a in kw.value.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return names


def class_aliases(source: str, name: str) -> dict[str, str]:
    """Validation alias -> field name for class ``name`` and its same-module bases: the names pydantic
    accepts in a field's place (``speculative_model_dir`` -> ``speculative_model``). A field's own
    name, which ``AliasChoices`` usually repeats, is not an alias."""
    aliases: dict[str, str] = {}
    for node in _annotated(source, name):
        if node.value is not None:
            aliases.update({a: node.target.id for a in _alias_names(node.value) if a != node.target.id})
    return aliases


def accepted_keys(source: str, name: str) -> set[str]:
    """The YAML keys class ``name`` accepts: its fields and their validation aliases."""
    return class_fields(source, name) | set(class_aliases(source, name))


def class_members(source: str, name: str) -> set[str]:
    """:func:`class_fields` plus the class's methods and properties (e.g. a ``token_ids`` property)."""
    cls = _classes(ast.parse(source)).get(name)
    methods = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))} if cls is not None else set()
    return class_fields(source, name) | methods


def decoding_registry(source: str) -> dict[str, str]:
    """``decoding_type`` value -> config class name, from ``llm_args.py``: the 1.2 line's
    ``DecodingBaseConfig.from_dict`` ``config_classes`` dict, or the later per-class
    ``decoding_type: Literal["X"]`` fields."""
    tree = ast.parse(source)
    registry: dict[str, str] = {}
    base = _classes(tree).get("DecodingBaseConfig")
    for node in ast.walk(base) if base is not None else ():
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "config_classes" for t in node.targets):
            if isinstance(node.value, ast.Dict):
                registry.update({k.value: v.id for k, v in zip(node.value.keys, node.value.values)
                                 if isinstance(k, ast.Constant) and isinstance(v, ast.Name)})
    for cls in _classes(tree).values():
        for node in cls.body:
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "decoding_type"
                    and isinstance(node.annotation, ast.Subscript) and ast.unparse(node.annotation.value).endswith("Literal")):
                value = node.annotation.slice
                if isinstance(value, ast.Constant):
                    registry.setdefault(value.value, cls.name)
    return registry


def draft_len_schedule_validator(source: str) -> Callable[[dict, int | None], dict] | None:
    """``DecodingBaseConfig.validate_draft_len_schedule_and_sort`` from ``llm_args.py`` as a plain
    function ``(schedule, max_draft_len) -> sorted schedule`` (raises ValueError as TensorRT-LLM
    does), or ``None`` when the version has no such validator. Only that function's body runs: its
    decorators are dropped and ``info.data`` carries ``max_draft_len``."""
    base = _classes(ast.parse(source)).get("DecodingBaseConfig")
    for node in base.body if base is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == "validate_draft_len_schedule_and_sort":
            node.decorator_list = []
            namespace: dict = {}
            exec(compile(ast.Module(body=[node], type_ignores=[]), "llm_args.py", "exec"), namespace)  # noqa: S102
            fn = namespace[node.name]
            return lambda schedule, max_draft_len: fn(None, dict(schedule), SimpleNamespace(data={"max_draft_len": max_draft_len}))
    return None


def read(relative: str) -> str:
    """The text of ``tensorrt_llm/<relative>`` in the installed package."""
    root = package_dir()
    assert root is not None
    return (root / relative).read_text()


__all__ = ["accepted_keys", "class_aliases", "class_fields", "class_members", "decoding_registry", "draft_len_schedule_validator", "package_dir", "read"]
