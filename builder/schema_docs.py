"""The recipe's JSON Schema and its field reference, both generated from the pydantic models.

``docs/recipe.schema.json`` is :func:`recipe_schema` (``Recipe.model_json_schema()``) and
``docs/recipe-reference.md`` is :func:`render_reference` of it, so the published reference cannot drift
from the validator; ``tests/test_recipe_schema.py`` fails when the committed files are stale.
Regenerate both after changing a model in :mod:`specbuild.builder.recipe` or a method's settings in
:mod:`specbuild.methods` (from the repository root)::

    python -m specbuild.builder.schema_docs docs

Torch-free, like the recipe module itself.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SCHEMA_FILE = "recipe.schema.json"
REFERENCE_FILE = "recipe-reference.md"
SCHEMA_ID = "https://specbuild.dev/recipe.schema.json"  # a name, not fetched by anything here
CONSTRAINTS = {  # JSON Schema keyword -> how the reference writes it
    "minimum": ">= {}",
    "exclusiveMinimum": "> {}",
    "maximum": "<= {}",
    "exclusiveMaximum": "< {}",
    "minLength": "at least {} character(s)",
    "pattern": "matches `{}`",
    "minItems": "at least {} items",
}


def recipe_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a recipe file, as the validator sees it (mode "validation").

    Example: ``recipe_schema()["properties"]["speculation"]["discriminator"]["propertyName"] == "method"``.
    """
    from .recipe import Recipe

    schema = Recipe.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


def schema_text(schema: dict[str, Any]) -> str:
    """``schema`` as the committed file holds it: two-space indents, keys in model order, final newline."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def render_reference(schema: dict[str, Any]) -> str:
    """A Markdown field reference of ``schema``: the top-level sections, then one table per model.

    Each table row gives a field's name, type, default (``required`` when it has none), constraints and
    description. Models are listed in the order the top level and the speculation union reach them.
    """
    defs = schema.get("$defs", {})
    lines = [
        "# Recipe field reference",
        "",
        "Generated from the pydantic models in `builder/recipe.py` and `methods/` (their JSON Schema, "
        f"[`{SCHEMA_FILE}`]({SCHEMA_FILE})); do not edit by hand. Regenerate with "
        "`python -m specbuild.builder.schema_docs docs` from the repository root.",
        "",
        "Unknown keys are refused everywhere. `speculation` is chosen by its `method`: "
        + ", ".join(f"[`{m}`](#{_anchor(name)})" for m, name in _union_members(schema["properties"]["speculation"]))
        + ".",
        "",
    ]
    lines += _model_section("Recipe", schema, defs)
    for name in _reachable(schema, defs):
        lines += _model_section(name, defs[name], defs)
    return "\n".join(lines).rstrip() + "\n"


def _union_members(prop: dict[str, Any]) -> list[tuple[str, str]]:
    """``(method, model name)`` of a discriminated union, in the discriminator mapping's order."""
    mapping = prop.get("discriminator", {}).get("mapping", {})
    return [(method, ref.rsplit("/", 1)[-1]) for method, ref in mapping.items()]


def _refs(node: Any) -> list[str]:
    """Model names ``node`` refers to, in order of appearance."""
    if isinstance(node, dict):
        found = [node["$ref"].rsplit("/", 1)[-1]] if "$ref" in node else []
        return found + [r for key, value in node.items() if key != "discriminator" for r in _refs(value)]
    if isinstance(node, list):
        return [r for item in node for r in _refs(item)]
    return []


def _reachable(schema: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    """Every model reachable from the top level, breadth first (so sections follow the recipe's order)."""
    order: list[str] = []
    queue = _refs(schema.get("properties", {}))
    while queue:
        name = queue.pop(0)
        if name not in order and name in defs:
            order.append(name)
            queue += _refs(defs[name].get("properties", {}))
    return order


EXAMPLE_RECIPE = "smollm2-ngram"
"""The top level's example in recipe-reference.md: this bundled recipe (the quick start's), verbatim."""


def _anchor(name: str) -> str:
    return name.lower()


def _model_section(name: str, model: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    title = "Recipe (the top level)" if name == "Recipe" else name
    lines = [f"## {title}" if name == "Recipe" else f'<a id="{_anchor(name)}"></a>\n## {title}', ""]
    if model.get("description"):
        lines += [_one_paragraph(model["description"]), ""]
    if name == "Recipe":
        from specbuild.builder.recipe import bundled_recipes

        lines += ["```yaml", bundled_recipes()[EXAMPLE_RECIPE].read_text().rstrip(), "```", ""]
    required = set(model.get("required", []))
    properties = model.get("properties", {})
    described = any(prop.get("description") for prop in properties.values())
    header = ["field", "type", "default", "constraints"] + (["description"] if described else [])
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for field, prop in properties.items():
        default = "required" if field in required else _default(prop)
        cells = [f"`{field}`", _type(prop, defs), default, _constraints(prop)]
        cells += [_one_paragraph(prop.get("description", ""))] if described else []
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return lines + [""]


def _one_paragraph(text: str) -> str:
    return " ".join(text.split())


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return ""
    value = prop["default"]
    return f"`{json.dumps(value)}`" if not isinstance(value, dict) or len(json.dumps(value)) <= 40 else "(see the section)"


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    """A short type: ``integer``, ``"a" \\| "b"``, ``list of list of integer``, a link to a model, ..."""
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    if "const" in prop:
        return f'`"{prop["const"]}"`' if isinstance(prop["const"], str) else f"`{prop['const']}`"
    if "enum" in prop:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in prop:
            return " or ".join(_type(option, defs) for option in prop[key])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs)}"
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"map to {_type(prop['additionalProperties'], defs)}"
    return kind


def _constraints(prop: dict[str, Any]) -> str:
    """E.g. ``>= 1; <= 64``; for a list (of lists) of numbers the numbers' own: ``each entry >= 0``."""
    found = [text.format(prop[key]) for key, text in CONSTRAINTS.items() if key in prop]
    for key in ("anyOf", "oneOf"):
        found += [c for option in prop.get(key, []) if (c := _constraints(option))]
    leaf = prop
    while isinstance(leaf.get("items"), dict):
        leaf = leaf["items"]
    if leaf is not prop and (inner := _constraints(leaf)):
        found.append(f"each entry {inner}")
    return "; ".join(found)


def write_docs(out_dir: Path) -> tuple[Path, Path]:
    """Write the schema and the reference into ``out_dir`` (created); returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    schema = recipe_schema()
    schema_path, reference_path = out_dir / SCHEMA_FILE, out_dir / REFERENCE_FILE
    schema_path.write_text(schema_text(schema), encoding="utf-8")
    reference_path.write_text(render_reference(schema), encoding="utf-8")
    return schema_path, reference_path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write docs/recipe.schema.json and docs/recipe-reference.md.")
    parser.add_argument("out_dir", type=Path, nargs="?", default=Path("docs"), help="where to write them (default: docs)")
    for path in write_docs(parser.parse_args(argv).out_dir):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
