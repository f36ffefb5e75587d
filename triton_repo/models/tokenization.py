"""Pre- and postprocessing logic (tokenize / detokenize), importable without Triton.

Tensor names follow TensorRT-LLM's ``inflight_batcher_llm`` preprocessing/postprocessing models:
``QUERY`` -> ``INPUT_ID`` + ``REQUEST_INPUT_LEN``; ``TOKENS_BATCH`` + ``SEQUENCE_LENGTH`` -> ``OUTPUT``.
"""

from __future__ import annotations

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


def detokenize_step(tokenizer, sent_ids: list[int], new_ids: list[int], *, final: bool) -> str:
    """The text a streamed step adds: ``decode(sent + new)`` minus ``decode(sent)``, so the steps'
    texts concatenate to ``decode(all ids)`` exactly (incremental detokenization, as vLLM does).

    A token may hold part of a UTF-8 character that a later token completes; until the last step,
    trailing replacement characters (U+FFFD) are held back. Example (byte-level BPE): "é" = bytes
    C3 A9 as two tokens -> step 1 adds "", step 2 adds "é" (not "\ufffd" then "\ufffd").

    Args:
        sent_ids: the ids of the earlier steps; new_ids: this step's ids; final: the last step.
    """
    before = _held_back(tokenizer.decode(sent_ids, skip_special_tokens=True)) if sent_ids else ""
    after = tokenizer.decode([*sent_ids, *new_ids], skip_special_tokens=True)
    after = after if final else _held_back(after)
    return after[len(before) :] if after.startswith(before) else after[_common_prefix(before, after) :]


def _held_back(text: str) -> str:
    return text.rstrip("\ufffd")


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

