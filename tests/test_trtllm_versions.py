"""The TensorRT-LLM lines a PyTorch-path plan is written for: 1.2.1, the 1.3 line and the 1.4 line.

Every plan's ``speculative_config`` is checked against that line's own ``llm_args.py`` names
(tests/upstream_trtllm.py, ``LINE_SOURCES``: the 1.2 registry; NVIDIA/TensorRT-LLM main at 0004396
and the 1.3.0rc27 API reference for 1.3; the 1.4.0rc1 and 1.4.0rc4 API references for 1.4), for
every bundled llama recipe (the engine-path ones through ``specbuild migrate`` from 1.3 on) and
every decoding type a recipe can ask for.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from specbuild.builder.recipe import RecipeError, load_recipe, parse_recipe
from specbuild.builder.reference import check_reference_speculation
from specbuild.builder.trtllm_plan import ALLOW_UNVERIFIED_ENV, plan_for, with_trtllm_version
from specbuild.builder.trtllm_version import DECODING_TYPE_SINCE, NEWEST_VERIFIED_LINE, llm_api_config, parse_version
from specbuild.builder.migrate import migrate
from upstream_trtllm import LINE_SOURCES, LINES, REMOVED_IN_1_4, check_speculative_config, llm_api_line

VERSIONS = ("1.2.1", "1.3.0", "1.4.0")
RECIPES = tuple(sorted(p.stem for p in (Path(__file__).parents[1] / "recipes").glob("llama-*.yaml")))
TARGET = "target: {checkpoint: meta-llama/Llama-3.1-8B-Instruct, dtype: bfloat16}\n"
# one speculation per decoding type a recipe can ask for on the PyTorch path
SPECULATIONS = {
    "NGram": "{method: ngram, max_draft_len: 4}",
    "Eagle3 chain": "{method: eagle3, eagle_model: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, max_draft_len: 3}",
    "Eagle3 dynamic tree": "{method: eagle3, eagle_model: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, max_draft_len: 4, "
                           "use_dynamic_tree: true, dynamic_tree_max_topK: 8, max_total_draft_tokens: 24}",
    "Draft_Target": "{method: draft_target, draft_checkpoint: meta-llama/Llama-3.2-1B-Instruct, max_draft_len: 4}",
    "MTP": "{method: mtp, num_nextn_predict_layers: 1}",
}


def _config(loaded, version: str, tmp_path: Path) -> dict:
    plan = plan_for(with_trtllm_version(loaded, version), tmp_path)
    configs = [yaml.safe_load(f.text)["speculative_config"] for f in plan.files]
    assert configs[0] == (yaml.safe_load(plan.files[1].text)["speculative_config"])  # trtllm-serve's and Triton's agree
    return configs[0]


def test_the_recipe_list_is_every_llama_recipe():
    assert {"llama-eagle3", "llama-ngram", "llama-eagle", "llama-medusa", "llama-lookahead"} <= set(RECIPES)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", RECIPES)
def test_every_llama_recipe_passes_its_versions_llm_args(name, version, tmp_path):
    """A PyTorch-path recipe is planned as it is; an engine-path recipe is planned for the PyTorch
    path where the version has no engine path (1.3 on: ``specbuild migrate``'s recipe), and on
    1.2.1 its migrated recipe is planned too, so every llama recipe's LLM-API YAML meets every line."""
    loaded = load_recipe(name)
    if loaded.recipe.build.backend == "tensorrt":
        migration = migrate(loaded, eagle_model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", version=version)
        out = tmp_path / f"{name}-pytorch.yaml"
        out.write_text(yaml.safe_dump(migration.recipe, sort_keys=False))
        loaded = load_recipe(str(out))
    config = _config(loaded, version, tmp_path)
    assert check_speculative_config(config, version) == [], (LINE_SOURCES[llm_api_line(version)], config)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", sorted(SPECULATIONS))
def test_every_decoding_type_passes_its_versions_llm_args(kind, version, tmp_path):
    text = f"name: t\n{TARGET}speculation: {SPECULATIONS[kind]}\nbuild: {{backend: pytorch}}\n"
    config = _config(parse_recipe(text, Path("t.yaml")), version, tmp_path)
    assert check_speculative_config(config, version) == [], config


def test_eagle3_on_1_4_carries_no_removed_field_and_names_the_model_by_its_field(tmp_path):
    config = _config(load_recipe("llama-eagle3"), "1.4.0", tmp_path)
    assert not set(config) & REMOVED_IN_1_4 and config["decoding_type"] == "Eagle3"
    assert "speculative_model" in config and "speculative_model_dir" not in config
    old = _config(load_recipe("llama-eagle3"), "1.2.1", tmp_path)
    assert old["decoding_type"] == "Eagle" and old["eagle3_one_model"] is True and "speculative_model_dir" in old
    for name in sorted(REMOVED_IN_1_4):
        assert check_speculative_config({**config, name: None}, "1.4.0") == [f"Eagle3: {name!r} was removed in the 1.4 line"]
    assert {"eagle3_one_model", "eagle_choices", "greedy_sampling", "posterior_threshold"} <= REMOVED_IN_1_4


def test_eagle3_on_1_3_leaves_out_eagle3_one_model_which_1_3_0rc27_has_not(tmp_path):
    """The 1.3.0rc27 reference's Eagle3DecodingConfig has no eagle3_one_model (main at 0004396 still
    had it, ignoring False): a 1.3 plan that wrote it would fail ``extra = "forbid"`` there."""
    config = _config(load_recipe("llama-eagle3"), "1.3.0", tmp_path)
    assert config["decoding_type"] == "Eagle3" and "eagle3_one_model" not in config
    assert check_speculative_config({**config, "eagle3_one_model": True}, "1.3.0") == ["Eagle3: unknown field 'eagle3_one_model'"]


def test_dynamic_tree_fields_are_checked_as_tensorrt_llm_checks_them():
    with pytest.raises(RecipeError, match="needs dynamic_tree_max_topK"):
        parse_recipe(f"name: t\n{TARGET}speculation: {{method: eagle3, eagle_model: e/h, use_dynamic_tree: true}}\n"
                     "build: {backend: pytorch}\n", Path("t.yaml"))
    with pytest.raises(RecipeError, match=r"max_total_draft_tokens must be in .* = \[3, 12\], got 13"):
        parse_recipe(f"name: t\n{TARGET}speculation: {{method: eagle3, eagle_model: e/h, use_dynamic_tree: true, "
                     "dynamic_tree_max_topK: 4, max_total_draft_tokens: 13}\nbuild: {backend: pytorch}\n", Path("t.yaml"))
    # the reference engine drafts the dynamic tree too (tests/test_eagle3_tree.py): no refusal there
    check_reference_speculation(parse_recipe(f"name: t\n{TARGET}speculation: {{method: eagle3, eagle_model: e/h, use_dynamic_tree: true, "
                                             "dynamic_tree_max_topK: 4}\nbuild: {backend: reference}\n", Path("t.yaml")))


def test_sa_standalone_and_as_an_enhancer_in_the_1_4_names():
    """SA (SADecodingConfig) and sa_config (SAEnhancerConfig on Eagle3, MTP, PARD), as a plan for the
    reference engine's ``sa`` method or an SA-enhanced recipe would write them."""
    sa = {"decoding_type": "SA", "max_draft_len": 4, "max_matching_ngram_size": -1, "enable_global_pool": True}
    assert check_speculative_config(sa, "1.4.0") == []
    assert check_speculative_config({"decoding_type": "SA", "max_draft_len": 4, "max_matching_ngram_size": 3}, "1.3.0") == []
    assert check_speculative_config(sa, "1.2.1") == ["Invalid decoding type: SA"]
    for decoding_type in ("Eagle3", "MTP", "PARD"):
        enhanced = {"decoding_type": decoding_type, "max_draft_len": 3, "sa_config": {"threshold": 4, "enable_global_pool": False}}
        assert check_speculative_config(enhanced, "1.4.0") == []
    assert check_speculative_config({"decoding_type": "Eagle3", "sa_config": {"window": 4}}, "1.4.0") == ["Eagle3.sa_config: unknown field 'window'"]
    assert check_speculative_config({"decoding_type": "NGram", "sa_config": {}}, "1.4.0") == ["NGram: unknown field 'sa_config'"]
    for decoding_type in ("PARD", "DFlash", "MTP", "AUTO"):
        assert check_speculative_config({"decoding_type": decoding_type, "max_draft_len": 3}, "1.4.0") == []


@pytest.mark.parametrize("line", sorted(LINES))
def test_decoding_types_specbuild_knows_by_line_agree_with_the_test_data(line):
    """builder/trtllm_version.py's DECODING_TYPE_SINCE says when each newer decoding type appears; the
    data read from each line's llm_args.py says the same."""
    for decoding_type, first in DECODING_TYPE_SINCE.items():
        assert (decoding_type in LINES[line]) == (parse_version(line) >= parse_version(first)), (decoding_type, line)


def test_mtp_on_1_4_writes_max_draft_len():
    assert llm_api_config({"decoding_type": "MTP", "num_nextn_predict_layers": 2}, "1.4.0") == {"decoding_type": "MTP", "max_draft_len": 2}
    assert llm_api_config({"decoding_type": "MTP", "num_nextn_predict_layers": 2}, "1.3.0")["num_nextn_predict_layers"] == 2


def test_a_version_newer_than_the_newest_verified_is_refused_unless_overridden(tmp_path, monkeypatch):
    loaded = with_trtllm_version(load_recipe("llama-ngram"), "1.5.0")
    with pytest.raises(RecipeError, match=rf"--trtllm-version 1.5.0 \(replaces build.trtllm_version of .*llama-ngram.yaml\): TensorRT-LLM 1.5.0 .* newer than the newest "
                                          rf"verified line, {NEWEST_VERIFIED_LINE}.x.*--allow-unverified-trtllm"):
        plan_for(loaded, tmp_path)
    plan = plan_for(loaded, tmp_path, allow_unverified=True)
    assert any(n.startswith("WARNING: TensorRT-LLM 1.5.0") for n in plan.notes)
    assert check_speculative_config(yaml.safe_load(plan.files[0].text)["speculative_config"], "1.4.0") == []
    monkeypatch.setenv(ALLOW_UNVERIFIED_ENV, "1")
    assert plan_for(loaded, tmp_path).notes == plan.notes
    assert not plan_for(with_trtllm_version(load_recipe("llama-ngram"), "1.4.2"), tmp_path).notes


def test_plan_cli_override_warns(tmp_path):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "specbuild.cli", "plan", "llama-ngram", "--trtllm-version", "1.5.0", "-o", str(tmp_path)]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    allowed = subprocess.run([*cmd, "--allow-unverified-trtllm"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "newest verified line" in refused.stderr
    assert allowed.returncode == 0 and "warning: --allow-unverified-trtllm" in allowed.stderr and "WARNING: TensorRT-LLM 1.5.0" in allowed.stdout


def test_eagle3_with_an_sa_enhancer_plans_for_1_4_only(tmp_path):
    text = (f"name: t\n{TARGET}speculation: {{method: eagle3, eagle_model: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, max_draft_len: 3, "
            "sa_config: {threshold: 5, enable_global_pool: true}}\nbuild: {backend: pytorch}\n")
    loaded = parse_recipe(text, Path("t.yaml"))
    config = _config(loaded, "1.4.0", tmp_path)
    assert config["sa_config"] == {"threshold": 5, "enable_global_pool": True} and check_speculative_config(config, "1.4.0") == []
    for version in ("1.2.1", "1.3.0"):
        with pytest.raises(RecipeError, match=rf"t.yaml:\d+: speculation.sa_config: sa_config needs TensorRT-LLM >= 1.4 \(planned for {version}\)"):
            plan_for(with_trtllm_version(loaded, version), tmp_path)
    check_reference_speculation(parse_recipe(text.replace("backend: pytorch", "backend: reference"), Path("t.yaml")))  # runs there too
    with pytest.raises(RecipeError, match="sa_config"):
        parse_recipe(text.replace("threshold: 5", "window: 5"), Path("t.yaml"))
