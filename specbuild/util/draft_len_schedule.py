"""TensorRT-LLM's ``draft_len_schedule``: draft length by batch size, and the rules it must obey.

``speculative_config.draft_len_schedule`` (LLM API, PyTorch backend) maps batch-size thresholds to
draft lengths: ``{1: 4, 4: 2, 8: 0}`` means batch sizes 1-3 draft 4 tokens, 4-7 draft 2, 8 and up
none (each threshold holds up to the next one; tensorrt_llm/llmapi/llm_args.py, the field's
description). TensorRT-LLM validates it in ``DecodingBaseConfig.validate_draft_len_schedule_and_sort``;
:func:`check_draft_len_schedule` applies the same rules before anything is deployed:

1. every batch-size threshold is >= 1;
2. every draft length is >= 0;
3. batch size 1 has an entry;
4. ``schedule[1] == max_draft_len`` (batch size 1 uses the largest draft length);
5. no draft length exceeds ``max_draft_len``.

(The current line relaxes 3-4 to "the smallest threshold maps to ``max_draft_len``"; a schedule
that passes 1-5 passes that too.)

Two readings. TensorRT-LLM 1.2 (``_torch/speculative/drafter.py`` ``get_draft_len_for_batch_size``) reads
a key as a lower bound: it holds from itself up to the next key, the largest key's entry for every
batch above it, and ``max_concurrency`` turns speculation off above its count. TensorRT-LLM's main after
1.2.1 (commit fcd3f31682808ae56118ae43c1d7864a3a945e6f: ``_torch/speculative/utils.py``
``get_draft_len_for_batch_size``, ``llmapi/llm_args.py``) reads a key as an inclusive upper bound: ``{4: 4,
8: 2}`` drafts 4 at batch 1-4, 2 at 5-8 and 0 above 8; there ``max_concurrency`` and
``draft_len_schedule`` are mutually exclusive (``max_concurrency`` alone becomes ``{max_concurrency:
max_draft_len}``). :func:`portable_schedule` writes a schedule both read the same way, without
``max_concurrency``: every run of equal draft lengths gets a key at its first and at its last batch size.
"""

from __future__ import annotations

from collections.abc import Mapping


class DraftLenScheduleError(ValueError):
    """A schedule TensorRT-LLM would reject; the message names the rule and the fix."""


def check_draft_len_schedule(schedule: Mapping[int, int], max_draft_len: int) -> dict[int, int]:
    """``schedule`` sorted by threshold, after checking the rules in the module docstring.

    Example: ``({4: 2, 1: 4}, 4)`` -> ``{1: 4, 4: 2}``; ``({1: 3, 4: 2}, 4)`` raises (rule 4).

    Raises:
        DraftLenScheduleError: a rule is broken; the message says which and how to fix it.
    """
    for batch_size, draft_len in schedule.items():
        if batch_size < 1:
            raise DraftLenScheduleError(f"draft_len_schedule: batch size threshold must be >= 1, got {batch_size}")
        if draft_len < 0:
            raise DraftLenScheduleError(f"draft_len_schedule: draft length must be >= 0, got {draft_len} for batch size {batch_size}")
    if 1 not in schedule:
        raise DraftLenScheduleError(f"draft_len_schedule must include batch size 1: add {{1: {max_draft_len}}} (max_draft_len)")
    if schedule[1] != max_draft_len:
        raise DraftLenScheduleError(
            f"draft_len_schedule[1] must equal max_draft_len: got {schedule[1]}, max_draft_len is {max_draft_len}; "
            f"batch size 1 uses the largest draft length (set max_draft_len to {schedule[1]} or schedule[1] to {max_draft_len})"
        )
    over = {b: k for b, k in schedule.items() if k > max_draft_len}
    if over:
        raise DraftLenScheduleError(f"draft_len_schedule: draft lengths must be <= max_draft_len {max_draft_len}, got {over}")
    return dict(sorted(schedule.items()))


