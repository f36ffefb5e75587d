"""Do a draft and its target read token ids the same way? Compared from the tokenizer files alone.

Speculation hands the target's token ids to the draft and the draft's ids back to the target, so
both must give every id the same token: equal ``vocab_size`` is not enough (two tokenizers of the
same size with different tokens pass that). This compares the id -> token tables of the two
checkpoint folders without loading a tokenizer library (milliseconds for small vocabularies, about
0.2 s for a 128k-token ``tokenizer.json``):

- ``tokenizer.json`` (Hugging Face fast tokenizers): ``model.vocab`` plus ``added_tokens``;
- else ``vocab.json`` plus ``added_tokens.json`` (slow BPE tokenizers);
- else ``tokenizer.model`` (SentencePiece), byte for byte.

Example: target ``{"a": 0, "b": 1}`` and draft ``{"a": 0, "c": 1}`` -> id 1 is ``'b'`` vs ``'c'``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TokenTable:
    """One checkpoint's tokenizer as ``id -> token`` (``None`` for SentencePiece: ``digest`` only)."""

    source: Path
    tokens: dict[int, str] | None
    digest: str


def read_token_table(checkpoint_dir: Path) -> TokenTable | None:
    """The id -> token table of ``checkpoint_dir``'s tokenizer files, or None when it has none."""
    fast, slow, piece = (checkpoint_dir / n for n in ("tokenizer.json", "vocab.json", "tokenizer.model"))
    if fast.is_file():
        raw = fast.read_bytes()
        data = _json(raw)
        model = data.get("model") if isinstance(data, dict) else None
        vocab = model.get("vocab") if isinstance(model, dict) else None
        added = data.get("added_tokens") if isinstance(data, dict) else None
        return TokenTable(fast, _table(vocab, added), hashlib.sha256(raw).hexdigest())
    if slow.is_file():
        raw = slow.read_bytes()
        added_path = checkpoint_dir / "added_tokens.json"
        added = _json(added_path.read_bytes()) if added_path.is_file() else {}
        extra = [{"id": i, "content": t} for t, i in added.items()] if isinstance(added, dict) else []
        return TokenTable(slow, _table(_json(raw), extra), hashlib.sha256(raw).hexdigest())
    if piece.is_file():
        return TokenTable(piece, None, hashlib.sha256(piece.read_bytes()).hexdigest())
    return None


def token_table_difference(target: TokenTable, draft: TokenTable) -> str | None:
    """None when both tables give every id the same token, else what differs, in words.

    Example: ``"token id 1 is 'b' in the target's tokenizer (.../tokenizer.json) but 'c' in the draft's (...)"``.
    """
    if target.digest == draft.digest:
        return None
    if target.tokens is None or draft.tokens is None:
        if target.tokens is None and draft.tokens is None:
            return f"their SentencePiece models differ ({target.source} vs {draft.source})"
        return None  # different formats: not comparable from the files; vocab_size was checked
    if target.tokens == draft.tokens:
        return None
    for token_id in sorted(set(target.tokens) | set(draft.tokens)):
        t, d = target.tokens.get(token_id), draft.tokens.get(token_id)
        if t != d:
            return (
                f"token id {token_id} is {_show(t)} in the target's tokenizer ({target.source}) "
                f"but {_show(d)} in the draft's ({draft.source})"
            )
    return None


def _show(token: str | None) -> str:
    return "absent" if token is None else repr(token)


def _json(raw: bytes):
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _table(vocab, added) -> dict[int, str] | None:
    """``id -> token`` from a vocab (``{token: id}``, or Unigram's ``[[token, score], ...]``) and added tokens."""
    if isinstance(vocab, dict):
        table = {int(i): str(t) for t, i in vocab.items() if isinstance(i, int)}
    elif isinstance(vocab, list):
        table = {i: str(entry[0]) for i, entry in enumerate(vocab) if isinstance(entry, list) and entry}
    else:
        return None
    for entry in added or []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int):
            table[entry["id"]] = str(entry.get("content"))
    return table
