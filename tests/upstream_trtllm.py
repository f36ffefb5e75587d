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
- ``tensorrt_llm/llmapi/llm_args.py`` by LLM-API line (the 1.2 registry; main at
  0004396720054fd8e205cbf616f21f0b57c6b412, read in full; the published 1.3.0rc27, 1.4.0rc1 and
  1.4.0rc4 API references) and the tag commits that could be pinned: see the comment above
  ``LLM_API_1_2`` below. Every line: ``speculative_model`` is the field, ``speculative_model_dir``
  its validation alias.

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

# Where each line's names come from (issue 34; what could and could not be pinned):
#
# - Tag commits, from triton-inference-server/tensorrtllm_backend's ``tensorrt_llm`` submodule (its
#   release commits pin the TensorRT-LLM tag; checked on v0.10.0 -> 9bd15f1937f5..., the commit NVIDIA's
#   0.10.0 release page names): v1.3.0rc1 = TRTLLM_V1_3_0RC1_COMMIT. 1.2.1: the backend's r26.05-r26.07
#   branches build ``TENSORRTLLM_REPO_TAG=release/1.2.1`` / ``TENSORRTLLM_VER=1.2.1``
#   (dockerfile/Dockerfile.triton.trt_llm_backend) with the submodule at TRTLLM_1_2_1_SUBMODULE_COMMIT
#   (r26.04: 2fdb9e66302b15db9a9b5e71d3ac45d5921ea45d). The llm_args.py text at these commits could
#   not be read here: the stored copies of NVIDIA/TensorRT-LLM hold other commits ("not at that
#   commit"), and the repository snapshots (2.5 GB; the triton-inference-server fork 2.0 GB) are over
#   the 500 MB fetch limit.
# - Text read at a pinned commit: NVIDIA/TensorRT-LLM main at MAIN_COMMIT (tensorrt_llm/llmapi/llm_args.py,
#   read in full). Its fields place it in the 1.3 pre-release series, before 1.3.0rc27: EagleDecodingConfig
#   still has greedy_sampling / posterior_threshold / eagle3_one_model (gone from the 1.3.0rc27 and
#   1.4 references) and eagle_choices says "will be removed in release 1.4"; DecodingBaseConfig has no
#   moe_backend / spec_dec_variant (both in every 1.4 reference).
# - Per-release field lists: NVIDIA's published API reference for each release,
#   nvidia.github.io/TensorRT-LLM/<release>/llm-api/reference/<Class>.html, whose class signature
#   Sphinx generates from that release's own llm_args.py (every pydantic field, in order; validation
#   aliases are not shown). Read for 1.3.0rc27 (EagleDecodingConfig, Eagle3DecodingConfig,
#   MTPDecodingConfig), 1.4.0rc1 (Eagle3DecodingConfig, MTPDecodingConfig) and 1.4.0rc4
#   (Eagle3DecodingConfig, MTPDecodingConfig, NGramDecodingConfig, SADecodingConfig).
#
# A line's registry is the intersection over its sources (a key accepted by it is accepted by every
# release read for that line); a class no reference page was read for keeps the pinned commit's
# class fields on the line's base.
TRTLLM_V1_3_0RC1_COMMIT = "45d7022cc33903509fd8045bbc577d77dd1d3e2f"
TRTLLM_1_2_1_SUBMODULE_COMMIT = "ca88df0a400515b8206a19eb30cd047eb7661035"
MAIN_COMMIT = "0004396720054fd8e205cbf616f21f0b57c6b412"

# 1.2.x: DecodingBaseConfig.from_dict's config_classes (the YAML ``decoding_type`` values) -> fields
# accepted besides decoding_type (StrictBaseModel: any other key is an error). Read from the stored
# 1.2-layout copies (registry dict in from_dict; their commits could not be resolved, see above);
# ``speculative_model`` with its alias ``speculative_model_dir`` as 1.2.1 defines it (issue 34's check
# of the 1.2.1 wheel). A class may define more (MTP's relaxed-acceptance options), so these sets can
# only make a check stricter, never let an unknown key through.
_BASE_1_2 = frozenset({"max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency", "draft_len_schedule",
                       "load_format", "acceptance_window", "acceptance_length_threshold"})
