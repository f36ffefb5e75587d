"""The method registry (``specbuild.methods``): one object per method, read by every stage.

A plugin registers a method the way the built-ins do and reaches the recipe schema, recipe validation,
the TensorRT-LLM planner's refusals and the reference engine, with a drafter of its own; the engine validates ``speculative_config``
with each method's recipe model; shared modules never branch on a method's name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from specbuild.builder.recipe import Speculation, load_recipe
from specbuild.methods import reference_methods
from specbuild.methods import SpeculationMethod, TrtllmMapping, add, builtin_methods, registered
from toy_method import METHOD as TOY
from toy_method import ToySpeculation

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

# Run with a plugin distribution on sys.path: its entry point names tests/toy_method/'s METHOD.
PLUGIN_RUN = r"""
import json, sys
from pathlib import Path

from specbuild.builder.recipe import RecipeError, parse_recipe
from specbuild.builder.schema_docs import recipe_schema, render_reference
from specbuild.builder.trtllm_plan import plan_tensorrt
from specbuild.engine import GenerationRequest
from specbuild.runtime import EngineLimits, ReferenceEngine
from specbuild.methods import registered

tmp, checkpoint = Path(sys.argv[1]), sys.argv[2]
report = {"methods": list(registered())}
schema = recipe_schema()
report["in_schema"] = "toy" in schema["properties"]["speculation"]["discriminator"]["mapping"]
report["in_reference"] = "## ToySpeculation" in render_reference(schema)


def recipe(speculation, backend="reference"):
    text = f"name: toy\ntarget: {{checkpoint: {checkpoint}}}\nspeculation: {speculation}\nbuild: {{backend: {backend}}}\n"
    return parse_recipe(text, tmp / "r.yaml")


def refusal(call):
    try:
        call()
    except RecipeError as exc:
        return str(exc)
    return None


loaded = recipe("{method: toy, max_draft_len: 3}")
report["settings"] = type(loaded.recipe.speculation).__name__
report["decoding_type_spelling"] = recipe("{method: Toy}").recipe.speculation.method
report["bad_value"] = refusal(lambda: recipe("{method: toy, repeats_of: middle}"))
report["unknown_key"] = refusal(lambda: recipe("{method: toy, repeat: 2}"))
report["tensorrt"] = refusal(lambda: plan_tensorrt(recipe("{method: toy}", backend="tensorrt"), tmp / "out"))
engine = ReferenceEngine.from_pretrained(
    checkpoint, speculative_config=loaded.recipe.speculation.to_llm_api(), limits=EngineLimits(3, 64, 160, 3)
)
prompts = [[5, 6, 7, 7, 7, 8], [9, 9, 4], [11, 12, 13, 11, 12]]
plain = [engine.generate(GenerationRequest(input_ids=p, max_tokens=16, num_draft_tokens=0)).output_ids for p in prompts]
spec = engine.generate(GenerationRequest(input_ids=prompts[0], max_tokens=16))
from specbuild.engine.scheduler import Scheduler
from specbuild.engine.stream import collect
from toy_method.engine import RepeatDrafter

with Scheduler(engine, max_batch_size=3) as scheduler:
    together = [collect(s) for s in [scheduler.stream(GenerationRequest(input_ids=p, max_tokens=16)) for p in prompts]]
report["engine"] = {"same_as_plain": spec.output_ids == plain[0] and [r.output_ids for r in together] == plain,
                    "drafted": spec.total_draft_tokens, "drafter": type(engine.prepare(GenerationRequest(prompts[0], 4)).drafter).__name__,
                    "batch_calls": RepeatDrafter.batch_calls}
