"""The tuner's schedule in each engine's own syntax, checked by each engine's own rules.

:func:`specbuild.tune.draft_len_schedule` gives, per deployment, TensorRT-LLM's
``draft_len_schedule`` ``{batch-size threshold: draft length}`` plus ``max_concurrency``
(speculation off above it). :func:`engine_schedules` writes the same advice for three engines:

- **TensorRT-LLM** (PyTorch backend, ``speculative_config``): ``draft_len_schedule``,
  ``max_concurrency``, ``max_draft_len`` = ``schedule[1]``; checked by
  :func:`specbuild.util.draft_len_schedule.check_draft_len_schedule`
  (``llm_args.py`` ``DecodingBaseConfig.validate_draft_len_schedule_and_sort``). One-engine
  methods (EAGLE-3 one-model, MTP, draft/target one-model) keep drafter state that only the draft
  forward refreshes; at draft length 0 it goes stale and acceptance collapses for the rest of the
  request (NVIDIA/TensorRT-LLM PR #16888, which floors the resolved length at
  ``min_runtime_draft_len`` = 1 for those modes, 0 for n-gram). No TensorRT-LLM release carries
  that fix (:data:`PR_16888_FIRST_RELEASE`), so for one-engine methods every 0 entry becomes 1
  and ``max_concurrency`` (which TensorRT-LLM turns into a 0 entry) becomes a 1 entry above it.
  TensorRT-LLM 1.2 reads a key as holding up to the next key; main after 1.2.1 reads it as an
  inclusive upper bound (0 above the largest) and refuses ``max_concurrency`` beside a schedule, so
  the written schedule is :func:`~specbuild.util.draft_len_schedule.portable_schedule`'s: a key at both
  ends of every run of equal draft lengths, ``max_concurrency`` folded in as a 0 entry, read the
  same by both up to ``max_batch_size``.
- **vLLM** (``speculative_config``): ``num_speculative_tokens`` = the largest draft length and
  ``num_speculative_tokens_per_batch_size``, a list of inclusive ranges ``[start, end, k]``;
  checked by :func:`check_vllm_schedule`, the rules of ``validate_and_normalize_dynamic_sd_schedule``
  (vllm/v1/spec_decode/dynamic/utils.py). vLLM ignores it when ``data_parallel_size > 1``
  (vllm-project/vllm PR #45963: warns, falls back to ``num_speculative_tokens``): a warning says so.
- **SGLang**: ``--speculative-adaptive`` with ``--speculative-adaptive-config FILE.json``, whose
  integer-string keys are batch-size slots (the largest key <= the batch, after CUDA-graph padding)
  each with its ``candidate_steps``; one candidate per slot makes it a fixed schedule. Checked by
  :func:`check_sglang_adaptive_config` (python/sglang/srt/speculative/adaptive_spec_params.py
  ``_load_adaptive_config``, ``_init_adaptive_speculative_params``). SGLang runs it for EAGLE /
  EAGLE-3 with ``topk`` 1 only (``adaptive_unsupported_reason``); other methods get no SGLang
  schedule and a note that says so.

Example: ``{1: 4, 4: 2}`` with max_concurrency 8 ->
TensorRT-LLM ``draft_len_schedule {1: 4, 3: 4, 4: 2, 8: 2, 9: 0}``;
vLLM ``num_speculative_tokens 4``, ``[[1, 3, 4], [4, 8, 2], [9, 256, 0]]``;
SGLang (EAGLE-3) ``{"1": {"candidate_steps": [4]}, "4": {"candidate_steps": [2]}, "9": {"candidate_steps": [0]}}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from specbuild.util.draft_len_schedule import DraftLenScheduleError, check_draft_len_schedule, portable_schedule


@dataclass(frozen=True)
class Schedule:
    """Draft length by concurrency for one deployment and prompt set.

    Attributes:
        best: measured concurrency -> the lowest-latency draft length among those significantly faster
            than k = 0 there (0 when none is).
        draft_len_schedule: TensorRT-LLM's ``{threshold: draft_len}`` for the levels where speculation
            is on (a batch of b requests uses the largest threshold <= b), with ``schedule[1] ==
            max_draft_len``; ``{}`` when TensorRT-LLM cannot express ``best`` (``note`` says why).
            Deploy it as the recipe's ``build.draft_len_schedule`` with ``speculation.max_draft_len``.
        max_concurrency: speculation off above it (TensorRT-LLM ``max_concurrency``); ``None`` = on at
            every measured level; 0 = off at every level.
        max_draft_len: ``draft_len_schedule[1]`` (``None`` without a schedule).
        note: why there is no schedule ("" when there is one), or how a lookahead schedule is built.
        by_batch: the measured best k as batch-size thresholds where speculation is on (up to
            max_concurrency), before TensorRT-LLM's rules: what vLLM and SGLang are given.
        lookahead_ngram: lookahead only: the N to build (``speculation.max_ngram_size``), whose whole
            step is the schedule's non-zero entry (:func:`~specbuild.tune.analysis.draft_len_schedule`).
    """

    deployment: str
    prompt_set: str
    best: dict[int, int]
    draft_len_schedule: dict[int, int]
    max_concurrency: int | None
    max_draft_len: int | None = None
    note: str = ""
    lookahead_ngram: int | None = None
    by_batch: dict[int, int] = field(default_factory=dict)


PR_16888_FIRST_RELEASE: str | None = None  # no TensorRT-LLM release has the K=0 fix (1.2.1 is the newest release)
# TensorRT-LLM's min_runtime_draft_len per method of this project's PyTorch path (PR #16888's
# tests/unittest/_torch/speculative/hw_agnostic/test_min_runtime_draft_len.py): 1 for one-engine modes.
ONE_ENGINE_METHODS = frozenset({"eagle3", "eagle", "mtp", "draft_target"})
# Which of this project's methods each engine runs (TensorRT-LLM: the PyTorch path, where draft_len_schedule
# lives, llm_args.py; vLLM: config/speculative.py SpeculativeMethod; SGLang: below).
TRTLLM_PYTORCH_METHODS = frozenset({"ngram", "draft_target", "eagle", "eagle3", "mtp"})
VLLM_METHODS = frozenset({"ngram", "draft_target", "eagle", "eagle3", "medusa", "mtp"})
TRTLLM_MAX_BATCH_SIZE = 2048  # TensorRT-LLM BuildConfig's default max_batch_size (the LLM API's when unset)
VLLM_MAX_NUM_SEQS = 256  # the last range's end; vLLM carries the last range's k past it anyway
SGLANG_METHODS = frozenset({"eagle", "eagle3"})  # adaptive_unsupported_reason: EAGLE/EAGLE3 only


class EngineScheduleError(ValueError):
    """A schedule the engine would refuse; the message names the engine's rule."""


