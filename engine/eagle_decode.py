"""Greedy EAGLE-1/2 decoding (Li et al. 2024), standalone: the head drafts a tree, the target verifies it in one pass.

Unlike Medusa, the EAGLE head needs the target's feature of EVERY accepted token, not only the last one
(its own KV cache runs over all positions), so this module has its own step instead of
``medusa_decode.tree_step``; it reuses ``tree_forward``, ``accept_tree_greedy`` and ``compact``.
One step (:func:`eagle_step`)::

    target cache holds context[:-1]; head state holds (f_j, c_{j+1}) for j < len(context) - 1
    draft      = proposer.propose(state, root=context[-1])        static or EAGLE-2 dynamic tree, 1 + n tokens
    target     = tree_forward(draft.tree, draft.tokens)           one pass, tree attention mask
    accepted   = longest root-to-node path matching the target's argmax; bonus = argmax at its end
    cache      = compact(prefix + root + accepted path)
    head state += (features at [root, *accepted], [*accepted tokens, bonus])

Features are the target's final-norm hidden states (``TreeForward.hidden``; see
:mod:`specbuild.engine.methods.eagle` for why). The output is the target's own greedy output token for
token (fp32; up to rounding between a tree pass and a one-token pass); ``max_tokens`` is never exceeded
(the tree is cut to the depth that can still be emitted, every chunk is clipped) and decoding stops at
``end_id`` even inside an accepted chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from .acceptance import TreeAcceptance, accept_tree_greedy
from .kv_cache_tree import compact
from .methods.eagle import EagleHead, EagleProposer, EagleTreeConfig, TreeDraft
from .target import cache_keyword, new_cache
from .stream import DecodeState, Steps, check_prompt_and_length, collect
from .tree_verify import tree_forward
from .types import GenerationResult


class FeatureTreeProposer(Protocol):
    """A tree proposer fed with the target's features of every position (EAGLE; :class:`EagleProposer`)."""

    def new_state(self) -> Any:
        """Per-request state, empty."""
        ...

    def update(self, state: Any, next_tokens: Sequence[int], features: torch.Tensor) -> None:
        """Feed ``features [m, H]`` and the ``m`` tokens they produced."""
        ...

    def propose(self, state: Any, root: int, max_depth: int) -> TreeDraft:
        """A tree at most ``max_depth`` deep and its ``[1 + n]`` tokens, ``root`` first."""
        ...

    def capped(self, num_draft_tokens: int) -> FeatureTreeProposer:
        """The same proposer growing trees of at most ``num_draft_tokens`` nodes (a request's cap)."""
        ...


@dataclass(frozen=True)
class EagleStep:
    """One verification step's outcome.

    Attributes:
        draft: the verified tree and tokens.
        acceptance: accepted path and bonus token.
        features: ``[1 + num_accepted, H]`` target features at the root and the accepted nodes.
    """

    draft: TreeDraft
    acceptance: TreeAcceptance
    features: torch.Tensor


def prefill_features(model: PreTrainedModel, prompt: Sequence[int], cache: DynamicCache) -> tuple[int, torch.Tensor]:
    """Fill ``cache`` with ``prompt``; return the first greedy token and the ``[T, H]`` final-norm features."""
    input_ids = torch.tensor([list(prompt)], dtype=torch.long, device=model.device)  # [1, T]
    outputs = model(
        input_ids=input_ids, use_cache=True, logits_to_keep=1, output_hidden_states=True, **{cache_keyword(model): cache}
    )
    # logits: [1, 1, vocab]; hidden_states[-1]: [1, T, H], the final norm's output (the LM head's input)
    return int(outputs.logits[0, -1].argmax()), outputs.hidden_states[-1][0]


def eagle_step(
    model: PreTrainedModel, proposer: FeatureTreeProposer, state: Any, root: int, cache: DynamicCache, *, max_depth: int
) -> EagleStep:
    """Propose, verify in one target pass, accept greedily, compact the target cache to the accepted path.

    The target ``cache`` grows by ``1 + num_accepted``; ``state`` is NOT updated (the caller feeds
    ``step.features`` with ``acceptance.emitted_tokens`` when decoding goes on).
    """
    prefix_len = cache.get_seq_length()
    draft = proposer.propose(state, root, max_depth)
    forward = tree_forward(model, draft.tree, draft.tokens, cache)
    acceptance = accept_tree_greedy(draft.tree, draft.tokens, forward.target_tokens)
    keep = [0, *acceptance.accepted_nodes]
    compact(cache, prefix_len=prefix_len, keep_indices=keep)
    return EagleStep(draft, acceptance, forward.hidden[keep])  # features [1 + num_accepted, H]


def feature_tree_steps(
    model: PreTrainedModel, proposer: FeatureTreeProposer, input_ids: Sequence[int], *, max_tokens: int, end_id: int = -1
) -> Steps:
    """Greedy EAGLE decoding for one prompt, step by step (any :class:`FeatureTreeProposer`): the
    prefill's token, then one :class:`~specbuild.engine.stream.StepOutput` per verification (counters:
    draft tokens = tree nodes verified). The caller runs it under ``torch.inference_mode()``."""
    cache = new_cache(model)
    state = DecodeState(list(input_ids), max_tokens, end_id)
    head_state = proposer.new_state()
    first, features = prefill_features(model, input_ids, cache)  # features [T, H]
    yield state.first(first)
    if not state.done:
        proposer.update(head_state, [*input_ids[1:], first], features)
    while not state.done:
        step = eagle_step(model, proposer, head_state, state.context[-1], cache, max_depth=state.remaining - 1)
        emitted = step.acceptance.emitted_tokens
        yield state.step(emitted, drafted=step.draft.tree.num_nodes, accepted=step.acceptance.num_accepted)
        if not state.done:
            proposer.update(head_state, emitted, step.features)


def generate_feature_tree_greedy(
    model: PreTrainedModel, proposer: FeatureTreeProposer, input_ids: Sequence[int], *, max_tokens: int, end_id: int = -1
) -> GenerationResult:
    """Greedy generation for one prompt with any :class:`FeatureTreeProposer`: :func:`feature_tree_steps`, collected.

    Returns:
        ``GenerationResult``: ``total_draft_tokens`` counts tree nodes verified, ``num_decoding_iterations``
        target passes after the prefill.

    Raises:
        ValueError: empty prompt or ``max_tokens < 1``.
    """
    check_prompt_and_length(input_ids, max_tokens)
    with torch.inference_mode():
        return collect(feature_tree_steps(model, proposer, input_ids, max_tokens=max_tokens, end_id=end_id))


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
