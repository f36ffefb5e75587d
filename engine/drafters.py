"""The drafter contract: what a speculation method gives the engine, and what the engine asks of it.

A method's engine side is one :class:`EngineMethod` (named by its registered
:class:`~specbuild.methods.SpeculationMethod`'s ``engine`` entry string, e.g.
``"specbuild.methods.medusa.engine:ENGINE"``). The engine calls ``load`` once, then ``make_drafter`` per
speculative request; the worker (:mod:`specbuild.engine.worker`) drives every :class:`Drafter` the same
way, whatever its method::

    prefill      first token (+ target hidden states if drafter.wants_hidden) -> drafter.start(...)
    each step    block = drafter.draft(context, ...)        root + drafts (+ extra rows), see engine.block
                 one batched target pass over every row's block
                 accepted path + bonus token (engine.acceptance), KV cache keeps root + path
                 drafter.update(context, step)              feed what the target produced

A drafter that can draft many requests in one call also implements :class:`BatchDrafter` (a group key
and a group draft call), as vLLM's proposers take the whole batch (``vllm/v1/spec_decode``). Nothing
here names a method: :class:`ChainDrafter` adapts any :class:`Proposer` of token chains (n-gram, SA, a
plugin's), and each method's own drafters live in its folder (``specbuild/methods/<m>/engine.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from .block import Block

if TYPE_CHECKING:
    from .sampling import Sampler
    from .validation import ResolvedRequest


# --- what the engine gives a drafter back -----------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """What a verification step gives the drafter back.

    Attributes:
        block: the block that was verified.
        keep: block indices kept in the KV cache (root + accepted path).
        emitted: accepted tokens + bonus token (before clipping at ``max_tokens`` / the end token).
        target_tokens: ``[T]`` the target's greedy token after every block row (None for sampled requests).
        hidden_states: transformers' hidden states of the block rows (tuple of ``[T, H]``, index 0 the
            embeddings, the last after the final norm), when the drafter wants them.
    """

    block: Block
    keep: list[int]
    emitted: list[int]
    target_tokens: list[int] | None
    hidden_states: tuple[torch.Tensor, ...] | None


# --- drafters ----------------------------------------------------------------------------------------


class Drafter(Protocol):
    """A request's drafting state.

    Attributes:
        wants_hidden: the drafter reads the target's hidden states (prefill and every step).
    """

    wants_hidden: bool

    def start(self, prompt: Sequence[int], first_token: int, hidden_states: tuple[torch.Tensor, ...] | None) -> None:
        """After the prefill: the prompt, the first token, the prompt's hidden states (``[T, H]`` each) if wanted."""
        ...

    def draft(self, context: Sequence[int], *, max_accept: int, sampler: Sampler | None) -> Block:
        """This step's block for ``context`` (prompt + emitted; ``context[-1]`` is the root); at most
        ``max_accept`` draft tokens can be emitted (deeper nodes would be wasted).

        A drafter of trees (``tree_drafts = True``: Medusa, EAGLE) also takes ``max_draft_tokens``: the
        iteration's draft length K (TensorRT-LLM's runtime draft length: ``1 + K`` tokens per request
        and step), which caps the tree's nodes, as a request's ``num_draft_tokens`` does; None: no cap.
        ``max_accept`` is then what the request may still emit."""
        ...

    def update(self, context: Sequence[int], step: StepResult) -> None:
        """After a step that did not finish the request; ``context`` already holds the emitted tokens."""
        ...


