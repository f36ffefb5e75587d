"""Draft-target speculation: a smaller causal LM sharing the target's vocabulary proposes k tokens.

Leviathan et al. 2023 (§2.3) and Chen et al. 2023 (Algorithm 2); TensorRT-LLM's
``DraftTargetDecodingConfig`` names the knobs (``max_draft_len``, ``speculative_model_dir``). The draft
runs autoregressively with its own KV cache; greedy requests take its argmax tokens, sampled requests
draw from its distributions ``q`` under the request's own sampling parameters and return them for
rejection sampling (:func:`specbuild.engine.acceptance.accept_speculative`). The requests of one engine
draft together (:class:`DraftModelDrafter`, a :class:`~specbuild.engine.drafters.BatchDrafter`): one
draft forward per draft token for all of them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from specbuild.engine import target as target_model
from specbuild.engine.block import Block
from specbuild.engine.draft_linear import DraftProjection, pack_draft_linears
from specbuild.engine.drafters import ChainDrafter, Draft, EngineMethod, MethodContext
from specbuild.engine.forward import RowBlock, forward_blocks
from specbuild.engine.kv_pool import KVCacheFullError, KVPool, KVShape
from specbuild.engine.types import InvalidRequestError

from ..heads import torch_dtype
from ..token_map import load_token_ids
from . import DraftTargetSpeculation, check_draft_vocab

if TYPE_CHECKING:
    from specbuild.builder.recipe import LoadedRecipe
    from specbuild.engine.sampling import Sampler
    from specbuild.engine.validation import ResolvedRequest

@dataclass(frozen=True)
class DraftModel:
    """The loaded draft, shared by every request of an engine.

    Attributes:
        config: the method's settings (its ``draft_checkpoint`` already resolved by the engine).
        model: the draft ``PreTrainedModel`` (target's dtype and device).
        path: where it was loaded from (for messages).
        max_position_embeddings: positions the draft can attend to, or None when its config has no limit.
    """

    config: DraftTargetSpeculation
    model: Any
    path: Path
    max_position_embeddings: int | None
    slots: DraftSlots | None = None


PRIVATE_CHUNK = 256
"""Positions a private draft pool grows by (a proposer outside an engine, or one that found no free slot)."""


class DraftSlots:
    """The draft's KV cache in an engine: a :class:`~specbuild.engine.kv_pool.KVPool` with one slot per
    request in flight (``max_batch_size`` slots of ``max_seq_len + max_draft_len + 2`` positions), so the
    drafts of every request step through one draft forward per draft token (:func:`propose_batch`).
    Slots are handed out and back under a lock (a proposer gives its slot back when it is dropped).
    """

    def __init__(self, model: Any, *, num_slots: int, capacity: int) -> None:
        self.pool = KVPool(KVShape.of(model), num_slots=num_slots, capacity=capacity, dtype=model.dtype, device=model.device)
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """A free slot (emptied), or None when every slot is held."""
        with self._lock:
            try:
                return self.pool.allocate()
            except KVCacheFullError:
                return None

    def give_back(self, slot: int) -> None:
        with self._lock:
            self.pool.release(slot)


def load_draft(config: DraftTargetSpeculation, context: MethodContext) -> DraftModel:
    """Load the draft (``config.draft_checkpoint``) with the target's dtype and device, after checking the vocabulary.

    Raises:
        FileNotFoundError: no checkpoint at the draft directory.
        ValueError: vocabulary size mismatch; a bad ``speculative_token_map`` (:func:`load_token_ids`).
    """
    path = Path(config.draft_checkpoint)
    check_draft_vocab(path, int(context.target.config.get_text_config().vocab_size))
    model = target_model.load_target(
        path, dtype=context.target.dtype, device=str(context.target.device), trust_remote_code=context.trust_remote_code
    )
    token_ids = load_token_ids(config, int(context.target.config.get_text_config().vocab_size))
    use_draft_lm_head(model, token_ids, context.draft_weight_dtype)  # CPU: each draft step projects one row
    pack_draft_linears(model, context.draft_weight_dtype)  # its layers' linears (the lm_head is the DraftLMHead's now)
    max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    slots = None
    if context.max_batch_size is not None and context.max_seq_len is not None:
        slots = DraftSlots(model, num_slots=context.max_batch_size, capacity=context.max_seq_len + config.max_draft_len + 2)
    return DraftModel(config, model, path, max_positions, slots)


def check_prompt(draft: DraftModel, input_ids: Sequence[int]) -> None:
    """Refuse a prompt the draft cannot read (longer than its ``max_position_embeddings``).

    Raises:
        InvalidRequestError: naming the prompt length, the draft's limit and the way out.
    """
    limit = draft.max_position_embeddings
    if limit is not None and len(input_ids) > limit:
        raise InvalidRequestError(
            f"input_ids has {len(input_ids)} tokens but the draft model {draft.path} reads at most {limit} "
            f"(its max_position_embeddings); send at most {limit} tokens, or num_draft_tokens=0 for plain decoding"
        )


class DraftTargetProposer:
    """:class:`~specbuild.engine.drafters.Proposer` running the draft model with its own KV cache.

    The cache holds ``cached`` = the context prefix the draft has seen plus the drafts it fed itself.
    Each step keeps the longest prefix of ``cached`` that is still in the context (accepted drafts stay,
    rejected ones are rolled back) and feeds the rest::

        step n:   context = c0 .. c9            feed c?..c9, sample d0; feed d0, sample d1; ... d(k-1)
                  cached  = c0 .. c9 d0 .. d(k-2)     (d(k-1) is never fed)
        step n+1: context = c0 .. c9 d0 d1 b    (d0, d1 accepted, bonus b)
                  keep c0 .. c9 d0 d1, roll back the rest, feed [b]

    The cache is always a slot of a :class:`DraftSlots` pool (the one KV cache interface,
    :class:`~specbuild.engine.kv_pool.KVCache`). In an engine (the draft has :class:`DraftSlots`) it is a
    slot of the draft's shared pool and the requests of a batch draft together (:func:`propose_batch`);
    otherwise, or when every slot is held, a private one-slot pool, regrown (and refilled from the
    context) when the context outgrows it.
    """

    def __init__(self, draft: DraftModel) -> None:
        self._draft = draft
        self._cached: list[int] = []
        self._slots: DraftSlots | None = None  # the draft's shared slots, or a private one-slot pool
        self._slot: int | None = None

    def _take_cache(self) -> None:
        """On first use (the request is running by then): a slot of the draft's pool if one is free, else
        a private one-slot pool. The shared slot goes back when this proposer is dropped."""
        if self._slot is not None:
            return
        slots = self._draft.slots
        self._slot = None if slots is None else slots.take()
        if self._slot is not None:
            self._slots = slots
            weakref.finalize(self, slots.give_back, self._slot)
        else:
            self._private(PRIVATE_CHUNK)

    def _private(self, capacity: int) -> None:
        """A private one-slot pool of ``capacity`` positions (rounded up to :data:`PRIVATE_CHUNK`), empty."""
        capacity = -(-capacity // PRIVATE_CHUNK) * PRIVATE_CHUNK
        self._slots = DraftSlots(self._draft.model, num_slots=1, capacity=capacity)
        self._slot = self._slots.take()
        self._cached = []

    @property
    def batch_key(self) -> DraftSlots | None:
        """The draft's slots when this request holds one (it then drafts with the others), else None.
        Takes the request's cache on first use."""
        self._take_cache()
        return self._slots if self._slots is self._draft.slots else None

    def propose(self, context: Sequence[int], num_draft_tokens: int, sampler: Sampler | None = None) -> Draft:
        """``k`` tokens sampled (or greedy when ``sampler`` is None) from the draft, with their ``[k, vocab]`` q.

        ``k = min(num_draft_tokens, max_draft_len)``, fewer when the draft's positions run out (an empty
        draft then: the engine decodes plainly).
        """
        self._take_cache()
        need = len(context) + self._num_drafts(len(context), num_draft_tokens)
        if self._slots is not self._draft.slots and need > self._slots.pool.capacity:
            self._private(2 * need)  # a private pool the context outgrew: a bigger one, refilled from the context
        return propose_batch([self], [context], [num_draft_tokens], [sampler])[0]

    def update(self, context: Sequence[int], num_accepted: int) -> None:
        """Nothing to do: the next :meth:`propose` rolls the cache back to what the context kept."""
        del context, num_accepted

    def _num_drafts(self, context_len: int, num_draft_tokens: int) -> int:
        return min(num_draft_tokens, self._draft.config.max_draft_len, self._positions_left(context_len))

    @staticmethod
    def _choose(logits: Any, sampler: Sampler | None, probs: list) -> int:
        """The draft token from ``logits [1, vocab]``: argmax, or a draw whose ``q`` is appended to ``probs``."""
        if sampler is None:
            return int(logits[0].argmax())
        probs.append(sampler.probs(logits)[0])  # [vocab]
        return sampler.sample(probs[-1])

    def _positions_left(self, context_len: int) -> int:
        """Most drafts the draft's positions allow: feeding context + k - 1 drafts needs that many positions."""
        limit = self._draft.max_position_embeddings
        return self._draft.config.max_draft_len if limit is None else limit - context_len + 1

    def _kept_prefix(self, context: Sequence[int]) -> int:
        """Length of the longest prefix of ``cached`` still in ``context`` (at most ``len(context) - 1``)."""
        keep = 0
        limit = min(len(self._cached), len(context) - 1)
        while keep < limit and self._cached[keep] == context[keep]:
            keep += 1
        return keep

    def _sync_cache(self, context: Sequence[int]) -> list[int]:
        """Roll the cache back to its longest prefix still in ``context``; return the tokens to feed (>= 1)."""
        keep = self._kept_prefix(context)
        self._slots.pool.truncate(self._slot, keep)
        self._cached = self._cached[:keep]
        return list(context[keep:])


def propose_batch(
    proposers: Sequence[DraftTargetProposer], contexts: Sequence[Sequence[int]], num_draft_tokens: Sequence[int],
    samplers: Sequence[Sampler | None],
) -> list[Draft]:
    """:meth:`DraftTargetProposer.propose` for requests of one engine's draft, each holding a slot of its
    :class:`DraftSlots` (or one request on its private pool): per draft token ONE draft forward over every request still drafting
    (:func:`~specbuild.engine.forward.forward_blocks`, rows at their own lengths), so ``B`` requests cost
    about one request's draft passes, not ``B``. A request whose feed is longer than ``1 +
    max_draft_len`` (its first step feeds the prompt) runs its first forward alone, so the others are not
    padded to it. Each request gets the draft it gets alone: on CPU a row's bits do not depend on the
    rows beside it (packed linears, per-row attention), and sampled rows draw from their own samplers.

    Raises:
        ValueError: the proposers do not hold slots of one :class:`DraftSlots`.
    """
    draft = proposers[0]._draft
    for p in proposers:
        p._take_cache()
    if any(p._slots is not proposers[0]._slots for p in proposers):
        raise ValueError("propose_batch drafts for requests holding slots of one draft's DraftSlots only")
    pool = proposers[0]._slots.pool
    ks = [p._num_drafts(len(c), n) for p, c, n in zip(proposers, contexts, num_draft_tokens)]
    tokens: list[list[int]] = [[] for _ in proposers]
    probs: list[list[Any]] = [[] for _ in proposers]
    feeds = {i: proposers[i]._sync_cache(contexts[i]) for i in range(len(proposers)) if ks[i] > 0}
    widest = 1 + draft.config.max_draft_len
    for step in range(max(ks, default=0)):
        active = [i for i in feeds if step < ks[i]]
        narrow = [i for i in active if len(feeds[i]) <= widest]
        for group in [*([i] for i in active if len(feeds[i]) > widest), *([narrow] if narrow else [])]:
            out = forward_blocks(
                draft.model, pool, [RowBlock(proposers[i]._slot, feeds[i], logits_from=len(feeds[i]) - 1) for i in group]
            )
            for i, logits in zip(group, out.logits):  # logits [1, vocab]
                pool.commit(proposers[i]._slot, list(range(len(feeds[i]))))
                proposers[i]._cached += feeds[i]
                tokens[i].append(proposers[i]._choose(logits, samplers[i], probs[i]))
                feeds[i] = [tokens[i][-1]]
    return [Draft(t, torch.stack(q) if q else None) for t, q in zip(tokens, probs)]


class DraftModelDrafter(ChainDrafter):
    """A :class:`DraftTargetProposer`'s chains; the requests holding slots of one draft's :class:`DraftSlots`
    draft together (a :class:`~specbuild.engine.drafters.BatchDrafter`)."""

    proposer: DraftTargetProposer

    @property
    def batch_key(self) -> DraftSlots | None:
        """The draft's slots when this request holds one, else None (a private cache: it drafts alone)."""
        return self.proposer.batch_key

    @classmethod
    def draft_batch(cls, drafters: Sequence[DraftModelDrafter], contexts, *, max_accepts, samplers) -> list[Block]:
        """:meth:`draft` for requests of one draft model: one draft forward per draft token for all of them."""
        rows = [i for i, (d, m) in enumerate(zip(drafters, max_accepts)) if min(d.k, m) > 0]
        blocks = [Block.chain(context[-1]) for context in contexts]
        if rows:
            drafts = propose_batch([drafters[i].proposer for i in rows], [contexts[i] for i in rows],
                                   [min(drafters[i].k, max_accepts[i]) for i in rows], [samplers[i] for i in rows])
            for i, draft in zip(rows, drafts):
                blocks[i] = Block.chain(contexts[i][-1], draft.tokens, draft.probs)
        return blocks


def make_drafter(draft: DraftModel, request: ResolvedRequest) -> DraftModelDrafter:
    """A request's drafter: its own proposer (cache) over the engine's draft, chains of at most ``num_draft_tokens``."""
    return DraftModelDrafter(DraftTargetProposer(draft), request.num_draft_tokens)


ENGINE = EngineMethod(make_drafter=make_drafter, load=load_draft, check_prompt=check_prompt)
"""The draft runs with its own KV cache (a slot of the engine's draft pool); greedy or speculative sampling on its chain."""


# --- the draft's lm_head ----------------------------------------------------------------------------


class DraftLMHead(torch.nn.Module):
    """A draft model's ``lm_head`` (``nn.Linear [vocab, hidden]``) projected by :class:`~specbuild.engine.draft_linear.DraftProjection`.

    A draft-target step projects one row (``logits_to_keep=1``); on CPU that is faster against the
    packed copy ``DraftProjection`` keeps (one more weight's memory). With ``token_ids`` (a hot-token
    map) only those rows are computed and every other token's logit is ``-inf``. ``weight`` and ``bias``
    are the linear's own parameters (tied embeddings stay tied). Call with ``x [..., hidden]``; returns
    ``[..., vocab]``.
    """

    def __init__(self, linear: torch.nn.Linear, token_ids: Sequence[int] | None = None, weight_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.project = DraftProjection(linear, token_ids, weight_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x)


def use_draft_lm_head(model: PreTrainedModel, token_ids: Sequence[int] | None = None,
                      weight_dtype: torch.dtype | None = None) -> PreTrainedModel:
    """Swap a draft model's ``nn.Linear`` lm_head for a :class:`DraftLMHead` (in place; returns it): on CPU,
    and on any device with a hot-token map ``token_ids``.

    Only for a draft the engine owns and never trains or saves: the target's logits always come from its
    own unchanged forward, so verification never depends on this kernel choice. Anything but a plain
    ``nn.Linear`` (custom heads), or CUDA without a map, is left as it is; a second call changes nothing.
    ``weight_dtype``: as :class:`~specbuild.engine.draft_linear.DraftProjection`'s.
    """
    head = model.get_output_embeddings()
    if type(head) is torch.nn.Linear and (head.weight.device.type == "cpu" or token_ids is not None):
        model.set_output_embeddings(DraftLMHead(head, token_ids, weight_dtype))
    return model


# --- the builder: the draft written into the engine directory -----------------------------------------


def write_draft(loaded: LoadedRecipe, draft_dir: Path, out: Path, *, log) -> None:
    """:attr:`~specbuild.methods.ReferenceWeights.write`: the draft as a Hugging Face checkpoint in
    ``draft_dtype`` (or the target's)."""
    r = loaded.recipe
    dtype = r.speculation.draft_dtype or r.target.dtype
    model = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch_dtype(dtype), trust_remote_code=r.target.trust_remote_code)
    log(f"writing draft {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {dtype})")
    model.save_pretrained(out, safe_serialization=True)
