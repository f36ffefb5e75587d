"""The tuner's schedule written for TensorRT-LLM, vLLM and SGLang, each checked by that engine's own
rules (kept as test data in tests/upstream_schedules.py with the commits they were read at)."""

from __future__ import annotations

import pytest
from specbuild.util.draft_len_schedule import check_draft_len_schedule, draft_len_for
from specbuild.builder.recipe import parse_recipe
from specbuild.builder.trtllm_plan import plan_pytorch
from specbuild.tune import Schedule
from specbuild.tune.schedules import (
    EngineScheduleError,
    check_sglang_adaptive_config,
    check_vllm_schedule,
    engine_schedules,
    sglang_draft_len_for,
    vllm_draft_len_for,
)
from upstream_schedules import (
    SGLANG_DEFAULT_SLOTS,
    SGLANG_REFUSED,
    SGLANG_SLOT_OF,
    TRTLLM_CONFIG_CLASS,
    TRTLLM_MIN_RUNTIME_DRAFT_LEN,
    VLLM_LOOKUP,
    VLLM_REFUSED,
)


@pytest.mark.parametrize(("ranges", "k", "rule"), VLLM_REFUSED)
def test_vllm_refusals_name_upstreams_rule(ranges, k, rule):
    with pytest.raises(EngineScheduleError, match=rule):
        check_vllm_schedule(ranges, k)


@pytest.mark.parametrize(("ranges", "k", "batch", "expected"), VLLM_LOOKUP)
def test_vllm_lookup_is_upstreams(ranges, k, batch, expected):
    assert vllm_draft_len_for(ranges, k, batch) == expected


@pytest.mark.parametrize(("config", "steps", "rule"), SGLANG_REFUSED)
def test_sglang_refusals_name_upstreams_rule(config, steps, rule):
    with pytest.raises(EngineScheduleError, match=rule):
        check_sglang_adaptive_config(config, steps)


def test_sglang_default_config_passes_and_routes_by_largest_key_not_above_the_batch():
    check_sglang_adaptive_config(SGLANG_DEFAULT_SLOTS, 3)
    single = {key: {"candidate_steps": [int(key)]} for key in SGLANG_DEFAULT_SLOTS}
    assert [str(sglang_draft_len_for(single, b)) for b, _ in SGLANG_SLOT_OF] == [slot for _, slot in SGLANG_SLOT_OF]


SCHEDULE = Schedule("smollm2-eagle", "humaneval", {1: 4, 4: 2, 8: 0, 16: 0}, {1: 4, 4: 2}, 4, 4)


@pytest.mark.parametrize("method", ["ngram", "eagle3"])
def test_every_engine_runs_the_same_draft_length_at_every_batch_size(method):
    out = engine_schedules(SCHEDULE, method)
    trt, vllm = out.trtllm, out.vllm
    check_draft_len_schedule(trt["draft_len_schedule"], trt["max_draft_len"])
    check_vllm_schedule(vllm["num_speculative_tokens_per_batch_size"], vllm["num_speculative_tokens"])
    floor = TRTLLM_MIN_RUNTIME_DRAFT_LEN[TRTLLM_CONFIG_CLASS[method]]
    for batch in range(1, 65):
        wanted = 0 if batch > 4 else draft_len_for({1: 4, 4: 2}, batch)
        mc = trt.get("max_concurrency")
        trt_k = 0 if mc is not None and batch > mc else draft_len_for(trt["draft_len_schedule"], batch)
        assert trt_k == max(wanted, floor), batch
        assert vllm_draft_len_for(vllm["num_speculative_tokens_per_batch_size"], vllm["num_speculative_tokens"], batch) == wanted
        if out.sglang is not None:
            assert sglang_draft_len_for(out.sglang, batch) == wanted
    assert any("data_parallel_size > 1" in n for n in out.notes["vllm"])


