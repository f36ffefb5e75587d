"""Training prompts from the user's own data: JSONL prompts, OpenAI-style chat logs rendered with the
target's chat template, weighted mixes of sources, and clear errors for bad lines."""

from __future__ import annotations

import json
import re

import pytest

from specbuild.prompts import Prompt, PromptSourceError, apply_chat_template, load_prompts, render_messages
from specbuild.train.config import TrainConfig
from specbuild.train.sources import TrainDataError, responses_fingerprint, training_prompts, weighted

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    from tiny_models import make_tokenizer

    tokenizer = make_tokenizer(tmp_path_factory.mktemp("tok"))
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def write_jsonl(path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def test_chat_log_lines_keep_the_conversation_and_drop_the_final_assistant_turn(tmp_path):
    log = write_jsonl(tmp_path / "log.jsonl", [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello! How can I help?"}]},
        {"id": "t2", "messages": [{"role": "user", "content": "Add 2 and 3"}, {"role": "assistant", "content": "5"},
                                  {"role": "user", "content": [{"type": "text", "text": "Now "}, {"type": "text", "text": "times 4"}]}]},
        {"prompt": "def f():"},
    ])
    first, second, plain = load_prompts(log)
    assert first == Prompt("log.jsonl:1", "Hi", messages=(("system", "Be brief."), ("user", "Hi")))
    assert second.id == "t2" and second.text == "Now times 4"
    assert second.messages == (("user", "Add 2 and 3"), ("assistant", "5"), ("user", "Now times 4"))  # earlier answers stay
    assert plain == Prompt("log.jsonl:3", "def f():")


def test_conversations_render_with_the_chat_template_and_plain_prompts_stay_as_written(tmp_path, chat_tokenizer):
    log = write_jsonl(tmp_path / "log.jsonl", [
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "A"}]},
        {"prompt": "raw text"},
    ])
    rendered = render_messages(load_prompts(log), chat_tokenizer)
    assert [p.text for p in rendered] == ["<|system|>S<|end|><|user|>Hi<|end|><|assistant|>", "raw text"]
    assert all(p.messages is None for p in rendered)
    # verify / bench send a file's chat log the same way, whatever --chat-template says for files
    assert [p.text for p in apply_chat_template(load_prompts(log), log, "auto", chat_tokenizer)] == [p.text for p in rendered]


def test_a_multi_turn_log_without_a_chat_template_is_refused_with_the_fix(tmp_path, chat_tokenizer):
    from tiny_models import make_tokenizer

    base = make_tokenizer(tmp_path / "base")
    base.chat_template = None
    one = Prompt("a", "Hi", messages=(("user", "Hi"),))
    assert render_messages([one], base) == [Prompt("a", "Hi")]  # a base model reads a lone user turn as raw text
    two = Prompt("b", "Hi", messages=(("system", "S"), ("user", "Hi")))
    with pytest.raises(ValueError, match=r"prompt 'b' is a conversation of 2 turns, but the tokenizer has no chat template"):
        render_messages([two], base)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"messages": []}', r'"messages" must be a non-empty list'),
        ('{"messages": "hi"}', r'"messages" must be a non-empty list'),
        ('{"messages": ["hi"]}', r"messages\[0\] is a JSON str, not an object"),
        ('{"messages": [{"role": "human", "content": "hi"}]}', r"messages\[0\]\.role is 'human'; expected one of system, user"),
        ('{"messages": [{"role": "user", "content": 3}]}', r"messages\[0\]\.content must be a string .* got int"),
        ('{"messages": [{"role": "user"}]}', r"messages\[0\]\.content must be a string"),
        ('{"messages": [{"role": "system", "content": "S"}, {"role": "assistant", "content": "A"}]}', "holds no user turn"),
        ('{"messages": [{"role": "user", "content": "x"}', "invalid JSON"),
    ],
)
def test_bad_chat_log_lines_name_file_line_and_the_fix(tmp_path, line, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(PromptSourceError, match=expected) as e:
        load_prompts(str(path))
    assert f"{path}:2:" in str(e.value)


def test_weighted_takes_a_share_cycling_with_distinct_ids():
    prompts = [Prompt(f"p{i}", f"text {i}") for i in range(4)]
    assert [p.id for p in weighted(prompts, 1.5)] == ["p0", "p1", "p2", "p3", "p0#2", "p1#2"]
    assert [p.id for p in weighted(prompts, 0.5)] == ["p0", "p1"]
    assert [p.id for p in weighted(prompts, 0.01)] == ["p0"]


def test_train_prompts_mix_several_sources_with_weights_and_template_the_bundled_user_messages(tmp_path):
    log = write_jsonl(tmp_path / "traffic.jsonl", [{"messages": [{"role": "user", "content": f"question {i}"}]} for i in range(3)])
    config = TrainConfig(prompts=[{"source": "mixed:code", "weight": 0.1}, {"source": log, "weight": 2}, "humaneval-train"],
                         held_out="humaneval:20")
    train, held_out = training_prompts(config)
    code = load_prompts("mixed:code")
    n_code = round(0.1 * len(code))
    assert [p.id for p in train[:n_code]] == [p.id for p in code[:n_code]]
    assert all(p.messages == (("user", p.text),) for p in train[:n_code])  # bundled user messages: chat template
    assert [p.text for p in train[n_code : n_code + 6]] == [f"question {i}" for i in (0, 1, 2, 0, 1, 2)]
    humaneval = train[n_code + 6 :]
    assert humaneval[0].id == "HumanEval/40" and all(p.messages is None for p in humaneval)  # code stays raw
    assert [p.id for p in held_out] == [f"HumanEval/{i}" for i in range(20)]
    assert config.prompts_label == f"mixed:code x0.1 + {log} x2 + humaneval-train"


@pytest.mark.parametrize(("held_out", "fix"), [
    ("humaneval:50", "use humaneval:N with N <= 40"),
    ("mixed:code:3", "take them out of train.prompts, or hold out another prompt set"),
])
def test_held_out_prompts_that_are_trained_on_are_refused_with_the_fix_for_their_source(held_out, fix):
    config = TrainConfig(prompts=["mixed:code", "humaneval-train"], held_out=held_out)
    with pytest.raises(TrainDataError, match=r"train.held_out: \d+ held-out prompt\(s\) are also training prompts.*" + re.escape(fix)):
        training_prompts(config)


def test_a_conversation_changes_the_data_fingerprint_even_with_the_same_last_user_message():
    config = TrainConfig()
    a = [Prompt("x", "Hi", messages=(("user", "Hi"),))]
    b = [Prompt("x", "Hi", messages=(("system", "Be brief."), ("user", "Hi")))]
    assert responses_fingerprint("t", a, config) != responses_fingerprint("t", b, config)


def test_train_prompts_list_is_validated_by_the_recipe_schema():
    with pytest.raises(ValueError, match="weight"):
        TrainConfig(prompts=[{"source": "mixed", "weight": 0}])
    with pytest.raises(ValueError, match="at least 1"):
        TrainConfig(prompts=[])
    assert TrainConfig(prompts="mixed").prompt_sources[0].weight == 1
