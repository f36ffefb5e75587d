"""TensorRT-LLM's draft_len_schedule rules (tensorrt_llm/llmapi/llm_args.py
``DecodingBaseConfig.validate_draft_len_schedule_and_sort``), the schedule ``specbuild tune``
recommends, and that schedule written into the PyTorch path's extra_llm_api_options.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from specbuild.util.draft_len_schedule import (
    DraftLenScheduleError,
    check_draft_len_schedule,
    draft_len_for,
    schedule_from_measurements,
)
from specbuild.builder.recipe import RecipeError, parse_recipe
from specbuild.builder.trtllm_plan import plan_pytorch, plan_tensorrt
from specbuild.tune import Candidate, draft_len_schedule
from specbuild.tune.analysis import batch_thresholds
from upstream_trtllm import check_speculative_config


@pytest.mark.parametrize(("schedule", "max_draft_len", "message"), [
    ({0: 4, 1: 4}, 4, "batch size threshold must be >= 1, got 0"),
    ({1: 4, 4: -1}, 4, "draft length must be >= 0, got -1"),
    ({2: 4, 8: 2}, 4, r"must include batch size 1: add \{1: 4\}"),
    ({1: 3, 4: 2}, 4, r"draft_len_schedule\[1\] must equal max_draft_len: got 3, max_draft_len is 4"),
    ({1: 4, 4: 6}, 4, r"draft lengths must be <= max_draft_len 4, got \{4: 6\}"),
])
def test_each_tensorrt_llm_rule_is_enforced(schedule, max_draft_len, message):
    with pytest.raises(DraftLenScheduleError, match=message):
        check_draft_len_schedule(schedule, max_draft_len)


def test_valid_schedule_is_sorted_and_looked_up_by_the_largest_threshold_not_above_the_batch():
    schedule = check_draft_len_schedule({8: 0, 1: 4, 4: 2}, 4)
    assert list(schedule) == [1, 4, 8]
    assert [draft_len_for(schedule, b) for b in (1, 3, 4, 7, 8, 100)] == [4, 4, 2, 2, 0, 0]


def candidates(best_by_level: dict[int, int]) -> list[Candidate]:
    """Bench points whose lowest latency at each concurrency is at the given draft length."""
    return [Candidate("d", "ngram", "s", k, level, 10.0 if k == best else 20.0 + k, 1.0)
            for level, best in best_by_level.items() for k in (0, 1, 2, 3, 4)]


def test_tune_schedule_passes_the_rules_or_says_why_none_exists():
    # batch sizes 2-4 occur only under loads above 1: C=4's k=2 governs them (batch_thresholds)
    (s,) = draft_len_schedule(candidates({1: 4, 4: 2, 8: 0}))
    assert (s.draft_len_schedule, s.max_draft_len, s.note) == ({1: 4, 2: 2}, 4, "")
    assert check_draft_len_schedule(s.draft_len_schedule, s.max_draft_len) == s.draft_len_schedule
    # speculation loses at C=1 but wins at C=4: TensorRT-LLM cannot draft more at 4 than at 1
    (s,) = draft_len_schedule(candidates({1: 0, 4: 3, 8: 0}))
    assert (s.draft_len_schedule, s.max_draft_len) == ({}, None) and "schedule[1] = max_draft_len" in s.note
    (s,) = draft_len_schedule(candidates({1: 2, 4: 3}))
    assert s.draft_len_schedule == {} and "draft lengths {2: 3} above concurrency 1's 2" in s.note
    assert schedule_from_measurements({4: 2})[0] is None


def test_a_levels_k_governs_the_batch_sizes_above_the_level_below():
    """Closed loop at C: the batch is at most C and falls below it between requests, so a batch between
    two measured levels belongs to the higher one."""
    assert batch_thresholds({1: 4, 2: 4, 4: 2}) == {1: 4, 2: 4, 3: 2}
    assert batch_thresholds({1: 4, 4: 2, 16: 1}) == {1: 4, 2: 2, 5: 1}
    assert batch_thresholds({1: 3}) == {1: 3}


def test_tune_schedule_takes_a_significant_k_when_the_fastest_looking_k_is_not_significant():
    """At C=4 k=4 has the lowest p50 but its speed-up interval contains 1; k=2's lies above 1: k=2,
    not k=0 (measured so on smollm2-ngram, humaneval:16, 3 repeats)."""
    cands = [Candidate("d", "ngram", "s", k, level, ms, 1.0) for level, row in {
        1: {0: 2189, 2: 1453, 4: 1299}, 4: {0: 3190, 2: 2877, 4: 2819}, 8: {0: 4682, 2: 4157, 4: 4453}}.items()
        for k, ms in row.items()]
    ci = {("d", "s", 2, 1): [1.37, 1.58], ("d", "s", 4, 1): [1.53, 1.85], ("d", "s", 2, 4): [1.04, 1.26],
          ("d", "s", 4, 4): [0.94, 1.17], ("d", "s", 2, 8): [0.73, 0.90], ("d", "s", 4, 8): [0.63, 0.80]}
    (s,) = draft_len_schedule(cands, min_gain=0.05, speedup_ci=ci)
    assert s.best == {1: 4, 4: 2, 8: 0}
    assert (s.draft_len_schedule, s.max_concurrency) == ({1: 4, 2: 2}, 4)
    # no significant k at a level: speculation off there
    ci[("d", "s", 2, 4)] = [0.98, 1.26]
    (s,) = draft_len_schedule(cands, min_gain=0.05, speedup_ci=ci)
    assert s.best[4] == 0


NGRAM = """name: t
target: {checkpoint: meta-llama/Llama-3.1-8B-Instruct, dtype: bfloat16}
speculation: {method: ngram, max_draft_len: MAXK}
build:
  backend: pytorch
  trtllm_version: '1.2.1'
  draft_len_schedule: SCHEDULE
