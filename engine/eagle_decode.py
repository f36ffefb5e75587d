"""Greedy EAGLE-1/2 decoding (Li et al. 2024), standalone: the head drafts a tree, the target verifies it in one pass.

Unlike Medusa, the EAGLE head needs the target's feature of EVERY accepted token, not only the last one
(its own KV cache runs over all positions). The engine's loop is the batched worker
(:mod:`specbuild.engine.worker`) with a :class:`~specbuild.engine.drafters.FeatureTreeDrafter`;
:func:`generate_feature_tree_greedy` runs one prompt through it alone. One step::

    slot holds context[:-1]; head state holds (f_j, c_{j+1}) for j < len(context) - 1
    draft      = proposer.propose(state, root=context[-1])        static or EAGLE-2 dynamic tree, 1 + n tokens
    target     = one pass over the tree (ancestor mask)
    accepted   = longest root-to-node path matching the target's argmax; bonus = argmax at its end
    slot       = keep prefix + root + accepted path
    head state += (features at [root, *accepted], [*accepted tokens, bonus])

Features are the target's final-norm hidden states (see :mod:`specbuild.methods.eagle.engine` for why).
The output is the target's own greedy output token for token (fp32; up to rounding between a tree pass
and a one-token pass); ``max_tokens`` is never exceeded (the tree is cut to the depth that can still be
emitted, every chunk is clipped) and decoding stops at ``end_id`` even inside an accepted chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedModel

from specbuild.methods.eagle.engine import FeatureTreeDrafter, FeatureTreeProposer
from specbuild.methods.eagle.engine import EagleHead, EagleProposer, EagleTreeConfig
from .stream import check_prompt_and_length, collect
from .types import GenerationResult
from .worker import InflightRequest
from .worker import run_alone


def generate_feature_tree_greedy(
    model: PreTrainedModel, proposer: FeatureTreeProposer, input_ids: Sequence[int], *, max_tokens: int, end_id: int = -1
) -> GenerationResult:
    """Greedy generation for one prompt with any :class:`FeatureTreeProposer`, run through the batched worker alone.

    Returns:
        ``GenerationResult``: ``total_draft_tokens`` counts tree nodes verified, ``num_decoding_iterations``
        target passes after the prefill.

    Raises:
        ValueError: empty prompt or ``max_tokens < 1``.
    """
    check_prompt_and_length(input_ids, max_tokens)
    request = InflightRequest(list(input_ids), max_tokens, end_id, FeatureTreeDrafter(proposer))
    return collect(run_alone(model, request, max_block=1 + max_tree_nodes(proposer)))


def max_tree_nodes(proposer: Any) -> int:
    """The most nodes ``proposer``'s trees can have (its ``max_draft_len``; 63 if it does not say)."""
    config = getattr(proposer, "tree_config", None)
    return int(getattr(config, "max_draft_len", 63))


def eagle_generate_greedy(
    model: PreTrainedModel,
    head: EagleHead,
    input_ids: Sequence[int],
    *,
    max_tokens: int,
    choices: Sequence[Sequence[int]] | None = None,
    dynamic_top_k: int | None = None,
    num_eagle_layers: int = 4,
    max_draft_len: int = 63,
    end_id: int = -1,
) -> GenerationResult:
    """Greedy EAGLE decoding: a static tree (``choices``, default EAGLE-1's mc_sim_7b_63) or EAGLE-2's dynamic tree.

    Example: ``eagle_generate_greedy(model, load_eagle_head(dir), prompt, max_tokens=64, dynamic_top_k=8,
    num_eagle_layers=5, max_draft_len=60)`` -> the target's greedy 64 tokens in fewer target passes.

    Args:
        choices: ``eagle_choices``, exactly ``num_eagle_layers`` deep; exclusive with ``dynamic_top_k``.
        dynamic_top_k: ``dynamic_tree_max_topK``; set -> EAGLE-2 dynamic tree of depth ``num_eagle_layers``
            with at most ``max_draft_len`` nodes.

    Raises:
        ValueError: empty prompt, ``max_tokens < 1``, ``choices`` depth != ``num_eagle_layers``
            (TensorRT-LLM#2588), both trees given, or a head that does not fit the target.
    """
    tree_config = EagleTreeConfig(
        num_eagle_layers=num_eagle_layers,
        max_draft_len=max_draft_len,
        eagle_choices=None if choices is None else tuple(tuple(c) for c in choices),
        dynamic_tree_max_topK=dynamic_top_k,
    )
    proposer = EagleProposer(model, head, tree_config)
    return generate_feature_tree_greedy(model, proposer, input_ids, max_tokens=max_tokens, end_id=end_id)
