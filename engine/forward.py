"""The one target forward call site: a ragged batch of blocks, each row at its own positions with its own mask.

Every target pass of the engine (prefill, plain step, chain / tree / lookahead verification, for one
request or a whole batch) goes through :func:`forward_blocks`, so this is the function that is batched,
profiled and (optionally) compiled. A Llama-architecture model on the CPU runs the engine's layer loop
over the rows' tokens concatenated, with transformers' own modules (:mod:`~specbuild.engine.decoder`).
Any other model runs transformers' forward over the rows padded to the widest: the engine supplies the
KV cache (:class:`~specbuild.engine.kv_pool.SlotCache`), the position ids and a 4D additive mask,
which transformers passes untouched to the engine's attention (:mod:`~specbuild.engine.attention`:
fused SDPA with grouped-query heads) or its own ``eager`` / ``sdpa``. The padded layout:

Worked example: two rows, slot 0 holds 5 positions and verifies a chain of 3 (root + 2 drafts), slot 1
holds 2 and runs a plain step (1 token); the batch is padded to ``T = 3``, ``kv_len = 5 + 3 = 8``::

    row 0  tokens  r  d0 d1      positions 5 6 7     writes slot 0 at 5 6 7
    row 1  tokens  r  .  .       positions 2 3 4     writes slot 1 at 2 3 4 (3, 4: padding)

    mask row 0 (kv 0..7):  r : 1 1 1 1 1 1 . .      row 1:  r  : 1 1 1 . . . . .
                           d0: 1 1 1 1 1 1 1 .              pad: . . . 1 . . . .  (itself: no empty row)
                           d1: 1 1 1 1 1 1 1 1              pad: . . . . 1 . . .
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import decoder
from .attention import ENGINE_ATTENTION, ROWS_KWARG
from .kv_pool import KVPool, SlotCache
from specbuild.util.checkpoints import cache_keyword

# Attention implementations that apply a custom 4D float mask as given (flash kernels would ignore it).
MASK_ATTENTION = ("eager", "sdpa", ENGINE_ATTENTION)


@dataclass(frozen=True)
class RowBlock:
    """One row's input to a forward pass.

    Attributes:
        slot: the row's KV slot; its ``T`` tokens are written after the slot's current length.
        tokens: ``[T]`` token ids (``T >= 1``).
        positions: ``[T]`` position offsets from the slot's length (a tree node: its depth); None -> ``0 .. T-1``.
        allowed: ``[T, T]`` bool, block token ``i`` may see block token ``j`` (every token sees the whole
            cached prefix); None -> causal.
        logits_from: first block index whose next-token logits are needed (a prefill: ``T - 1``).
    """

    slot: int
    tokens: list[int]
    positions: list[int] | None = None
    allowed: torch.Tensor | None = None
    logits_from: int = 0


@dataclass(frozen=True)
class ForwardOutput:
    """Target outputs of one pass, row by row (rows in the order given).

    Attributes:
        logits: per row ``[T_b - logits_from, vocab]``, row ``i`` scoring the token after block index
            ``logits_from + i``.
        hidden_states: None unless asked for; else transformers' ``hidden_states`` per row: a tuple of
            ``[T_b, hidden]`` (index 0 the embeddings, ``i + 1`` decoder layer ``i``'s output, the last
            one after the final norm).
    """

    logits: list[torch.Tensor]
    hidden_states: list[tuple[torch.Tensor, ...]] | None


def check_mask_attention(model) -> None:
    """Raises: ValueError if the model's attention implementation would ignore a custom 4D mask."""
    attention = getattr(model.config, "_attn_implementation", None)
    if attention not in MASK_ATTENTION:
        raise ValueError(
            f"the reference engine needs attn_implementation in {MASK_ATTENTION} (custom attention masks), "
            f"the target uses {attention!r}"
        )