@runtime_checkable
class BatchDrafter(Drafter, Protocol):
    """A :class:`Drafter` that drafts many requests in one call (optional).

    The worker groups the rows of an iteration whose drafters are of one class and have the same
    non-None :attr:`batch_key` (e.g. the engine's one draft head), and calls :meth:`draft_batch` once per
    group. A row whose key is None drafts alone through :meth:`Drafter.draft`.
    """

    @property
    def batch_key(self) -> Hashable | None:
        """What the rows of one group share (their head, their draft model's KV slots); None: draft alone."""
        ...

    @classmethod
    def draft_batch(cls, drafters: Sequence[Any], contexts: Sequence[Sequence[int]], *, max_accepts: Sequence[int],
                    samplers: Sequence[Sampler | None]) -> list[Block]:
        """:meth:`Drafter.draft` of every drafter in one call: ``[i]`` is the block that ``drafters[i]``
        drafts alone for ``contexts[i]`` (token for token), in the order given."""
        ...


def batch_key(drafter: Drafter) -> Hashable | None:
    """``drafter``'s group key if it is a :class:`BatchDrafter`, else None (it drafts alone)."""
    return drafter.batch_key if isinstance(drafter, BatchDrafter) else None


class GroupedByProposer:
    """A :class:`BatchDrafter` half: rows group by their proposer's ``batch_key`` (the engine's one
    draft head: EAGLE, EAGLE-3), so one head call serves them all. The class adds ``draft_batch``."""

    proposer: Any

    @property
    def batch_key(self) -> Hashable | None:
        return self.proposer.batch_key


class PlainDrafter:
    """No speculation (``num_draft_tokens == 0``): a one-token block every step."""

    wants_hidden = False

    def start(self, prompt, first_token, hidden_states) -> None:
        del prompt, first_token, hidden_states

    def draft(self, context, *, max_accept, sampler) -> Block:
        del max_accept, sampler
        return Block.chain(context[-1])

    def update(self, context, step) -> None:
        del context, step


# --- chains from a proposer --------------------------------------------------------------------------


@dataclass(frozen=True)
class Draft:
    """What a proposer proposes: draft tokens and, for a draft model, the distributions they came from.

    Attributes:
        tokens: ``k`` draft token ids.
        probs: ``[k, vocab]`` the draft distributions ``q`` the tokens were sampled from, or None for
            deterministic drafts (n-gram; any greedy proposal). Only sampled requests use it.
    """

    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None


class Proposer(Protocol):
    """Proposes a chain of draft tokens for one request; :class:`ChainDrafter` makes it a drafter.

    A method makes a new proposer per request, so a proposer may keep per-request state (a draft
    model's KV cache, a suffix automaton) and drop it with the request.
    """

    def propose(
        self, context: Sequence[int], num_draft_tokens: int, sampler: Sampler | None = None
    ) -> list[int] | Draft:
        """Return at most ``num_draft_tokens`` draft tokens to follow ``context`` (prompt + emitted tokens).

        An empty draft means "no guess": the engine then runs a plain one-token step. ``sampler`` is the
        request's sampler for sampled requests; the engine leaves it out for greedy ones, so a greedy
        proposer may take just ``(context, num_draft_tokens)``. A proposer that samples its drafts
        returns a :class:`Draft` with their ``[k, vocab]`` distributions.
        """
        ...

    def update(self, context: Sequence[int], num_accepted: int) -> None:
        """Called after each verification with the new context and how many draft tokens were accepted."""
        ...


def as_draft(proposal: list[int] | Draft) -> Draft:
    """A proposer's return value as a :class:`Draft` (a plain list is a deterministic draft)."""
    return proposal if isinstance(proposal, Draft) else Draft(list(proposal))


class ChainDrafter(PlainDrafter):
    """A :class:`Proposer`'s chains of at most ``num_draft_tokens`` drafts, verified by token matching
    (greedy) or speculative sampling (sampled requests). Drafts alone; a method whose proposers draft
    together subclasses it as a :class:`BatchDrafter` (draft-target)."""

    def __init__(self, proposer: Proposer, num_draft_tokens: int) -> None:
        self.proposer, self.k = proposer, num_draft_tokens

    def draft(self, context, *, max_accept, sampler) -> Block:
        k = min(self.k, max_accept)
        if k <= 0:
            return Block.chain(context[-1])
        proposal = self.proposer.propose(context, k) if sampler is None else self.proposer.propose(context, k, sampler=sampler)
        draft = as_draft(proposal)
        return Block.chain(context[-1], draft.tokens, draft.probs)

    def update(self, context, step) -> None:
        self.proposer.update(context, len(step.keep) - 1)


