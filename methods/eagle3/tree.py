"""EAGLE-3 drafting EAGLE-2's dynamic tree in the reference engine (TensorRT-LLM's PyTorch backend:
``use_dynamic_tree``, ``dynamic_tree_max_topK``, ``max_total_draft_tokens``).

The tree is grown by EAGLE-1/2's code (:class:`~specbuild.methods.eagle.engine.EagleProposer`: its
``_dynamic`` expansion, :func:`~specbuild.methods.eagle.engine.propose_batch`, the draft positions'
:class:`~specbuild.methods.eagle.engine.DraftKV` and the per-request cap); only what differs for EAGLE-3
is here: the head is fed the fused captured layers (:func:`specbuild.methods.eagle3.engine.update_batch`),
and its draft distribution is ``softmax(lm_head(norm(o)))`` over its draft vocabulary, mapped to target
ids with ``d2t``. The settings map onto EAGLE-2's as TensorRT-LLM names them::

    EAGLE-3 (TensorRT-LLM)       EagleTreeConfig        meaning
    max_draft_len                num_eagle_layers       tree depth (draft layers)
    dynamic_tree_max_topK = K    dynamic_tree_max_topK  children per expanded node, nodes expanded per depth
    max_total_draft_tokens       max_draft_len          nodes kept by the final reranking (default K * depth)

EAGLE-2 (Li et al. 2024b, §4): the root's top-K children; at each further depth the K nodes of highest
cumulative draft log-probability each get their top-K children; finally the ``max_total_draft_tokens``
best nodes of all generated form the tree the target verifies. A node at depth ``d`` runs the head on
``[embed(its token) ; its parent's output]`` at rotary position ``P + d - 1`` (``P`` true positions),
attending to the true cache and its own draft ancestors, exactly as a chain's depth-``d`` draft does
(with K = 1 the tree is the chain :class:`~specbuild.methods.eagle3.engine.Eagle3Proposer` drafts).
Greedy only: the target verifies the tree by its argmax, so the output is the target's greedy output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..eagle.engine import EagleDrafter, EagleProposer, EagleTreeConfig
from . import Eagle3Speculation
from .engine import Eagle3Proposer, update_batch


def eagle3_tree_config(config: Eagle3Speculation) -> EagleTreeConfig:
    """EAGLE-2's tree settings from EAGLE-3's (see the module's table).

    Raises:
        ValueError: ``use_dynamic_tree`` off (a chain needs no tree), or an :class:`EagleTreeConfig` error.
    """
    if not config.use_dynamic_tree or config.dynamic_tree_max_topK is None:
        raise ValueError("an EAGLE-3 tree needs use_dynamic_tree: true and dynamic_tree_max_topK")
    k = config.dynamic_tree_max_topK
    return EagleTreeConfig(num_eagle_layers=config.max_draft_len,
                           max_draft_len=config.max_total_draft_tokens or k * config.max_draft_len, dynamic_tree_max_topK=k)


class Eagle3TreeProposer(EagleProposer):
    """Grows EAGLE-2 dynamic trees with an EAGLE-3 head (stateless itself; per-request
    :class:`~specbuild.methods.eagle3.engine.Eagle3State`).

    Use as :class:`~specbuild.methods.eagle.engine.EagleProposer`, with the fused features of
    :meth:`capture`: ``update(state, tokens, proposer.capture(hidden_states))``, then per step
    ``proposer.propose(state, root, max_depth)`` -> a :class:`~specbuild.methods.eagle.engine.TreeDraft`.
    """

    def __init__(self, chain: Eagle3Proposer, tree_config: EagleTreeConfig) -> None:
        """``chain``: the head's chain proposer (its fit to the target checked), whose head, embedding and
        draft projection the tree shares.

        Raises:
            ValueError: ``tree_config`` is not a dynamic tree, or K above the draft vocabulary's size.
        """
        if tree_config.dynamic_tree_max_topK is None:
            raise ValueError("an EAGLE-3 tree is EAGLE-2's dynamic tree: give dynamic_tree_max_topK")
        head = chain.head
        draft_vocab, vocab = chain.lm_head.out_features, chain.embedding.weight.shape[0]
        if tree_config.dynamic_tree_max_topK > draft_vocab:
            raise ValueError(f"dynamic_tree_max_topK={tree_config.dynamic_tree_max_topK} exceeds the head's draft "
                             f"vocabulary of {draft_vocab} tokens")
        self.chain, self.tree_config = chain, tree_config
        self.embedding, self.lm_head, self.head = chain.embedding, chain.lm_head, head
        self._project, self._dtype = chain._project, chain._dtype
        self.vocab_size = vocab
        d2t = getattr(head, "d2t", None)
        self.target_ids = None if d2t is None else torch.arange(len(d2t), device=d2t.device) + d2t  # [Vd] target ids

    # The head's own calls are the chain's (one head, one state type): requests of one head grow their
    # trees together (batch_key), and feeding true positions is the chain's update.
    batch_key = Eagle3Proposer.batch_key
    new_state = staticmethod(Eagle3Proposer.new_state)
    update = Eagle3Proposer.update

    def capture(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        """transformers' ``hidden_states`` (``L + 1`` of ``[1, S, Ht]``) -> fused features ``[S, 3 Ht]``."""
        return self.chain.capture(hidden_states)

    def _log_probs(self, outputs: torch.Tensor) -> torch.Tensor:
        """``[b, H]`` pre-norm head outputs -> ``[b, Vd]`` draft log-probabilities, indexed by DRAFT id."""
        return torch.log_softmax(self._project(self.head.norm(outputs)).float(), dim=-1)

    def _top_k(self, log_probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's ``k`` best draft ids as target ids (``d + d2t[d]``): top-K over the ``Vd`` draft
        vocabulary, never a token outside it (what vLLM gets by scattering the draft logits to the full
        vocabulary with ``-inf`` elsewhere, without the ``[b, V]`` scatter)."""
        top = log_probs.topk(min(k, log_probs.shape[-1]), dim=-1)  # dynamic_tree_max_topK may exceed a small Vd
        return top.values, top.indices if self.target_ids is None else self.target_ids[top.indices]


class Eagle3TreeDrafter(EagleDrafter):
    """A request's EAGLE-3 dynamic trees (an :class:`Eagle3TreeProposer`, capped at its
    ``num_draft_tokens`` nodes), fed the fused captured layers of every accepted position; the requests of
    one head feed their features and grow their trees in shared head calls."""

    proposer: Eagle3TreeProposer
    head_update_batch = staticmethod(update_batch)  # EAGLE-3's fused feed; draft_batch is EagleDrafter's

    def start(self, prompt, first_token, hidden_states) -> None:
        self.pending = ([*prompt[1:], first_token], self.proposer.capture([h[None] for h in hidden_states]))

    def update(self, context, step) -> None:
        self.pending = (step.emitted, self.proposer.capture([h[None] for h in step.hidden_states])[step.keep])

    def step_plan(self, max_accept: int, max_draft_tokens: int | None) -> tuple[Any, int]:
        """The iteration's K is a depth here: EAGLE-3's max_draft_len (and so draft_len_schedule's entries)
        counts draft layers, max_total_draft_tokens the nodes (TensorRT-LLM's EagleDecodingConfig)."""
        return self.proposer, max_accept if max_draft_tokens is None else min(max_accept, max_draft_tokens)
