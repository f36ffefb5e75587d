"""Acceptance of draft tokens: the one place that decides which tokens a verification step emits.

Vocabulary: the proposer's *draft tokens* ``d[0:k]`` are verified by one target forward pass over
``[last, d0, ..., d(k-1)]``, which yields ``k + 1`` target tokens ``t[0:k+1]``. The *accepted tokens* are
the longest draft prefix equal to the target's tokens; the *bonus token* is the target's token right
after it. The step emits accepted + bonus, i.e. its *acceptance length* is ``num_accepted + 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Acceptance:
    """Outcome of verifying one block of draft tokens.

    Attributes:
        accepted_tokens: the draft prefix the target agrees with (``num_accepted`` tokens).
        bonus_token: the target's token after the accepted prefix (a correction on rejection, or the
            free extra token when every draft token was accepted).
    """

    accepted_tokens: list[int]
    bonus_token: int

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_tokens)

    @property
    def emitted_tokens(self) -> list[int]:
        """Accepted tokens followed by the bonus token (acceptance length = ``num_accepted + 1``)."""
        return [*self.accepted_tokens, self.bonus_token]


def accept_greedy(draft_tokens: Sequence[int], target_tokens: Sequence[int]) -> Acceptance:
    """Greedy verification: accept the longest draft prefix that matches the target's argmax tokens.

    With greedy decoding the output is exactly the target's own greedy output (Leviathan et al. 2023,
    "Fast Inference from Transformers via Speculative Decoding", §2.3, temperature-0 case).

    Example: draft [5, 7, 9], target [5, 7, 4, 8] -> accepted [5, 7], bonus 4.

    Args:
        draft_tokens: ``k`` draft token ids.
        target_tokens: ``k + 1`` target argmax ids; ``target_tokens[i]`` is the target's choice for the
            position of ``draft_tokens[i]``, the last one follows the whole draft.

    Raises:
        ValueError: if ``len(target_tokens) != len(draft_tokens) + 1``.
    """
    if len(target_tokens) != len(draft_tokens) + 1:
        raise ValueError(
            f"need len(draft_tokens) + 1 target tokens, got {len(target_tokens)} for {len(draft_tokens)} drafts"
        )
    num_accepted = 0
    for draft, target in zip(draft_tokens, target_tokens):
        if draft != target:
            break
        num_accepted += 1
    return Acceptance(list(draft_tokens[:num_accepted]), int(target_tokens[num_accepted]))


def clip_emitted(tokens: Sequence[int], *, remaining: int, end_id: int) -> tuple[list[int], bool]:
    """Cut a step's emitted tokens at ``remaining`` tokens and after the first ``end_id``.

    Example: tokens [4, 2, 9, 2], remaining 3, end_id 2 -> ([4, 2], True).

    Args:
        tokens: the tokens a step would emit (accepted + bonus).
        remaining: how many more tokens the request may emit (``>= 0``).
        end_id: end token id, or ``-1`` to never stop on a token.

    Returns:
        ``(kept_tokens, stopped)``; ``stopped`` is True when the end token was kept (it is the last one).
    """
    kept = list(tokens[:remaining])
    if end_id in kept:
        kept = kept[: kept.index(end_id) + 1]
        return kept, True
    return kept, False
