"""Request validation: every rejected field raises InvalidRequestError naming the field and its range."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral, Real

from .types import SEED_RANGE, GenerationRequest, InvalidRequestError, SamplingParams


@dataclass(frozen=True)
class ResolvedRequest:
    """A validated request with the engine defaults filled in; ``sampling`` is None for greedy decoding."""

    input_ids: list[int]
    max_tokens: int
    end_id: int
    num_draft_tokens: int
    sampling: SamplingParams | None = None
    lookahead_config: tuple[int, int, int] | None = None


def validate_request(
    request: GenerationRequest,
    *,
    max_input_len: int,
    max_seq_len: int,
    max_draft_len: int,
    vocab_size: int,
    default_end_id: int,
) -> ResolvedRequest:
    """Check ``request`` against the engine's limits and fill in ``end_id`` / ``num_draft_tokens``.

    Raises:
        InvalidRequestError: empty or too long ``input_ids``, ids outside ``[0, vocab_size)``,
            ``max_tokens`` < 1 or past ``max_seq_len``, ``num_draft_tokens`` outside
            ``[0, max_draft_len]``, ``end_id`` not -1 and outside ``[0, vocab_size)``, ``temperature``
            negative or not finite, ``top_k`` negative, ``top_p`` outside ``(0, 1]``, ``seed`` outside
            ``[0, 2**64)``, ``lookahead_config`` not None and not three integers (its range is the
            method's to check).
    """
    _check_input_ids(request.input_ids, max_input_len=max_input_len, vocab_size=vocab_size)
    _check_max_tokens(request.max_tokens, input_len=len(request.input_ids), max_seq_len=max_seq_len)
    num_draft = max_draft_len if request.num_draft_tokens is None else request.num_draft_tokens
    if not isinstance(num_draft, int) or not 0 <= num_draft <= max_draft_len:
        raise InvalidRequestError(
            f"num_draft_tokens={request.num_draft_tokens!r} is out of range; allowed: 0..{max_draft_len} "
            "(the engine's max_draft_len) or None"
        )
    end_id = default_end_id if request.end_id is None else request.end_id
    if not isinstance(end_id, int) or not (end_id == -1 or 0 <= end_id < vocab_size):
        raise InvalidRequestError(
            f"end_id={request.end_id!r} is out of range; allowed: -1 (never stop), None (engine default) "
            f"or a token id in [0, {vocab_size})"
        )
    sampling = resolve_sampling(request)
    lookahead = _check_lookahead_config(request.lookahead_config)
    return ResolvedRequest(list(request.input_ids), request.max_tokens, end_id, num_draft, sampling, lookahead)


def _check_lookahead_config(value: object) -> tuple[int, int, int] | None:
    if value is None:
        return None
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 3
        or any(isinstance(v, bool) or not isinstance(v, Integral) for v in value)
    ):
        raise InvalidRequestError(f"lookahead_config={value!r}; allowed: None or three integers (w, n, g)")
    w, n, g = (int(v) for v in value)
    return (w, n, g)


def resolve_sampling(request: GenerationRequest) -> SamplingParams | None:
    """The request's sampling parameters with defaults filled in, or None for greedy decoding.

    Every field is checked even when the request is greedy, so a bad value never passes silently.

    Examples:
        temperature None or 0 -> None (greedy);  temperature 0.7, top_k None -> SamplingParams(0.7, 0, 1.0, 0).

    Raises:
        InvalidRequestError: a field is out of range (the message names it and the allowed values).
    """
    temperature = _checked_real("temperature", request.temperature, 0.0, lambda t: t >= 0, ">= 0 (0 or None: greedy)")
    top_k = _checked_int("top_k", request.top_k, 0, lambda k: k >= 0, ">= 0 (0 or None: off)")
    top_p = _checked_real("top_p", request.top_p, 1.0, lambda p: 0 < p <= 1, "(0, 1] (1.0 or None: off)")
    seed = _checked_int("seed", request.seed, 0, lambda s: 0 <= s < SEED_RANGE, "[0, 2**64) or None")
    if temperature == 0:
        return None
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)


def _checked_real(name: str, value: object, default: float, ok: Callable[[float], bool], allowed: str) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or not ok(value):
        raise InvalidRequestError(f"{name}={value!r} is out of range; allowed: {allowed}")
    return float(value)


def _checked_int(name: str, value: object, default: int, ok: Callable[[int], bool], allowed: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, Integral) or not ok(int(value)):
        raise InvalidRequestError(f"{name}={value!r} is out of range; allowed: {allowed}")
    return int(value)


def _check_input_ids(input_ids: list[int], *, max_input_len: int, vocab_size: int) -> None:
    if len(input_ids) == 0:
        raise InvalidRequestError("input_ids is empty; a prompt needs at least 1 token")
    if len(input_ids) > max_input_len:
        raise InvalidRequestError(
            f"input_ids has {len(input_ids)} tokens; allowed: 1..{max_input_len} (max_input_len)"
        )
    bad = [t for t in input_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(
            f"input_ids contains ids outside [0, {vocab_size}) (vocab_size): {bad[:5]}"
            + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        )


def _check_max_tokens(max_tokens: int, *, input_len: int, max_seq_len: int) -> None:
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidRequestError(f"max_tokens={max_tokens!r}; allowed: >= 1")
    if input_len + max_tokens > max_seq_len:
        raise InvalidRequestError(
            f"len(input_ids) + max_tokens = {input_len} + {max_tokens} = {input_len + max_tokens} exceeds "
            f"max_seq_len={max_seq_len}; allowed max_tokens for this prompt: 1..{max_seq_len - input_len}"
        )
