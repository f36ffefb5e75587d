"""``specbuild migrate``: engine-path recipes (TensorRT-LLM <= 1.2) rewritten for the PyTorch path, whose
1.3 and 1.4 plans pass those lines' llm_args checks (tests/upstream_trtllm.py); and ``plan`` names the
replacement when an engine-path recipe is planned for 1.3 or later."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from specbuild.builder.migrate import migrate
from specbuild.builder.recipe import RecipeError, load_recipe
from specbuild.builder.trtllm_plan import plan_for, with_trtllm_version
from upstream_trtllm import check_speculative_config

EXPECTED = {
    "llama-eagle": {"method": "eagle3", "eagle_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "max_draft_len": 4, "use_dynamic_tree": True,
                    "dynamic_tree_max_topK": 10, "max_total_draft_tokens": 40},
    "llama-medusa": {"method": "eagle3", "eagle_model": "./eagle3-head-vicuna-7b-v1.3", "max_draft_len": 4},
    "llama-lookahead": {"method": "ngram", "max_draft_len": 6, "max_matching_ngram_size": 3},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_migrated_recipes_plan_and_pass_the_1_3_and_1_4_checks(name, tmp_path):
    out = tmp_path / f"{name}-pytorch.yaml"
    cli = subprocess.run([sys.executable, "-m", "specbuild.cli", "migrate", name, "-o", str(out)], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    written = yaml.safe_load(out.read_text())
    assert written["speculation"] == EXPECTED[name] and written["build"]["backend"] == "pytorch"
    assert written["build"]["trtllm_version"] == "1.3.0" and written["target"] == yaml.safe_load(
        load_recipe(name).path.read_text())["target"]
    loaded = load_recipe(str(out))
    for version in ("1.3.0", "1.4.0"):
        plan = plan_for(with_trtllm_version(loaded, version), tmp_path / version)
        config = yaml.safe_load(plan.files[0].text)["speculative_config"]
        assert check_speculative_config(config, version) == [], (version, config)
    assert "note:" in cli.stdout and f"specbuild plan {out}" in cli.stdout


def test_named_head_and_refusals(tmp_path):
    migration = migrate(load_recipe("llama-medusa"), eagle_model="org/vicuna-eagle3", version="1.4.0")
    assert migration.recipe["speculation"]["eagle_model"] == "org/vicuna-eagle3" and migration.recipe["build"]["trtllm_version"] == "1.4.0"
    with pytest.raises(RecipeError, match="build.backend is 'pytorch'; migrate moves engine-path"):
        migrate(load_recipe("llama-eagle3"))


@pytest.mark.parametrize(("name", "replacement"), [("llama-eagle", "EAGLE-3 \\(method eagle3\\) with a head to name or train"),
                                                   ("llama-medusa", "EAGLE-3"), ("llama-lookahead", "n-gram \\(method ngram\\) or suffix automaton")])
def test_plan_for_1_3_names_the_replacement_and_migrate(name, replacement, tmp_path):
    with pytest.raises(RecipeError, match=rf"needs TensorRT-LLM <= 1.2.x .*1.3.0.*tritonserver:26.04-trtllm-python-py3.*{replacement}.*"
                                          r"specbuild migrate RECIPE -o NEW.yaml") as info:
        plan_for(with_trtllm_version(load_recipe(name), "1.3.0"), tmp_path)
    assert "<yy.mm>" not in str(info.value) and "not available for method" not in str(info.value)


def test_the_migrated_description_names_what_runs_now_and_plan_warns_of_a_missing_local_head(tmp_path):
    """nc3 item 10: the description kept the old EAGLE head and engine path; a head path that does not
    exist passed `plan` without a word."""
    from specbuild.builder.recipe import recipe_warnings

    eagle = migrate(load_recipe("llama-eagle")).recipe["description"]
    assert eagle.startswith("meta-llama/Llama-3.1-8B-Instruct + EAGLE-3 head (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B), TensorRT-LLM PyTorch path")
    assert "EAGLE-LLaMA3.1-Instruct-8B" not in eagle and eagle.endswith("migrated from llama-eagle (eagle, engine path)")
    out = tmp_path / "vicuna.yaml"
    out.write_text(migrate(load_recipe("llama-medusa")).yaml_text(load_recipe("llama-medusa").path))
    own = lambda loaded: [w for w in recipe_warnings(loaded) if "serve.host" not in w]  # noqa: E731 - not the container's 0.0.0.0 note
    (warning,) = own(load_recipe(str(out)))
    head = tmp_path / "eagle3-head-vicuna-7b-v1.3"
    assert warning.startswith(f"{out}:") and f"speculation.eagle_model: {head} does not exist" in warning
    assert "hf download" in warning and "train" in warning
    head.mkdir()  # once it is there, no warning
    assert own(load_recipe(str(out))) == []
    assert own(load_recipe("llama-eagle3")) == []  # Hugging Face ids: the plan downloads them
