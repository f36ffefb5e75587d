"""Draft-target speculation: a smaller causal LM sharing the target's vocabulary proposes k tokens.

Leviathan et al. 2023 (§2.3) and Chen et al. 2023 (Algorithm 2); TensorRT-LLM's
``DraftTargetDecodingConfig`` names the knobs (``max_draft_len``, ``speculative_model_dir``). The draft
runs autoregressively with its own KV cache; greedy requests take its argmax tokens, sampled requests
draw from its distributions ``q`` under the request's own sampling parameters and return them for
rejection sampling (:func:`specbuild.engine.acceptance.accept_speculative`).

torch and transformers are imported inside the functions that run the draft: the recipe validator imports
the method registry and must stay torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import threading
import weakref

from ..types import InvalidRequestError
from .base import Draft, MethodContext, load_token_ids, pack_draft_linears

if TYPE_CHECKING:
    from specbuild.methods.draft_target import DraftTargetSpeculation

    from ..sampling import Sampler

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


class DraftSlots:
    """The draft's KV cache in an engine: a :class:`~specbuild.engine.kv_pool.KVPool` with one slot per
    request in flight (``max_batch_size`` slots of ``max_seq_len + max_draft_len + 2`` positions), so the
    drafts of every request step through one draft forward per draft token (:func:`propose_batch`).
    Slots are handed out and back under a lock (a proposer gives its slot back when it is dropped).
    """

    def __init__(self, model: Any, *, num_slots: int, capacity: int) -> None:
        from ..kv_pool import KVPool, KVShape

        self.pool = KVPool(KVShape.of(model), num_slots=num_slots, capacity=capacity, dtype=model.dtype, device=model.device)
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """A free slot (emptied), or None when every slot is held."""
        from ..kv_pool import KVCacheFullError

        with self._lock:
            try:
                return self.pool.allocate()
            except KVCacheFullError:
                return None

    def give_back(self, slot: int) -> None:
        with self._lock:
            self.pool.release(slot)


def read_vocab_size(checkpoint_dir: str | Path) -> int:
    """``vocab_size`` from a Hugging Face ``config.json`` (top level, else ``text_config``), without torch.

    Raises:
        FileNotFoundError: no ``config.json``.
        ValueError: it names no vocab_size.
    """
    config_path = Path(checkpoint_dir) / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no Hugging Face checkpoint at {checkpoint_dir} (config.json missing)")
    config = json.loads(config_path.read_text())
    vocab_size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    if vocab_size is None:
        raise ValueError(f"{config_path}: no vocab_size")
    return int(vocab_size)


def check_draft_vocab(draft_dir: str | Path, target_vocab_size: int) -> None:
    """Refuse a draft whose vocabulary size differs from the target's (before loading any weights).

    Raises:
        ValueError: the sizes differ; the message names both.
    """
    draft_vocab_size = read_vocab_size(draft_dir)
    if draft_vocab_size != target_vocab_size:
        raise ValueError(
            f"draft model {draft_dir} has vocab_size={draft_vocab_size} but the target has "
            f"vocab_size={target_vocab_size}; draft-target speculation needs a draft that shares the "
            "target's vocabulary"
        )


def load_draft(config: DraftTargetSpeculation, context: MethodContext) -> DraftModel:
    """Load the draft (``config.draft_checkpoint``) with the target's dtype and device, after checking the vocabulary.

    Raises:
        FileNotFoundError: no checkpoint at the draft directory.
        ValueError: vocabulary size mismatch; a bad ``speculative_token_map`` (:func:`load_token_ids`).
    """
    from .. import target as target_model

    path = Path(config.draft_checkpoint)
    check_draft_vocab(path, int(context.target.config.get_text_config().vocab_size))
    model = target_model.load_target(
        path, dtype=context.target.dtype, device=str(context.target.device), trust_remote_code=context.trust_remote_code
    )
    token_ids = load_token_ids(config, int(context.target.config.get_text_config().vocab_size))
    target_model.use_draft_lm_head(model, token_ids, context.draft_weight_dtype)  # CPU: each draft step projects one row
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
    """:class:`~specbuild.engine.methods.base.Proposer` running the draft model with its own KV cache.

    The cache holds ``cached`` = the context prefix the draft has seen plus the drafts it fed itself.
    Each step keeps the longest prefix of ``cached`` that is still in the context (accepted drafts stay,
    rejected ones are rolled back) and feeds the rest::

        step n:   context = c0 .. c9            feed c?..c9, sample d0; feed d0, sample d1; ... d(k-1)
                  cached  = c0 .. c9 d0 .. d(k-2)     (d(k-1) is never fed)
        step n+1: context = c0 .. c9 d0 d1 b    (d0, d1 accepted, bonus b)
                  keep c0 .. c9 d0 d1, roll back the rest, feed [b]

    In an engine (the draft has :class:`DraftSlots`) the cache is a slot of the draft's pool and the
    requests of a batch draft together (:func:`propose_batch`); otherwise, or when every slot is held,
    a private ``DynamicCache``.
    """

    def __init__(self, draft: DraftModel) -> None:
        self._draft = draft
        self._cached: list[int] = []
        self._slot: int | None = None
        self._cache: Any = None  # the private DynamicCache, when there is no slot

    def _take_cache(self) -> None:
        """On first use (the request is running by then): a slot of the draft's pool if one is free, else
        a private cache. The slot goes back when this proposer is dropped."""
        if self._slot is not None or self._cache is not None:
            return
        slots = self._draft.slots
        self._slot = None if slots is None else slots.take()
        if self._slot is not None:
            weakref.finalize(self, slots.give_back, self._slot)
        else:
            from .. import target as target_model

            self._cache = target_model.new_cache(self._draft.model)

    @property
    def batch_key(self) -> DraftSlots | None:
        """The draft's slots when this request holds one (it then drafts with the others), else None.
        Takes the request's cache on first use."""
        self._take_cache()
        return self._draft.slots if self._slot is not None else None

    def propose(self, context: Sequence[int], num_draft_tokens: int, sampler: Sampler | None = None) -> Draft:
        """``k`` tokens sampled (or greedy when ``sampler`` is None) from the draft, with their ``[k, vocab]`` q.

        ``k = min(num_draft_tokens, max_draft_len)``, fewer when the draft's positions run out (an empty
        draft then: the engine decodes plainly).
        """
        self._take_cache()
        if self._slot is not None:
            return propose_batch([self], [context], [num_draft_tokens], [sampler])[0]
        import torch

        from .. import target as target_model

        k = self._num_drafts(len(context), num_draft_tokens)
        if k <= 0:
            return Draft()
        feed = self._sync_cache(context)
        tokens, probs = [], []
        for _ in range(k):
            logits = target_model.forward_logits(self._draft.model, feed, self._cache, num_logits=1)  # [1, vocab]
            self._cached += feed
            tokens.append(self._choose(logits, sampler, probs))
            feed = [tokens[-1]]
        return Draft(tokens, torch.stack(probs) if probs else None)  # probs: [k, vocab]

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
        from ..kv_cache import rollback

        keep = self._kept_prefix(context)
        if self._slot is None:
            rollback(self._cache, keep)
        else:
            self._draft.slots.pool.truncate(self._slot, keep)
        self._cached = self._cached[:keep]
        return list(context[keep:])