print(json.dumps(report))
"""


def _plugin_distribution(root: Path) -> Path:
    """A distribution as pip installs one (``toy_plugin-0.1.dist-info``) declaring the toy method."""
    dist = root / "toy_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[specbuild.methods]\ntoy = toy_method:METHOD\n")
    return root


def test_a_plugin_method_reaches_the_schema_the_recipe_the_planner_and_the_engine(tiny_checkpoint, tmp_path):
    site = _plugin_distribution(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", PLUGIN_RUN, str(tmp_path), str(tiny_checkpoint)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["methods"] == [m.name for m in builtin_methods()] + ["toy"]  # built-ins first, then plugins
    assert report["in_schema"] and report["in_reference"]
    assert report["settings"] == "ToySpeculation" and report["decoding_type_spelling"] == "toy"
    assert re.search(r"r.yaml:\d+: speculation.repeats_of: Input should be 'last' or 'first'", report["bad_value"])
    assert re.search(r"speculation.repeat: unknown key \(did you mean 'repeats_of'\?\); allowed keys here: max_draft_len, "
                     r"method, repeats_of", report["unknown_key"])
    assert "method 'toy' is not available on build.backend 'tensorrt': TensorRT-LLM has no toy method" in report["tensorrt"]
    # the plugin's own drafter runs, alone and in batches through its own group call, and changes no output
    assert report["engine"]["same_as_plain"] and report["engine"]["drafted"] > 0
    assert report["engine"]["drafter"] == "RepeatDrafter" and report["engine"]["batch_calls"] > 0


def test_a_plugin_is_not_registered_unless_installed():
    assert "toy" not in registered()


# One valid recipe section per method the reference engine runs: a new method adds its line here.
EXAMPLES = {
    "ngram": {"max_draft_len": 3, "max_matching_ngram_size": 2, "is_use_oldest": False},
    "draft_target": {"draft_checkpoint": "/w", "max_draft_len": 3},
    "lookahead": {"max_window_size": 3, "max_ngram_size": 3, "max_verification_set_size": 2},
    "medusa": {"medusa_model": "/w", "num_medusa_heads": 3, "medusa_choices": [[0], [0, 0], [1]]},
    "eagle": {"eagle_model": "/w", "max_draft_len": 6, "num_eagle_layers": 2, "eagle_choices": [[0], [0, 0], [1]]},
    "eagle3": {"eagle_model": "/w", "max_draft_len": 2, "eagle3_one_model": False},
    "sa": {"max_draft_len": 3, "max_matching_ngram_size": 2, "enable_global_pool": True, "global_pool_size": 8},
}


@pytest.mark.parametrize("decoding_type", sorted(reference_methods()))
def test_the_engine_validates_speculative_config_with_the_recipes_model(decoding_type):
    """The engine directory's speculative_config (the recipe's to_llm_api, paths left out) parses back, with
    the method's recipe model, to the recipe's settings, the weights now inside the engine directory."""
    method = reference_methods()[decoding_type]
    recipe_spec = method.params.model_validate({"method": method.name, **EXAMPLES[method.name]})
    written = {k: v for k, v in recipe_spec.to_llm_api().items() if k != "speculative_model_dir"}
    engine_spec = method.parse_speculative_config(written, base_dir=Path("/engine"))
    assert type(engine_spec) is method.params is type(recipe_spec)
    moved = {}
    if method.weights is not None:
        assert getattr(engine_spec, method.weights.field) == str(Path("/engine") / method.weights.reference.subdir)
        moved = {method.weights.field: "/w"}
    assert engine_spec.model_copy(update=moved) == recipe_spec


def test_every_method_the_engine_runs_has_an_example():
    assert {m.name for m in reference_methods().values()} == set(EXAMPLES)


def test_the_recipe_union_is_the_registry():
    union = typing.get_args(typing.get_args(Speculation)[0])
    assert union == tuple(m.params for m in registered().values())
    loaded = load_recipe("smollm2-medusa")
    assert type(loaded.recipe.speculation) is registered()["medusa"].params
    assert loaded.recipe.speculation.definition is registered()["medusa"]


def test_unknown_speculative_config_keys_are_listed_with_the_allowed_ones():
    message = (r"^unknown Eagle3 speculative_config keys \['b', 'c'\]; allowed: \['decoding_type', 'dynamic_tree_max_topK', "
               r"'eagle3_one_model', 'greedy_sampling', 'max_draft_len', 'max_total_draft_tokens', 'sa_config', "
               r"'speculative_model_dir', 'use_dynamic_tree', 'use_rejection_sampling'\] \(the reference engine drafts EAGLE-3 as a chain or, with "
               r"use_dynamic_tree, EAGLE-2's dynamic tree\)$")
    with pytest.raises(ValueError, match=message):
        registered()["eagle3"].parse_speculative_config({"decoding_type": "Eagle3", "c": 2, "b": 3, "speculative_model_dir": "h"})


def test_one_directory_given_twice_is_refused():
    with pytest.raises(ValueError, match=r"gives \['medusa_model', 'speculative_model_dir'\]: .* keep one"):
        registered()["medusa"].parse_speculative_config({"speculative_model_dir": "a", "medusa_model": "b"})


def test_the_registry_refuses_clashes():
    found = dict(registered())
    with pytest.raises(ValueError, match=r"plugin x: speculation method 'ngram' is already registered"):
        add(found, registered()["ngram"], "plugin x")
    with pytest.raises(ValueError, match=r"decoding_type 'NGram' of 'toy' is already 'ngram''s"):
        add(found, dataclasses.replace(TOY, trtllm=TrtllmMapping(decoding_type="NGram")), "plugin y")
    with pytest.raises(TypeError, match="must name a SpeculationMethod, got dict"):
        add(found, {"name": "toy"}, "plugin z")
    add(found, TOY, "plugin toy")
    assert found["toy"] is TOY


def test_a_method_is_checked_when_it_is_made():
    with pytest.raises(ValueError, match=r"ToySpeculation.method must be Literal\['other'\]"):
        SpeculationMethod(name="other", title="other", params=ToySpeculation, trtllm=TrtllmMapping(decoding_type="Other"))
    with pytest.raises(ValueError, match="names it by decoding_type"):
        dataclasses.replace(TOY, trtllm=TrtllmMapping(decoding_type=None))


# Shared modules read the method object; none of them compares a method's name (``spec.method == "eagle"``,
# ``method in ("medusa", "eagle")``, ``decoding_type == "Eagle3"``).
SHARED = ["builder/recipe.py", "builder/reference.py", "builder/trtllm_plan.py", "builder/trtllm_run.py",
          "builder/trtllm_version.py", "specbuild/runtime.py", "engine/worker.py", "engine/drafters.py", "methods/__init__.py", "builder/train_stage.py",
          "builder/train_evaluate.py", "triton_repo/tensorrtllm.py", "triton_repo/models/trtllm_front.py", "specbuild/pipeline.py"]
BRANCH = re.compile(r"""\b(method|decoding_type)\s*(==|!=|in|not\s+in)\s*[(\[{"']""")


@pytest.mark.parametrize("path", SHARED)
def test_shared_modules_do_not_branch_on_method_names(path):
    assert [line.strip() for line in (ROOT / path).read_text().splitlines() if BRANCH.search(line)] == []
