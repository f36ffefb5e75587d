"""vLLM's, SGLang's and TensorRT-LLM's schedule rules and lookups, kept as test data (inputs, what the
engine does with them, and its words), each with the file and commit it was read at. No upstream code
is copied: these are the cases the engines' own sources and tests define.

- vLLM: vllm-project/vllm ``vllm/v1/spec_decode/dynamic/utils.py`` @ 14b450ca590cbff96e7004bdb147a5d3acf5a4f6
  (``validate_and_normalize_dynamic_sd_schedule``, ``build_dynamic_sd_schedule_lookup``);
  ``vllm/config/speculative.py`` @ 002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443 (``num_speculative_tokens``
  ``Field(gt=0)``; ``num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None``);
  PR #45963 (off under data parallelism); the lookup cases of its schedule-helper regression tests.
- SGLang: sgl-project/sglang ``python/sglang/srt/speculative/adaptive_spec_params.py`` @
  015c872628e328b530880bcf95ae91222604b225, ``adaptive_step_router.py`` @ a12239f6ac74d804d169ee5d3cfed3c49fa7162c.
- TensorRT-LLM: PR #16888, ``tests/unittest/_torch/speculative/hw_agnostic/test_min_runtime_draft_len.py``
  @ 011d0933dcb5e592f5fa2626beaf42a96324c578 (``min_runtime_draft_len`` per config class).
"""

from __future__ import annotations

VLLM_SOURCE = "vllm-project/vllm vllm/v1/spec_decode/dynamic/utils.py @ 14b450ca"
# (num_speculative_tokens_per_batch_size, num_speculative_tokens, the rule upstream's error states)
VLLM_REFUSED = [
    ([], 3, "must not be empty"),
    ([[1, 4]], 3, "range_start, range_end, num_speculative_tokens"),
    ([[0, 4, 3]], 3, "must be positive"),
    ([[1, 4, 3], [8, 6, 2]], 3, "start must be <= end"),
    ([[1, 4, -1]], 3, "must be >= 0"),
    ([[1, 8, 3], [4, 16, 2]], 3, "non-overlapping and sorted"),
    ([[2, 8, 3]], 3, "must start at 1"),
    ([[1, 8, 3]], 0, "num_speculative_tokens must be > 0"),
]
# (schedule, num_speculative_tokens, batch size, k): gaps inherit, the tail carries, k is capped
VLLM_LOOKUP = [
    ([[1, 16, 3], [32, 128, 2], [256, 256, 0]], 3, 1, 3),
    ([[1, 16, 3], [32, 128, 2], [256, 256, 0]], 3, 17, 3),
    ([[1, 16, 3], [32, 128, 2], [256, 256, 0]], 3, 31, 3),
    ([[1, 16, 3], [32, 128, 2], [256, 256, 0]], 3, 32, 2),
    ([[1, 16, 3], [32, 128, 2], [256, 256, 0]], 3, 255, 2),
    ([[1, 16, 3], [32, 128, 2], [256, 256, 0]], 3, 256, 0),
    ([[1, 4, 5]], 3, 2, 3),
    ([[1, 4, 2], [5, 512, 0]], 2, 5, 0),  # vLLM #49548's schedule
]

SGLANG_SOURCE = "sgl-project/sglang python/sglang/srt/speculative/adaptive_spec_params.py @ 015c8726"
# (config, speculative_num_steps, the rule upstream's error states)
SGLANG_REFUSED = [
    ({"strategy": "fastest", "1": {"candidate_steps": [3]}}, 3, "'strategy' must be 'ema' or 'throughput_aware'"),
    ({"strategy": "ema"}, 3, "at least one integer-string BS key"),
    ({"1": {"candidate_steps": []}}, 3, "candidate_steps must be a list of non-negative ints"),
    ({"1": {"candidate_steps": [3, -1]}}, 3, "candidate_steps must be a list of non-negative ints"),
    ({"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0]}}, 5, "is not in the adaptive config candidate_steps"),
]
# SGLang's own default config: slot keys 1, 8, 32, 64; the slot of a batch is the largest key <= it
SGLANG_DEFAULT_SLOTS = {"1": {"candidate_steps": [1, 3, 5, 7]}, "8": {"candidate_steps": [0, 1, 3]},
                        "32": {"candidate_steps": [0, 1]}, "64": {"candidate_steps": [0]}}
SGLANG_SLOT_OF = [(1, "1"), (7, "1"), (8, "8"), (31, "8"), (32, "32"), (100, "64")]

TRTLLM_FLOOR_SOURCE = "NVIDIA/TensorRT-LLM tests/unittest/_torch/speculative/hw_agnostic/test_min_runtime_draft_len.py @ 011d0933"
# min_runtime_draft_len by config class (PR #16888): one-engine modes 1, n-gram 0
TRTLLM_MIN_RUNTIME_DRAFT_LEN = {"Eagle3DecodingConfig": 1, "MTPDecodingConfig": 1, "DraftTargetDecodingConfig": 1,
                                "NGramDecodingConfig": 0}
# this project's PyTorch-path method -> TensorRT-LLM config class
TRTLLM_CONFIG_CLASS = {"eagle3": "Eagle3DecodingConfig", "mtp": "MTPDecodingConfig", "draft_target": "DraftTargetDecodingConfig",
                       "ngram": "NGramDecodingConfig"}

# draft_len_schedule's two readings, as each line's docstring example states them (batch size -> draft length)
TRTLLM_12_READING_SOURCE = "NVIDIA/TensorRT-LLM v1.2.1 tensorrt_llm/_torch/speculative/drafter.py get_draft_len_for_batch_size"
# 1.2: the entry of the largest key <= the batch size (a key holds up to the next); the field's example
TRTLLM_12_READING = ({1: 4, 4: 2, 8: 0}, [(1, 4), (3, 4), (4, 2), (7, 2), (8, 0), (64, 0)])
TRTLLM_MAIN_READING_SOURCE = ("NVIDIA/TensorRT-LLM tensorrt_llm/_torch/speculative/utils.py get_draft_len_for_batch_size "
                              "@ fcd3f31682808ae56118ae43c1d7864a3a945e6f (\"New semantics\")")
# main: keys are inclusive upper bounds, 0 above the largest; the docstring's own example
TRTLLM_MAIN_READING = ({4: 4, 8: 2, 32: 1}, [(1, 4), (4, 4), (5, 2), (8, 2), (9, 1), (32, 1), (33, 0)])
# main, llm_args.py DecodingBaseConfig @ fcd3f31: max_concurrency beside draft_len_schedule is refused
TRTLLM_MAIN_EXCLUSIVE = "max_concurrency and draft_len_schedule are mutually exclusive"