@dataclass(frozen=True)
class EngineSchedules:
    """One deployment's schedule in each engine's syntax; ``None`` where an engine cannot express it.

    Attributes:
        trtllm: ``speculative_config`` keys (``max_draft_len``, ``draft_len_schedule`` in the form
            every TensorRT-LLM line reads the same way, ``max_concurrency`` folded into it).
        vllm: ``speculative_config`` keys (``num_speculative_tokens``, ``num_speculative_tokens_per_batch_size``).
        sglang: the ``--speculative-adaptive-config`` JSON object.
        sglang_args: the server flags that go with it.
        notes: per engine, what was changed or why there is nothing.
    """

    deployment: str
    method: str
    trtllm: dict | None
    vllm: dict | None
    sglang: dict | None
    sglang_args: list[str] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def engine_schedules(schedule: Schedule, method: str, max_batch_size: int | None = None) -> EngineSchedules:
    """``schedule`` (from :func:`~specbuild.tune.draft_len_schedule`) for TensorRT-LLM, vLLM
    and SGLang, each passed through that engine's rules. ``method``: this project's method name;
    ``max_batch_size``: the deployment's (TensorRT-LLM's schedule keys end there; None:
    :data:`TRTLLM_MAX_BATCH_SIZE`)."""
    notes: dict[str, list[str]] = {"tensorrt-llm": [], "vllm": [], "sglang": []}
    # what was measured, as batch-size thresholds: vLLM and SGLang take any draft length per range, so they
    # get a schedule even where TensorRT-LLM's rules (schedule[1] = max_draft_len, none above it) give none
    measured = schedule.draft_len_schedule or schedule.by_batch
    top = max(measured.values(), default=0)
    if top == 0:  # speculation off wherever it was measured: nothing for any engine
        why = schedule.note or "no schedule"
        for lines in notes.values():
            lines.append(why)
        return EngineSchedules(schedule.deployment, method, None, None, None, notes=notes)
    trtllm = vllm = None
    if method not in TRTLLM_PYTORCH_METHODS:
        notes["tensorrt-llm"].append(f"TensorRT-LLM runs {method} on its engine path only, which has no draft_len_schedule")
    elif schedule.draft_len_schedule:
        trtllm = trtllm_config(schedule.draft_len_schedule, schedule.max_concurrency, method, notes["tensorrt-llm"],
                               max_batch_size=max_batch_size or TRTLLM_MAX_BATCH_SIZE)
    else:
        notes["tensorrt-llm"].append(schedule.note)
    if method in VLLM_METHODS:
        ranges = vllm_ranges(measured, schedule.max_concurrency)
        vllm = {"num_speculative_tokens": top, "num_speculative_tokens_per_batch_size": ranges}
        check_vllm_schedule(ranges, top)
        notes["vllm"].append("vLLM ignores num_speculative_tokens_per_batch_size when data_parallel_size > 1 and runs "
                             f"num_speculative_tokens={top} at every batch size (vllm-project/vllm PR #45963)")
    else:
        notes["vllm"].append(f"vLLM has no {method} method")
    sglang, sglang_args = None, []
    if method in SGLANG_METHODS:
        sglang = sglang_adaptive_config(measured, schedule.max_concurrency)
        sglang_args = ["--speculative-adaptive", "--speculative-adaptive-config", "FILE.json", "--speculative-eagle-topk", "1",
                       "--speculative-num-steps", str(top)]
        check_sglang_adaptive_config(sglang, top)
        notes["sglang"].append("SGLang looks the slot up after padding the batch to its CUDA-graph batch sizes")
    else:
        notes["sglang"].append(f"SGLang has no batch-size schedule for {method}: --speculative-adaptive runs EAGLE/EAGLE3 "
                               "with topk 1 only (sglang/srt/speculative/adaptive_spec_params.py)")
    return EngineSchedules(schedule.deployment, method, trtllm, vllm, sglang, sglang_args, notes)