_EAGLE_1_2 = frozenset({"eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree", "dynamic_tree_max_topK",
                        "num_eagle_layers", "max_non_leaves_per_layer", "eagle3_one_model", "eagle3_layers_to_capture"})
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

# NVIDIA/TensorRT-LLM main at MAIN_COMMIT: every DecodingBaseConfig subclass (decoding_type literal ->
# fields). MTP's num_nextn_predict_layers is init=False there but accepted (a deprecated key remapped
# to max_draft_len before validation), as every 1.3/1.4 reference lists it.
_BASE_MAIN = frozenset({"max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency", "draft_len_schedule",
                        "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold", "use_rejection_sampling",
                        "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty"})
_EAGLE_MAIN = frozenset({"eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree", "dynamic_tree_max_topK",
                         "num_eagle_layers", "max_non_leaves_per_layer", "eagle3_one_model", "eagle3_layers_to_capture",
                         "eagle3_model_arch"})
_MTP_MAIN = frozenset({"use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta", "use_mtp_vanilla", "mtp_eagle_one_model",
                       "use_dynamic_tree", "dynamic_tree_max_topK", "sa_config", "begin_thinking_phase_token",
                       "end_thinking_phase_token", "num_nextn_predict_layers"})
LLM_API_MAIN: dict[str, frozenset[str]] = {
    "Eagle": _BASE_MAIN | _EAGLE_MAIN,
    "Eagle3": _BASE_MAIN | _EAGLE_MAIN | {"sa_config"},
    "SaveState": _BASE_MAIN | {"output_directory", "write_interval", "file_prefix", "eagle3_layers_to_capture"},
    "User_Provided": _BASE_MAIN | {"drafter", "resource_manager"},
    "NGram": _BASE_MAIN | {"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"},
    "SA": _BASE_MAIN | {"max_matching_ngram_size", "enable_global_pool", "global_pool_size"},
    "Draft_Target": _BASE_MAIN,
    "MTP": _BASE_MAIN | _MTP_MAIN,
    "PARD": _BASE_MAIN | {"mask_token_id", "sa_config"},
    "DFlash": _BASE_MAIN | {"mask_token_id", "target_layer_ids", "attention_backend"},
    "DSpark": _BASE_MAIN | {"mask_token_id", "target_layer_ids", "block_size", "markov_rank", "markov_head_type", "attention_backend"},
    "AUTO": _BASE_MAIN,
}
SA_ENHANCER = frozenset({"threshold", "enable_global_pool"})  # SAEnhancerConfig at MAIN_COMMIT: the sa_config of Eagle3, MTP and PARD

# The published 1.3.0rc27 API reference (the newest 1.3 release whose reference was read).
_BASE_1_3_RC27 = _BASE_MAIN  # the DecodingBaseConfig part of every 1.3.0rc27 signature read
_EAGLE_1_3_RC27 = frozenset({"eagle_choices", "use_dynamic_tree", "dynamic_tree_max_topK", "num_eagle_layers", "max_non_leaves_per_layer",
                             "eagle3_layers_to_capture", "eagle3_model_arch"})
_MTP_REFERENCE = frozenset({"use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta", "use_mtp_vanilla", "use_dynamic_tree",
                            "dynamic_tree_max_topK", "sa_config", "num_nextn_predict_layers", "begin_thinking_phase_token",
                            "end_thinking_phase_token"})
REFERENCE_1_3_0RC27: dict[str, frozenset[str]] = {
    "Eagle": _BASE_1_3_RC27 | _EAGLE_1_3_RC27,
    "Eagle3": _BASE_1_3_RC27 | _EAGLE_1_3_RC27 | {"sa_config"},
    "MTP": _BASE_1_3_RC27 | _MTP_REFERENCE,
}
# The published 1.4.0rc1 and 1.4.0rc4 API references.
_BASE_1_4_RC1 = _BASE_MAIN | {"moe_backend", "spec_dec_variant"}
_BASE_1_4_RC4 = _BASE_1_4_RC1 | {"moe_tactic"}
_EAGLE3_1_4 = frozenset({"use_dynamic_tree", "dynamic_tree_max_topK", "max_non_leaves_per_layer", "eagle3_layers_to_capture",
                         "eagle3_model_arch", "sa_config"})
