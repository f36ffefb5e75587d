"""What one request brings to a decoding iteration: a block of tokens and the tree the target verifies.

Every method's step is the same shape (SpecInfer, Miao et al. 2024, §4: a chain is a one-path tree)::

    block      = [root, drafts..., extra rows...]      root = last emitted token (not yet in the KV cache)
    tree       = the verified part: tree index i  <->  block index tree_index[i]  (root <-> 0)
    positions  = offsets from the cache length (a tree node: its depth)
    allowed    = [T, T] who sees whom inside the block (every row also sees the cached prefix)

    plain         [r]                      tree: root only
    chain (k=3)   [r d0 d1 d2]             tree: r - d0 - d1 - d2 (causal mask)
    Medusa/EAGLE  [r n1 .. nn]             tree: the speculation tree (ancestor mask)
    lookahead     [r window.. cand..]      tree: the candidates (a trie from the root); the window rows
                                           are extra rows whose argmax feeds the next window level

The target scores every row in one pass; :func:`specbuild.engine.acceptance.accept_tree_greedy`
(greedy) or :func:`~specbuild.engine.acceptance.accept_speculative` (sampled chains) picks the
accepted path, and the KV cache keeps the root and that path (:meth:`Block.keep`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from .tree import SpecTree


@lru_cache(maxsize=64)
def chain_tree(length: int) -> SpecTree:
    """A one-path tree of ``length`` nodes: ``[[0], [0, 0], ...]``."""
    return SpecTree.from_choices([[0] * depth for depth in range(1, length + 1)])


@dataclass(frozen=True)
class Block:
    """One row's tokens for one target pass, and the tree verified in it.

    Attributes:
        tokens: ``[T]`` token ids, ``tokens[0]`` the root.
        tree: the verification tree (``tree.num_nodes`` draft tokens).
        positions: ``[T]`` offsets from the cache length; None -> the tree's depths (``T`` = tree size).
        allowed: ``[T, T]`` bool in-block visibility; None -> causal for a chain, the ancestor mask for a tree.
        tree_index: ``[tree.num_nodes + 1]`` block index of each tree index; None -> the identity.
        draft_probs: ``[k, vocab]`` the distributions a sampled chain's drafts were drawn from (None: deterministic).
        num_draft_tokens: draft tokens this step counts as verified; None -> ``tree.num_nodes``.
    """

    tokens: list[int]
    tree: SpecTree
    positions: list[int] | None = None
    allowed: torch.Tensor | None = None
    tree_index: tuple[int, ...] | None = None
    draft_probs: torch.Tensor | None = None
    num_draft_tokens: int | None = None

    @classmethod
    def chain(cls, root: int, drafts: Sequence[int] = (), draft_probs: torch.Tensor | None = None) -> Block:
        """``[root, *drafts]``, verified as a chain (plain decoding when ``drafts`` is empty)."""
        return cls([int(root), *map(int, drafts)], chain_tree(len(drafts)), draft_probs=draft_probs)

    @classmethod
    def of_tree(cls, tree: SpecTree, tokens: Sequence[int]) -> Block:
        """A speculation tree's tokens (``[1 + n]``, root first, node order).

        Raises:
            ValueError: ``len(tokens) != tree.num_nodes + 1``.
        """
        if len(tokens) != tree.num_nodes + 1:
            raise ValueError(f"tree has {tree.num_nodes + 1} indices (root included), got {len(tokens)} tokens")
        return cls([int(t) for t in tokens], tree, positions=list(tree.depths), allowed=tree.ancestor_mask())

    @property
    def is_chain(self) -> bool:
        return self.tree.num_nodes == self.tree.max_depth and self.tree_index is None and len(self.tokens) == self.tree.num_nodes + 1

    @property
    def drafted(self) -> int:
        return self.tree.num_nodes if self.num_draft_tokens is None else self.num_draft_tokens

    @property
    def chain_drafts(self) -> list[int]:
        """The draft tokens of a chain block (``tokens[1:]``)."""
        return self.tokens[1:]

    def block_index(self, tree_index: int) -> int:
        return tree_index if self.tree_index is None else self.tree_index[tree_index]

    def tree_tokens(self) -> list[int]:
        """``[tree.num_nodes + 1]`` token per tree index."""
        return [self.tokens[self.block_index(i)] for i in range(self.tree.num_nodes + 1)]

    def keep(self, accepted_nodes: Sequence[int]) -> list[int]:
        """Block indices the KV cache keeps: the root and the accepted path (ascending)."""
        return [0, *(self.block_index(n) for n in accepted_nodes)]
