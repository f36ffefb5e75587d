"""Prompt sources: HumanEval from the installed package, .jsonl and .txt files, and their errors."""

from __future__ import annotations

import json

import pytest

from specbuild.prompts import HUMANEVAL_SIZE, Prompt, PromptSourceError, load_prompts


def test_humaneval_n_reads_the_package_file():
    prompts = load_prompts("humaneval:3")
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert len({p.text for p in prompts}) == 3
    for p in prompts:
        assert p.text.lstrip().startswith(("def", "from", "import")), p.text[:40]


def test_humaneval_without_n_is_all_problems():
    prompts = load_prompts("humaneval")
    assert len(prompts) == HUMANEVAL_SIZE == 164
    assert len({p.id for p in prompts}) == 164


@pytest.mark.parametrize("source", ["humaneval:0", "humaneval:165", "humaneval:abc", "humaneval:-1", "humaneval:"])
def test_humaneval_n_out_of_range(source):
    with pytest.raises(PromptSourceError, match=r"humaneval:N with N in 1\.\.164") as e:
        load_prompts(source)
    assert repr(source) in str(e.value)


def test_jsonl_prompt_text_and_ids(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [{"prompt": "def f():", "id": "a"}, {"text": "import os"}, {"prompt": "x\ny", "id": 7}]
    path.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\n\n" + json.dumps(lines[2]) + "\n")
    assert load_prompts(str(path)) == [
        Prompt(id="a", text="def f():"),
        Prompt(id="p.jsonl:2", text="import os"),
        Prompt(id="7", text="x\ny"),
    ]


def test_relative_paths_resolve_against_base_dir(tmp_path):
    (tmp_path / "p.txt").write_text("first prompt\n\nsecond prompt\n")
    assert load_prompts("p.txt", base_dir=tmp_path) == [
        Prompt(id="p.txt:1", text="first prompt"),
        Prompt(id="p.txt:3", text="second prompt"),
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"prompt": "ok"', "invalid JSON"),
        ('["a list"]', "got a JSON list"),
        ('{"id": "x"}', 'no string "prompt" or "text"'),
        ('{"prompt": 3}', 'no string "prompt" or "text"'),
        ('{"prompt": "ok", "id": [1]}', '"id" must be a string or integer'),
    ],
)
def test_bad_jsonl_line_names_file_line_and_expectation(tmp_path, line, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(PromptSourceError) as e:
        load_prompts(str(path))
    message = str(e.value)
    assert f"{path}:2:" in message
    assert expected in message
    assert 'expected a JSON object with a string "prompt" or "text"' in message


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("latin1.txt", "first\ncaf\xe9 au lait\n".encode("latin-1"), r"latin1\.txt:2: not UTF-8 text \(byte 0xe9, byte 4 of the line\); save the file as UTF-8"),
        ("cr-only.txt", b"one\rtwo\rcaf\xe9\r", r"cr-only\.txt:3: not UTF-8 text \(byte 0xe9, byte 4 of the line\)"),
        ("latin1.jsonl", b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n', r"latin1\.jsonl:2: not UTF-8 text"),
        ("surrogate.jsonl", b'{"prompt": "a"}\n{"prompt": "bad \\ud800 escape"}\n', r"surrogate\.jsonl:2: .*lone UTF-16 surrogate"),
        ("surrogate-chat.jsonl", b'{"prompt": "a"}\n{"messages": [{"role": "user", "content": "x\\udfff"}]}\n', r"surrogate-chat\.jsonl:2: .*surrogate"),
        ("deep.jsonl", b'{"prompt": "a"}\n' + b"[" * 200_000 + b"\n", r"deep\.jsonl:2: JSON that cannot be read \(nested too deeply\)"),
        ("bigint.jsonl", b'{"prompt": "a"}\n{"prompt": "b", "id": ' + b"9" * 5000 + b"}\n", r"bigint\.jsonl:2: JSON that cannot be read"),
    ],
)
def test_text_python_cannot_hold_is_refused_with_its_line(tmp_path, name, data, expected):
    """A Latin-1 chat export, a JSON lone surrogate escape, absurd nesting or a 5000-digit id: a clear error
    at the line (a verify, bench or training prompt file), not a UnicodeDecodeError or RecursionError."""
    (tmp_path / name).write_bytes(data)
    with pytest.raises(PromptSourceError, match=expected):
        load_prompts(str(tmp_path / name))


def test_lines_end_as_in_text_mode(tmp_path):
    (tmp_path / "ends.txt").write_bytes(b"one\r\ntwo\rthree\n\nfour")
    assert [(p.id, p.text) for p in load_prompts(str(tmp_path / "ends.txt"))] == [
        ("ends.txt:1", "one"), ("ends.txt:2", "two"), ("ends.txt:3", "three"), ("ends.txt:5", "four")]


def test_duplicate_id_is_an_error(tmp_path):
    path = tmp_path / "dup.jsonl"
    path.write_text('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n')
    with pytest.raises(PromptSourceError, match=r"dup\.jsonl:2: duplicate id 'x'"):
        load_prompts(str(path))


def test_missing_file_names_the_source(tmp_path):
    with pytest.raises(PromptSourceError, match=r"'nope\.jsonl': no such file") as e:
        load_prompts("nope.jsonl", base_dir=tmp_path)
    assert "humaneval" in str(e.value)  # says what is expected


