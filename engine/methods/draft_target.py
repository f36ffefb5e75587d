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
    target_model.use_draft_lm_head(model, token_ids)  # CPU: each draft step projects one row
    pack_draft_linears(model)  # its layers' linears (the lm_head is the DraftLMHead's now)
    max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    return DraftModel(config, model, path, max_positions)


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
    """

    def __init__(self, draft: DraftModel) -> None:
        from .. import target as target_model

        self._draft = draft
        self._cache = target_model.new_cache(draft.model)
        self._cached: list[int] = []

    def propose(self, context: Sequence[int], num_draft_tokens: int, sampler: Sampler | None = None) -> Draft:
        """``k`` tokens sampled (or greedy when ``sampler`` is None) from the draft, with their ``[k, vocab]`` q.

        ``k = min(num_draft_tokens, max_draft_len)``, fewer when the draft's positions run out (an empty
        draft then: the engine decodes plainly).
        """
        import torch

        from .. import target as target_model

        k = min(num_draft_tokens, self._draft.config.max_draft_len, self._positions_left(len(context)))
        if k <= 0:
            return Draft()
        feed = self._sync_cache(context)
        tokens, probs = [], []
        for _ in range(k):
            logits = target_model.forward_logits(self._draft.model, feed, self._cache, num_logits=1)  # [1, vocab]
            self._cached += feed
            if sampler is None:
                tokens.append(int(logits[0].argmax()))
            else:
                probs.append(sampler.probs(logits)[0])  # [vocab]
                tokens.append(sampler.sample(probs[-1]))
            feed = [tokens[-1]]
        return Draft(tokens, torch.stack(probs) if probs else None)  # probs: [k, vocab]

    def update(self, context: Sequence[int], num_accepted: int) -> None:
        """Nothing to do: the next :meth:`propose` rolls the cache back to what the context kept."""
        del context, num_accepted

    def _positions_left(self, context_len: int) -> int:
        """Most drafts the draft's positions allow: feeding context + k - 1 drafts needs that many positions."""
        limit = self._draft.max_position_embeddings
        return self._draft.config.max_draft_len if limit is None else limit - context_len + 1

    def _sync_cache(self, context: Sequence[int]) -> list[int]:
        """Roll the cache back to its longest prefix still in ``context``; return the tokens to feed (>= 1)."""
        from ..kv_cache import rollback

        keep = 0
        limit = min(len(self._cached), len(context) - 1)
        while keep < limit and self._cached[keep] == context[keep]:
            keep += 1
        rollback(self._cache, keep)
        self._cached = self._cached[:keep]
        return list(context[keep:])