"""


def test_tune_schedule_written_into_extra_llm_api_options_validates(tmp_path):
    (s,) = draft_len_schedule(candidates({1: 4, 4: 2, 8: 1}))
    text = NGRAM.replace("MAXK", str(s.max_draft_len)).replace("SCHEDULE", yaml.safe_dump(s.draft_len_schedule, default_flow_style=True).strip())
    plan = plan_pytorch(parse_recipe(text, Path("t.yaml")), tmp_path)
    for f in plan.files:  # extra_llm_api_options.yaml and model.yaml
        config = yaml.safe_load(f.text)["speculative_config"]
        # {1: 4, 2: 2, 5: 1} up to the recipe's max_batch_size 4, keyed for both TensorRT-LLM readings
        assert config["draft_len_schedule"] == {1: 4, 2: 2, 4: 2}
        assert check_draft_len_schedule(config["draft_len_schedule"], config["max_draft_len"])
        assert check_speculative_config(config, "1.2.1") == []


def test_plan_refuses_a_schedule_tensorrt_llm_would_reject(tmp_path):
    bad = NGRAM.replace("MAXK", "4").replace("SCHEDULE", "{1: 2, 4: 1}")
    with pytest.raises(RecipeError, match=r"t.yaml:7: build.draft_len_schedule: draft_len_schedule\[1\] must equal max_draft_len: got 2"):
        plan_pytorch(parse_recipe(bad, Path("t.yaml")), tmp_path)
    engine = NGRAM.replace("MAXK", "4").replace("SCHEDULE", "{1: 4}").replace("backend: pytorch", "backend: tensorrt")
    with pytest.raises(RecipeError, match="build.draft_len_schedule: .*the engine path has no such option"):
        plan_tensorrt(parse_recipe(engine, Path("t.yaml")), tmp_path)
    with pytest.raises(RecipeError, match="build.draft_len_schedule"):
        parse_recipe(NGRAM.replace("MAXK", "4").replace("SCHEDULE", "{0: 4}"), Path("t.yaml"))
