"""Speculation trees (TensorRT-LLM ``medusa_choices`` / ``eagle_choices``).

A tree is given as *choices*: the root-to-node paths of child indices, the root excluded. Child index
``c`` at depth ``d`` means "the ``c``-th best candidate of draft position ``d``" (for Medusa: the top-``c``
token of head ``d - 1``; Cai et al. 2024, "Medusa", §2.1.2 tree attention). Verification feeds the root
(the last accepted token, not yet in the KV cache) and every node in one target forward pass; each node
attends to the cached prefix and to its ancestors only (SpecInfer tree attention, Miao et al. 2024, §4).

Node order is TensorRT-LLM's / Medusa's: choices sorted by ``(depth, path)``, so a parent always comes
before its children; index 0 is the root. Worked example, choices ``[[0], [1], [0, 0]]``, prefix 5::

    index | path   | depth | parent | position | attends to (ancestor mask row)
    ------+--------+-------+--------+----------+-------------------------------
      0   | root   |   0   |   -1   |    5     | 0
      1   | [0]    |   1   |    0   |    6     | 0 1
      2   | [1]    |   1   |    0   |    6     | 0 . 2
      3   | [0, 0] |   2   |    1   |    7     | 0 1 . 3

    root-to-leaf paths (retrieve indices): [0, 2], [0, 1, 3]

Greedy acceptance (:func:`specbuild.engine.acceptance.accept_tree_greedy`, re-exported here) walks down from the root: the target's argmax at a node must equal one child's token
to go on. Tokens [t, a, b, c] at indices 0..3 and target argmax [a, c, x, y] accept nodes [1, 3]
(tokens a, c) and the bonus token is the argmax at node 3, y.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from .acceptance import TreeAcceptance, accept_tree_greedy


@dataclass(frozen=True)
class SpecTree:
    """A validated speculation tree; build it with :meth:`from_choices`.

    Attributes:
        paths: node paths in node order, ``paths[i - 1]`` is node ``i`` (index 0, the root, has no path).
        parents: ``[num_nodes + 1]`` parent index per index; ``parents[0] == -1``.
        depths: ``[num_nodes + 1]`` depth per index; ``depths[0] == 0``.
    """

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]

    @classmethod
    def from_choices(cls, choices: Sequence[Sequence[int]]) -> SpecTree:
        """Validate ``choices`` (e.g. ``[[0], [1], [0, 0]]``) and order the nodes by ``(depth, path)``.

        An empty list gives a root-only tree (a plain decoding step).

        Raises:
            ValueError: a path is empty, has a negative or non-integer index, appears twice, or its
                parent path is not in ``choices``; the message names the path.
        """
        paths = [_check_path(path) for path in choices]
        seen: set[tuple[int, ...]] = set()
        for path in paths:
            if path in seen:
                raise ValueError(f"tree choice {list(path)} appears more than once")
            seen.add(path)
        for path in paths:
            if len(path) > 1 and path[:-1] not in seen:
                raise ValueError(f"tree choice {list(path)} has no parent: {list(path[:-1])} is not in the choices")
        ordered = sorted(paths, key=lambda p: (len(p), p))
        index = {path: i + 1 for i, path in enumerate(ordered)}
        parents = (-1, *(index.get(path[:-1], 0) for path in ordered))
        depths = (0, *(len(path) for path in ordered))
        return cls(tuple(ordered), parents, depths)

    @property
    def num_nodes(self) -> int:
        """Draft nodes, the root excluded (63 for :data:`specbuild.methods.base.MC_SIM_7B_63`)."""
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        """Longest path (draft tokens one step can accept at most); 0 for a root-only tree."""
        return max(self.depths)

    @property
    def top_k_per_depth(self) -> tuple[int, ...]:
        """``[max_depth]``: candidates needed at depth ``d + 1`` (largest child index there + 1)."""
        top_k = [0] * self.max_depth
        for path in self.paths:
            top_k[len(path) - 1] = max(top_k[len(path) - 1], path[-1] + 1)
        return tuple(top_k)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """``[num_nodes + 1]`` child indices per index, in node order."""
        children: list[list[int]] = [[] for _ in self.parents]
        for node, parent in enumerate(self.parents[1:], start=1):
            children[parent].append(node)
        return tuple(tuple(c) for c in children)

    def truncated(self, max_depth: int) -> SpecTree:
        """The subtree of nodes at depth ``<= max_depth`` (``max_depth >= 0``); e.g. when few tokens remain."""
        if max_depth >= self.max_depth:
            return self
        return SpecTree.from_choices([p for p in self.paths if len(p) <= max(max_depth, 0)])

    def first(self, num_nodes: int) -> SpecTree:
        """The first ``num_nodes`` nodes in node order (``>= 0``), a valid tree: parents come before children.

        A request's ``num_draft_tokens = k`` below the tree size verifies this subtree. Example: the
        example tree above with ``first(2)`` keeps ``[0]`` and ``[1]`` and drops ``[0, 0]``.
        """
        if num_nodes >= self.num_nodes:
            return self
        return SpecTree.from_choices(self.paths[: max(num_nodes, 0)])

    def ancestor_mask(self) -> torch.Tensor:
        """``[num_nodes + 1, num_nodes + 1]`` bool, ``mask[i, j]``: index ``j`` is ``i`` or an ancestor of ``i``."""
        size = self.num_nodes + 1
        mask = torch.eye(size, dtype=torch.bool)
        for node in range(1, size):
            mask[node] |= mask[self.parents[node]]
        return mask

    def position_ids(self, prefix_len: int) -> torch.Tensor:
        """``[num_nodes + 1]`` long: ``prefix_len + depth`` (the root sits right after the cached prefix)."""
        return torch.tensor(self.depths, dtype=torch.long) + prefix_len

    def leaf_paths(self) -> list[list[int]]:
        """Root-to-leaf index paths (Medusa's ``retrieve_indices``), each starting at 0, in leaf order."""
        return [self.path_to(node) for node in range(self.num_nodes + 1) if not self.children[node]]

    def path_to(self, node: int) -> list[int]:
        """Indices from the root to ``node``, both included: ``path_to(3) == [0, 1, 3]`` in the example."""
        path = [node]
        while path[-1] != 0:
            path.append(self.parents[path[-1]])
        return path[::-1]


def _check_path(path: Sequence[int]) -> tuple[int, ...]:
    as_tuple = tuple(path)
    if not as_tuple:
        raise ValueError("tree choice [] is empty; the root is implicit, list only its descendants")
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in as_tuple):
        raise ValueError(f"tree choice {list(as_tuple)} must hold non-negative integer child indices")
    return as_tuple


__all__ = ["SpecTree", "TreeAcceptance", "accept_tree_greedy"]
