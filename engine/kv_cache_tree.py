"""KV-cache compaction after tree verification: keep the prefix and the accepted path, drop the rest.

After :func:`specbuild.engine.tree_verify.tree_forward` the cache holds ``prefix_len`` positions plus one
per tree index (root first, then the nodes in tree order). Example, tree ``[[0], [1], [0, 0]]``, accepted
path root -> 1 -> 3::

    before:  | p0 .. p4 | root n1 n2 n3 |   9 positions (prefix_len 5)
    keep:      0 .. 4     5    6     8      compact(cache, prefix_len=5, keep_indices=[0, 1, 3])
    after:   | p0 .. p4 | root n1 n3 |      8 positions, as if the path had been decoded one by one

Rotary position ids are baked into the cached keys; the tree gave node ``i`` position ``prefix_len +
depth(i)``, which along one root-to-node path is exactly its sequential position, so the compacted cache
equals a sequential run's (up to floating-point rounding).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache


def compact(cache: DynamicCache, *, prefix_len: int, keep_indices: Sequence[int]) -> None:
    """Keep positions ``[0, prefix_len)`` and ``prefix_len + i`` for ``i`` in ``keep_indices``, in that order.

    Args:
        cache: a ``DynamicCache``, ``[batch, num_kv_heads, seq_len, head_dim]`` per layer
            (``cache.layers[i].keys`` / ``.values``).
        prefix_len: positions before the tree block (the root's position).
        keep_indices: tree indices to keep, ascending, usually ``[0, *accepted_nodes]``.

    Raises:
        ValueError: an index falls outside the cached tree block or the indices are not ascending.
        NotImplementedError: a layer is a sliding-window layer (its window bookkeeping would break).
    """
    cached = cache.get_seq_length()
    if any(i < 0 or prefix_len + i >= cached for i in keep_indices):
        raise ValueError(f"keep_indices {list(keep_indices)} outside the tree block [0, {cached - prefix_len})")
    if list(keep_indices) != sorted(set(keep_indices)):
        raise ValueError(f"keep_indices {list(keep_indices)} must be strictly ascending")
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            raise NotImplementedError(f"tree compaction of a sliding-window cache layer ({type(layer).__name__})")
    keep = torch.cat([torch.arange(prefix_len), torch.tensor(list(keep_indices), dtype=torch.long) + prefix_len])
    for layer in cache.layers:
        index = keep.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)
