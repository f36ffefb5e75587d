"""Stop sequences for the OpenAI front: the text is cut before the first stop string, as the front decodes.

The engine does not see OpenAI's ``stop`` strings (the reference deployment has no ``stop_words_list``);
the front applies them to the text it receives, as vLLM's detokenizer does
(vllm ``v1/engine/detokenizer.py``, ``check_stop_strings``):

- the returned text ends just before the earliest stop string (not included, OpenAI's rule) and
  ``finish_reason`` is ``"stop"``;
- the returned token ids are the shortest prefix of the generated ids whose text covers the returned
  text: ``decode(ids)`` equals the text when the stop string starts on a token boundary, and otherwise
  starts with it (the last id also carries the stop string's first characters);
- streamed, text that could be the start of a stop string is held back until the next chunk says
  whether it is (vLLM holds back ``max(len(stop)) - 1`` characters; here exactly the suffix that is a
  prefix of some stop string), and ids go out with the text they decode to.

Worked example, stops ``["\\n\\n"]``, chunks ``"a\\n"``, ``"\\nb"``: the first chunk sends ``"a"`` (``"\\n"``
held back), the second finds ``"\\n\\n"`` at 1 and ends the answer as ``"a"``, finish_reason ``"stop"``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Decode = Callable[[Sequence[int]], str]


def parse_stop(value: Any) -> tuple[str, ...]:
    """OpenAI's ``stop``: ``null``, a string or a list of strings -> the non-empty strings, in order.

    ``""``, ``[]`` and ``null`` mean none. Raises ``ValueError`` naming the entry that is not a
    string or is empty inside a list.
    """
    if value in (None, "", []):
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list):
        raise ValueError(f"stop must be a string or a list of strings, got {type(value).__name__}")
    for i, entry in enumerate(value):
        if not isinstance(entry, str) or not entry:
            raise ValueError(f"stop[{i}] must be a non-empty string, got {entry!r}")
    return tuple(dict.fromkeys(value))


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Index in ``text`` of the earliest stop string beginning at or after ``start``; None if none.

    Example: ``find_stop("ab<>c", ["<>", "c"]) == 2``.
    """
    found = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(found) if found else None


def held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string.

    Example: ``held_back("x = 1\\n", ["\\n\\n"]) == 1``; ``held_back("abc", ["\\n"]) == 0``.
    """
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


def covering_ids(decode: Decode, ids: Sequence[int], text: str, start: int = 0) -> int:
    """Smallest ``k >= start`` with ``decode(ids[:k])`` starting with ``text``; ``len(ids)`` if none does."""
    for k in range(start, len(ids) + 1):
        if decode(ids[:k]).startswith(text):
            return k
    return len(ids)


def decoded_ids(decode: Decode, ids: Sequence[int], text: str, start: int = 0) -> int:
    """Largest ``k >= start`` with ``text`` starting with ``decode(ids[:k])``: the ids whose text is all in ``text``."""
    k = start
    while k < len(ids) and text.startswith(decode(ids[: k + 1])):
        k += 1
    return k


@dataclass(frozen=True)
class Piece:
    """What the front sends next: ``text`` and the ``ids`` it decodes from; ``stopped``: a stop string ended it."""

    text: str
    ids: list[int]
    stopped: bool = False


@dataclass
class StopCutter:
    """Stop strings applied to one generation as its chunks arrive (see the module docstring).

    ``feed`` takes each chunk's text and ids and returns what may go out now; after a ``Piece`` with
    ``stopped``, the generation is over (the caller cancels it). ``finish`` returns what was held back
    when the generation ended without a stop string.
    """

    stops: tuple[str, ...]
    decode: Decode
    text: str = ""
    ids: list[int] = field(default_factory=list)
    sent_chars: int = 0
    sent_ids: int = 0

    def feed(self, text: str, ids: Sequence[int]) -> Piece:
        self.text += text
        self.ids.extend(int(i) for i in ids)
        at = find_stop(self.text, self.stops, self.sent_chars)
        if at is not None:
            k = covering_ids(self.decode, self.ids, self.text[:at], self.sent_ids)
            return self._send(at, k, stopped=True)
        end = len(self.text) - held_back(self.text[self.sent_chars:], self.stops)
        return self._send(end, decoded_ids(self.decode, self.ids, self.text[:end], self.sent_ids))

    def finish(self) -> Piece:
        return self._send(len(self.text), len(self.ids))

    def _send(self, end: int, k: int, *, stopped: bool = False) -> Piece:
        piece = Piece(self.text[self.sent_chars:end], self.ids[self.sent_ids:k], stopped)
        self.sent_chars, self.sent_ids = end, max(k, self.sent_ids)
        return piece


def cut_whole(stops: tuple[str, ...], decode: Decode, text: str, ids: Sequence[int]) -> Piece:
    """A whole (non-streamed) answer with the stop strings applied: one :class:`Piece`."""
    cutter = StopCutter(stops, decode)
    piece = cutter.feed(text, ids)
    if piece.stopped:
        return piece
    rest = cutter.finish()
    return Piece(piece.text + rest.text, piece.ids + rest.ids)
