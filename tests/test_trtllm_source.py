"""Source truth: specbuild's LLM-API output checked against the installed TensorRT-LLM's own Python
sources, read with ``ast`` (never imported), and the readers themselves.

On a GPU box, inside the NGC container, before building::

    pip install /work pytest && cd /work && pytest -m trtllm_source tests/test_trtllm_source.py

Without TensorRT-LLM the ``trtllm_source`` tests skip, saying so; the reader tests below run
everywhere, on source texts in the two layouts the LLM API has had. (The C++ Triton backend's
sources are not in the wheel; its parameter reading is test data, tests/upstream_trtllm.py.)
"""

from __future__ import annotations

import ast
import itertools

import pytest
import yaml
from specbuild.util.draft_len_schedule import DraftLenScheduleError, check_draft_len_schedule
from specbuild.builder.recipe import load_recipe
from specbuild.builder.trtllm_plan import plan_for
from specbuild.builder.trtllm_version import installed_version, parse_version
from specbuild.triton_repo.models.llmapi_front import sampling_arguments
from trtllm_sources import (
    accepted_keys,
    class_aliases,
    class_fields,
    class_members,
    decoding_registry,
    draft_len_schedule_validator,
    package_dir,
    read,
)
from upstream_trtllm import LINES, NESTED, SPECULATIVE_MODEL_ALIASES, llm_api_classes

ROOT = package_dir()
source_truth = pytest.mark.skipif(
    ROOT is None, reason="TensorRT-LLM is not installed here (importlib.util.find_spec('tensorrt_llm') is None); "
                         "run `pytest -m trtllm_source` inside the TensorRT-LLM container")
PYTORCH_RECIPES = ("llama-eagle3", "llama-ngram")
# Schedules around max_draft_len 4 that probe every rule (tensorrt_llm/llmapi/llm_args.py).
SCHEDULES = [{1: 4}, {1: 4, 4: 2, 8: 0}, {8: 0, 1: 4}, {1: 3, 4: 2}, {2: 4}, {1: 4, 4: 5}, {0: 4, 1: 4}, {1: 4, 2: -1}, {2: 4, 8: 1}]


def _ours_accepts(schedule: dict, k: int) -> bool:
    try:
        check_draft_len_schedule(schedule, k)
        return True
    except DraftLenScheduleError:
        return False


@pytest.mark.trtllm_source
@source_truth
@pytest.mark.parametrize("name", PYTORCH_RECIPES)
def test_planned_speculative_config_is_accepted_by_the_installed_llm_args(name, tmp_path):
    version = installed_version()
    source = read("llmapi/llm_args.py")
    registry = decoding_registry(source)
    plan = plan_for(load_recipe(name), tmp_path, version=version)
    for f in plan.files:
        config = yaml.safe_load(f.text)["speculative_config"]
        assert config["decoding_type"] in registry, (f.path.name, sorted(registry))
        assert set(config) - {"decoding_type"} <= accepted_keys(source, registry[config["decoding_type"]]), f.path.name


@pytest.mark.trtllm_source
@source_truth
def test_test_data_matches_the_installed_llm_api():
    """The hand-kept registry (tests/upstream_trtllm.py) for the installed line is the source's."""
    source = read("llmapi/llm_args.py")
    registry = decoding_registry(source)
    ours = llm_api_classes(installed_version() or "1.2")
    assert set(ours) <= set(registry)
    for decoding_type, fields in ours.items():
        assert fields <= class_fields(source, registry[decoding_type]), decoding_type
        assert class_aliases(source, registry[decoding_type]).items() <= SPECULATIVE_MODEL_ALIASES.items(), decoding_type


@pytest.mark.trtllm_source
@source_truth
def test_sampling_params_has_every_keyword_the_pytorch_path_model_passes():
    fields = class_fields(read("sampling_params.py"), "SamplingParams")
    every = (sampling_arguments(8, end_id=2, pad_id=0, temperature=0.5, top_k=4, top_p=0.9, seed=1) | sampling_arguments(8, end_id=-1)
             | sampling_arguments(8, end_ids=(128001, 128008, 128009)))
    assert set(every) <= fields


@pytest.mark.trtllm_source
@source_truth
def test_request_output_has_what_the_pytorch_path_model_reads():
    """RequestOutput.prompt_token_ids and outputs[i].token_ids / .text / .request_perf_metrics
    (tensorrt_llm/executor/result.py)."""
    source = read("executor/result.py")
    assert {"token_ids", "text", "request_perf_metrics"} <= class_members(source, "CompletionOutput")
    request_output = next(n for n in ast.walk(ast.parse(read("llmapi/llm.py"))) if isinstance(n, ast.ClassDef) and n.name == "RequestOutput")
    # a field, property or attribute of RequestOutput or of the result classes it builds on
    assert "prompt_token_ids" in ast.unparse(request_output) or "self.prompt_token_ids" in source or "prompt_token_ids:" in source
    # what derived acceptance counts read when the perf metrics are zero (llmapi_front.acceptance)
    assert "self.decoding_iter" in source or "avg_decoded_tokens_per_iter" in source


