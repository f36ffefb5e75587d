"""Request validation: every rejected field raises InvalidRequestError naming the field and its range."""

from __future__ import annotations

from dataclasses import dataclass

from .types import GenerationRequest, InvalidRequestError


@dataclass(frozen=True)
class ResolvedRequest:
    """A validated request with the engine defaults filled in."""

    input_ids: list[int]
    max_tokens: int
    end_id: int
    num_draft_tokens: int


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
            ``[0, max_draft_len]``, ``end_id`` not -1 and outside ``[0, vocab_size)``.
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
    return ResolvedRequest(list(request.input_ids), request.max_tokens, end_id, num_draft)


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