def propose_batch(
    proposers: Sequence[DraftTargetProposer], contexts: Sequence[Sequence[int]], num_draft_tokens: Sequence[int],
    samplers: Sequence[Sampler | None],
) -> list[Draft]:
    """:meth:`DraftTargetProposer.propose` for requests of one engine's draft, each holding a slot of its
    :class:`DraftSlots`: per draft token ONE draft forward over every request still drafting
    (:func:`~specbuild.engine.forward.forward_blocks`, rows at their own lengths), so ``B`` requests cost
    about one request's draft passes, not ``B``. A request whose feed is longer than ``1 +
    max_draft_len`` (its first step feeds the prompt) runs its first forward alone, so the others are not
    padded to it. Each request gets the draft it gets alone: on CPU a row's bits do not depend on the
    rows beside it (packed linears, per-row attention), and sampled rows draw from their own samplers.

    Raises:
        ValueError: a proposer holds no slot, or the proposers belong to different drafts.
    """
    import torch

    from ..forward import RowBlock, forward_blocks

    draft = proposers[0]._draft
    for p in proposers:
        p._take_cache()
    if any(p._draft.slots is not draft.slots or p._slot is None for p in proposers):
        raise ValueError("propose_batch drafts for requests holding slots of one draft's DraftSlots only")
    pool = draft.slots.pool
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
