"""Stop strings as the OpenAI front applies them (specbuild.triton_repo.openai_stop), on a real tokenizer.

The tiny test tokenizer (GPT-2-style byte-level BPE) decodes ids as the deployment's postprocessing
does; every chunking of a generation must give the same text, ids and finish as the whole answer.
"""

from __future__ import annotations

import pytest

from specbuild.triton_repo.openai_stop import StopCutter, cut_whole, find_stop, held_back, parse_stop


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    from specbuild.triton_repo.models.tokenization import load_tokenizer

    return load_tokenizer(str(tiny_checkpoint))


def _decode(tokenizer):
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)


def test_parse_stop_takes_what_openai_and_vllm_take():
    assert parse_stop(None) == () and parse_stop("") == () and parse_stop([]) == ()
    assert parse_stop("\n") == ("\n",)
    assert parse_stop(["a", "b", "a"]) == ("a", "b")
    with pytest.raises(ValueError, match=r"stop\[1\] must be a non-empty string"):
        parse_stop(["a", ""])
    with pytest.raises(ValueError, match="string or a list"):
        parse_stop(3)


def test_find_and_hold_back():
    assert find_stop("ab<>c", ["<>", "c"]) == 2
    assert find_stop("abc", ["x"]) is None
    assert held_back("x = 1\n", ["\n\n"]) == 1
    assert held_back("abc", ["\n"]) == 0
    assert held_back("the E", ["END", "Ex"]) == 1 and held_back("the EN", ["END"]) == 2


def _chunkings(ids: list[int]):
    yield [ids]
    yield [[i] for i in ids]
    yield [ids[i:i + 3] for i in range(0, len(ids), 3)]


def _streamed(tokenizer, stops, ids, chunks):
    decode = _decode(tokenizer)
    cutter, text, out, stopped, sent = StopCutter(stops, decode), "", [], False, []
    for chunk in chunks:
        new_text = decode([*sent, *chunk])[len(decode(sent)):]  # what the postprocessing model sends for the step
        sent.extend(chunk)
        piece = cutter.feed(new_text, chunk)
        text, out = text + piece.text, out + piece.ids
        assert text.startswith(decode(out)) or piece.stopped  # ids go out with (never before) their text
        if piece.stopped:
            stopped = True
            break
    if not stopped:
        piece = cutter.finish()
        text, out = text + piece.text, out + piece.ids
    return text, out, stopped


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _cut_alike_streamed(tokenizer, ids: list[int], stops: tuple[str, ...]):
    """The whole answer ``ids`` cut at ``stops`` (a :class:`Piece`), after checking that every chunking
    of the ids streams to the same text, ids and finish."""
    decode = _decode(tokenizer)
    whole = cut_whole(stops, decode, decode(ids), ids)
    for chunks in _chunkings(ids):
        assert _streamed(tokenizer, stops, ids, chunks) == (whole.text, whole.ids, whole.stopped)
    return whole


def test_stop_cuts_text_and_ids_the_same_whole_or_streamed(tokenizer):
    decode = _decode(tokenizer)
    ids = _ids(tokenizer, "The quick brown fox jumps over the lazy dog. The quick brown fox")
    full = decode(ids)
    stop_token = decode(ids[:5])[len(decode(ids[:4])):]  # the text of the 5th token: a stop on a token boundary
    whole = _cut_alike_streamed(tokenizer, ids, (stop_token,))
    assert whole.stopped and whole.text == full[:full.index(stop_token)]
    assert decode(whole.ids) == whole.text and whole.ids == ids[:4]


def test_a_stop_inside_a_token_keeps_the_token_that_starts_it(tokenizer):
    decode = _decode(tokenizer)
    ids = _ids(tokenizer, "hello world, hello there")
    full = decode(ids)
    stop = "ld, h"  # begins inside " world"
    whole = _cut_alike_streamed(tokenizer, ids, (stop,))
    assert whole.text == full[:full.index(stop)] and whole.stopped
    assert decode(whole.ids).startswith(whole.text) and not decode(whole.ids[:-1]).startswith(whole.text)


def test_no_stop_found_returns_everything_and_held_back_text(tokenizer):
    ids = _ids(tokenizer, "abc def ghi")
    stops = ("ghiX", "zzz")  # "ghi" at the end could begin "ghiX": held back, then sent at the end
    whole = _cut_alike_streamed(tokenizer, ids, stops)
    assert (whole.text, whole.ids, whole.stopped) == (_decode(tokenizer)(ids), ids, False)


def test_earliest_of_several_stops_wins(tokenizer):
    whole = _cut_alike_streamed(tokenizer, _ids(tokenizer, "one two three four"), (" four", " two"))
    assert whole.text == "one" and whole.stopped