def chain_drafter(make_proposer: Callable[[Any], Proposer]) -> Callable[[Any, ResolvedRequest], Drafter]:
    """An :attr:`EngineMethod.make_drafter` for a method that proposes chains: a :class:`ChainDrafter` over
    ``make_proposer(loaded)`` capped at the request's ``num_draft_tokens``."""

    def make_drafter(loaded: Any, request: ResolvedRequest) -> Drafter:
        return ChainDrafter(make_proposer(loaded), request.num_draft_tokens)

    return make_drafter


# --- a method's engine side --------------------------------------------------------------------------


@dataclass(frozen=True)
class MethodContext:
    """What a method may need when the engine loads it (once per engine, not per request).

    Attributes:
        target: the loaded target model (its vocabulary, dtype and device).
        trust_remote_code: passed to Hugging Face loaders of extra checkpoints.
        max_batch_size: requests in flight at most (the build's); None outside an engine.
        max_seq_len: prompt + generated tokens of one request at most (the build's); None outside an engine.
        draft_weight_dtype: what draft-side packed weights hold
            (:func:`~specbuild.engine.draft_linear.draft_weight_dtype`); None: as loaded.
    """

    target: Any
    trust_remote_code: bool = False
    max_batch_size: int | None = None
    max_seq_len: int | None = None
    draft_weight_dtype: Any = None


def _settings_themselves(params: Any, context: MethodContext) -> Any:
    del context
    return params


def _any_prompt(loaded: Any, input_ids: Sequence[int]) -> None:
    del loaded, input_ids


@dataclass(frozen=True)
class EngineMethod:
    """A method's side in the reference engine: load what it needs, make each request's drafter.

    The engine validates ``speculative_config`` with the method's settings model
    (:meth:`specbuild.methods.SpeculationMethod.parse_speculative_config`), then calls ``load`` once
    (it returns what the other callables take: the settings themselves, or e.g. a loaded draft head),
    ``check_prompt`` before a speculative request, and ``make_drafter`` per speculative request
    (``num_draft_tokens >= 1``; requests with 0 get a :class:`PlainDrafter`).

    Attributes:
        make_drafter: ``(loaded, request) -> Drafter`` for a validated request
            (:class:`~specbuild.engine.validation.ResolvedRequest`: its ``num_draft_tokens`` caps the
            drafts or tree nodes per step). :func:`chain_drafter` makes one from a :class:`Proposer`.
        load: ``(settings, MethodContext) -> loaded``; raises ValueError / FileNotFoundError.
        check_prompt: ``(loaded, input_ids)``; raises InvalidRequestError for a prompt the method cannot
            serve (e.g. longer than a draft model's context).
        resolve_window: ``(loaded, (w, n, g))``: the method reads a request's ``lookahead_config``
            (Lookahead) and checks it here, raising ValueError outside the built ``(W, N, G)``; None: the
            engine refuses requests that send one.
        greedy_only: sampled requests (``temperature > 0``) are refused, as TensorRT-LLM refuses them.
    """

    make_drafter: Callable[[Any, ResolvedRequest], Drafter]
    load: Callable[[Any, MethodContext], Any] = _settings_themselves
    check_prompt: Callable[[Any, Sequence[int]], None] = _any_prompt
    resolve_window: Callable[[Any, tuple[int, int, int]], Any] | None = None
    greedy_only: bool = False


__all__ = [
    "BatchDrafter", "ChainDrafter", "Draft", "Drafter", "EngineMethod", "GroupedByProposer", "MethodContext", "PlainDrafter",
    "Proposer",
    "StepResult", "as_draft", "batch_key", "chain_drafter",
]
