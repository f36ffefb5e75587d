"""Tree verification on the target: every tree node scored in ONE forward pass with a tree attention mask.

SpecInfer tree attention (Miao et al. 2024, §4) as used by Medusa (Cai et al. 2024, §2.1.2): the root and
the ``n`` draft nodes go in as one ``[1, 1 + n]`` block after the cached prefix; each attends to the whole
prefix and to its own ancestors, and sits at position ``prefix_len + depth``. transformers (5.x,
``masking_utils._preprocess_mask_arguments``) passes a 4D ``attention_mask`` through untouched, so the
model sees exactly this mask. It is additive float (0 = attend, dtype min = masked), which both the
``eager`` (``weights + mask``) and ``sdpa`` attention accept; a bool mask would be wrong under ``eager``.

    cache before:  | prefix (prefix_len) |
    forward:                            | root n1 n2 ... nn |       mask row of node i: prefix all 1,
    cache after:   | prefix (prefix_len) | root n1 n2 ... nn |       tree part = ancestor_mask()[i]

The cache then holds every node; :func:`specbuild.engine.kv_cache_tree.compact` keeps the accepted path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from .target import cache_keyword
from .tree import SpecTree

# Attention implementations that apply a custom 4D float mask as given.
TREE_MASK_ATTENTION = ("eager", "sdpa")


@dataclass(frozen=True)
class TreeForward:
    """Target outputs at every tree index of one verification pass.

    Attributes:
        logits: ``[1 + n, vocab]`` next-token logits after each index.
        hidden: ``[1 + n, hidden]`` final-norm hidden state at each index (Medusa's head input).
    """

    logits: torch.Tensor
    hidden: torch.Tensor

    @property
    def target_tokens(self) -> list[int]:
        """``[1 + n]`` greedy target token after each index (for ``accept_tree_greedy``)."""
        return self.logits.argmax(dim=-1).tolist()


def tree_attention_mask(tree: SpecTree, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask ``[1, 1, 1 + n, prefix_len + 1 + n]``: 0 where allowed, ``finfo(dtype).min`` elsewhere."""
    allowed = torch.cat(
        [torch.ones(tree.num_nodes + 1, prefix_len, dtype=torch.bool), tree.ancestor_mask()], dim=1
    )  # [1 + n, prefix_len + 1 + n]
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def tree_forward(
    model: PreTrainedModel, tree: SpecTree, tree_tokens: Sequence[int], cache: DynamicCache
) -> TreeForward:
    """Run the root and all tree nodes through the target in one pass; the cache grows by ``1 + n``.

    Args:
        tree_tokens: ``[1 + n]`` token per tree index; ``tree_tokens[0]`` is the root, the last accepted
            token, which the cache does not hold yet.
        cache: the request's cache holding the ``prefix_len`` positions before the root.

    Raises:
        ValueError: if ``len(tree_tokens) != tree.num_nodes + 1``, or the model's attention implementation
            is not one of :data:`TREE_MASK_ATTENTION` (flash kernels would ignore the tree mask silently).
    """
    if len(tree_tokens) != tree.num_nodes + 1:
        raise ValueError(f"tree has {tree.num_nodes + 1} indices (root included), got {len(tree_tokens)} tokens")
    attention = getattr(model.config, "_attn_implementation", None)
    if attention not in TREE_MASK_ATTENTION:
        raise ValueError(f"tree verification needs attn_implementation in {TREE_MASK_ATTENTION}, the target uses {attention!r}")
    prefix_len = cache.get_seq_length()
    device, dtype = model.device, model.dtype
    input_ids = torch.tensor([list(tree_tokens)], dtype=torch.long, device=device)  # [1, 1 + n]
    outputs = model(
        input_ids=input_ids,
        attention_mask=tree_attention_mask(tree, prefix_len, dtype).to(device),  # [1, 1, 1 + n, prefix_len + 1 + n]
        position_ids=tree.position_ids(prefix_len)[None].to(device),  # [1, 1 + n]
        use_cache=True,
        output_hidden_states=True,
        **{cache_keyword(model): cache},
    )
    # logits: [1, 1 + n, vocab]; hidden_states[-1]: [1, 1 + n, hidden], the final norm's output
    return TreeForward(logits=outputs.logits[0], hidden=outputs.hidden_states[-1][0])
