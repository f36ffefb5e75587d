"""The toy plugin's engine side: a drafter of its own, no proposer and no built-in drafter class.

:class:`RepeatDrafter` implements the engine's :class:`~specbuild.engine.drafters.Drafter` directly and
the optional :class:`~specbuild.engine.drafters.BatchDrafter`: the requests of one engine share a group
key, so the worker drafts them in one :meth:`RepeatDrafter.draft_batch` call, which counts its calls
for the plugin test.
"""

from __future__ import annotations

from collections.abc import Sequence

from specbuild.engine.block import Block
from specbuild.engine.drafters import EngineMethod, MethodContext, PlainDrafter
from specbuild.engine.validation import ResolvedRequest

from . import ToySpeculation


class ToyEngine:
    """What the engine loads once: the settings (an object of its own, so its identity is the group key)."""

    def __init__(self, spec: ToySpeculation, context: MethodContext) -> None:
        del context
        self.spec = spec


class RepeatDrafter(PlainDrafter):
    """Drafts ``min(k, max_draft_len)`` copies of the context's last (or first) token."""

    batch_calls = 0  # draft_batch calls in this process

    def __init__(self, loaded: ToyEngine, num_draft_tokens: int) -> None:
        self.loaded, self.k = loaded, min(num_draft_tokens, loaded.spec.max_draft_len)

    @property
    def batch_key(self) -> ToyEngine:
        return self.loaded

    def draft(self, context: Sequence[int], *, max_accept: int, sampler: object) -> Block:
        del sampler
        token = context[-1] if self.loaded.spec.repeats_of == "last" else context[0]
        return Block.chain(context[-1], [token] * min(self.k, max_accept))

    @classmethod
    def draft_batch(cls, drafters: Sequence[RepeatDrafter], contexts, *, max_accepts, samplers) -> list[Block]:
        cls.batch_calls += 1
        return [d.draft(c, max_accept=m, sampler=s) for d, c, m, s in zip(drafters, contexts, max_accepts, samplers)]


def make_drafter(loaded: ToyEngine, request: ResolvedRequest) -> RepeatDrafter:
    return RepeatDrafter(loaded, request.num_draft_tokens)


ENGINE = EngineMethod(make_drafter=make_drafter, load=ToyEngine)
