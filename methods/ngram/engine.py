"""N-gram (prompt lookup) speculation in the reference engine: a proposer over
:func:`~specbuild.methods.ngram.find_ngram_draft`, verified as a chain.

Saxena 2023, "Prompt Lookup Decoding" (github.com/apoorvumang/prompt-lookup-decoding); TensorRT-LLM's
``NGramDecodingConfig`` names the knobs. No draft model: the guess is what followed the last time the
context's current suffix appeared.
"""

from __future__ import annotations

from collections.abc import Sequence

from specbuild.engine.drafters import EngineMethod, chain_drafter

from . import NGramSpeculation, find_ngram_draft


class NGramProposer:
    """:class:`~specbuild.engine.drafters.Proposer` for prompt lookup; stateless between steps.

    ``config``: the method's settings (``max_draft_len``, ``max_matching_ngram_size``, ``is_use_oldest``;
    :class:`~specbuild.methods.ngram.NGramSpeculation`). The reference engine searches the request's own
    context each step: it behaves as TensorRT-LLM's ``is_keep_all=True``, ``is_public_pool=False``.
    """

    def __init__(self, config: NGramSpeculation) -> None:
        self.config = config

    def propose(self, context: Sequence[int], num_draft_tokens: int, sampler: object = None) -> list[int]:
        """Deterministic drafts; ``sampler`` is unused (acceptance treats ``q`` as one-hot)."""
        del sampler
        return find_ngram_draft(
            context,
            max_ngram_size=self.config.max_matching_ngram_size,
            num_draft_tokens=min(num_draft_tokens, self.config.max_draft_len),
            use_oldest=self.config.is_use_oldest,
        )

    def update(self, context: Sequence[int], num_accepted: int) -> None:
        del context, num_accepted


ENGINE = EngineMethod(make_drafter=chain_drafter(NGramProposer))
"""Prompt lookup in the request's own context, a chain of at most ``num_draft_tokens`` per step."""