def trtllm_config(schedule: Mapping[int, int], max_concurrency: int | None, method: str, notes: list[str], *,
                  max_batch_size: int = TRTLLM_MAX_BATCH_SIZE) -> dict:
    """TensorRT-LLM ``speculative_config`` keys, floored at draft length 1 for one-engine methods, in
    :func:`~specbuild.util.draft_len_schedule.portable_schedule`'s form up to ``max_batch_size``
    (module docstring). Raises :class:`DraftLenScheduleError` for a schedule TensorRT-LLM refuses.

    Example: ``({1: 4, 4: 2}, 8, "ngram", [], max_batch_size=16)`` -> ``{"max_draft_len": 4,
    "draft_len_schedule": {1: 4, 3: 4, 4: 2, 8: 2, 9: 0}}``."""
    schedule = dict(schedule)
    if method in ONE_ENGINE_METHODS and PR_16888_FIRST_RELEASE is None:
        floored = {b: max(k, 1) for b, k in schedule.items()}
        if max_concurrency is not None:
            floored[max_concurrency + 1] = 1
        if floored != schedule:
            notes.append(f"{method} is a one-engine method: draft length floored at 1 (max_concurrency and 0 entries become 1); "
                         "at 0 its drafter state goes stale on every release (NVIDIA/TensorRT-LLM PR #16888, unreleased)")
        schedule, max_concurrency = floored, None
    check_draft_len_schedule(schedule, schedule[1])
    return {"max_draft_len": schedule[1], "draft_len_schedule": portable_schedule(schedule, max_concurrency, max_batch_size)}


