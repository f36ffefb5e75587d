"""The proposer interface every speculative method implements (one module per method)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Proposer(Protocol):
    """Proposes draft tokens for one request; the engine verifies them with the target.

    The engine makes a new proposer per request, so a proposer may keep per-request state (a draft
    model's KV cache, a lookahead pool) and drop it with the request.
    """

    def propose(self, context: Sequence[int], num_draft_tokens: int) -> list[int]:
        """Return at most ``num_draft_tokens`` draft tokens to follow ``context`` (prompt + emitted tokens).

        An empty list means "no guess": the engine then runs a plain one-token step.
        """
        ...

    def update(self, context: Sequence[int], num_accepted: int) -> None:
        """Called after each verification with the new context and how many draft tokens were accepted."""
        ...