REFERENCE_1_4_0RC1: dict[str, frozenset[str]] = {
    "Eagle3": _BASE_1_4_RC1 | _EAGLE3_1_4 | {"num_eagle_layers"},
    "MTP": _BASE_1_4_RC1 | _MTP_REFERENCE,
}
REFERENCE_1_4_0RC4: dict[str, frozenset[str]] = {
    "Eagle3": _BASE_1_4_RC4 | _EAGLE3_1_4,
    "MTP": _BASE_1_4_RC4 | _MTP_REFERENCE | {"draft_lm_head_dtype", "draft_moe_dtype"},
    "NGram": _BASE_1_4_RC4 | {"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"},
    "SA": _BASE_1_4_RC4 | {"max_matching_ngram_size", "enable_global_pool", "global_pool_size"},
}


def _line(base: frozenset[str], pinned: dict[str, frozenset[str]], *references: dict[str, frozenset[str]],
          types: frozenset[str]) -> dict[str, frozenset[str]]:
    """A line's registry: for each decoding type in ``types``, the fields every reference read for
    it has (intersection), else the pinned commit's class fields on the line's ``base``."""
    out = {}
    for decoding_type in sorted(types):
        read = [r[decoding_type] for r in references if decoding_type in r]
        if read:
            out[decoding_type] = frozenset.intersection(*read)
        else:
            out[decoding_type] = (pinned[decoding_type] - _BASE_MAIN) | base
    return out


_TYPES_1_3 = frozenset(LLM_API_MAIN) - {"DFlash", "DSpark"}  # DFlash / DSpark: first in the 1.4 line (DECODING_TYPE_SINCE)
# The 1.3 line: main at MAIN_COMMIT (in the 1.3 pre-release series) and the 1.3.0rc27 reference. What the
# later 1.3 releases dropped (EagleDecodingConfig's greedy_sampling, posterior_threshold, eagle3_one_model)
# is out, so a 1.3 plan must not write eagle3_one_model.
LLM_API_1_3 = _line(_BASE_MAIN, LLM_API_MAIN, LLM_API_MAIN, REFERENCE_1_3_0RC27, types=_TYPES_1_3)
# The 1.4 line: the 1.4.0rc1 and 1.4.0rc4 references; other classes: MAIN_COMMIT's class fields on the 1.4 base.
LLM_API_1_4 = _line(_BASE_1_4_RC1, LLM_API_MAIN, REFERENCE_1_4_0RC1, REFERENCE_1_4_0RC4, types=frozenset(LLM_API_MAIN))
# Fields the 1.3 line's Eagle3 had somewhere in its series (MAIN_COMMIT) that the 1.4 line's Eagle3 has not.
REMOVED_IN_1_4 = LLM_API_MAIN["Eagle3"] - LLM_API_1_4["Eagle3"]
LINES = {"1.2": LLM_API_1_2, "1.3": LLM_API_1_3, "1.4": LLM_API_1_4}
# Where each line's names were read, for messages and docs.
LINE_SOURCES = {
    "1.2": "the 1.2 registry (DecodingBaseConfig.from_dict) in stored copies; 1.2.1 builds from release/1.2.1 "
           f"(tensorrtllm_backend r26.05-r26.07, submodule {TRTLLM_1_2_1_SUBMODULE_COMMIT[:9]}), text at that commit not readable",
    "1.3": f"NVIDIA/TensorRT-LLM main {MAIN_COMMIT[:9]} (1.3 pre-release series) and the 1.3.0rc27 API reference; "
           f"v1.3.0rc1 is {TRTLLM_V1_3_0RC1_COMMIT[:9]}",
    "1.4": f"the 1.4.0rc1 and 1.4.0rc4 API references (class fields of other classes: main {MAIN_COMMIT[:9]})",
}
NESTED = {"sa_config": SA_ENHANCER}  # fields whose value is itself a strict config


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
    checked against every source read for that line (:data:`LINE_SOURCES`): [] when it is accepted."""
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
            gone = llm_api_line(version) == "1.4" and name in REMOVED_IN_1_4
            errors.append(f"{decoding_type}: {key!r} was removed in the 1.4 line" if gone else f"{decoding_type}: unknown field {key!r}")
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