def portable_schedule(schedule: Mapping[int, int], max_concurrency: int | None, max_batch_size: int) -> dict[int, int]:
    """``schedule`` (1.2's reading) with ``max_concurrency`` folded in, keyed so that TensorRT-LLM 1.2
    (:func:`draft_len_for`) and main (:func:`draft_len_up_to`) give the same draft length at every batch
    size from 1 to ``max_batch_size`` (module docstring), with no ``max_concurrency`` key needed.

    Example: ``({1: 4, 3: 2}, 4, 16)`` -> ``{1: 4, 2: 4, 3: 2, 4: 2, 5: 0}``; ``({1: 4, 4: 2}, None, 8)``
    -> ``{1: 4, 3: 4, 4: 2, 8: 2}``.

    Raises:
        DraftLenScheduleError: ``schedule`` breaks a rule of :func:`check_draft_len_schedule` (its
            ``max_draft_len`` is ``schedule[1]``), or ``max_batch_size`` < 1.
    """
    if 1 not in schedule:
        raise DraftLenScheduleError(f"draft_len_schedule must include batch size 1, got {dict(schedule)}")
    check_draft_len_schedule(schedule, schedule[1])
    if max_batch_size < 1:
        raise DraftLenScheduleError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if max_concurrency is not None and max_concurrency < 1:
        raise DraftLenScheduleError(f"max_concurrency must be >= 1 beside a schedule, got {max_concurrency}")
    top = max_batch_size if max_concurrency is None else min(max_batch_size, max_concurrency)
    lengths = [draft_len_for(schedule, b) for b in range(1, top + 1)]
    portable: dict[int, int] = {}
    for b, k in enumerate(lengths, 1):
        if b == 1 or lengths[b - 2] != k:
            portable[b] = k  # a run starts: 1.2 reads it from here
        if (b == top and k > 0) or (b < top and lengths[b] != k):
            portable[b] = k  # a run ends: main reads it up to here (and 0 above the largest key anyway)
    if top < max_batch_size and lengths[-1] > 0:
        portable[top + 1] = 0  # max_concurrency: off above it (main: 0 above the largest key too)
    return portable


def draft_len_up_to(schedule: Mapping[int, int], batch_size: int) -> int:
    """TensorRT-LLM main's reading (module docstring): the entry of the smallest key >= ``batch_size``,
    0 above the largest. Example: ``({4: 4, 8: 2}, 5)`` -> 2; ``({4: 4, 8: 2}, 9)`` -> 0."""
    keys = [b for b in schedule if b >= batch_size]
    return schedule[min(keys)] if keys else 0


def draft_len_for(schedule: Mapping[int, int], batch_size: int) -> int:
    """The draft length TensorRT-LLM uses at ``batch_size``: the entry of the largest threshold
    <= ``batch_size``. Example: ``({1: 4, 4: 2, 8: 0}, 5)`` -> 2."""
    return schedule[max(b for b in schedule if b <= batch_size)]


def schedule_from_measurements(best: Mapping[int, int]) -> tuple[dict[int, int] | None, str]:
    """``best`` (concurrency -> the draft length measured best there, ``specbuild tune``) as a valid
    ``draft_len_schedule`` (its ``max_draft_len`` is ``schedule[1]``), or ``None`` and why TensorRT-LLM
    cannot express it.

    Example: ``{1: 4, 4: 2}`` -> ``({1: 4, 4: 2}, "")``; ``{1: 0, 4: 3}`` -> ``None``: TensorRT-LLM
    cannot draft more at batch 4 than at batch 1.
    """
    if not best:
        return None, "speculation off at every measured concurrency: deploy without speculation"
    if 1 not in best:
        return None, "concurrency 1 was not measured; TensorRT-LLM's schedule starts at batch size 1 (add 1 to the levels)"
    k1 = best[1]
    if k1 == 0:
        return None, "no speculation at concurrency 1: TensorRT-LLM needs schedule[1] = max_draft_len > 0; deploy without speculation"
    higher = {c: k for c, k in best.items() if k > k1}
    if higher:
        return None, (f"draft lengths {higher} above concurrency 1's {k1}: TensorRT-LLM allows none above "
                      "schedule[1] = max_draft_len")
    return check_draft_len_schedule(best, k1), ""
