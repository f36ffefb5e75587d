"""Greedy Medusa decoding (Cai et al. 2024), standalone: heads propose a tree, the target verifies it in one pass.

The engine's loop is the batched worker (:mod:`specbuild.engine.worker`) with a
:class:`~specbuild.engine.drafters.TreeDrafter`; :func:`generate_tree_greedy` runs one prompt through it
alone. One step::

    slot holds context[:-1]; root = context[-1]; hidden = target's final-norm state that produced root
    block       = [root, head candidates per node]                       1 + n tokens, ancestor mask
    target      = one pass over the block
    accepted    = longest root-to-node path matching the target's argmax; bonus = argmax at its end
    slot        = keep prefix + root + accepted path
    next root   = bonus, next hidden = hidden at the last accepted index

The output is the target's own greedy output token for token (fp32; up to rounding between a tree pass
and a one-token pass). ``max_tokens`` is never exceeded (the tree is cut to the depth that can still be
emitted, and every chunk is clipped) and decoding stops at ``end_id`` even inside an accepted chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedModel

from specbuild.methods.medusa.engine import MedusaHeads, MedusaProposer, TreeDrafter, TreeProposer
from .stream import check_prompt_and_length, collect
from .tree import SpecTree
from .types import GenerationResult
from .worker import InflightRequest
from .worker import run_alone


def generate_tree_greedy(
    model: PreTrainedModel,
    proposer: TreeProposer,
    input_ids: Sequence[int],
    *,
    max_tokens: int,
    tree: SpecTree,
    end_id: int = -1,
) -> GenerationResult:
    """Greedy generation with tree speculation for one prompt, run through the batched worker alone (a :class:`~specbuild.engine.drafters.TreeDrafter`).

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
    request = InflightRequest(list(input_ids), max_tokens, end_id, TreeDrafter(proposer, tree))
    return collect(run_alone(model, request, max_block=tree.num_nodes + 1))


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
