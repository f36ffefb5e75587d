"""Greedy lookahead decoding (Fu et al. 2024, §3), standalone: one target pass per step, no draft model.

One step (:func:`lookahead_step`)::

    cache holds context[:-1]; last = context[-1]
    block      = [last] + window (w x (n-1) Jacobi guesses, minus the slot `last` fills)
                 + up to g pool n-grams starting with `last`                 (w + g) * (n - 1) tokens
    target     = masked_forward(block)                                       one pass, 4D lookahead mask
    accepted   = the candidate with the longest prefix equal to the target's argmax; bonus after it
    cache      = compact(prefix + last + accepted)                           = context[:-1] + last + accepted
    window     = argmax after the top window level becomes the next level; full columns -> pool

The output is the target's own greedy output token for token (fp32; up to rounding between a block pass
and a one-token pass). ``max_tokens`` is never exceeded (candidates are cut to what can still be
emitted and every chunk is clipped) and decoding stops at ``end_id`` even inside an accepted chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from .acceptance import Acceptance, accept_greedy
from .kv_cache_tree import compact
from .methods.lookahead import (
    LookaheadConfig,
    LookaheadParams,
    LookaheadState,
    StepLayout,
    build_step_layout,
)
from .target import cache_keyword, new_cache, prefill
from .stream import DecodeState, Steps, check_prompt_and_length, collect
from .tree_verify import TREE_MASK_ATTENTION
from .types import GenerationResult


@dataclass(frozen=True)
class LookaheadStep:
    """One step's outcome.

    Attributes:
        layout: the block that went through the target.
        acceptance: accepted draft tokens (from the best candidate) and the bonus token.
        new_level: ``[w]`` next window level (argmax after each top-level window token); empty when ``n == 1``.
    """

    layout: StepLayout
    acceptance: Acceptance
    new_level: list[int]


def masked_forward(
    model: PreTrainedModel, tokens: Sequence[int], positions: Sequence[int], allowed: torch.Tensor, cache: DynamicCache
) -> torch.Tensor:
    """Run a block of ``T`` tokens after the cache with a custom attention structure; the cache grows by ``T``.

    Args:
        tokens: ``[T]`` token ids.
        positions: ``[T]`` positions relative to the cache length (position_ids = cache length + these).
        allowed: ``[T, T]`` bool; each row also sees every cached position.

    Returns:
        ``[T, vocab]`` next-token logits at each block index.

    Raises:
        ValueError: the model's attention implementation is not one of ``TREE_MASK_ATTENTION`` (a flash
            kernel would silently ignore the mask).
    """
    attention = getattr(model.config, "_attn_implementation", None)
    if attention not in TREE_MASK_ATTENTION:
        raise ValueError(f"lookahead needs attn_implementation in {TREE_MASK_ATTENTION}, the target uses {attention!r}")
    prefix_len = cache.get_seq_length()
    device, dtype = model.device, model.dtype
    visible = torch.cat([torch.ones(len(tokens), prefix_len, dtype=torch.bool), allowed], dim=1)  # [T, prefix + T]
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    outputs = model(
        input_ids=torch.tensor([list(tokens)], dtype=torch.long, device=device),  # [1, T]
        attention_mask=mask[None, None].to(device),  # [1, 1, T, prefix + T]
        position_ids=(torch.tensor([list(positions)], dtype=torch.long) + prefix_len).to(device),  # [1, T]
        use_cache=True,
        **{cache_keyword(model): cache},
    )
    return outputs.logits[0]  # [T, vocab]


def lookahead_step(
    model: PreTrainedModel, state: LookaheadState, last_token: int, cache: DynamicCache, *, max_accept: int
) -> LookaheadStep:
    """Build the block, run it, accept greedily, compact the cache to ``prefix + last + accepted``.

    ``cache`` holds the context before ``last_token``; afterwards it also holds ``last_token`` and the
    accepted tokens (grows by ``1 + num_accepted``). ``state`` is not advanced here (see
    :meth:`LookaheadState.advance`).

    Args:
        max_accept: candidates are cut to this many tokens (``remaining - 1``: the bonus takes a slot).
    """
    prefix_len = cache.get_seq_length()
    layout = build_step_layout(last_token, state.levels, state.candidates(last_token, max_accept), state.params)
    target = masked_forward(model, layout.tokens, layout.positions, layout.allowed, cache).argmax(dim=-1).tolist()
    best, best_indices = Acceptance([], target[0]), []
    for candidate, indices in zip(layout.candidates, layout.candidate_index):
        acceptance = accept_greedy(candidate, [target[0], *(target[i] for i in indices)])
        if acceptance.num_accepted > best.num_accepted:
            best, best_indices = acceptance, indices[: acceptance.num_accepted]
    compact(cache, prefix_len=prefix_len, keep_indices=[0, *best_indices])
    top = layout.lookahead_index[-1] if layout.lookahead_index else []
    return LookaheadStep(layout, best, [target[i] for i in top])


def lookahead_steps(
    model: PreTrainedModel,
    input_ids: Sequence[int],
    *,
    max_tokens: int,
    params: LookaheadParams,
    end_id: int = -1,
) -> Steps:
    """Greedy lookahead decoding of one prompt with the resolved ``(w, n, g)`` (``LookaheadConfig.resolve``),
    step by step: the prefill's token, then one :class:`~specbuild.engine.stream.StepOutput` per target
    pass (counters: draft tokens = verification-branch tokens). The caller runs it under
    ``torch.inference_mode()``."""
    cache = new_cache(model)
    state = DecodeState(list(input_ids), max_tokens, end_id)
    yield state.first(prefill(model, input_ids, cache))
    pool = LookaheadState.start(input_ids, params)
    while not state.done:
        step = lookahead_step(model, pool, state.context[-1], cache, max_accept=state.remaining - 1)
        out = state.step(step.acceptance.emitted_tokens, drafted=step.layout.num_draft_tokens, accepted=step.acceptance.num_accepted)
        pool.advance(step.new_level, state.context[-(len(out.token_ids) + params.ngram - 1) :], state.context[-1])
        yield out


def lookahead_generate_greedy(
    model: PreTrainedModel,
    input_ids: Sequence[int],
    *,
    max_tokens: int,
    config: LookaheadConfig,
    end_id: int = -1,
    window: tuple[int, int, int] | None = None,
) -> GenerationResult:
    """Greedy lookahead decoding of one prompt (:func:`lookahead_steps`, collected); token-identical to
    plain greedy decoding.

    Example: ``lookahead_generate_greedy(model, prompt, max_tokens=64, config=LookaheadConfig(4, 3, 4))``
    -> the target's greedy 64 tokens in fewer target passes when pool n-grams get accepted.

    Args:
        input_ids: prompt token ids (non-empty).
        max_tokens: new tokens at most, ``>= 1``.
        config: the built maxima ``(W, N, G)``.
        end_id: stop after this token; ``-1`` never stops on a token.
        window: the request's ``(w, n, g)`` within ``(W, N, G)``; None -> ``(W, N, G)``; ``(1, 1, 0)`` is
            plain decoding.

    Returns:
        ``GenerationResult``: ``total_draft_tokens`` counts verification-branch tokens (the candidates),
        ``num_decoding_iterations`` target passes after the prefill.

    Raises:
        ValueError: empty prompt, ``max_tokens < 1``, ``window`` outside ``(W, N, G)``, or a target whose
            attention implementation ignores custom masks.
    """
    check_prompt_and_length(input_ids, max_tokens)
    params = config.resolve(window)
    with torch.inference_mode():
        return collect(lookahead_steps(model, input_ids, max_tokens=max_tokens, params=params, end_id=end_id))
