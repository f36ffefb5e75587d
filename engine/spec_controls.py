"""TensorRT-LLM's runtime speculation controls, as its PyTorch executor applies them every iteration.

``speculative_config`` (LLM API, ``DecodingBaseConfig``) has four controls besides ``max_draft_len``:

- ``draft_len_schedule`` ``{batch-size threshold: draft length}``: the draft length of an iteration is
  the entry of the largest threshold <= the number of active requests (``{1: 4, 4: 2, 8: 0}``: 1-3
  requests draft 4, 4-7 draft 2, 8 and up none);
- ``max_concurrency``: speculation runs while ``min(active requests, max_batch_size,
  max_num_tokens // (1 + K)) <= max_concurrency``, ``K`` the iteration's draft length;
- ``acceptance_window`` N and ``acceptance_length_threshold`` T: each finished request records its
  accepted tokens per iteration (``avg_decoded_tokens_per_iter - 1``, floored at 0); once N requests
  have finished, a rolling mean over the last N below T turns speculation off for the engine's lifetime.

Sources (NVIDIA/TensorRT-LLM, the 1.2 line the recipes target, ``build.trtllm_version: '1.2.1'``):
``tensorrt_llm/_torch/speculative/drafter.py`` ``Drafter.get_draft_len_for_batch_size`` (bisect_right
over the sorted thresholds) and ``Drafter.should_use_spec_decode``;
``tensorrt_llm/_torch/pyexecutor/py_executor.py`` ``_prepare_and_schedule_batch`` (schedule first; K == 0
turns speculation off; then the permanent gate; then ``should_use_spec_decode`` with the scheduled K);
``tensorrt_llm/_torch/speculative/speculation_gate.py`` ``SpeculationGate.record_avg_decoded``;
``tensorrt_llm/llmapi/llm_args.py`` ``DecodingBaseConfig`` (fields and the schedule's validator).
Later lines differ: PR #10860 (merged for the 1.3 line) reads a key as "batch sizes UP TO this key"
(``bisect_left``; beyond the largest key speculation is off) and turns ``max_concurrency`` into such a
schedule; the reference engine follows the 1.2 line.

The reference engine (:class:`~specbuild.engine.worker.Worker`) evaluates :func:`runtime_draft_len`
once per iteration over its running requests (prefilling ones included, as TensorRT-LLM's
``active_requests``); a request's own ``num_draft_tokens`` still caps its drafts.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CONTROL_KEYS = ("draft_len_schedule", "max_concurrency", "acceptance_window", "acceptance_length_threshold")
"""``speculative_config`` keys that are runtime controls (the engine reads them; the methods do not)."""


def draft_len_for_batch_size(schedule: Mapping[int, int], batch_size: int) -> int:
    """The draft length at ``batch_size``: the entry of the largest threshold <= ``batch_size``, 0 below
    every threshold (TensorRT-LLM 1.2 ``Drafter.get_draft_len_for_batch_size``).

    Example: ``({1: 4, 4: 2, 8: 0}, 5)`` -> 2; ``({1: 4, 4: 2, 8: 0}, 64)`` -> 0.
    """
    thresholds = sorted(schedule)
    index = bisect_right(thresholds, batch_size)
    return 0 if index == 0 else schedule[thresholds[index - 1]]


def should_use_spec_decode(
    num_requests: int, *, max_concurrency: int | None, max_batch_size: int, max_num_tokens: int, max_draft_len: int
) -> bool:
    """TensorRT-LLM 1.2 ``Drafter.should_use_spec_decode``: always without ``max_concurrency``, else
    whether ``min(num_requests, max_batch_size, max_num_tokens // (1 + max_draft_len))`` (the requests
    that can run in one iteration: "effective requests") is at most ``max_concurrency``; never with no
    request or no room.

    Example: 12 requests, ``max_batch_size=8``, ``max_num_tokens=28``, ``max_draft_len=4``,
    ``max_concurrency=6``: ``min(12, 8, 28 // 5 = 5) = 5 <= 6`` -> True.
    """
    if max_concurrency is None:
        return True
    if num_requests <= 0 or max_batch_size <= 0 or max_num_tokens <= 0:
        return False
    token_cap = max_num_tokens // (1 + max_draft_len)
    if token_cap <= 0:
        return False
    return min(num_requests, max_batch_size, token_cap) <= max_concurrency


@dataclass
class SpeculationGate:
    """The acceptance gate (TensorRT-LLM ``SpeculationGate``): a rolling mean of accepted tokens per
    iteration over the last ``window`` finished requests; below ``threshold`` it closes for good.

    Attributes:
        window: N, requests in the rolling mean (>= 1).
        threshold: T, accepted draft tokens per iteration (``avg_decoded_tokens_per_iter - 1``).
        disabled: closed; speculation stays off from the next iteration on.
        last_mean: the mean at the latest full-window record (None before N requests finished).
    """

    window: int
    threshold: float
    disabled: bool = False
    last_mean: float | None = None
    _history: deque = field(default_factory=deque, repr=False)
    _count: int = 0

    def record(self, avg_decoded_tokens_per_iter: float) -> bool:
        """Record one finished request; True when this record closes the gate.

        Example: window 3, threshold 0.7; records 1.1, 1.2, 1.3 -> accepted 0.1, 0.2, 0.3, mean 0.2 < 0.7:
        the third record closes it.
        """
        if self.disabled:
            return False
        self._history.append(max(0.0, float(avg_decoded_tokens_per_iter) - 1.0))
        if len(self._history) > self.window:
            self._history.popleft()
        self._count += 1
        if self._count < self.window:
            return False
        self.last_mean = sum(self._history) / len(self._history)
        self.disabled = self.last_mean < self.threshold
        return self.disabled


@dataclass(frozen=True)
class RuntimeControls:
    """The runtime controls of one engine (``speculative_config`` keys of :data:`CONTROL_KEYS`).

    Attributes:
        max_draft_len: the method's ``max_draft_len`` (``schedule[1]`` must equal it).
        draft_len_schedule: sorted ``{threshold: draft length}``, or None.
        max_concurrency: >= 0, or None (no limit).
        acceptance_window: N >= 0 (0 or None: no gate).
        acceptance_length_threshold: T >= 0, or None (no gate).
    """

    max_draft_len: int
    draft_len_schedule: dict[int, int] | None = None
    max_concurrency: int | None = None
    acceptance_window: int | None = None
    acceptance_length_threshold: float | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], max_draft_len: int) -> RuntimeControls:
        """The controls in a ``speculative_config`` (other keys are ignored), checked as TensorRT-LLM's
        ``DecodingBaseConfig`` checks them.

        Raises:
            ValueError: a schedule TensorRT-LLM refuses (the rule it breaks), a negative
                ``max_concurrency`` / ``acceptance_window`` / ``acceptance_length_threshold``, or a value
                of the wrong type.
        """
        from specbuild.util.draft_len_schedule import check_draft_len_schedule

        schedule = config.get("draft_len_schedule")
        if schedule is not None:
            if not isinstance(schedule, Mapping):
                raise ValueError(f"speculative_config.draft_len_schedule must be a mapping {{batch size: draft length}}, got {schedule!r}")
            schedule = check_draft_len_schedule({_int(b, "draft_len_schedule key"): _int(k, "draft_len_schedule value")
                                                 for b, k in schedule.items()}, max_draft_len)
        values = {name: config.get(name) for name in CONTROL_KEYS[1:]}
        for name, value in values.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
                                      or (name != "acceptance_length_threshold" and not isinstance(value, int))):
                kind = "number" if name == "acceptance_length_threshold" else "integer"
                raise ValueError(f"speculative_config.{name} must be a non-negative {kind} or null, got {value!r}")
        return cls(max_draft_len, schedule or None, **values)

    def new_gate(self) -> SpeculationGate | None:
        """A fresh acceptance gate, or None when ``acceptance_window`` is 0/unset or there is no threshold."""
        if not self.acceptance_window or self.acceptance_length_threshold is None:
            return None
        return SpeculationGate(self.acceptance_window, self.acceptance_length_threshold)


def runtime_draft_len(
    controls: RuntimeControls, gate: SpeculationGate | None, *, num_active: int, max_batch_size: int, max_num_tokens: int
) -> int:
    """The iteration's draft length K (0: speculation off), as TensorRT-LLM 1.2's
    ``PyExecutor._prepare_and_schedule_batch`` decides it: K from the schedule at ``num_active``
    requests (else ``max_draft_len``); off when the schedule says 0, when the gate is closed, or when
    :func:`should_use_spec_decode` with that K says no.
    """
    k = controls.max_draft_len
    if controls.draft_len_schedule is not None:
        k = draft_len_for_batch_size(controls.draft_len_schedule, num_active)
        if k == 0:
            return 0
    if gate is not None and gate.disabled:
        return 0
    use = should_use_spec_decode(num_active, max_concurrency=controls.max_concurrency, max_batch_size=max_batch_size,
                                 max_num_tokens=max_num_tokens, max_draft_len=k)
    return k if use else 0


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"speculative_config.{what} must be an integer, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"speculative_config.{what} must be an integer, got {value!r}") from None
    if str(number) != str(value).strip() and number != value:
        raise ValueError(f"speculative_config.{what} must be an integer, got {value!r}")
    return number


__all__ = [
    "CONTROL_KEYS",
    "RuntimeControls",
    "SpeculationGate",
    "draft_len_for_batch_size",
    "runtime_draft_len",
    "should_use_spec_decode",
]
