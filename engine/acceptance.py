"""Acceptance of draft tokens: the one place that decides which tokens a verification step emits.

Vocabulary: the proposer's *draft tokens* ``d[0:k]`` are verified by one target forward pass over
``[last, d0, ..., d(k-1)]``, which yields ``k + 1`` target tokens ``t[0:k+1]``. The *accepted tokens* are
the longest draft prefix equal to the target's tokens; the *bonus token* is the target's token right
after it. The step emits accepted + bonus, i.e. its *acceptance length* is ``num_accepted + 1``.

Greedy requests use :func:`accept_tree_greedy` (token matching; a chain is a one-path tree, so with
greedy decoding the output is the target's own, Leviathan et al. 2023, §2.3): the accepted tokens are
the longest root-to-node path the target agrees with. Sampled requests verify chains with
:func:`accept_speculative` (rejection sampling), which emits tokens distributed exactly as the target's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .sampling import Sampler
    from .tree import SpecTree


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


def accept_speculative(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    *,
    sampler: Sampler,
) -> Acceptance:
    """Speculative sampling: emit tokens distributed exactly as the target's sampling distribution ``p``.

    Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", §2.3; Chen et al.
    2023, "Accelerating Large Language Model Decoding with Speculative Sampling", Algorithm 2. For
    ``i = 0 .. k-1``: accept draft token ``x = d[i]`` with probability ``min(1, p_i(x) / q_i(x))``; on
    the first rejection the bonus token is drawn from ``norm(max(0, p_i - q_i))`` and the step ends.
    When all ``k`` are accepted the bonus token is drawn from ``p_k``.

    Proposers without a draft distribution (n-gram, any deterministic guess) pass ``draft_probs=None``:
    ``q_i`` is then the one-hot ``delta(d[i])``, which *is* the distribution the draft token was drawn
    from, so the same theorem applies unchanged: accept with probability ``p_i(x)``, and on rejection
    draw from ``norm(max(0, p_i - delta_x))`` = ``p_i`` without ``x``, renormalised. (Equivalently: draw
    ``t ~ p_i`` and accept when ``t == x``; TensorRT-LLM's token matching under sampling.)

    Example: p_0 = [0.5, 0.5], q_0 = [1, 0], d = [0] -> accept 0 with probability 0.5, else emit 1
    (the residual [0, 0.5] normalised); the first emitted token is 0 or 1 with probability 0.5 each.

    Args:
        draft_tokens: ``k`` draft token ids.
        draft_probs: ``[k, vocab]`` the draft's distributions ``q`` the tokens were drawn from, or None
            (deterministic drafts: ``q`` one-hot on each draft token).
        target_probs: ``[k + 1, vocab]`` the target's sampling distributions ``p`` at the draft positions
            and after the last draft token.
        sampler: the request's seeded random stream.

    Raises:
        ValueError: if the shapes do not match ``k``.
    """
    k = len(draft_tokens)
    if target_probs.shape[0] != k + 1 or (draft_probs is not None and draft_probs.shape != (k, target_probs.shape[1])):
        raise ValueError(
            f"need target_probs [k + 1, vocab] and draft_probs [k, vocab] for k={k} drafts, got "
            f"{tuple(target_probs.shape)} and {None if draft_probs is None else tuple(draft_probs.shape)}"
        )
    q = draft_probs if draft_probs is not None else _one_hot(draft_tokens, target_probs)  # [k, vocab]
    for i, token in enumerate(draft_tokens):
        p_x, q_x = target_probs[i, token], q[i, token]
        if sampler.uniform() * q_x < p_x:  # r < p(x) / q(x), without dividing by q(x) = 0
            continue
        return Acceptance(list(draft_tokens[:i]), sampler.sample(_residual(target_probs[i], q[i])))
    return Acceptance(list(draft_tokens), sampler.sample(target_probs[k]))


def _one_hot(draft_tokens: Sequence[int], target_probs: torch.Tensor) -> torch.Tensor:
    """``[k, vocab]`` one-hot rows on the draft tokens (the distribution of a deterministic draft)."""
    rows = torch.zeros(len(draft_tokens), target_probs.shape[1], dtype=target_probs.dtype, device=target_probs.device)
    tokens = torch.tensor(list(draft_tokens), dtype=torch.long, device=target_probs.device)  # [k]
    rows[torch.arange(len(tokens), device=tokens.device), tokens] = 1.0
    return rows


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, p - q))`` (``[vocab]``); ``p`` itself if rounding left no mass (only when p == q)."""
    residual = (p - q).clamp_min(0.0)
    total = residual.sum()
    return residual / total if total > 0 else p


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


@dataclass(frozen=True)
class TreeAcceptance(Acceptance):
    """Outcome of greedy tree verification: an :class:`Acceptance` that also names the tree nodes.

    Attributes:
        accepted_nodes: tree indices of the accepted path below the root (``num_accepted`` of them).
        accepted_tokens: their tokens.
        bonus_token: the target's argmax at the last accepted index (the root when nothing was accepted).
    """

    accepted_nodes: list[int] = field(default_factory=list)

    @property
    def last_index(self) -> int:
        """Tree index whose target output gave the bonus token (0 = root)."""
        return self.accepted_nodes[-1] if self.accepted_nodes else 0


def accept_tree_greedy(tree: SpecTree, tree_tokens: Sequence[int], target_tokens: Sequence[int]) -> TreeAcceptance:
    """Greedy tree acceptance: the longest root-to-node path whose every token is the target's argmax at its parent.

    Medusa's greedy ``evaluate_posterior`` (Cai et al. 2024, §2.1.2: the longest matching prefix over
    all leaf paths); among equally long paths the first in node order wins. Siblings may hold the same
    token (lookahead's candidates share first tokens), so every matching child is explored.

    Example: tree ``[[0], [1], [1, 0]]``, tokens ``[r, a, a, b]``, target argmax ``[a, x, b, y]``: node 1
    matches but has no child, node 2 matches and its child 3 (``b``) matches too -> accepted nodes
    ``[2, 3]``, tokens ``[a, b]``, bonus ``y``.

    Args:
        tree_tokens: ``[num_nodes + 1]`` token per index, ``tree_tokens[0]`` the root.
        target_tokens: ``[num_nodes + 1]`` target argmax after each index (from one tree forward pass).

    Raises:
        ValueError: if either list does not have ``num_nodes + 1`` entries.
    """
    size = tree.num_nodes + 1
    if len(tree_tokens) != size or len(target_tokens) != size:
        raise ValueError(
            f"need {size} tree tokens and target tokens, got {len(tree_tokens)} and {len(target_tokens)}"
        )
    best: list[int] = []
    stack: list[list[int]] = [[]]  # paths below the root, explored depth first in node order
    while stack:
        path = stack.pop()
        if len(path) > len(best):
            best = path
        parent = path[-1] if path else 0
        matches = [c for c in tree.children[parent] if tree_tokens[c] == target_tokens[parent]]
        stack.extend([*path, c] for c in reversed(matches))
    last = best[-1] if best else 0
    return TreeAcceptance([int(tree_tokens[n]) for n in best], int(target_tokens[last]), accepted_nodes=best)
