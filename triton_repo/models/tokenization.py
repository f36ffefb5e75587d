"""Pre- and postprocessing logic (tokenize / detokenize), importable without Triton.

Tensor names follow TensorRT-LLM's ``inflight_batcher_llm`` preprocessing/postprocessing models:
``QUERY`` -> ``INPUT_ID`` + ``REQUEST_INPUT_LEN``; ``TOKENS_BATCH`` + ``SEQUENCE_LENGTH`` -> ``OUTPUT``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from specbuild.tokenizer import load_tokenizer  # noqa: F401  (the Triton models load theirs through this module)


@dataclass(frozen=True)
class Tokenized:
    """``input_ids``: [batch, max_len] int32, right-padded with ``pad_id``; ``lengths``: [batch, 1] int32."""

    input_ids: np.ndarray
    lengths: np.ndarray


def decode_queries(query: np.ndarray) -> list[str]:
    """``QUERY`` [batch, 1] BYTES -> one str per row. Raises ValueError for bytes that are not UTF-8."""
    texts = []
    for i, row in enumerate(query.reshape(query.shape[0], -1)):
        value = row[0]
        try:
            texts.append(value.decode("utf-8") if isinstance(value, bytes) else str(value))
        except UnicodeDecodeError as exc:
            raise ValueError(f"text_input[{i}] is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    return texts


def tokenize(tokenizer, texts: list[str], *, pad_id: int, add_special_tokens: bool) -> Tokenized:
    """Tokenize ``texts``. Raises ValueError for an empty prompt (nothing to condition on)."""
    ids = []
    for i, text in enumerate(texts):
        if not text:
            raise ValueError(f"text_input[{i}] is empty; send a non-empty prompt")
        row = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        if not row:
            raise ValueError(f"text_input[{i}] tokenizes to no tokens")
        ids.append(row)
    width = max(len(r) for r in ids)
    padded = np.full((len(ids), width), pad_id, dtype=np.int32)
    for i, row in enumerate(ids):
        padded[i, : len(row)] = row
    return Tokenized(input_ids=padded, lengths=np.array([[len(r)] for r in ids], dtype=np.int32))


def detokenize(tokenizer, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``tokens`` [batch, beam, len] + ``lengths`` [batch, beam] -> [batch, beam] UTF-8 bytes (object array)."""
    out = np.empty(lengths.shape, dtype=object)
    for b in range(tokens.shape[0]):
        for k in range(tokens.shape[1]):
            ids = tokens[b, k, : int(lengths[b, k])].tolist()
            out[b, k] = tokenizer.decode(ids, skip_special_tokens=True).encode("utf-8")
    return out


# Tokens decoded before the sent/new boundary (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
DETOKENIZE_CONTEXT = 5

# transformers' ``clean_up_tokenization`` rewrites " .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's",
# " 've", " 're"; a text ending in a proper prefix of one may still change when the next token comes.
_CLEANUP_PREFIXES = (" n'", " 'v", " 'r", " n", " '", " ")


def detokenize_step(tokenizer, sent_ids: list[int], new_ids: list[int], *, final: bool) -> str:
    """The text a streamed step adds, so the steps' texts concatenate to ``decode(all ids)`` exactly.

    Incremental detokenization with a bounded window, the prefix_offset / read_offset scheme of vLLM
    (``vllm/transformers_utils/detokenizer_utils.py``) and HF TGI: only the last
    :data:`DETOKENIZE_CONTEXT` sent ids (more where needed, see below) are decoded, once alone and once
    with ``new_ids``, and the step adds the difference. Decoding starts at the same token in both, so a
    tokenizer that drops the first token's leading space (SentencePiece ``▁``, byte-level ``Ġ`` with
    ``add_prefix_space``) drops it in both, and the difference is what the full decode adds. Cost per
    step: O(window + new), not O(all ids).

    Held back until a later step (or the last one): trailing replacement characters (U+FFFD: a token
    holds part of a UTF-8 character that a later token completes) and, for a tokenizer with
    ``clean_up_tokenization_spaces``, a trailing " ", " '", " n"... that the cleanup may still rewrite.
    Example (byte-level BPE): "é" = bytes C3 A9 as two tokens -> step 1 adds "", step 2 adds "é".

    The window grows (doubling) until its text starts at a character boundary: not empty and not
    starting with U+FFFD (the window began inside a character, or a run of invalid bytes that the
    held-back text must cover whole). Stateless: the ids alone decide, so any postprocessing
    instance can take any step.

    Args:
        sent_ids: the ids of the earlier steps (all of them or at least their tail);
        new_ids: this step's ids; final: the last step (nothing is held back).
    """
    cleanup = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
    decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
    start, before = len(sent_ids), ""
    if sent_ids:
        context = DETOKENIZE_CONTEXT
        while True:
            start = max(0, len(sent_ids) - context)
            text = decode(sent_ids[start:])
            if start == 0 or (text and not text.startswith("\ufffd")):
                break
            context *= 2
        before = _held_back(text, cleanup)
    after = decode([*sent_ids[start:], *new_ids])
    after = after if final else _held_back(after, cleanup)
    return after[len(before) :] if after.startswith(before) else after[_common_prefix(before, after) :]


def _held_back(text: str, cleanup: bool = False) -> str:
    text = text.rstrip("\ufffd")
    if cleanup:
        for suffix in _CLEANUP_PREFIXES:
            if text.endswith(suffix):
                return text[: -len(suffix)]
    return text


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

