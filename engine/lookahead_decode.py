"""Greedy lookahead decoding (Fu et al. 2024, §3), standalone: one target pass per step, no draft model.

The engine's loop is the batched worker (:mod:`specbuild.engine.worker`) with a
:class:`~specbuild.engine.drafters.LookaheadDrafter`; :func:`lookahead_generate_greedy` runs one prompt
through it alone. One step::

    slot holds context[:-1]; last = context[-1]
    block      = [last] + window (w x (n-1) Jacobi guesses, minus the slot `last` fills)
                 + up to g pool n-grams starting with `last`                 (w + g) * (n - 1) tokens
    target     = one pass over the block with the 4D lookahead mask (build_step_layout)
    accepted   = the candidate with the longest prefix equal to the target's argmax; bonus after it
    slot       = keep prefix + last + accepted
    window     = argmax after the top window level becomes the next level; full columns -> pool

The output is the target's own greedy output token for token (fp32; up to rounding between a block pass
and a one-token pass). ``max_tokens`` is never exceeded (candidates are cut to what can still be
emitted and every chunk is clipped) and decoding stops at ``end_id`` even inside an accepted chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedModel

from specbuild.methods.lookahead.engine import LookaheadConfig, LookaheadDrafter
from .stream import check_prompt_and_length, collect
from .types import GenerationResult
from .worker import InflightRequest, run_alone


def lookahead_generate_greedy(
    model: PreTrainedModel,
    input_ids: Sequence[int],
    *,
    max_tokens: int,
    config: LookaheadConfig,
    end_id: int = -1,
    window: tuple[int, int, int] | None = None,
) -> GenerationResult:
    """Greedy lookahead decoding of one prompt (the batched worker with a :class:`~specbuild.engine.drafters.LookaheadDrafter`, alone); token-identical to
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
    request = InflightRequest(list(input_ids), max_tokens, end_id, LookaheadDrafter(params))
    return collect(run_alone(model, request, max_block=params.tokens_per_step))