def forward_blocks(model, pool: KVPool, rows: list[RowBlock], *, hidden_states: bool = False) -> ForwardOutput:
    """Run every row's block through the target in ONE forward pass; each slot grows by its row's block.

    A Llama-architecture target on the CPU runs the engine's own layer loop over the rows' tokens
    concatenated (:mod:`~specbuild.engine.decoder`); any other model runs transformers' forward over
    the rows padded to the widest, whose slots form a contiguous range (a free slot in between runs a
    one-token dummy row). The pool's lengths are NOT advanced: the caller commits what it keeps
    (:meth:`KVPool.commit`).

    Args:
        rows: at least one row; distinct slots.
        hidden_states: also return every layer's hidden states (EAGLE features, EAGLE-3 captures, Medusa).

    Raises:
        ValueError: no rows, an empty row, repeated slots, or a block that would run past the slot's capacity.
    """
    if not rows:
        raise ValueError("forward_blocks needs at least one row")
    by_slot = {row.slot: row for row in rows}
    if len(by_slot) != len(rows):
        raise ValueError(f"rows share slots: {[row.slot for row in rows]}")
    if any(not row.tokens for row in rows):
        raise ValueError("every row of a forward pass needs at least one token")
    if decoder.supports(model):
        lengths = [pool.length(row.slot) for row in rows]
        for row, length in zip(rows, lengths):
            if length + len(row.tokens) > pool.capacity:
                raise ValueError(f"a block of {len(row.tokens)} tokens after {length} cached ones exceeds the slot capacity {pool.capacity}")
        logits, hidden = decoder.forward_rows(
            model, pool,
            slots=[row.slot for row in rows], lengths=lengths, tokens=[row.tokens for row in rows],
            offsets=[range(len(row.tokens)) if row.positions is None else row.positions for row in rows],
            allowed=[row.allowed for row in rows], logits_from=[row.logits_from for row in rows],
            hidden_states=hidden_states,
        )
        return ForwardOutput(logits, hidden)
    first, last = min(by_slot), max(by_slot)
    batch = [by_slot.get(slot, RowBlock(slot, [0])) for slot in range(first, last + 1)]
    # a slot in between that is not in this pass (free, or a request waiting for the next iteration) gets a
    # dummy token written past its length, where nothing committed lives
    lengths = [pool.length(row.slot) for row in batch]
    width = max(len(row.tokens) for row in batch)  # T
    kv_len = max(lengths) + width
    if kv_len > pool.capacity:
        raise ValueError(f"a block of {width} tokens after {max(lengths)} cached ones exceeds the slot capacity {pool.capacity}")
    pool.zero_fill(range(first, last + 1), kv_len)
    device, dtype = model.device, model.dtype
    input_ids, positions, allowed = _pack(batch, lengths, width, kv_len)  # [B, T], [B, T], [B, T, kv_len]
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]
    writes = torch.tensor(lengths)[:, None] + torch.arange(width)  # [B, T]: each row's block after its length
    cache = SlotCache(pool, first=first, write_positions=writes.to(device), kv_len=kv_len)
    keep = width - min(row.logits_from for row in rows)
    spans = {}
    if getattr(model.config, "_attn_implementation", None) == ENGINE_ATTENTION:  # each row attends alone
        spans[ROWS_KWARG] = tuple((len(row.tokens), length + len(row.tokens)) for row, length in zip(batch, lengths))
    outputs = model(
        input_ids=input_ids.to(device),
        attention_mask=mask.to(device),  # [B, 1, T, kv_len]
        position_ids=positions.to(device),
        use_cache=True,
        logits_to_keep=keep,
        output_hidden_states=hidden_states,
        **{cache_keyword(model): cache},
        **spans,
    )
    logits = outputs.logits  # [B, keep, vocab], block indices width - keep .. width - 1
    out_logits, out_hidden = [], [] if hidden_states else None
    for row in rows:
        b, size = row.slot - first, len(row.tokens)
        out_logits.append(logits[b, row.logits_from - (width - keep) : size - (width - keep)])
        if out_hidden is not None:
            out_hidden.append(tuple(h[b, :size] for h in outputs.hidden_states))
    return ForwardOutput(out_logits, out_hidden)


def _pack(batch: list[RowBlock], lengths: list[int], width: int, kv_len: int):
    """Padded ``input_ids`` / ``position_ids`` ``[B, T]`` and the visibility ``[B, T, kv_len]`` (bool)."""
    input_ids = torch.zeros(len(batch), width, dtype=torch.long)
    positions = torch.zeros(len(batch), width, dtype=torch.long)
    allowed = torch.zeros(len(batch), width, kv_len, dtype=torch.bool)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    for b, (row, length) in enumerate(zip(batch, lengths)):
        size = len(row.tokens)
        input_ids[b, :size] = torch.tensor(row.tokens, dtype=torch.long)
        offsets = torch.arange(width) if row.positions is None else torch.tensor([*row.positions, *range(size, width)])
        positions[b] = offsets + length
        allowed[b, :size, :length] = True
        allowed[b, :size, length : length + size] = causal[:size, :size] if row.allowed is None else row.allowed
        pad = torch.arange(size, width)
        allowed[b, pad, length + pad] = True  # padding sees itself only (a fully masked row would be NaN)
    return input_ids, positions, allowed
