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
