"""TensorRT-LLM's own per-iteration speculation choice, kept as test data: the functions as written in
its sources (method bodies lifted to functions, logging dropped), run by tests/test_spec_controls.py
against the reference engine's choice.

Sources (NVIDIA/TensorRT-LLM):

- ``tensorrt_llm/_torch/speculative/drafter.py`` ``Drafter.should_use_spec_decode`` at
  83ab45a50d169b08e29e9bf2f46fc66b3838cc37 (the max_num_tokens-aware form the 1.2 line has; its
  argument is named ``max_draft_len`` in older copies, ``max_total_draft_tokens`` here);
- the same file's ``Drafter.get_draft_len_for_batch_size`` as added by PR #8194 ("Dynamic draft length in
  spec decode (stage 1)", TRTLLM-8136) and kept in later copies (bisect_right: the largest threshold <=
  the batch size); the stored copies of that revision carry no commit id here, so the PR is cited;
- ``tensorrt_llm/_torch/pyexecutor/py_executor.py`` ``PyExecutor._prepare_and_schedule_batch`` of the
  same line: the schedule first, ``K == 0`` -> off, then the permanent acceptance gate, then
  ``should_use_spec_decode(active_requests, max_batch_size, max_num_tokens, K)``;
- the 1.3 line's ``tensorrt_llm/_torch/speculative/utils.py`` ``get_draft_len_for_batch_size`` (PR
  #10860, "Dynamic draft length on spec decode one-model path"), kept to show the semantics the
  reference engine does NOT follow (keys are "up to" batch sizes, bisect_left, 0 past the largest key).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

UPSTREAM_1_2 = '''
def get_draft_len_for_batch_size(draft_len_schedule, batch_size):
    thresholds = list(draft_len_schedule.keys())
    idx = bisect_right(thresholds, batch_size)
    if idx == 0:
        return 0
    threshold = thresholds[idx - 1]
    return draft_len_schedule[threshold]


def should_use_spec_decode(max_concurrency, requests, max_batch_size, max_num_tokens, max_total_draft_tokens):
    if max_concurrency is None:
        return True
    if not requests or max_batch_size <= 0 or max_num_tokens <= 0:
        return False
    tokens_per_request = 1 + max_total_draft_tokens
    token_cap = max_num_tokens // tokens_per_request
    if token_cap <= 0:
        return False
    num_effective_requests = min(len(requests), max_batch_size, token_cap)
    return num_effective_requests <= max_concurrency


def prepare_and_schedule_batch(draft_len_schedule, max_concurrency, speculation_permanently_disabled,
                               active_requests, max_batch_size, max_num_tokens, max_total_draft_tokens):
    if draft_len_schedule is not None:
        batch_size_input = len(active_requests)
        max_total_draft_tokens = get_draft_len_for_batch_size(draft_len_schedule, batch_size_input)
    if draft_len_schedule is not None and max_total_draft_tokens == 0:
        use_spec_decode = False
    elif speculation_permanently_disabled:
        use_spec_decode = False
    else:
        use_spec_decode = should_use_spec_decode(max_concurrency, active_requests, max_batch_size,
                                                 max_num_tokens, max_total_draft_tokens)
    return use_spec_decode, max_total_draft_tokens
'''

UPSTREAM_1_3_SCHEDULE = '''
def get_draft_len_for_batch_size(draft_len_schedule, batch_size, max_draft_len):
    if draft_len_schedule is None:
        return max_draft_len
    schedule_batch_sizes = list(draft_len_schedule.keys())
    idx = bisect_left(schedule_batch_sizes, batch_size)
    if idx < len(schedule_batch_sizes):
        return draft_len_schedule[schedule_batch_sizes[idx]]
    return 0
'''


def load(source: str) -> dict:
    """The functions of ``source`` (one of the texts above), by name."""
    namespace: dict = {"bisect_left": bisect_left, "bisect_right": bisect_right}
    exec(compile(source, "upstream_spec_controls", "exec"), namespace)  # noqa: S102 - test data written above
    return namespace
