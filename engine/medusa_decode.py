"""Greedy Medusa decoding (Cai et al. 2024), standalone: heads propose a tree, the target verifies it in one pass.

One step (:func:`tree_step`)::

    cache holds context[:-1]; root = context[-1]; hidden = target's final-norm state that produced root
    tree tokens = [root, head candidates per node]                        1 + n tokens
    target      = tree_forward(tree tokens)                              one pass, tree attention mask
    accepted    = longest root-to-node path matching the target's argmax; bonus = argmax at its end
    cache       = compact(prefix + root + accepted path)                 = context[:-1] + root + accepted
    next root   = bonus, next hidden = hidden at the last accepted index

The output is the target's own greedy output token for token (fp32; up to rounding between a tree pass
and a one-token pass). ``max_tokens`` is never exceeded (the tree is cut to the depth that can still be
emitted, and every chunk is clipped) and decoding stops at ``end_id`` even inside an accepted chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from .acceptance import TreeAcceptance, accept_tree_greedy
from .kv_cache_tree import compact
from .methods.medusa import MedusaHeads, MedusaProposer
from .target import cache_keyword, new_cache
from .tree import SpecTree
from .stream import DecodeState, Steps, check_prompt_and_length, collect
from .tree_verify import tree_forward
from .types import GenerationResult


class TreeProposer(Protocol):
    """Fills a speculation tree from the target's last hidden state (Medusa heads; EAGLE later).

    Attributes:
        tree: the full tree this proposer fills; :class:`~specbuild.engine.runtime.ReferenceEngine` cuts
            it per request (``num_draft_tokens``: :meth:`SpecTree.first`) and per step (the depth that
            ``max_tokens`` still allows: :meth:`SpecTree.truncated`).
    """

    tree: SpecTree

    def propose_tree(self, context: Sequence[int], hidden: torch.Tensor, tree: SpecTree) -> list[int]:
        """``[1 + tree.num_nodes]`` tokens, ``context[-1]`` (the root) first.

        ``hidden`` is ``[hidden_size]``, the target's final-norm state that produced ``context[-1]``.
        """
        ...


@dataclass(frozen=True)
class TreeStep:
    """One verification step's outcome.

    Attributes:
        tree_tokens: ``[1 + n]`` tokens verified (root first).
        acceptance: accepted path and bonus token.
        next_hidden: ``[hidden]`` target hidden state at the last accepted index (the heads' next input).
    """

    tree_tokens: list[int]
    acceptance: TreeAcceptance
    next_hidden: torch.Tensor


def prefill_with_hidden(model: PreTrainedModel, prompt: Sequence[int], cache: DynamicCache) -> tuple[int, torch.Tensor]:
    """Fill ``cache`` with ``prompt``; return the first greedy token and the ``[hidden]`` state that produced it."""
    input_ids = torch.tensor([list(prompt)], dtype=torch.long, device=model.device)  # [1, T]
    outputs = model(
        input_ids=input_ids, use_cache=True, logits_to_keep=1, output_hidden_states=True, **{cache_keyword(model): cache}
    )
    # logits: [1, 1, vocab]; hidden_states[-1]: [1, T, hidden]
    return int(outputs.logits[0, -1].argmax()), outputs.hidden_states[-1][0, -1]


def tree_step(
    model: PreTrainedModel,
    proposer: TreeProposer,
    tree: SpecTree,
    context: Sequence[int],
    hidden: torch.Tensor,
    cache: DynamicCache,
) -> TreeStep:
    """Propose, verify in one target pass, accept greedily, compact the cache to the accepted path.

    ``cache`` holds ``context[:-1]``; afterwards it also holds ``context[-1]`` and the accepted tokens
    (grows by ``1 + num_accepted``); the bonus token stays out of it.
    """
    prefix_len = cache.get_seq_length()
    tree_tokens = proposer.propose_tree(context, hidden, tree)
    forward = tree_forward(model, tree, tree_tokens, cache)
    acceptance = accept_tree_greedy(tree, tree_tokens, forward.target_tokens)
    compact(cache, prefix_len=prefix_len, keep_indices=[0, *acceptance.accepted_nodes])
    return TreeStep(tree_tokens, acceptance, forward.hidden[acceptance.last_index])


def tree_steps(
    model: PreTrainedModel, proposer: TreeProposer, input_ids: Sequence[int], *, max_tokens: int, tree: SpecTree, end_id: int = -1
) -> Steps:
    """Greedy tree speculation for one prompt, step by step (any :class:`TreeProposer`): the prefill's
    token, then one :class:`~specbuild.engine.stream.StepOutput` per verification (counters: draft
    tokens = tree nodes verified). The caller runs it under ``torch.inference_mode()``.

    Each step cuts ``tree`` to depth ``remaining - 1``: deeper nodes could never be emitted (the bonus
    token takes the last slot), e.g. 3 tokens left -> at most 2 accepted + bonus.
    """
    cache = new_cache(model)
    state = DecodeState(list(input_ids), max_tokens, end_id)
    first, hidden = prefill_with_hidden(model, input_ids, cache)
    yield state.first(first)
    while not state.done:
        step_tree = tree.truncated(state.remaining - 1)
        step = tree_step(model, proposer, step_tree, state.context, hidden, cache)
        hidden = step.next_hidden
        yield state.step(step.acceptance.emitted_tokens, drafted=step_tree.num_nodes, accepted=step.acceptance.num_accepted)


def generate_tree_greedy(
    model: PreTrainedModel,
    proposer: TreeProposer,
    input_ids: Sequence[int],
    *,
    max_tokens: int,
    tree: SpecTree,
    end_id: int = -1,
) -> GenerationResult:
    """Greedy generation with tree speculation for one prompt: :func:`tree_steps`, collected.

    Args:
        input_ids: prompt token ids (non-empty).
        max_tokens: new tokens at most, ``>= 1``.
        tree: the full tree; each step cuts it to the depth that can still be emitted.
        end_id: stop after this token; ``-1`` never stops on a token.

    Returns:
        ``GenerationResult``: ``total_draft_tokens`` counts tree nodes verified, ``num_decoding_iterations``
        target passes after the prefill.

    Raises:
        ValueError: empty prompt or ``max_tokens < 1``.
    """
    check_prompt_and_length(input_ids, max_tokens)
    with torch.inference_mode():
        return collect(tree_steps(model, proposer, input_ids, max_tokens=max_tokens, tree=tree, end_id=end_id))


def medusa_generate_greedy(
    model: PreTrainedModel,
    heads: MedusaHeads,
    input_ids: Sequence[int],
    *,
    max_tokens: int,
    tree: SpecTree,
    end_id: int = -1,
) -> GenerationResult:
    """Greedy Medusa decoding: :func:`generate_tree_greedy` with a :class:`MedusaProposer`.

    Example: ``medusa_generate_greedy(model, load_medusa_heads(dir), prompt, max_tokens=64,
    tree=SpecTree.from_choices(MC_SIM_7B_63))`` -> the target's greedy 64 tokens, fewer target passes.

    Raises:
        ValueError: empty prompt, ``max_tokens < 1``, or a tree deeper than the head count.
    """
    proposer = MedusaProposer(heads, tree)
    return generate_tree_greedy(model, proposer, input_ids, max_tokens=max_tokens, tree=tree, end_id=end_id)