def vllm_ranges(schedule: Mapping[int, int], max_concurrency: int | None, max_num_seqs: int = VLLM_MAX_NUM_SEQS) -> list[list[int]]:
    """Thresholds as vLLM's inclusive ranges, equal neighbours merged: ``{1: 4, 4: 2}``, 8 ->
    ``[[1, 3, 4], [4, 8, 2], [9, 256, 0]]``; ``{1: 4, 2: 4}``, 2 -> ``[[1, 2, 4], [3, 256, 0]]``."""
    steps = sorted(schedule.items())
    if max_concurrency is not None:
        steps.append((max_concurrency + 1, 0))
    steps = [(start, k) for i, (start, k) in enumerate(steps) if i == 0 or k != steps[i - 1][1]]  # {1: 4, 2: 4} is one range
    ends = [start - 1 for start, _ in steps[1:]] + [max(max_num_seqs, steps[-1][0])]
    return [[start, end, k] for (start, k), end in zip(steps, ends)]


def check_vllm_schedule(ranges: Sequence[Sequence[int]], num_speculative_tokens: int | None) -> None:
    """vLLM's rules for the 3-item form of ``num_speculative_tokens_per_batch_size`` (vllm/v1/spec_decode/
    dynamic/utils.py ``validate_and_normalize_dynamic_sd_schedule``; config/speculative.py for
    ``num_speculative_tokens > 0``). Raises :class:`EngineScheduleError` naming the broken rule."""
    if num_speculative_tokens is None or num_speculative_tokens <= 0:
        raise EngineScheduleError(f"vLLM: num_speculative_tokens must be > 0, got {num_speculative_tokens}")
    if not ranges:
        raise EngineScheduleError("vLLM: num_speculative_tokens_per_batch_size must not be empty")
    for entry in ranges:
        if len(entry) != 3:
            raise EngineScheduleError(f"vLLM: each entry must be (range_start, range_end, num_speculative_tokens), got {list(entry)}")
        start, end, k = entry
        if start <= 0 or end <= 0:
            raise EngineScheduleError(f"vLLM: batch-size range ({start}, {end}) must be positive")
        if start > end:
            raise EngineScheduleError(f"vLLM: batch-size range start must be <= end, got ({start}, {end})")
        if k < 0:
            raise EngineScheduleError(f"vLLM: num_speculative_tokens of each range must be >= 0, got {k}")
    previous_end = 0
    for start, end, _ in sorted(ranges):
        if start <= previous_end:
            raise EngineScheduleError("vLLM: batch-size ranges must be non-overlapping and sorted")
        previous_end = end
    if min(start for start, _, _ in ranges) != 1:
        raise EngineScheduleError("vLLM: the first batch-size range must start at 1")


def vllm_draft_len_for(ranges: Sequence[Sequence[int]], num_speculative_tokens: int, batch_size: int) -> int:
    """vLLM's k at ``batch_size`` (``build_dynamic_sd_schedule_lookup``): the range holding it, a gap
    or the tail past the last range carries the previous range's k, capped at ``num_speculative_tokens``.
    Example: ``[[1, 16, 3], [32, 128, 2]]``, 3 -> 3 at 17, 2 at 32 and at 500."""
    k = 0
    for start, _, range_k in sorted(ranges):
        if start > batch_size:
            break
        k = range_k
    return min(num_speculative_tokens, k)


