"""KV-cache helpers: the engine owns a transformers ``DynamicCache`` per request."""

from __future__ import annotations

from transformers import DynamicCache


def rollback(cache: DynamicCache, length: int) -> None:
    """Drop cached positions past ``length`` (rejected draft tokens) from every layer.

    Args:
        cache: the request's cache, ``[1, num_kv_heads, seq_len, head_dim]`` per layer.
        length: positions to keep, ``0 <= length <= cache.get_seq_length()``.

    Raises:
        ValueError: if ``length`` is negative or longer than the cache.
    """
    cached = cache.get_seq_length()
    if not 0 <= length <= cached:
        raise ValueError(f"cannot roll back a cache of {cached} positions to {length}")
    if length < cached:
        # A negative argument means "remove this many" in every transformers version (>= 5 rejects positives).
        cache.crop(length - cached)
