"""N-gram (prompt lookup) speculation: draft tokens copied from earlier in the context.

Saxena 2023, "Prompt Lookup Decoding" (github.com/apoorvumang/prompt-lookup-decoding); TensorRT-LLM's
``NGramDecodingConfig`` names the knobs. No draft model: the guess is what followed the last time the
context's current suffix appeared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specbuild.methods.ngram import NGramSpeculation


def find_ngram_draft(
    context: Sequence[int], *, max_ngram_size: int, num_draft_tokens: int, use_oldest: bool = True
) -> list[int]:
    """Prompt lookup: copy the tokens that followed an earlier occurrence of the context's suffix.

    For ``n`` from ``max_ngram_size`` down to 1, take the last ``n`` tokens of ``context`` and look for
    them at an earlier start position ``i`` (``i + n < len(context)``, so at least one token follows).
    The first ``n`` with a match wins; the draft is ``context[i + n : i + n + num_draft_tokens]``, which
    may be shorter than ``num_draft_tokens`` near the end of the context.

    Examples:
        context [1, 2, 3, 4, 2, 3], n=2, k=3: suffix [2, 3] matches at i=1 -> propose [4, 2, 3].
        context [1, 2, 3, 4, 2, 3], n=2, k=1 -> propose [4].
        context [7, 1, 8, 1, 9, 1], n=1, k=2: suffix [1] matches at i=1 and i=3;
            use_oldest=True -> [8, 1], use_oldest=False -> [9, 1].
        context [1, 2, 3], any n -> [] (no earlier occurrence of a suffix); k=0 -> [].

    Args:
        context: prompt + tokens emitted so far.
        max_ngram_size: longest suffix to try, ``>= 1``.
        num_draft_tokens: the most tokens to propose, ``>= 0``.
        use_oldest: earliest match (True) or latest match (False).

    Returns:
        Up to ``num_draft_tokens`` token ids; ``[]`` when nothing matches.
    """
    if num_draft_tokens <= 0:
        return []
    length = len(context)
    for n in range(min(max_ngram_size, length - 1), 0, -1):
        start = _match_start(context, n, use_oldest=use_oldest)
        if start is not None:
            return list(context[start + n : start + n + num_draft_tokens])
    return []


def _match_start(context: Sequence[int], n: int, *, use_oldest: bool) -> int | None:
    """Start of the earliest (or latest) earlier occurrence of ``context[-n:]``, or None."""
    suffix = list(context[-n:])
    starts = range(len(context) - n)  # i + n <= len - 1: excludes the suffix itself
    for i in starts if use_oldest else reversed(starts):
        if context[i] == suffix[0] and list(context[i : i + n]) == suffix:
            return i
    return None


class NGramProposer:
    """:class:`~specbuild.engine.methods.base.Proposer` for prompt lookup; stateless between steps.

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
