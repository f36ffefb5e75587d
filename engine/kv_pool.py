"""The engine's KV cache: one preallocated slot per in-flight request, rows of different lengths.

Every request in flight owns a *slot*: per layer, keys and values ``[num_kv_heads, capacity, head_dim]``
where ``capacity = max_seq_len + max_block`` (the build's longest sequence plus the widest block one
step can write, padding included). A row's cache is ``length`` positions long; a step writes its block
after them and then *commits* what was accepted::

    slot s, length L:     | c0 .. c(L-1) |                          (the context but its last token)
    step writes T tokens: | c0 .. c(L-1) | r  x1 x2 x3 pad |         r = root (last token), x = drafts
    commit keep=[0, 2]:   | c0 .. c(L-1) | r  x2 |                   x2 moved to L + 1; length L + 2
    a chain's keep is a prefix [0 .. a], so committing only moves the length (a rollback).

Keys carry their rotary position, and a node of a tree sits at ``L + depth``, which along the accepted
path is exactly its sequential position, so a committed slot equals a sequential run's cache (up to
floating-point rounding). Nothing is freed or reallocated while the engine runs: a slot is handed back
when its request ends and the next request overwrites it. On CPU the pool is allocated with
``torch.empty``, so the operating system commits its pages only as slots are first written.

A forward pass over a contiguous range of slots reads them through a :class:`SlotCache`, the cache
object transformers' attention layers call (``cache.update(keys, values, layer_idx)``): it writes each
row's new keys/values at that row's own positions and returns a *view* of the slots (no copy of the
cached context), which the caller's 4D attention mask restricts to each row's own positions.

**The one KV cache interface.** :class:`KVCache` is what every user of a KV cache calls: the target's
forward (:mod:`~specbuild.engine.forward`, :mod:`~specbuild.engine.decoder`), a draft model
(``methods/draft_target``) and the EAGLE / EAGLE-3 heads (``methods/eagle``), and :class:`KVPool` is its
one implementation. It follows SGLang's single memory pool (``ReqToTokenPool`` + ``TokenToKVPool``: a
request holds a slot, and ``get_key_buffer`` / ``set_kv_buffer`` read and write a layer) with vLLM's
``KVCacheManager`` verbs (``allocate`` / ``free`` as :meth:`~KVCache.allocate` / :meth:`~KVCache.release`).
Only this module knows how a slot's positions lie in memory: callers read and write through
:meth:`~KVCache.read` / :meth:`~KVCache.write`, and the C attention kernel gets slot and position tables
plus :meth:`~KVCache.addressing` (three strides), never a tensor shape it assumes. A strided layout
change (e.g. SGLang's token-major ``[slot, position, head, dim]``) is a change to this file alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


ZERO_CHUNK = 256  # positions zeroed at a time when a batch first reaches them


class KVCacheFullError(RuntimeError):
    """No free slot (more requests in flight than ``max_batch_size``), or a pool too large for the memory."""


@dataclass(frozen=True)
class KVShape:
    """What one slot holds, per layer: ``[num_kv_heads, capacity, head_dim]`` keys and as many values."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, model) -> KVShape:
        """Read the shape from a transformers model's text config (``head_dim`` defaults to hidden / heads).

        Raises:
            ValueError: the config lacks ``num_hidden_layers`` or ``num_attention_heads``.
        """
        config = model.config.get_text_config()
        try:
            layers, heads = int(config.num_hidden_layers), int(config.num_attention_heads)
        except AttributeError as exc:
            raise ValueError(f"{type(model).__name__}: config has no {exc.name}; cannot size the KV cache") from None
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        return cls(layers, kv_heads, head_dim)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """Keys + values of one position over all layers, in bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class KVAddressing:
    """Where element ``(slot, kv_head, position, d)`` of one layer's key (or value) buffer lies: at
    ``slot * slot_stride + kv_head * head_stride + position * pos_stride + d`` elements from the buffer's
    start (``d`` contiguous). What a kernel needs, beside each row's slot and positions, to read and
    write a pool of any strided layout.

    Attributes:
        num_slots, num_kv_heads, capacity, head_dim: the pool's geometry.
        slot_stride, head_stride, pos_stride: element strides (``head_dim``'s is 1).
    """

    num_slots: int
    num_kv_heads: int
    capacity: int
    head_dim: int
    slot_stride: int
    head_stride: int
    pos_stride: int

    @property
    def numel(self) -> int:
        """Elements one layer's key buffer holds."""
        return self.num_slots * self.num_kv_heads * self.capacity * self.head_dim


@runtime_checkable
class KVCache(Protocol):
    """The engine's KV cache interface: request slots of ``capacity`` positions, per layer keys and values.

    A slot's ``length`` positions are committed; a forward pass writes its block after them
    (:meth:`write`), attends over them (:meth:`read`), and the caller then keeps the accepted path
    (:meth:`commit`) or rolls back (:meth:`truncate`). Shapes: keys/values of one slot and layer are
    ``[num_kv_heads, T, head_dim]`` as read or written, whatever the layout in memory.
    """

    shape: KVShape
    num_slots: int
    capacity: int

    def allocate(self) -> int:
        """A free slot, emptied (length 0). Raises :class:`KVCacheFullError` when every slot is in use."""
        ...

    def release(self, slot: int) -> None:
        """Hand ``slot`` back; its contents are overwritten by the next holder."""
        ...

    def length(self, slot: int) -> int:
        """Committed positions of ``slot``."""
        ...

    def commit(self, slot: int, keep: list[int]) -> None:
        """Keep block indices ``keep`` (ascending, ``keep[0] == 0``) of the block written after the length."""
        ...

    def truncate(self, slot: int, length: int) -> None:
        """Roll ``slot`` back to ``length`` positions (``0 <= length <= self.length(slot)``)."""
        ...

    def write(self, layer: int, slot: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``keys`` / ``values`` ``[num_kv_heads, T, head_dim]`` at positions ``start .. start + T - 1``
        of ``slot`` (past the length: not committed until :meth:`commit`)."""
        ...

    def read(self, layer: int, slot: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views (no copy) of positions ``0 .. end - 1`` of ``slot``: keys, values ``[num_kv_heads, end, head_dim]``."""
        ...

    def layer_buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's whole key and value buffers, for a kernel that addresses them by :meth:`addressing`."""
        ...

    def addressing(self) -> KVAddressing:
        """How a kernel finds ``(slot, kv_head, position, d)`` in :meth:`layer_buffers`."""
        ...


class KVPool:
    """``num_slots`` request slots of ``capacity`` positions each (see the module docstring).

    Args:
        shape: per-layer geometry (:meth:`KVShape.of`).
        num_slots: the build's ``max_batch_size``.
        capacity: positions per slot (``max_seq_len`` + the widest block a step writes).

    Raises:
        ValueError: ``num_slots`` or ``capacity`` below 1.
    """

    def __init__(self, shape: KVShape, *, num_slots: int, capacity: int, dtype: torch.dtype, device: torch.device | str) -> None:
        if num_slots < 1 or capacity < 1:
            raise ValueError(f"a KV pool needs num_slots >= 1 and capacity >= 1, got {num_slots} and {capacity}")
        self.shape, self.num_slots, self.capacity = shape, num_slots, capacity
        _check_fits(num_slots * capacity * shape.bytes_per_token(dtype), device, num_slots=num_slots, capacity=capacity)
        size = (num_slots, shape.num_kv_heads, capacity, shape.head_dim)
        # keys[layer]: indexed [num_slots, num_kv_heads, capacity, head_dim]; values alike
        self.keys = [self._buffer(size, dtype, device) for _ in range(shape.num_layers)]
        self.values = [self._buffer(size, dtype, device) for _ in range(shape.num_layers)]
        self.lengths = [0] * num_slots
        self._initialized = [0] * num_slots  # positions zeroed or written at least once, per slot
        self._free = list(range(num_slots))

    @staticmethod
    def _buffer(size: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """One layer's key (or value) buffer, indexed ``[slot, kv_head, position, d]`` (``size``): the one
        place the memory layout is chosen. Any strided layout with ``d`` contiguous works unchanged (the
        kernel follows :meth:`addressing`; ``tests/test_forward.py`` runs a token-major one); this one is
        slot-major and contiguous. ``torch.empty``: the OS commits pages as slots are first written."""
        return torch.empty(size, dtype=dtype, device=device)

    def length(self, slot: int) -> int:
        """Committed positions of ``slot``."""
        return self.lengths[slot]

    def write(self, layer: int, slot: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``keys`` / ``values`` ``[num_kv_heads, T, head_dim]`` at positions ``start .. start + T - 1`` of ``slot``.

        Raises:
            ValueError: the block would run past the slot's capacity.
        """
        end = start + keys.shape[1]
        if end > self.capacity:
            raise ValueError(f"a block of {keys.shape[1]} positions at {start} runs past the slot capacity {self.capacity}")
        self.keys[layer][slot, :, start:end] = keys
        self.values[layer][slot, :, start:end] = values
        if start <= self._initialized[slot]:  # contiguous with what is zeroed or written: no gap left unzeroed
            self._initialized[slot] = max(self._initialized[slot], end)

    def read(self, layer: int, slot: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of positions ``0 .. end - 1`` of ``slot``: keys, values ``[num_kv_heads, end, head_dim]``."""
        return self.keys[layer][slot, :, :end], self.values[layer][slot, :, :end]

    def layer_buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s key and value buffers (contiguous, addressed by :meth:`addressing`)."""
        return self.keys[layer], self.values[layer]

    def addressing(self) -> KVAddressing:
        """The buffers' geometry and element strides (read from the buffers, whatever :meth:`_buffer` chose)."""
        slot_stride, head_stride, pos_stride, _ = self.keys[0].stride()
        return KVAddressing(self.num_slots, self.shape.num_kv_heads, self.capacity, self.shape.head_dim,
                            slot_stride, head_stride, pos_stride)

    @property
    def nbytes(self) -> int:
        """Bytes the pool reserves (all slots, full capacity)."""
        return self.num_slots * self.capacity * self.shape.bytes_per_token(self.keys[0].dtype)

    def allocate(self) -> int:
        """The lowest free slot, emptied (length 0). Lowest first keeps the slots of a batch contiguous.

        Raises:
            KVCacheFullError: every slot is in use.
        """
        if not self._free:
            raise KVCacheFullError(f"all {self.num_slots} KV-cache slots are in use (max_batch_size)")
        slot = min(self._free)
        self._free.remove(slot)
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        """Hand ``slot`` back (its contents are overwritten by the next request). Releasing twice is a no-op."""
        if slot not in self._free:
            self._free.append(slot)

    def zero_fill(self, slots: range, upto: int) -> None:
        """Make positions ``[0, upto)`` of ``slots`` finite: a forward reads a slot up to ``kv_len``, past
        what the row may see, and masked scores must stay finite (``0 * NaN`` of never-written memory
        would poison the softmax). Each position is zeroed once, the first time a batch reaches it."""
        upto = min(self.capacity, -(-upto // ZERO_CHUNK) * ZERO_CHUNK)  # whole chunks: few small writes
        for slot in slots:
            start = self._initialized[slot]
            if start < upto:
                for cache in (*self.keys, *self.values):
                    cache[slot, :, start:upto].zero_()
                self._initialized[slot] = upto

    def commit(self, slot: int, keep: list[int]) -> None:
        """After a step wrote its block at ``[length, length + T)``: keep block indices ``keep``
        (ascending, ``keep[0] == 0``, the root) at ``length .. length + len(keep) - 1``.

        Raises:
            ValueError: ``keep`` is empty, not ascending or does not start at the root.
        """
        if not keep or keep[0] != 0 or any(b <= a for a, b in zip(keep, keep[1:])):
            raise ValueError(f"keep must be ascending block indices starting at the root (0), got {keep}")
        start = self.lengths[slot]
        if keep[-1] != len(keep) - 1:  # not a prefix: move the kept positions down (tree / lookahead)
            source = torch.tensor(keep, device=self.keys[0].device) + start  # [len(keep)]
            for cache in (*self.keys, *self.values):
                row = cache[slot]  # [num_kv_heads, capacity, head_dim]
                row[:, start : start + len(keep)] = row.index_select(1, source)
        self.lengths[slot] = start + len(keep)

    def truncate(self, slot: int, length: int) -> None:
        """Roll ``slot`` back to ``length`` positions (``0 <= length <=`` its length).

        Raises:
            ValueError: ``length`` out of range.
        """
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot roll back slot {slot} of {self.lengths[slot]} positions to {length}")
        self.lengths[slot] = length


def available_bytes(device: torch.device | str) -> int | None:
    """Memory free for a new allocation: CUDA's free device memory, or the kernel's ``MemAvailable``
    (``/proc/meminfo``) on the CPU; None where it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _check_fits(nbytes: int, device: torch.device | str, *, num_slots: int, capacity: int) -> None:
    """Refuse a pool that could not be backed when every slot fills (rather than dying of OOM mid-run).

    Raises:
        KVCacheFullError: ``nbytes`` exceeds the memory available now.
    """
    free = available_bytes(device)
    if free is not None and nbytes > free:
        raise KVCacheFullError(
            f"the KV cache needs {nbytes / 2**30:.2f} GiB ({num_slots} slots (max_batch_size) x {capacity} positions "
            f"(max_seq_len + widest step)), but only {free / 2**30:.2f} GiB is available on {device}; "
            "lower build.max_batch_size or build.max_seq_len"
        )


class SlotCache:
    """The transformers cache object of ONE forward pass over slots ``[first, first + B)``.

    Row ``b`` of the batch is slot ``first + b``; its ``T`` new positions go at ``write_positions[b]``
    (``[B, T]``, each row's length onwards). :meth:`update` returns keys and values
    ``[B, num_kv_heads, kv_len, head_dim]`` as views of the pool, ``kv_len`` covering every row's
    written block; the caller's 4D mask ``[B, 1, T, kv_len]`` hides what a row must not see.
    """

    is_compileable = False

    def __init__(self, pool: KVPool, *, first: int, write_positions: torch.Tensor, kv_len: int) -> None:
        self.pool, self.first, self.kv_len = pool, first, kv_len
        self.batch = write_positions.shape[0]
        self.write_positions = write_positions  # [B, T] long
        self.rows = torch.arange(self.batch, device=write_positions.device)[:, None].expand_as(write_positions)  # [B, T]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write ``[B, num_kv_heads, T, head_dim]`` keys/values at each row's positions; return the rows' views."""
        del args, kwargs
        span = slice(self.first, self.first + self.batch)
        keys, values = self.pool.keys[layer_idx][span], self.pool.values[layer_idx][span]  # [B, Hkv, capacity, D]
        # advanced indices (rows, positions) around a slice: the indexed shape is [B, T, Hkv, D]
        keys[self.rows, :, self.write_positions] = key_states.transpose(1, 2).to(keys.dtype)
        values[self.rows, :, self.write_positions] = value_states.transpose(1, 2).to(values.dtype)
        return keys[:, :, : self.kv_len], values[:, :, : self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Cached positions before this pass (of the first row; position ids are always passed explicitly)."""
        del layer_idx
        return self.pool.lengths[self.first]
