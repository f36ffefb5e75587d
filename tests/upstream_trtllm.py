"""What TensorRT-LLM's own sources define, kept as test data (names only, no code), each with the
file and commit it was read at, plus :func:`replay_parameter_reading`, which repeats what the
``tensorrtllm`` Triton backend does with a model's ``parameters`` when it loads it.

Sources (NVIDIA/TensorRT-LLM; the stored copies nearest the v1.2.1 tag that were available when
this was written; the tag's own commit could not be resolved here, so each entry names what was
read):

- ``triton_backend/inflightBatcherLLM`` sources at 0c8de69a1ca6213eebb20a51873890ff128666c2
  (``src/model_instance_state.cc``) and 5cdd69218f8815d6c8c101ca1facf2ec4ac4b622
  (``src/model_state.cc``);
- ``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt`` at
  0c8de69a1ca6213eebb20a51873890ff128666c2;
- ``tensorrt_llm/llmapi/llm_args.py``: the 1.2 line's ``DecodingBaseConfig.from_dict`` registry
  (no ``Eagle3``; EAGLE-3 is ``Eagle``); the 1.3 line (the stored pre-release copy): per-class
  ``decoding_type: Literal[...]``, ``Eagle3`` added; the 1.4 line (main at
  0004396720054fd8e205cbf616f21f0b57c6b412, read in full: SA, SAEnhancerConfig, PARD, DFlash,
  DSpark, MTP, AUTO). Every line: ``speculative_model`` is the field, ``speculative_model_dir`` its
  validation alias.

On a machine with TensorRT-LLM installed, tests/test_trtllm_source.py (``pytest -m
trtllm_source``) reads the installed ``llm_args.py`` / ``sampling_params.py`` instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BACKEND_SOURCE = "NVIDIA/TensorRT-LLM triton_backend/inflightBatcherLLM/src/model_instance_state.cc @ 0c8de69a, model_state.cc @ 5cdd6921"


@dataclass(frozen=True)
class ParameterRead:
    """One ``ModelState::GetParameter<T>(name)`` call: ``kind`` is T; ``required``: the call is not
    inside a try/catch, so an absent key throws "Cannot find parameter with name: <name>" and the
    model fails to load; ``choices``: the values the backend acts on (others are warned about and
    replaced by its default, or throw where noted in ``throws_on_other``)."""

    kind: str  # "string" | "bool" | "int" | "uint" | "float" | "size" | "int_list" | "choices_list"
    required: bool = False
    choices: tuple[str, ...] = ()
    throws_on_other: bool = False


# Every parameter the backend reads (model_instance_state.cc, model_state.cc), by function.
BACKEND_PARAMETERS: dict[str, ParameterRead] = {
    # getBatchingTypeFromParams: read outside try; any other value throws
    "gpt_model_type": ParameterRead("string", required=True, choices=("V1", "v1", "inflight_batching", "inflight_fused_batching"),
                                    throws_on_other=True),
    # getKvCacheConfigFromParams
    "max_tokens_in_paged_kv_cache": ParameterRead("int"),
    "kv_cache_free_gpu_mem_fraction": ParameterRead("float"),
    "cross_kv_cache_fraction": ParameterRead("float"),
    "kv_cache_host_memory_bytes": ParameterRead("size"),
    "kv_cache_onboard_blocks": ParameterRead("bool"),
    "max_attention_window_size": ParameterRead("int_list"),
    "sink_token_length": ParameterRead("int"),
    "enable_kv_cache_reuse": ParameterRead("bool"),
    # getExtendedRuntimePerfKnobConfigFromParams
    "multi_block_mode": ParameterRead("bool"),
    "enable_context_fmha_fp32_acc": ParameterRead("bool"),
    "cuda_graph_mode": ParameterRead("bool"),
    "cuda_graph_cache_size": ParameterRead("int"),
    # getParallelConfigFromParams
    "num_nodes": ParameterRead("int"),
    # getPeftCacheConfigFromParams
    "lora_cache_max_adapter_size": ParameterRead("int"),
    "lora_cache_optimal_adapter_size": ParameterRead("int"),
    "lora_cache_gpu_memory_fraction": ParameterRead("float"),
    "lora_cache_host_memory_bytes": ParameterRead("size"),
    "lora_prefetch_dir": ParameterRead("string"),
    # getSchedulerConfigFromParams
    "batch_scheduler_policy": ParameterRead("string", choices=("max_utilization", "guaranteed_no_evict")),
    # getSpeculativeDecodingConfigFromParams
    "speculative_decoding_fast_logits": ParameterRead("bool"),
    # getGuidedDecodingConfigFromParams: all three read outside try
    "tokenizer_dir": ParameterRead("string", required=True),
    "xgrammar_tokenizer_info_path": ParameterRead("string", required=True),
    "guided_decoding_backend": ParameterRead("string", required=True),
    # getExecutorConfigFromParams
    "max_beam_width": ParameterRead("int"),
    "iter_stats_max_iterations": ParameterRead("int"),
    "request_stats_max_iterations": ParameterRead("int"),
    "enable_trt_overlap": ParameterRead("bool"),
    "normalize_log_probs": ParameterRead("bool"),
    "enable_chunked_context": ParameterRead("bool"),
    "decoding_mode": ParameterRead("string", choices=("top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter",
                                                      "lookahead", "eagle")),
    "medusa_choices": ParameterRead("choices_list"),
    "eagle_choices": ParameterRead("choices_list"),
    # read only when decoding_mode is lookahead; then all three must be there (else TLLM_THROW)
    "lookahead_window_size": ParameterRead("uint"),
    "lookahead_ngram_size": ParameterRead("uint"),
    "lookahead_verification_set_size": ParameterRead("uint"),
    "gpu_weights_percent": ParameterRead("float"),
    "recv_poll_period_ms": ParameterRead("int"),
    # ModelInstanceState constructor
    "gpt_model_path": ParameterRead("string"),
    "encoder_model_path": ParameterRead("string"),
    "exclude_input_in_output": ParameterRead("bool"),
    "cancellation_check_period_ms": ParameterRead("int"),
    "stats_check_period_ms": ParameterRead("int"),
    # model_state.cc LoadParameters / GetExecutorWorkerPath
    "gpu_device_ids": ParameterRead("string"),
    "participant_ids": ParameterRead("string"),
    "worker_path": ParameterRead("string"),  # present at all: TLLM_THROW (renamed executor_worker_path)
    "executor_worker_path": ParameterRead("string"),
}
LOOKAHEAD_PARAMETERS = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")
# Parameter keys of triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt @ 0c8de69a
# (no logits_datatype: the logits type is the data_type of the logits outputs, model_state.cc).
TEMPLATE_PARAMETERS = frozenset({
    "max_beam_width", "FORCE_CPU_ONLY_INPUT_TENSORS", "gpt_model_type", "gpt_model_path", "encoder_model_path",
    "max_tokens_in_paged_kv_cache", "max_attention_window_size", "sink_token_length", "batch_scheduler_policy",
    "kv_cache_free_gpu_mem_fraction", "cross_kv_cache_fraction", "kv_cache_host_memory_bytes", "kv_cache_onboard_blocks",
    "enable_trt_overlap", "exclude_input_in_output", "cancellation_check_period_ms", "stats_check_period_ms",
    "iter_stats_max_iterations", "request_stats_max_iterations", "enable_kv_cache_reuse", "normalize_log_probs",
    "enable_chunked_context", "gpu_device_ids", "participant_ids", "num_nodes", "lora_cache_optimal_adapter_size",
    "lora_cache_max_adapter_size", "lora_cache_gpu_memory_fraction", "lora_cache_host_memory_bytes", "lora_prefetch_dir",
    "decoding_mode", "executor_worker_path", "lookahead_window_size", "lookahead_ngram_size",
    "lookahead_verification_set_size", "medusa_choices", "eagle_choices", "gpu_weights_percent",
    "enable_context_fmha_fp32_acc", "multi_block_mode", "cuda_graph_mode", "cuda_graph_cache_size",
    "speculative_decoding_fast_logits", "tokenizer_dir", "guided_decoding_backend", "xgrammar_tokenizer_info_path",
})
KNOWN_PARAMETERS = frozenset(BACKEND_PARAMETERS) | TEMPLATE_PARAMETERS

_BOOLS = {"True", "true", "TRUE", "1", "False", "false", "FALSE", "0"}  # ModelState::GetParameter<bool>
_INT = re.compile(r"^\s*[+-]?\d+")  # std::stoi / stoul / stoll: leading integer
_FLOAT = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_CHOICES = re.compile(r"^\s*\{\s*\d+(\s*,\s*\d+)*\s*\}(\s*,\s*\{\s*\d+(\s*,\s*\d+)*\s*\})*\s*$")  # "{0}, {0, 1}"
_INT_LIST = re.compile(r"^\s*\d+(\s*,\s*\d+)*\s*$")


def _unset(value: str, name: str) -> bool:
    """``fill_template.py`` leaves ``${name}`` for options it was not given; the backend treats an
    empty value or that placeholder as unset where it checks (getGuidedDecodingConfigFromParams)."""
    return value == "" or value == "${" + name + "}"


def _parses(kind: str, value: str) -> bool:
    if kind == "string":
        return True
    if kind == "bool":
        return value in _BOOLS
    if kind in ("int", "uint", "size"):
        return bool(_INT.match(value))
    if kind == "float":
        return bool(_FLOAT.match(value))
    if kind == "int_list":
        return bool(_INT_LIST.match(value))
    if kind == "choices_list":
        return bool(_CHOICES.match(value))
    raise ValueError(kind)


def replay_parameter_reading(params: dict[str, str]) -> list[str]:
    """What loading a ``tensorrtllm`` model with these ``parameters`` would run into, in the
    backend's words: [] when it loads and every given value is one the backend acts on.

    Errors: a required key absent (the load fails), a value the backend throws on, a lookahead
    decoding mode without its three sizes, ``worker_path`` present, guided decoding switched on
    with a backend other than ``xgrammar``; and, stricter than the backend (which only logs a
    warning and falls back to its default), any value it cannot parse or does not recognise, and
    any key it never reads.
    """
    errors = []
    for name, read in BACKEND_PARAMETERS.items():
        if name not in params:
            if read.required:
                errors.append(f"Cannot find parameter with name: {name}")
            continue
        value = params[name]
        if read.kind == "string" and name in ("gpt_model_path", "encoder_model_path", "lora_prefetch_dir"):
            continue
        if _unset(value, name) and not read.required:
            continue
        if not _parses(read.kind, value):
            errors.append(f"{name}: {value!r} is not a valid {read.kind}")
        elif read.choices and value not in read.choices:
            what = "throws" if read.throws_on_other else "ignored, default used"
            errors.append(f"{name}: {value!r} is not one of {', '.join(read.choices)} ({what})")
    if params.get("decoding_mode") == "lookahead":
        missing = [n for n in LOOKAHEAD_PARAMETERS if n not in params or not _parses("uint", params[n])]
        if missing:
            errors.append(f"Decoding mode is set to lookahead but lookahead parameters are not specified: {', '.join(missing)}")
    if "worker_path" in params:
        errors.append("worker_path parameter is specified, but this is no longer supported")
    backend = params.get("guided_decoding_backend", "")
    if not _unset(backend, "guided_decoding_backend") and not _unset(params.get("xgrammar_tokenizer_info_path", ""),
                                                                     "xgrammar_tokenizer_info_path"):
        if backend != "xgrammar":
            errors.append(f"guided_decoding_backend: {backend!r}: only 'xgrammar' is supported")
    if "gpt_model_path" not in params and "encoder_model_path" not in params:
        errors.append("Both encoder and decoder model paths are empty")
    errors += [f"{name}: not a parameter the backend reads or its template defines" for name in params if name not in KNOWN_PARAMETERS]
    return errors


# ----------------------------------------------------------------------------------------------
# LLM API (tensorrt_llm/llmapi/llm_args.py): decoding_type registry and each config class's fields.
# Fields are pydantic field names only; a ``validation_alias`` is listed in the line's aliases
# (alias -> field), never as a field (tests/test_trtllm_source.py checks both).

SPECULATIVE_MODEL_ALIASES = {"speculative_model_dir": "speculative_model"}  # AliasChoices("speculative_model", "speculative_model_dir")

_BASE_1_2 = frozenset({"max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency", "draft_len_schedule",
                       "load_format", "acceptance_window", "acceptance_length_threshold"})
_EAGLE_1_2 = frozenset({"eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree", "dynamic_tree_max_topK",
                        "num_eagle_layers", "max_non_leaves_per_layer", "eagle3_one_model", "eagle3_layers_to_capture"})
# 1.2.x: DecodingBaseConfig.from_dict's config_classes (the YAML ``decoding_type`` values) -> fields
# accepted besides decoding_type (StrictBaseModel: any other key is an error). Field lists are the
# ones read in the sources named above; a class may define more (MTP's relaxed-acceptance options,
# for one), so these sets can only make a check stricter, never let an unknown key through.
# ``speculative_model`` with its alias ``speculative_model_dir``: as the real 1.2.1 defines it
# (issue 34's check of the 1.2.1 wheel; the stored copies read here differ in this one name).
LLM_API_1_2: dict[str, frozenset[str]] = {
    "MTP": _BASE_1_2 | {"num_nextn_predict_layers"},
    "Medusa": _BASE_1_2 | {"medusa_choices", "num_medusa_heads"},
    "Eagle": _BASE_1_2 | _EAGLE_1_2,
    "Lookahead": _BASE_1_2 | {"max_window_size", "max_ngram_size", "max_verification_set_size"},
    "NGram": _BASE_1_2 | {"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"},
    "DraftTarget": _BASE_1_2,
    "SaveState": _BASE_1_2 | {"output_directory", "write_interval", "file_prefix", "eagle3_layers_to_capture"},
    "UserProvided": _BASE_1_2 | {"drafter", "resource_manager"},
    "AUTO": _BASE_1_2,
}
_BASE_1_3 = _BASE_1_2 | {"allow_advanced_sampling"}
# The 1.3 line (llm_args.py as stored at the 1.3 pre-release stage, MTP's note "will do nothing in
# release 1.3"): one ``decoding_type: Literal[...]`` per class. Eagle3, PARD and SA (suffix automaton,
# NVIDIA/TensorRT-LLM PR #11434, merged 2026-02 after the 1.2 branch) are new; DraftTarget and
# UserProvided are spelled Draft_Target and User_Provided there (the 1.2 spellings may be accepted as
# aliases, DecodingBaseConfig._decoding_type_alias; specbuild writes the canonical spelling for >= 1.3).
_RENAMED_1_3 = {"DraftTarget": "Draft_Target", "UserProvided": "User_Provided"}
LLM_API_1_3: dict[str, frozenset[str]] = {
    **{_RENAMED_1_3.get(name, name): (fields - _BASE_1_2) | _BASE_1_3 for name, fields in LLM_API_1_2.items()},
    "Eagle": _BASE_1_3 | _EAGLE_1_2 | {"eagle3_model_arch"},
    "Eagle3": _BASE_1_3 | _EAGLE_1_2 | {"eagle3_model_arch"},
    "PARD": _BASE_1_3 | {"mask_token_id"},
    "SA": _BASE_1_3 | {"max_matching_ngram_size"},
}
LLM_API_1_4_COMMIT = "0004396720054fd8e205cbf616f21f0b57c6b412"
# The 1.4 line: NVIDIA/TensorRT-LLM main at LLM_API_1_4_COMMIT, tensorrt_llm/llmapi/llm_args.py, every
# DecodingBaseConfig subclass read in full. EagleDecodingConfig still defines eagle_choices ("will be
# removed in release 1.4") and eagle3_one_model ("Setting False is ignored ... the two-model path is
# deprecated"): listed in REMOVED_IN_1_4, which a 1.4 plan must not write. MTP's
# num_nextn_predict_layers is init=False (a deprecated key remapped to max_draft_len before
# validation): left out.
_BASE_1_4 = frozenset({"max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency", "draft_len_schedule",
                       "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold", "use_rejection_sampling",
                       "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty"})
_EAGLE_1_4 = frozenset({"eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree", "dynamic_tree_max_topK",
                        "num_eagle_layers", "max_non_leaves_per_layer", "eagle3_one_model", "eagle3_layers_to_capture",
                        "eagle3_model_arch"})
SA_ENHANCER_1_4 = frozenset({"threshold", "enable_global_pool"})  # SAEnhancerConfig: the sa_config of Eagle3, MTP and PARD
LLM_API_1_4: dict[str, frozenset[str]] = {
    "Eagle": _BASE_1_4 | _EAGLE_1_4,
    "Eagle3": _BASE_1_4 | _EAGLE_1_4 | {"sa_config"},
    "SaveState": _BASE_1_4 | {"output_directory", "write_interval", "file_prefix", "eagle3_layers_to_capture"},
    "User_Provided": _BASE_1_4 | {"drafter", "resource_manager"},
    "NGram": _BASE_1_4 | {"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"},
    "SA": _BASE_1_4 | {"max_matching_ngram_size", "enable_global_pool", "global_pool_size"},
    "Draft_Target": _BASE_1_4,
    "MTP": _BASE_1_4 | {"use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta", "use_mtp_vanilla",
                        "mtp_eagle_one_model", "use_dynamic_tree", "dynamic_tree_max_topK", "sa_config",
                        "begin_thinking_phase_token", "end_thinking_phase_token"},
    "PARD": _BASE_1_4 | {"mask_token_id", "sa_config"},
    "DFlash": _BASE_1_4 | {"mask_token_id", "target_layer_ids", "attention_backend"},
    "DSpark": _BASE_1_4 | {"mask_token_id", "target_layer_ids", "block_size", "markov_rank", "markov_head_type", "attention_backend"},
    "AUTO": _BASE_1_4,
}
REMOVED_IN_1_4 = frozenset({"eagle_choices", "eagle3_one_model"})
LINES = {"1.2": LLM_API_1_2, "1.3": LLM_API_1_3, "1.4": LLM_API_1_4}
NESTED = {"sa_config": SA_ENHANCER_1_4}  # fields whose value is itself a strict config


def llm_api_line(version: str) -> str:
    """``"1.2.1"`` -> ``"1.2"``; the 1.x line of a version string (before 1.2: the 1.2 registry)."""
    major, minor = (int(p) for p in re.match(r"^(\d+)\.(\d+)", version).groups())
    return "1.2" if (major, minor) < (1, 3) else "1.3" if (major, minor) < (1, 4) else "1.4"


def llm_api_classes(version: str) -> dict[str, frozenset[str]]:
    """The registry for a TensorRT-LLM version string (``"1.2.1"`` -> the 1.2 line)."""
    return LINES[llm_api_line(version)]


def check_speculative_config(config: dict, version: str) -> list[str]:
    """What ``DecodingBaseConfig.from_dict`` / pydantic would reject in a YAML
    ``speculative_config`` for ``version`` (a field's validation alias is accepted in its place),
    plus, for 1.4, any field marked for removal there: [] when it is accepted."""
    classes = llm_api_classes(version)
    decoding_type = config.get("decoding_type")
    if decoding_type not in classes:
        return [f"Invalid decoding type: {decoding_type}"]
    fields = classes[decoding_type]
    errors = []
    for key, value in config.items():
        name = SPECULATIVE_MODEL_ALIASES.get(key, key)
        if key == "decoding_type":
            continue
        if name not in fields:
            errors.append(f"{decoding_type}: unknown field {key!r}")
        elif llm_api_line(version) == "1.4" and name in REMOVED_IN_1_4:
            errors.append(f"{decoding_type}: {key!r} is marked for removal in 1.4")
        elif name in NESTED and isinstance(value, dict):
            errors += [f"{decoding_type}.{key}: unknown field {k!r}" for k in value if k not in NESTED[name]]
    return errors


# ----------------------------------------------------------------------------------------------
# TensorRT-LLM's own LLM-API Triton model (the layout tensorrtllm_backend#858's README starts from):
# triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt @ 0a71057313ec0626527e164a8fc0205c5822e2f5
# and 1/model.yaml @ 0ebb1536ac12bbe27201185de960df3ab00bcecc (LLM() arguments + triton_config).
UPSTREAM_LLMAPI_MODEL = "tensorrt_llm"
UPSTREAM_LLMAPI_INPUTS = {
    "text_input": "TYPE_STRING", "image_url": "TYPE_STRING", "streaming": "TYPE_BOOL", "sampling_param_best_of": "TYPE_INT32",
    "sampling_param_temperature": "TYPE_FP32", "sampling_param_top_k": "TYPE_INT32", "sampling_param_top_p": "TYPE_FP32",
    "sampling_param_frequency_penalty": "TYPE_FP32", "sampling_param_presence_penalty": "TYPE_FP32",
    "sampling_param_max_tokens": "TYPE_INT32", "sampling_param_stop": "TYPE_STRING", "sampling_param_seed": "TYPE_UINT64",
    "sampling_param_exclude_input_from_output": "TYPE_BOOL", "sampling_param_return_perf_metrics": "TYPE_BOOL",
    "return_finish_reason": "TYPE_BOOL", "return_stop_reason": "TYPE_BOOL", "return_cumulative_logprob": "TYPE_BOOL",
    "stop": "TYPE_BOOL", "lora_id": "TYPE_UINT64", "lora_name": "TYPE_STRING", "lora_path": "TYPE_STRING",
    "lora_ckpt_source": "TYPE_STRING",
}
UPSTREAM_LLMAPI_OUTPUTS = {
    "text_output": "TYPE_STRING", "finish_reason": "TYPE_STRING", "stop_reason": "TYPE_STRING", "cumulative_logprob": "TYPE_FP32",
    "kv_cache_reused_block": "TYPE_INT32", "kv_cache_missed_block": "TYPE_INT32", "kv_cache_alloc_new_blocks": "TYPE_INT32",
    "kv_cache_alloc_total_blocks": "TYPE_INT32", "kv_cache_hit_rate": "TYPE_FP32", "arrival_time_ns": "TYPE_INT64",
    "first_scheduled_time_ns": "TYPE_INT64", "first_token_time_ns": "TYPE_INT64", "last_token_time_ns": "TYPE_INT64",
    "acceptance_rate": "TYPE_FP32", "total_accepted_draft_tokens": "TYPE_INT32", "total_draft_tokens": "TYPE_INT32",
}
UPSTREAM_LLMAPI_YAML_KEYS = {"model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "logits_post_processors", "triton_config"}
UPSTREAM_TRITON_CONFIG_KEYS = {"max_batch_size", "decoupled"}
# specbuild's ensemble name -> upstream's name for the same request field or result (docs/deploy-trtllm.md)
LLMAPI_NAME_MAP = {
    "text_input": "text_input", "max_tokens": "sampling_param_max_tokens", "temperature": "sampling_param_temperature",
    "top_k": "sampling_param_top_k", "top_p": "sampling_param_top_p", "seed": "sampling_param_seed",
    "exclude_input_in_output": "sampling_param_exclude_input_from_output", "return_perf_metrics": "sampling_param_return_perf_metrics",
    "text_output": "text_output", "acceptance_rate": "acceptance_rate", "total_accepted_draft_tokens": "total_accepted_draft_tokens",
    "total_draft_tokens": "total_draft_tokens",
}
