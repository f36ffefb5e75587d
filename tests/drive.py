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