@pytest.mark.trtllm_source
@source_truth
def test_draft_len_schedule_rules_agree_with_the_installed_validator():
    validate = draft_len_schedule_validator(read("llmapi/llm_args.py"))
    if validate is None:
        pytest.skip(f"TensorRT-LLM {installed_version()} has no draft_len_schedule")
    for schedule in SCHEDULES:
        try:
            validate(schedule, 4)
            theirs = True
        except ValueError:
            theirs = False
        assert not _ours_accepts(schedule, 4) or theirs, schedule  # what specbuild writes, TensorRT-LLM accepts


# --- the readers, on source texts in both layouts -------------------------------------------------

LLM_ARGS_1_2 = '''
class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: Optional[int] = None
    speculative_model_dir: Optional[str] = None
    draft_len_schedule: Optional[dict[int, int]] = None
    _private: bool = PrivateAttr(True)

    @classmethod
    def from_dict(cls, data: dict):
        config_classes = {"Eagle": EagleDecodingConfig, "NGram": NGramDecodingConfig}
        return config_classes[data["decoding_type"]](**data)

    @field_validator("draft_len_schedule")
    @classmethod
    def validate_draft_len_schedule_and_sort(cls, v, info):
        if v is not None:
            if 1 not in v:
                raise ValueError("draft_len_schedule must include batch_size=1")
            if info.data.get("max_draft_len") is not None and v[1] != info.data.get("max_draft_len"):
                raise ValueError("draft_len_schedule[1] must equal max_draft_len")
            return dict(sorted(v.items()))
        return v

class EagleDecodingConfig(DecodingBaseConfig):
    eagle_choices: Optional[List[List[int]]] = None
    eagle3_one_model: Optional[bool] = True
    decoding_type: ClassVar[str] = "Eagle"

class NGramDecodingConfig(DecodingBaseConfig):
    max_matching_ngram_size: int = 0
'''
LLM_ARGS_1_3 = '''
class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: Optional[int] = None
    speculative_model: Optional[str] = Field(default=None, validation_alias=AliasChoices("speculative_model", "speculative_model_dir"))

class EagleDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Eagle"] = "Eagle"
    eagle3_one_model: Optional[bool] = True

class Eagle3DecodingConfig(EagleDecodingConfig):
    decoding_type: Literal["Eagle3"] = Field(default="Eagle3")
'''


def test_readers_on_the_1_2_layout():
    assert decoding_registry(LLM_ARGS_1_2) == {"Eagle": "EagleDecodingConfig", "NGram": "NGramDecodingConfig"}
    assert class_fields(LLM_ARGS_1_2, "EagleDecodingConfig") == {"eagle_choices", "eagle3_one_model", "max_draft_len",
                                                                 "speculative_model_dir", "draft_len_schedule"}
    validate = draft_len_schedule_validator(LLM_ARGS_1_2)
    assert validate({4: 2, 1: 4}, 4) == {1: 4, 4: 2}
    with pytest.raises(ValueError, match="must include batch_size=1"):
        validate({2: 4}, 4)
    with pytest.raises(ValueError, match=r"\[1\] must equal max_draft_len"):
        validate({1: 3}, 4)


def test_readers_on_the_1_3_layout():
    assert decoding_registry(LLM_ARGS_1_3) == {"Eagle": "EagleDecodingConfig", "Eagle3": "Eagle3DecodingConfig"}
    assert class_fields(LLM_ARGS_1_3, "Eagle3DecodingConfig") == {"eagle3_one_model", "max_draft_len", "speculative_model"}
    assert class_aliases(LLM_ARGS_1_3, "Eagle3DecodingConfig") == {"speculative_model_dir": "speculative_model"}
    assert accepted_keys(LLM_ARGS_1_3, "Eagle3DecodingConfig") >= {"speculative_model", "speculative_model_dir"}
    assert draft_len_schedule_validator(LLM_ARGS_1_3) is None


@pytest.mark.parametrize("line", sorted(LINES))
def test_no_validation_alias_is_listed_as_a_field(line):
    """N2: the stored data lists fields only; an alias listed as a field makes the source check fail
    on a TensorRT-LLM whose reader is alias-aware (``speculative_model_dir`` is
    ``speculative_model``'s alias, not a field)."""
    for decoding_type, fields in LINES[line].items():
        assert not fields & set(SPECULATIVE_MODEL_ALIASES), (line, decoding_type)
        assert set(SPECULATIVE_MODEL_ALIASES.values()) <= fields, (line, decoding_type)
    for nested in NESTED.values():
        assert not nested & set(SPECULATIVE_MODEL_ALIASES)


def test_our_schedule_rules_are_at_least_as_strict_as_the_sample_validator():
    validate = draft_len_schedule_validator(LLM_ARGS_1_2)
    for schedule, k in itertools.product(SCHEDULES, (3, 4)):
        if _ours_accepts(schedule, k):
            validate(schedule, k)


def test_source_truth_tests_skip_with_a_reason_without_tensorrt_llm():
    if ROOT is not None:
        pytest.skip("TensorRT-LLM is installed here")
    assert source_truth.kwargs["reason"].startswith("TensorRT-LLM is not installed here")
