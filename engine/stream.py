"""Step-wise decoding: a request's steps are a generator of :class:`StepOutput`.

The engine has one decoding loop, the batched worker (:mod:`~specbuild.engine.worker`), for every
method; it yields a request's step once after the prefill and once per verification step. Streaming
sends each step's tokens as they come; non-streamed generation is :func:`collect` over the same steps,
so the concatenated stream equals the non-streamed output by construction::

    step       0 (prefill)   1            2                 3 (final)
    token_ids  [t0]          [d0 d1 t3]   [t4]              [d4 t6]       (accepted drafts + bonus)
    output     t0            t0 .. t3     t0 .. t4          t0 .. t6      finish_reason "length"
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from .acceptance import clip_emitted
from .types import GenerationResult


@dataclass(frozen=True)
class StepOutput:
    """What one decoding iteration emitted, with the request's running counters.

    Attributes:
        token_ids: the tokens this step emitted (the prefill's first token; then accepted drafts + bonus,
            clipped at ``max_tokens`` and after the end token); at least one token.
        total_draft_tokens: draft tokens verified so far (this step included).
        total_accepted_draft_tokens: accepted draft tokens emitted so far.
        num_decoding_iterations: target passes after the prefill so far (0 for the prefill step).
        finish_reason: ``None`` while decoding goes on; ``"stop"`` or ``"length"`` on the last step.
    """

    token_ids: list[int]
    total_draft_tokens: int
    total_accepted_draft_tokens: int
    num_decoding_iterations: int
    finish_reason: str | None = None

    @property
    def is_final(self) -> bool:
        return self.finish_reason is not None


@dataclass
class DecodeState:
    """One request's bookkeeping while its loop runs: context, output so far, counters.

    Attributes:
        context: prompt + emitted tokens (the proposers' view).
    """

    context: list[int]
    max_tokens: int
    end_id: int
    output: list[int] = field(default_factory=list)
    total_draft_tokens: int = 0
    total_accepted: int = 0
    iterations: int = 0
    finish_reason: str | None = None

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.output)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def first(self, token: int) -> StepOutput:
        """Record the prefill's token (no draft, no decoding iteration)."""
        return self._output(self._emit([token]))

    def step(self, emitted: list[int], *, drafted: int, accepted: int) -> StepOutput:
        """Record one verification step: ``drafted`` draft tokens verified, ``accepted`` of them accepted,
        ``emitted`` = accepted + bonus, clipped here. Every kept token but the step's last counts as
        accepted, the last as the target's own (the bonus, or the end token where the step was cut),
        so a request always has ``1 + steps + accepted`` tokens, the identity a client uses to derive
        its steps from the Triton outputs (:func:`specbuild.interface.spec_steps`). Example: drafts
        [a b c] all accepted, bonus d, end token b: kept [a b], 1 accepted."""
        kept = self._emit(emitted)
        self.iterations += 1
        self.total_draft_tokens += drafted
        self.total_accepted += min(accepted, len(kept) - 1)
        return self._output(kept)

    def _emit(self, tokens: list[int]) -> list[int]:
        kept, stopped = clip_emitted(tokens, remaining=self.remaining, end_id=self.end_id)
        self.output += kept
        self.context += kept
        if stopped:
            self.finish_reason = "stop"
        elif self.remaining == 0:
            self.finish_reason = "length"
        return kept

    def _output(self, kept: list[int]) -> StepOutput:
        return StepOutput(list(kept), self.total_draft_tokens, self.total_accepted, self.iterations, self.finish_reason)


def collect(steps: Iterable[StepOutput]) -> GenerationResult:
    """The whole generation from its steps: tokens concatenated, counters of the last step.

    Raises:
        ValueError: ``steps`` is empty.
    """
    output: list[int] = []
    last: StepOutput | None = None
    for last in steps:
        output += last.token_ids
    if last is None:
        raise ValueError("no decoding step was produced")
    return GenerationResult(
        output_ids=output,
        finish_reason=last.finish_reason or "length",
        total_draft_tokens=last.total_draft_tokens,
        total_accepted_draft_tokens=last.total_accepted_draft_tokens,
        num_decoding_iterations=last.num_decoding_iterations,
    )


def merge(steps: Sequence[StepOutput]) -> StepOutput:
    """Consecutive steps of one request as one: their tokens concatenated, the last one's counters and
    finish reason (a streamed response that covers several iterations, e.g. TensorRT-LLM's
    ``stream_interval``). ``merge`` of steps ``[5], [6 7], [8]`` -> ``[5 6 7 8]`` with step 3's counters.

    Raises:
        ValueError: ``steps`` is empty.
    """
    if not steps:
        raise ValueError("no decoding step to merge")
    last = steps[-1]
    return StepOutput([t for s in steps for t in s.token_ids], last.total_draft_tokens, last.total_accepted_draft_tokens,
                      last.num_decoding_iterations, last.finish_reason)


Steps = Iterator[StepOutput]
"""A request's decoding steps (a generator: the prefill, then one item per verification step)."""

__all__ = ["DecodeState", "StepOutput", "Steps", "collect", "merge"]