def test_one_engine_methods_keep_drafting_at_one_and_say_why():
    out = engine_schedules(SCHEDULE, "eagle3")
    assert out.trtllm == {"max_draft_len": 4, "draft_len_schedule": {1: 4, 3: 4, 4: 2, 5: 1, 2048: 1}}
    assert "PR #16888" in out.notes["tensorrt-llm"][0]
    assert out.sglang == {"1": {"candidate_steps": [4]}, "4": {"candidate_steps": [2]}, "5": {"candidate_steps": [0]}}
    assert "--speculative-adaptive" in out.sglang_args
    ngram = engine_schedules(SCHEDULE, "ngram")
    assert ngram.trtllm == {"max_draft_len": 4, "draft_len_schedule": {1: 4, 3: 4, 4: 2, 5: 0}}  # max_concurrency 4 folded in
    assert ngram.vllm == {"num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 3, 4], [4, 4, 2], [5, 256, 0]]}
    assert ngram.sglang is None and "no batch-size schedule for ngram" in ngram.notes["sglang"][0]


def test_an_engine_without_the_method_gets_no_schedule_and_says_so():
    out = engine_schedules(SCHEDULE, "lookahead")
    assert (out.trtllm, out.vllm, out.sglang) == (None, None, None)
    assert "engine path only" in out.notes["tensorrt-llm"][0] and "no lookahead method" in out.notes["vllm"][0]


def test_no_schedule_gives_nothing_for_any_engine_with_the_reason():
    out = engine_schedules(Schedule("d", "s", {1: 0}, {}, 0, None, "speculation off"), "ngram")
    assert (out.trtllm, out.vllm, out.sglang) == (None, None, None)
    assert out.notes["vllm"] == ["speculation off"]


PYTORCH_RECIPE = """name: t
target: {checkpoint: meta-llama/Llama-3.1-8B-Instruct, dtype: bfloat16}
speculation: {method: METHOD}
build: {backend: pytorch, trtllm_version: '1.2.1', max_batch_size: 8}
"""


@pytest.mark.parametrize(("method", "written"), [("ngram", {1: 4, 3: 4, 4: 2, 5: 0}), ("mtp", {1: 4, 3: 4, 4: 2, 5: 1, 8: 1})])
def test_write_recipe_gives_a_recipe_plan_accepts_with_the_schedule(tmp_path, method, written):
    import yaml
    from click.testing import CliRunner
    from specbuild.cli import main
    from specbuild.tune.write_recipe import write_scheduled_recipe

    source = tmp_path / "src.yaml"
    source.write_text(PYTORCH_RECIPE.replace("METHOD", "ngram, max_draft_len: 6" if method == "ngram" else "mtp, num_nextn_predict_layers: 4"))
    out = write_scheduled_recipe(tmp_path / "out" / "scheduled.yaml", source, SCHEDULE, engine_schedules(SCHEDULE, method))
    data = yaml.safe_load(out.read_text())
    assert data["name"] == "t-scheduled" and data["speculation"].get("max_draft_len", 4) == 4
    assert data["build"]["draft_len_schedule"] == written
    assert "max_concurrency" not in data["build"]  # folded into the schedule: main refuses both together
    result = CliRunner().invoke(main, ["plan", str(out)])
    assert result.exit_code == 0, result.output
    for f in plan_pytorch(parse_recipe(out.read_text(), out), tmp_path).files:
        assert yaml.safe_load(f.text)["speculative_config"]["draft_len_schedule"] == written


def test_write_recipe_for_the_reference_engine_keeps_max_concurrency(tmp_path):
    import yaml
    from click.testing import CliRunner
    from specbuild.cli import main
    from specbuild.tune.write_recipe import write_scheduled_recipe

    schedule = Schedule("smollm2-ngram", "humaneval", {1: 3, 4: 2, 8: 0}, {1: 3, 4: 2}, 4, 3)
    out = write_scheduled_recipe(tmp_path / "s.yaml", "smollm2-ngram", schedule, engine_schedules(schedule, "ngram"))
    data = yaml.safe_load(out.read_text())
    assert data["build"]["draft_len_schedule"] == {1: 3, 4: 2} and data["build"]["max_concurrency"] == 4
    assert data["speculation"]["max_draft_len"] == 3 and data["build"]["backend"] == "reference"
    result = CliRunner().invoke(main, ["plan", str(out)])
    assert result.exit_code == 0, result.output


def test_write_recipe_refuses_a_deployment_without_a_schedule(tmp_path):
    from specbuild.tune.write_recipe import WriteRecipeError, write_scheduled_recipe

    none = Schedule("d", "s", {1: 0}, {}, 0, None, "speculation off at every measured concurrency")
    with pytest.raises(WriteRecipeError, match="no schedule to write .speculation off"):
        write_scheduled_recipe(tmp_path / "o.yaml", "smollm2-ngram", none)
    with pytest.raises(WriteRecipeError, match="needs the deployment's recipe"):
        write_scheduled_recipe(tmp_path / "o.yaml", tmp_path / "missing.yaml", SCHEDULE)


def test_engine_configs_print_whole_at_80_columns():
    """Each engine's config is one unbroken line a user can copy, at 80 columns too (no folded keys)."""
    import io
    import json

    from rich.console import Console

    from specbuild.tune.schedules import engine_schedule_table

    engines = engine_schedules(SCHEDULE, "eagle3")
    buf = io.StringIO()
    console = Console(file=buf, width=80)
    for item in engine_schedule_table([engines]):
        console.print(item, soft_wrap=getattr(item, "no_wrap", None) is True)
    lines = buf.getvalue().splitlines()
    for label, config in (("TensorRT-LLM", engines.trtllm), ("vLLM", engines.vllm), ("SGLang", engines.sglang)):
        if config is not None:
            assert f"{engines.deployment} {label}: {json.dumps(config)}" in lines


def test_both_tensorrt_llm_readings_run_the_written_schedule_alike():
    """TensorRT-LLM 1.2 reads a schedule key as a lower bound, main as an inclusive upper bound (and
    refuses max_concurrency beside it): the written schedule runs the same draft length under both at
    every batch size, and what the tuner measured (1.2's reading plus max_concurrency)."""
    import random

    from specbuild.util.draft_len_schedule import draft_len_up_to, portable_schedule
    from upstream_schedules import TRTLLM_12_READING, TRTLLM_MAIN_READING

    (old, points), (new, new_points) = TRTLLM_12_READING, TRTLLM_MAIN_READING
    assert [draft_len_for(old, b) for b, _ in points] == [k for _, k in points]
    assert [draft_len_up_to(new, b) for b, _ in new_points] == [k for _, k in new_points]
    rng = random.Random(0)
    for _ in range(300):
        k1 = rng.randint(1, 6)
        schedule = {1: k1, **{rng.randint(2, 40): rng.randint(0, k1) for _ in range(rng.randint(0, 4))}}
        max_concurrency = rng.choice([None, rng.randint(1, 48)])
        max_batch_size = rng.randint(1, 64)
        portable = portable_schedule(schedule, max_concurrency, max_batch_size)
        check_draft_len_schedule(portable, k1)  # 1.2's rules; main's (smallest key -> max_draft_len) follow
        for b in range(1, max_batch_size + 1):
            wanted = 0 if max_concurrency is not None and b > max_concurrency else draft_len_for(schedule, b)
            assert draft_len_for(portable, b) == draft_len_up_to(portable, b) == wanted, (schedule, max_concurrency, b)


def test_the_plan_folds_max_concurrency_into_the_schedule_for_every_version(tmp_path):
    import yaml
    from upstream_schedules import TRTLLM_MAIN_EXCLUSIVE

    for version in ("1.2.1", "1.3.0", "1.4.0"):
        text = PYTORCH_RECIPE.replace("METHOD", "ngram, max_draft_len: 4").replace("'1.2.1'", f"'{version}'")
        text = text.replace("max_batch_size: 8}", "max_batch_size: 8, draft_len_schedule: {1: 4, 4: 2}, max_concurrency: 6}")
        spec = yaml.safe_load(plan_pytorch(parse_recipe(text, tmp_path / "r.yaml"), tmp_path).files[0].text)["speculative_config"]
        assert "max_concurrency" not in spec, TRTLLM_MAIN_EXCLUSIVE
        assert spec["draft_len_schedule"] == {1: 4, 3: 4, 4: 2, 6: 2, 7: 0}


@pytest.mark.parametrize(("version", "one_model", "noted"), [("1.2.1", True, True), ("1.2.1", False, False), ("1.3.0", True, False)])
def test_the_plan_says_when_tensorrt_llm_1_2_ignores_the_controls(tmp_path, version, one_model, noted):
    """On 1.2 only methods with a drafter object run draft_len_schedule / max_concurrency: a one-model
    EAGLE-3 recipe with a schedule would deploy without it, so the plan says so."""
    from specbuild.builder.trtllm_plan import plan_for

    speculation = "eagle3, eagle_model: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, max_draft_len: 4"
    if version == "1.2.1":
        speculation += f", eagle3_one_model: {str(one_model).lower()}"
    text = PYTORCH_RECIPE.replace("METHOD", speculation).replace("'1.2.1'", f"'{version}'")
    text = text.replace("max_batch_size: 8}", "max_batch_size: 8, draft_len_schedule: {1: 4, 4: 2}}")
    notes = plan_for(parse_recipe(text, tmp_path / "r.yaml"), tmp_path).notes
    assert any("ignores draft_len_schedule for one-model eagle3" in n for n in notes) is noted, notes


def test_write_recipe_for_lookahead_builds_the_measured_shape(tmp_path):
    """A lookahead schedule's entry is the token budget of the shape measured best at concurrency 1:
    the written recipe builds that N, so schedule[1] = its max_draft_len and the recipe validates."""
    import yaml
    from click.testing import CliRunner
    from specbuild.cli import main
    from specbuild.tune.write_recipe import write_scheduled_recipe

    schedule = Schedule("smollm2-lookahead", "humaneval", {1: 1, 2: 0}, {1: 7}, 1, 7, "lookahead: ...", 2)
    out = write_scheduled_recipe(tmp_path / "la.yaml", "smollm2-lookahead", schedule, engine_schedules(schedule, "lookahead"))
    data = yaml.safe_load(out.read_text())
    assert data["speculation"]["max_ngram_size"] == 2 and data["build"]["draft_len_schedule"] == {1: 7}
    assert data["build"]["max_concurrency"] == 1
    result = CliRunner().invoke(main, ["plan", str(out)])
    assert result.exit_code == 0, result.output


def test_vllm_gets_a_schedule_where_tensorrt_llms_rules_give_none():
    """Best k = 0 at concurrency 1 and 2 at 2-4: TensorRT-LLM cannot express it (schedule[1] must be its
    max_draft_len) and says why in its own row only; vLLM's ranges take any k per range; SGLang likewise."""
    why = "no speculation at concurrency 1: TensorRT-LLM needs schedule[1] = max_draft_len > 0; deploy without speculation"
    schedule = Schedule("d", "s", {1: 0, 4: 2, 8: 0}, {}, 4, None, why, by_batch={1: 0, 2: 2})
    out = engine_schedules(schedule, "eagle3")
    assert out.trtllm is None and out.notes["tensorrt-llm"] == [why]
    assert out.vllm == {"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 1, 0], [2, 4, 2], [5, 256, 0]]}
    assert not any("TensorRT-LLM" in n for n in out.notes["vllm"] + out.notes["sglang"])
    assert out.sglang == {"1": {"candidate_steps": [0]}, "2": {"candidate_steps": [2]}, "5": {"candidate_steps": [0]}}
    off = engine_schedules(Schedule("d", "s", {1: 0, 4: 0}, {}, 0, None, "speculation off", by_batch={}), "eagle3")
    assert (off.trtllm, off.vllm, off.sglang) == (None, None, None)


def test_write_recipe_for_medusa_cuts_the_tree_to_the_measured_draft_tokens(tmp_path):
    """Medusa's max_draft_len is its tree's node count; k1 = 2 of the bundled 4-node tree builds the
    first 2 nodes (what num_draft_tokens=2 verified when tune measured it), and the recipe validates."""
    import yaml
    from click.testing import CliRunner
    from specbuild.cli import main
    from specbuild.tune.write_recipe import write_scheduled_recipe

    schedule = Schedule("smollm2-medusa", "humaneval", {1: 2, 2: 2, 4: 0}, {1: 2, 2: 2}, 2, 2)
    out = write_scheduled_recipe(tmp_path / "m.yaml", "smollm2-medusa", schedule, engine_schedules(schedule, "medusa"))
    data = yaml.safe_load(out.read_text())
    assert data["speculation"]["medusa_choices"] == [[0], [1]] and "max_draft_len" not in data["speculation"]
    assert data["build"]["draft_len_schedule"] == {1: 2, 2: 2} and data["build"]["max_concurrency"] == 2
    assert CliRunner().invoke(main, ["plan", str(out)]).exit_code == 0


def test_write_recipe_refuses_an_eagle3_dynamic_tree_whose_units_differ(tmp_path):
    """EAGLE-3's draft_len_schedule counts draft layers, num_draft_tokens (what tune measures) the tree's
    nodes: no schedule is written from one for the other."""
    from specbuild.tune.write_recipe import WriteRecipeError, write_scheduled_recipe

    from specbuild.builder.recipe import bundled_recipes

    text = bundled_recipes()["smollm2-eagle3"].read_text()
    spec = text[text.index("  max_draft_len:"):text.index("train:")]
    tree = tmp_path / "tree.yaml"  # the bundled recipe with EAGLE-2's dynamic tree instead of its chain
    tree.write_text(text.replace(spec, "  max_draft_len: 4\n  use_dynamic_tree: true\n  dynamic_tree_max_topK: 3\n  max_total_draft_tokens: 8\n"))
    schedule = Schedule(str(tree), "humaneval", {1: 8, 4: 0}, {1: 8}, 1, 8)
    with pytest.raises(WriteRecipeError, match="counts draft layers .* counts the tree's nodes"):
        write_scheduled_recipe(tmp_path / "e.yaml", str(tree), schedule, engine_schedules(schedule, "eagle3"))
    assert not (tmp_path / "e.yaml").exists()
