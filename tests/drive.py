"""Drive one drafter through the engine's batched worker alone (a batch of one), as the engine runs a
request: what the tests of a method's proposer and drafter use, instead of decode loops in ``engine/``.

Example: ``generate_alone(model, TreeDrafter(proposer, tree), prompt, max_tokens=16, max_block=1 + tree.num_nodes)``
-> the :class:`~specbuild.engine.types.GenerationResult` of that request (tokens and counters).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specbuild.engine.drafters import Drafter
from specbuild.engine.stream import collect
from specbuild.engine.types import GenerationResult
from specbuild.engine.worker import InflightRequest, run_alone


def generate_alone(model: Any, drafter: Drafter, prompt: Sequence[int], *, max_tokens: int, max_block: int,
                   end_id: int = -1) -> GenerationResult:
    """``prompt`` decoded greedily for ``max_tokens`` tokens (stopping after ``end_id``; -1: never) with
    ``drafter``, its blocks at most ``max_block`` tokens wide, through :func:`~specbuild.engine.worker.run_alone`."""
    return collect(run_alone(model, InflightRequest(list(prompt), max_tokens, end_id, drafter), max_block=max_block))


def assert_equals_plain(result: GenerationResult, plain: Sequence[int], prompt: Any) -> None:
    """What every method's equivalence test asserts of one greedy request run to its length: the
    output equals plain greedy decoding token for token, and the iteration count adds up (each
    iteration emits one target token plus the drafts it accepted; the prefill emits the first)."""
    assert result.output_ids == list(plain), f"prompt {prompt}"
    assert result.finish_reason == "length"
    assert result.num_decoding_iterations >= 2
    assert result.num_decoding_iterations == len(plain) - 1 - result.total_accepted_draft_tokens
