"""Read a recipe file strictly: small, UTF-8, plain YAML with no duplicate keys and no aliases.

Recipes are a few dozen lines, so anything else is refused at once, before it can cost time or
memory: a file over :data:`MAX_RECIPE_BYTES` is not read, an alias (``*name``) is refused at its line
rather than expanded (a "billion laughs" file of 736 bytes otherwise expands to gigabytes), and a
key given twice in one mapping is an error rather than the last one silently winning.

Every problem is a :class:`RecipeFileError` whose message starts ``<file>:<line>: `` and says how to
fix it. Nothing here imports more than PyYAML.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MAX_RECIPE_BYTES = 256 * 1024  # the bundled recipes are under 4 KiB


class RecipeFileError(ValueError):
    """The file cannot be a recipe; the message names the file (and line or byte offset) and the fix."""


@dataclass(frozen=True)
class RecipeDocument:
    """A recipe file's data and the 1-based line of every key and item.

    ``lines`` maps a path of keys / indices to a line, e.g. ``{("serve", "host"): 12}``.
    """

    data: Any
    lines: dict[tuple[str | int, ...], int]


def read_recipe_text(path: Path) -> str:
    """The text of recipe file ``path``.

    Raises:
        RecipeFileError: not a regular file, larger than :data:`MAX_RECIPE_BYTES`, binary (a NUL byte)
            or not UTF-8 (the message names the first bad byte, its offset and line).
    """
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise RecipeFileError(f"{path}: is a directory, not a recipe file; give a .yaml file or a bundled recipe name")
        if size > MAX_RECIPE_BYTES:
            raise RecipeFileError(
                f"{path}: {size:,} bytes is too large for a recipe (the limit is {MAX_RECIPE_BYTES // 1024} KiB; "
                "recipes are a few dozen lines): is this the right file?"
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise RecipeFileError(f"{path}: cannot read recipe: {exc.strerror or exc}") from None
    nul = raw.find(b"\x00")
    if nul >= 0:
        line = raw.count(b"\n", 0, nul) + 1
        raise RecipeFileError(f"{path}:{line}: byte 0x00 at offset {nul}: this is a binary file, not a YAML recipe")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise RecipeFileError(
            f"{path}:{line}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} ({exc.reason}); "
            "save the recipe as UTF-8"
        ) from None


MAX_DEPTH = 32  # a recipe nests 4 levels (speculation.eagle_choices[i][j])


class _RecipeLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases at their line instead of expanding them, and nesting
    deeper than :data:`MAX_DEPTH` (PyYAML composes recursively: 5000 ``[`` would overflow the stack).

    Numbers are read as YAML 1.2 writes them, not 1.1: ``1:20:00`` (base 60, 4800 in YAML 1.1) and
    ``010`` (octal 8) stay strings, which the recipe's number fields then refuse by name."""

    depth = 0
    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def compose_node(self, parent, index):  # noqa: ANN001 (PyYAML's signature)
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise yaml.MarkedYAMLError(
                None, None,
                f"alias *{event.anchor} is not allowed in a recipe (aliases can expand a small file into gigabytes); "
                "write the value out in full",
                event.start_mark,
            )
        if self.depth >= MAX_DEPTH:
            raise yaml.MarkedYAMLError(
                None, None, f"nested more than {MAX_DEPTH} levels deep; a recipe needs 4 at most", event.start_mark,
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


_INT = re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F][0-9a-fA-F_]*|[-+]?0o[0-7][0-7_]*|[-+]?0b[01][01_]*)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")  # a digit always: "." and "-." stay strings
_RecipeLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_RecipeLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node).replace("_", "")
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    return sign * (int(digits[2:], 8) if digits.startswith("0o") else int(digits, 0))


_RecipeLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def parse_recipe_yaml(text: str, path: Path) -> RecipeDocument:
    """Parse recipe ``text`` (read from ``path``, for messages) into data and key lines.

    Raises:
        RecipeFileError: invalid YAML, an alias, or a key given twice in one mapping (both lines named).
    """
    stream = io.StringIO(text)
    stream.name = str(path)
    loader = _RecipeLoader(stream)
    try:
        node = loader.get_single_node()
        if node is None:
            return RecipeDocument(data=None, lines={})
        _refuse_duplicate_keys(node, path, key_of=lambda key: _key_value(loader, key))
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise RecipeFileError(f"{path}{line}: invalid YAML: {exc}") from None
    except (ValueError, OverflowError) as exc:  # a scalar its resolver took for a number that does not convert
        raise RecipeFileError(f"{path}: invalid YAML: {exc}; quote the value") from None
    finally:
        loader.dispose()
    return RecipeDocument(data=data, lines=_node_lines(node))


def _key_value(loader: yaml.SafeLoader, key: yaml.Node) -> Any:
    """A mapping key as Python will hold it (``1``, ``01`` and ``true`` are one dict key), else its text."""
    if isinstance(key, yaml.ScalarNode):
        try:
            value = loader.construct_object(key)
            hash(value)
            return value
        except (yaml.YAMLError, TypeError, ValueError):
            pass
    return str(key.value)


def _refuse_duplicate_keys(node: yaml.Node, path: Path, where: tuple = (), *, key_of=lambda key: str(key.value)) -> None:
    if isinstance(node, yaml.MappingNode):
        first: dict[Any, tuple[int, str]] = {}
        for key, value in node.value:
            name, line, same = str(key.value), key.start_mark.line + 1, key_of(key)
            if same in first:
                field = ".".join(str(p) for p in (*where, name))
                earlier_line, earlier = first[same]
                also = "" if earlier == name else f" as {earlier!r} (the same key once read)"
                raise RecipeFileError(
                    f"{path}:{line}: {field}: given twice (first at line {earlier_line}{also}); keep one of them"
                )
            first[same] = (line, name)
            _refuse_duplicate_keys(value, path, (*where, name), key_of=key_of)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, path, (*where, i), key_of=key_of)


def _node_lines(node: yaml.Node, prefix: tuple = ()) -> dict[tuple, int]:
    lines = {prefix: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            lines[prefix + (key.value,)] = key.start_mark.line + 1
            lines.update({k: v for k, v in _node_lines(value, prefix + (key.value,)).items() if k != prefix + (key.value,)})
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_node_lines(item, prefix + (i,)))
    return lines