def test_unknown_scheme():
    with pytest.raises(PromptSourceError, match=r"unknown scheme 'mbpp'.*expected 'humaneval'"):
        load_prompts("mbpp:10")


def test_unsupported_file_type_and_empty_file(tmp_path):
    (tmp_path / "p.csv").write_text("a,b\n")
    with pytest.raises(PromptSourceError, match=r"unsupported file type '\.csv'"):
        load_prompts(str(tmp_path / "p.csv"))
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(PromptSourceError, match="no prompts"):
        load_prompts(str(tmp_path / "empty.txt"))


# --- chat template (verify and bench send the bundled chat-style sets inside it) ---------------------

TEMPLATE = "{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    from tiny_models import make_tokenizer

    tokenizer = make_tokenizer(tmp_path_factory.mktemp("tok"))
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_auto_wraps_the_bundled_chat_sets_and_keeps_ids(chat_tokenizer):
    from specbuild.prompts import apply_chat_template

    for source in ("chat:3", "summarize:2"):
        raw = load_prompts(source)
        wrapped = apply_chat_template(raw, source, "auto", chat_tokenizer)
        assert [p.id for p in wrapped] == [p.id for p in raw]
        assert [p.text for p in wrapped] == [f"<|user|>{p.text}<|end|><|assistant|>" for p in raw]


def test_auto_leaves_humaneval_and_files_as_written(chat_tokenizer, tmp_path):
    from specbuild.prompts import apply_chat_template

    raw = load_prompts("humaneval:2")
    assert apply_chat_template(raw, "humaneval:2", "auto", chat_tokenizer) == raw
    assert apply_chat_template(raw, "humaneval:2", "always", chat_tokenizer)[0].text == f"<|user|>{raw[0].text}<|end|><|assistant|>"
    chat = load_prompts("chat:2")
    assert apply_chat_template(chat, "chat:2", "never", None) == chat


def test_chat_set_without_a_tokenizer_says_how_to_fix_it(chat_tokenizer):
    from specbuild.prompts import apply_chat_template

    with pytest.raises(ValueError, match=r"--tokenizer OUT/engine/tokenizer.*--chat-template never"):
        apply_chat_template(load_prompts("chat:1"), "chat:1", "auto", None)
    with pytest.raises(ValueError, match="must be one of auto, always, never"):
        apply_chat_template(load_prompts("chat:1"), "chat:1", "sometimes", chat_tokenizer)


def test_a_base_model_without_a_template_gets_raw_text_under_auto_but_always_is_refused(tmp_path):
    from tiny_models import make_tokenizer

    from specbuild.prompts import apply_chat_template

    base = make_tokenizer(tmp_path)
    base.chat_template = None
    chat = load_prompts("chat:2")
    assert apply_chat_template(chat, "chat:2", "auto", base) == chat
    with pytest.raises(ValueError, match="the tokenizer has no chat template"):
        apply_chat_template(chat, "chat:2", "always", base)


def test_verify_cli_asks_the_deployment_for_the_tokenizer_of_chat_prompts(monkeypatch):
    """Chat prompts without --tokenizer: verify takes the deployment's own (its preprocessing model names
    it), so an unreachable server is what it reports (exit 3); a deployment that names none (a foreign
    repository) gets the bad-input refusal with the way out (exit 2)."""
    from click.testing import CliRunner

    import specbuild.client.sdk
    from fake_client import ReadyClient
    from specbuild.cli import main

    result = CliRunner().invoke(main, ["verify", "--url", "127.0.0.1:9", "--prompts", "chat:2", "--wait-s", "0"])
    assert result.exit_code == 3 and "not reachable" in result.output  # specbuild.exit_codes: server unavailable
    monkeypatch.setattr(specbuild.client.sdk, "SpecClient", ReadyClient)  # ready, and its configs say nothing
    result = CliRunner().invoke(main, ["verify", "--url", "127.0.0.1:9", "--prompts", "chat:2", "--wait-s", "0"])
    assert result.exit_code == 2  # bad input
    assert "--chat-template never" in result.output and "unavailable" not in result.output.lower()


def test_an_empty_prompt_source_is_named_not_read_as_the_recipes_folder(tmp_path):
    for source in ("", "   "):
        with pytest.raises(PromptSourceError, match="prompt source is empty; expected 'humaneval'"):
            load_prompts(source, base_dir=tmp_path)


def test_a_prompt_file_read_again_is_the_file_as_it_is_now_under_the_name_given(tmp_path):
    """load_prompts keeps a file's prompts while it is unchanged (plan reads sources several times); a link
    gets ids from its own name, and a rewrite that keeps size and mtime (cp -p) is read anew."""
    import os

    first = tmp_path / "a.jsonl"
    first.write_text('{"prompt": "one"}\n')
    link = tmp_path / "b.jsonl"
    link.symlink_to(first)
    assert [p.id for p in load_prompts(str(first))] == ["a.jsonl:1"]
    assert [p.id for p in load_prompts(str(link))] == ["b.jsonl:1"]
    stat = first.stat()
    first.write_text('{"prompt": "two"}\n')
    os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert [p.text for p in load_prompts(str(first))] == ["two"]
    prompts = load_prompts(str(first))
    prompts.clear()  # the caller's list: the next read is whole
    assert [p.text for p in load_prompts(str(first))] == ["two"]