def sglang_adaptive_config(schedule: Mapping[int, int], max_concurrency: int | None) -> dict:
    """SGLang's adaptive config with one candidate per batch-size slot (a fixed schedule)."""
    steps = dict(schedule)
    if max_concurrency is not None:
        steps[max_concurrency + 1] = 0
    return {str(b): {"candidate_steps": [k]} for b, k in sorted(steps.items())}


def check_sglang_adaptive_config(config: Mapping, num_steps: int | None) -> None:
    """SGLang's rules (adaptive_spec_params.py ``resolve_adaptive_strategy``, ``_load_adaptive_config``,
    ``_init_adaptive_speculative_params``). Raises :class:`EngineScheduleError` naming the broken rule."""
    strategy = config.get("strategy", "ema")
    if strategy not in ("ema", "throughput_aware"):
        raise EngineScheduleError(f"SGLang: 'strategy' must be 'ema' or 'throughput_aware', got {strategy!r}")
    slots = {key: entry for key, entry in config.items() if key.isdigit()}
    if not slots:
        raise EngineScheduleError("SGLang: speculative_adaptive_config must contain at least one integer-string BS key")
    for key, entry in slots.items():
        steps = entry.get("candidate_steps") if isinstance(entry, Mapping) else None
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
            raise EngineScheduleError(f"SGLang: BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
    union = sorted({s for entry in slots.values() for s in entry["candidate_steps"]})
    if num_steps is not None and num_steps not in union:
        raise EngineScheduleError(f"SGLang: --speculative-num-steps={num_steps} is not in the adaptive config candidate_steps {union}")


def sglang_draft_len_for(config: Mapping, batch_size: int) -> int:
    """The step of the slot with the largest key <= ``batch_size`` (the first slot below all keys);
    single-candidate slots only. Example: ``{"1": [4], "4": [2]}`` -> 4 at 3, 2 at 4."""
    keys = sorted(int(k) for k in config if k.isdigit())
    key = max([k for k in keys if k <= batch_size] or keys[:1])
    return config[str(key)]["candidate_steps"][0]


__all__ = [
    "EngineScheduleError", "EngineSchedules", "DraftLenScheduleError", "check_sglang_adaptive_config", "check_vllm_schedule",
    "engine_schedule_table",
    "engine_schedules", "sglang_adaptive_config", "sglang_draft_len_for", "trtllm_config", "vllm_draft_len_for", "vllm_ranges",
]


def engine_schedule_table(engines: Sequence[EngineSchedules]) -> list:
    """Each deployment's schedule in TensorRT-LLM's, vLLM's and SGLang's syntax: a table of the notes, then
    one :class:`rich.text.Text` line per config (``no_wrap``) holding its JSON whole (print those with ``soft_wrap=True``:
    never folded or cut whatever the terminal width, as a user copies it into ``extra_llm_api_options.yaml``
    or a launch flag; a narrow terminal wraps it without inserting line breaks)."""
    import json

    from rich.table import Table
    from rich.text import Text

    t = Table(title="The schedule in each engine's syntax (each checked by that engine's rules): TensorRT-LLM and "
              "vLLM speculative_config, SGLang --speculative-adaptive-config; configs below", box=None,
              title_justify="left")
    t.add_column("deployment", no_wrap=True)
    t.add_column("engine", no_wrap=True)
    t.add_column("notes", overflow="fold")
    lines = []
    for e in engines:
        rows = (("TensorRT-LLM", e.trtllm, "tensorrt-llm"), ("vLLM", e.vllm, "vllm"), ("SGLang", e.sglang, "sglang"))
        for label, config, key in rows:
            t.add_row(e.deployment, label, "; ".join(e.notes.get(key, [])) or "-")
            if config is not None:
                lines.append(Text(f"{e.deployment} {label}: {json.dumps(config)}", no_wrap=True))
    return [t, *lines]
