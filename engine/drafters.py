"""One drafting interface for every method: a per-request :class:`Drafter` turns a method's proposer into blocks.

The worker (:mod:`specbuild.engine.worker`) drives every request the same way, whatever its method::

    prefill      first token (+ target hidden states if drafter.wants_hidden) -> drafter.start(...)
    each step    block = drafter.draft(context, ...)        root + drafts (+ extra rows), see engine.block
                 one batched target pass over every row's block
                 accepted path + bonus token (engine.acceptance), KV cache keeps root + path
                 drafter.update(context, step)              feed what the target produced

The method-specific proposers stay in their modules (n-gram, draft model, Medusa heads, EAGLE and
EAGLE-3 heads, lookahead's window and pool); a drafter only adapts one to this interface. A chain is a
one-path tree; lookahead's window rows are extra rows of its block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from .block import Block
from .methods.base import Proposer, as_draft

if TYPE_CHECKING:
    from .methods.lookahead import LookaheadParams
    from .sampling import Sampler
    from .tree import SpecTree


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


class Drafter(Protocol):
    """A request's drafting state.

    Attributes:
        wants_hidden: the drafter reads the target's hidden states (prefill and every step).

    A drafter may also draft many requests at once: requests whose drafters have the same non-None
    ``batch_key`` (e.g. the engine's shared proposer) are drafted by one call of their class's
    ``draft_rows(drafters, contexts, *, max_accepts, samplers) -> list[Block]``, which must give every
    request the block that :meth:`draft` gives it alone.
    """

    wants_hidden: bool

    def start(self, prompt: Sequence[int], first_token: int, hidden_states: tuple[torch.Tensor, ...] | None) -> None:
        """After the prefill: the prompt, the first token, the prompt's hidden states (``[T, H]`` each) if wanted."""
        ...

    def draft(self, context: Sequence[int], *, max_accept: int, sampler: Sampler | None) -> Block:
        """This step's block for ``context`` (prompt + emitted; ``context[-1]`` is the root); at most
        ``max_accept`` draft tokens can be emitted (deeper nodes would be wasted)."""
        ...

    def update(self, context: Sequence[int], step: StepResult) -> None:
        """After a step that did not finish the request; ``context`` already holds the emitted tokens."""
        ...


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


class ChainDrafter(PlainDrafter):
    """A :class:`~specbuild.engine.methods.base.Proposer` (n-gram, draft model): chains of at most ``k`` drafts."""

    def __init__(self, proposer: Proposer, num_draft_tokens: int) -> None:
        self.proposer, self.k = proposer, num_draft_tokens

    @property
    def batch_key(self) -> Any:
        """The proposer's ``batch_key`` (a draft model's shared KV slots), else None: n-gram rows draft alone."""
        return getattr(self.proposer, "batch_key", None)

    def draft(self, context, *, max_accept, sampler) -> Block:
        k = min(self.k, max_accept)
        if k <= 0:
            return Block.chain(context[-1])
        proposal = self.proposer.propose(context, k) if sampler is None else self.proposer.propose(context, k, sampler=sampler)
        draft = as_draft(proposal)
        return Block.chain(context[-1], draft.tokens, draft.probs)

    @classmethod
    def draft_rows(cls, drafters: Sequence[ChainDrafter], contexts, *, max_accepts, samplers) -> list[Block]:
        """:meth:`draft` for requests of one draft model: one draft forward per draft token for all of them."""
        from .methods.draft_target import propose_batch

        rows = [i for i, (d, m) in enumerate(zip(drafters, max_accepts)) if min(d.k, m) > 0]
        blocks = [Block.chain(context[-1]) for context in contexts]
        if rows:
            drafts = propose_batch([drafters[i].proposer for i in rows], [contexts[i] for i in rows],
                                   [min(drafters[i].k, max_accepts[i]) for i in rows], [samplers[i] for i in rows])
            for i, draft in zip(rows, drafts):
                blocks[i] = Block.chain(contexts[i][-1], draft.tokens, draft.probs)
        return blocks

    def update(self, context, step) -> None:
        self.proposer.update(context, len(step.keep) - 1)


class TreeDrafter(PlainDrafter):
    """Medusa: the heads fill ``tree`` from the target's final-norm hidden state at the root's producer."""

    wants_hidden = True

    def __init__(self, proposer: Any, tree: SpecTree) -> None:
        self.proposer, self.tree = proposer, tree
        self.hidden: torch.Tensor | None = None  # [H]

    def start(self, prompt, first_token, hidden_states) -> None:
        self.hidden = hidden_states[-1][-1]

    @property
    def batch_key(self) -> Any:
        """The shared proposer when it drafts many requests at once (``propose_trees``), else None."""
        return self.proposer if hasattr(self.proposer, "propose_trees") else None

    def draft(self, context, *, max_accept, sampler) -> Block:
        tree = self.tree.truncated(max_accept)
        return Block.of_tree(tree, self.proposer.propose_tree(context, self.hidden, tree))

    @classmethod
    def draft_rows(cls, drafters: Sequence[TreeDrafter], contexts, *, max_accepts, samplers) -> list[Block]:
        """:meth:`draft` for requests sharing one proposer: the heads run once for all of them."""
        del samplers
        trees = [d.tree.truncated(m) for d, m in zip(drafters, max_accepts)]
        tokens = drafters[0].proposer.propose_trees(contexts, [d.hidden for d in drafters], trees)
        return [Block.of_tree(tree, t) for tree, t in zip(trees, tokens)]

    def update(self, context, step) -> None:
        self.hidden = step.hidden_states[-1][step.keep[-1]]


def _feed_pending(drafters: Sequence[Any], update_batch: Any) -> None:
    """Feed every drafter's ``pending`` (tokens, features) to its head in one ``update_batch`` call
    (EAGLE-1/2 or EAGLE-3, the drafters sharing one proposer's head), and clear them."""
    feeding = [d for d in drafters if d.pending is not None]
    if feeding:
        update_batch(feeding[0].proposer, [d.state for d in feeding], [d.pending[0] for d in feeding],
                     [d.pending[1] for d in feeding])
        for d in feeding:
            d.pending = None


class FeatureTreeDrafter(PlainDrafter):
    """EAGLE-1/2: the head is fed the target's final-norm features of every accepted position.

    The features of a step wait in :attr:`pending` until the next draft, so that the requests of one
    head feed theirs and grow their trees in shared head calls (:meth:`draft_rows`).
    """

    wants_hidden = True

    def __init__(self, proposer: Any) -> None:
        self.proposer = proposer
        self.state = proposer.new_state()
        self.pending: tuple[list[int], torch.Tensor] | None = None  # (tokens, features [m, H]) not yet fed

    @property
    def batch_key(self) -> Any:
        """The proposer's head when its proposers draft together (``batch_key``), else None."""
        return getattr(self.proposer, "batch_key", None)

    def start(self, prompt, first_token, hidden_states) -> None:
        self.pending = ([*prompt[1:], first_token], hidden_states[-1])

    def draft(self, context, *, max_accept, sampler) -> Block:
        if self.pending is not None:
            self.proposer.update(self.state, *self.pending)
            self.pending = None
        proposal = self.proposer.propose(self.state, context[-1], max_accept)
        return Block.of_tree(proposal.tree, proposal.tokens)

    @classmethod
    def draft_rows(cls, drafters: Sequence[FeatureTreeDrafter], contexts, *, max_accepts, samplers) -> list[Block]:
        """:meth:`draft` for requests of one head: one head call feeds every pending feature, then one
        head call and one draft projection per tree depth for all of them."""
        from .methods.eagle import propose_batch, update_batch

        del samplers
        _feed_pending(drafters, update_batch)
        proposals = propose_batch([d.proposer for d in drafters], [d.state for d in drafters],
                                  [c[-1] for c in contexts], list(max_accepts))
        return [Block.of_tree(p.tree, p.tokens) for p in proposals]

    def update(self, context, step) -> None:
        self.pending = (step.emitted, step.hidden_states[-1][step.keep])


class FeatureChainDrafter(PlainDrafter):
    """EAGLE-3: chains from the fusion of captured target layers, fed after every step.

    As :class:`FeatureTreeDrafter`, a step's captured features wait in :attr:`pending` until the next
    draft, so that the requests of one head feed them and draft their chains in shared head calls
    (:meth:`draft_rows`).
    """

    wants_hidden = True

    def __init__(self, proposer: Any, num_draft_tokens: int) -> None:
        self.proposer, self.k = proposer, num_draft_tokens
        self.state = proposer.new_state()
        self.pending: tuple[list[int], torch.Tensor] | None = None  # (tokens, fused features [m, 3 Ht]) not yet fed

    @property
    def batch_key(self) -> Any:
        """The proposer's head when its proposers draft together (``batch_key``), else None."""
        return getattr(self.proposer, "batch_key", None)

    def _features(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.proposer.capture([h[None] for h in hidden_states])  # [T, 3 Ht]

    def start(self, prompt, first_token, hidden_states) -> None:
        self.pending = ([*prompt[1:], first_token], self._features(hidden_states))

    def draft(self, context, *, max_accept, sampler) -> Block:
        if self.pending is not None:
            self.proposer.update(self.state, *self.pending)
            self.pending = None
        return Block.chain(context[-1], self.proposer.propose(self.state, min(self.k, max_accept)))

    @classmethod
    def draft_rows(cls, drafters: Sequence[FeatureChainDrafter], contexts, *, max_accepts, samplers) -> list[Block]:
        """:meth:`draft` for requests of one head: one head call feeds every pending feature, then one
        draft projection and one head call per chain depth for all of them."""
        from .methods.eagle3 import propose_batch, update_batch

        del samplers
        _feed_pending(drafters, update_batch)
        chains = propose_batch(drafters[0].proposer, [d.state for d in drafters],
                               [min(d.k, m) for d, m in zip(drafters, max_accepts)])
        return [Block.chain(c[-1], chain) for c, chain in zip(contexts, chains)]

    def update(self, context, step) -> None:
        self.pending = (step.emitted, self._features(step.hidden_states)[step.keep])


class LookaheadDrafter(PlainDrafter):
    """Lookahead (Fu et al. 2024, §3): candidates from the n-gram pool, the Jacobi window as extra rows."""

    def __init__(self, params: LookaheadParams) -> None:
        self.params = params
        self.state = None
        self.layout = None

    def start(self, prompt, first_token, hidden_states) -> None:
        from .methods.lookahead import LookaheadState

        self.state = LookaheadState.start(prompt, self.params)

    def draft(self, context, *, max_accept, sampler) -> Block:
        from .methods.lookahead import build_step_layout
        from .tree import SpecTree

        last = context[-1]
        if max_accept <= 0:  # K = 0: a plain step; update() still feeds the pool and re-anchors the window
            self.layout = None
            return Block.chain(last)
        layout = build_step_layout(last, self.state.levels, self.state.candidates(last, max_accept), self.params)
        self.layout = layout
        # candidate c, token i  <->  tree path (c, 0, .., 0) of depth i + 1
        tree = SpecTree.from_choices([[c] + [0] * i for c, cand in enumerate(layout.candidates) for i in range(len(cand))])
        tree_index = (0, *(layout.candidate_index[path[0]][len(path) - 1] for path in tree.paths))
        return Block(layout.tokens, tree, layout.positions, layout.allowed, tree_index, None, layout.num_draft_tokens)

    def update(self, context, step) -> None:
        if self.layout is None:  # a plain step: no window rows ran; the window keeps its levels
            self.state.keep_up(context[-(len(step.emitted) + self.params.ngram - 1) :], context[-1])
            return
        top = self.layout.lookahead_index[-1] if self.layout.lookahead_index else []
        new_level = [step.target_tokens[i] for i in top]
        emitted = len(step.emitted)
        self.state.advance(new_level, context[-(emitted + self.params.ngram - 1) :], context[-1])
