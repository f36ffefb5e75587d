"""What the OpenAI front refuses before it asks the deployment, through the real FastAPI app.

Fields that would change the output and that the deployment cannot honour are refused with a 400 naming
the field and value (they used to be ignored: same text as without them); neutral values pass; unknown
fields are refused; malformed JSON and wrong types get a plain message; token-id prompts are taken when
the deployment's tokenizer splits their text into the same ids. Refusals happen before any generation,
so the app here points at a port where nothing listens: a request that got past the checks would be a
503, not a 400 or 200.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specbuild.triton_repo.openai_fields import BEGIN, END, FIELDS, RefusedField, check_fields, fields_markdown
from specbuild.triton_repo.openai_frontend import field_named, server_message

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def app(tiny_checkpoint):
    from fastapi.testclient import TestClient

    from specbuild.triton_repo.openai_frontend import FrontendConfig, create_app
    from specbuild.triton_repo.tritonserver import free_port

    config = FrontendConfig(f"127.0.0.1:{free_port('127.0.0.1')}", "tiny", str(tiny_checkpoint), timeout_s=2.0)
    with TestClient(create_app(config)) as client:
        client.tokenizer = client.app.state.front.tokenizer
        yield client


def _error(response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.mark.parametrize("route, field, value", [
    ("completions", "frequency_penalty", 1.5),
    ("completions", "presence_penalty", -0.5),
    ("completions", "repetition_penalty", 1.2),
    ("completions", "min_tokens", 3),
    ("completions", "min_p", 0.1),
    ("completions", "stop_token_ids", [5]),
    ("completions", "logit_bias", {"5": 100}),
    ("completions", "best_of", 2),
    ("completions", "echo", True),
    ("completions", "guided_regex", "[a-z]+"),
    ("chat", "response_format", {"type": "json_object"}),
    ("chat", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("chat", "tool_choice", "required"),
    ("chat", "structured_outputs", {"json": {"type": "object"}}),
    ("chat", "skip_special_tokens", False),
])
def test_output_changing_fields_are_refused_by_name(app, route, field, value):
    body = {"max_tokens": 4, "temperature": 0, field: value,
            **({"messages": [{"role": "user", "content": "hi"}]} if route == "chat" else {"prompt": "hi"})}
    error = _error(app.post(f"/v1/{'chat/completions' if route == 'chat' else 'completions'}", json=body))
    assert error["param"] == field and error["type"] == "invalid_request_error" and error["code"] == 400
    assert error["message"].startswith(f"{field}={json.dumps(value)} is not supported: ")
    assert "leave it out" in error["message"]


def test_neutral_values_pass_the_checks(app):
    """Neutral values reach the deployment: here nothing listens, so they end as 503, not 400."""
    neutral = {"frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_tokens": 0,
               "logit_bias": {}, "best_of": 1, "echo": False, "n": 1, "user": "u-1", "stop_token_ids": [],
               "logprobs": None, "stream_options": {"include_usage": True}, "seed": 3, "top_k": -1}
    response = app.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, **neutral})
    assert response.status_code == 503, response.text
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2, "response_format": {"type": "text"},
            "tool_choice": "none", "parallel_tool_calls": False, "metadata": {"k": "v"}, "store": False, "service_tier": "auto"}
    error = _error(app.post("/v1/chat/completions", json=chat))  # past the field checks: the tiny tokenizer has no chat template
    assert error["param"] == "messages" and "chat template" in error["message"]


def test_unknown_fields_are_refused_with_a_suggestion(app):
    error = _error(app.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "frequency_penalt": 1}))
    assert error["param"] == "frequency_penalt" and "did you mean 'frequency_penalty'" in error["message"]
    error = _error(app.post("/v1/completions", json={"prompt": "hi", "tools": []}))
    assert error["param"] == "tools" and "/v1/chat/completions" in error["message"]
    error = _error(app.post("/v1/completions", json={"prompt": "hi", "stream_options": {"continuous_usage_stats": True}}))
    assert error["param"] == "stream_options"


def test_malformed_json_says_where(app):
    response = app.post("/v1/completions", content=b'{"prompt": "hi",\n "max_tokens": }', headers={"Content-Type": "application/json"})
    error = _error(response)
    assert error["param"] is None
    assert error["message"] == "request body is not valid JSON: Expecting value at line 2 column 16"


def test_wrong_types_name_the_field_without_pydantic_internals(app):
    error = _error(app.post("/v1/completions", json={"prompt": "hi", "max_tokens": "many"}))
    assert error["param"] == "max_tokens" and error["message"].startswith('max_tokens=\'many\': ')
    error = _error(app.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": 5}]}))
    assert error["param"] == "messages.0.content" and "str" not in error["param"]
    error = _error(app.post("/v1/completions", json={"prompt": {"text": "hi"}}))
    assert error["param"] == "prompt" and "token ids" in error["message"]


def test_token_id_prompts(app):
    """A token-id prompt whose text splits back into the same ids passes (503 here: it reached the
    deployment); a batch, ids outside the vocabulary and ids that do not round-trip are 400s."""
    ids = app.tokenizer("def fib(n): return n", add_special_tokens=True)["input_ids"]
    assert app.post("/v1/completions", json={"prompt": ids, "max_tokens": 2}).status_code == 503
    assert app.post("/v1/completions", json={"prompt": [ids], "max_tokens": 2}).status_code == 503
    error = _error(app.post("/v1/completions", json={"prompt": [ids, ids]}))
    assert error["param"] == "prompt" and "batch of 2 prompts" in error["message"]
    error = _error(app.post("/v1/completions", json={"prompt": [1, 10**6]}))
    assert error["param"] == "prompt" and "[1000000]" in error["message"]
    pieces = [app.tokenizer.convert_tokens_to_ids(c) for c in "fib"]  # one id per character: not how "fib" is split
    assert app.tokenizer("fib", add_special_tokens=True)["input_ids"] != pieces
    error = _error(app.post("/v1/completions", json={"prompt": pieces}))
    assert error["param"] == "prompt" and "splits as" in error["message"] and "'fib'" in error["message"]


def test_the_deployment_refusal_keeps_only_the_users_part():
    raw = ("in ensemble 'ensemble', InvalidRequestError: num_draft_tokens=99 is out of range; allowed: 0..4 "
           "(the engine's max_draft_len) or None")
    assert server_message(raw) == "num_draft_tokens=99 is out of range; allowed: 0..4 (the engine's max_draft_len) or None"
    assert field_named(server_message(raw), None) == "num_draft_tokens"
    assert field_named("len(input_ids) + max_tokens = 3 + 900 = 903 exceeds max_seq_len=512", None) == "max_tokens"
    assert field_named("input_ids has 900 tokens; allowed: 1..512", None) == "prompt"
    assert field_named("something else happened", None) is None


def test_check_fields_direct():
    with pytest.raises(RefusedField, match="frequency_penalty=1.5 is not supported") as refused:
        check_fields({"frequency_penalty": 1.5}, "completions")
    assert refused.value.param == "frequency_penalty"
    check_fields({"frequency_penalty": 0, "logprobs": False, "top_logprobs": 0}, "chat")
    with pytest.raises(RefusedField):  # a boolean is not the number 0
        check_fields({"frequency_penalty": False}, "completions")


def test_min_tokens_passes_only_where_ignore_eos_already_fixes_the_length():
    """AIPerf users fix the output length with min_tokens = max_tokens and ignore_eos: that asks for nothing more."""
    check_fields({"max_tokens": 64, "min_tokens": 64, "ignore_eos": True}, "completions")
    check_fields({"max_completion_tokens": 32, "min_tokens": 8, "ignore_eos": True}, "chat")
    for body in ({"max_tokens": 64, "min_tokens": 64}, {"max_tokens": 8, "min_tokens": 64, "ignore_eos": True},
                 {"max_tokens": 64, "min_tokens": 8, "ignore_eos": False}):
        with pytest.raises(RefusedField, match="min_tokens=") as info:
            check_fields(body, "completions")
        assert info.value.param == "min_tokens"


def test_docs_table_is_the_codes():
    text = (ROOT / "docs" / "openai.md").read_text()
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert table == fields_markdown(), "run: python -m specbuild.triton_repo.openai_fields docs/openai.md"
    documented = set(re.findall(r"^\| `(\w+)` \|", table, flags=re.M))
    assert documented == {f.name for f in FIELDS}


def test_unseeded_sampled_requests_get_a_fresh_seed_and_greedy_ones_none():
    from specbuild.triton_repo.openai_frontend import UNSEEDED_RANGE, CompletionRequest

    seeds = {CompletionRequest(prompt="hi", temperature=0.7).sampling()["seed"] for _ in range(64)}
    assert len(seeds) == 64 and all(0 <= s < UNSEEDED_RANGE for s in seeds)
    assert CompletionRequest(prompt="hi", temperature=0.7, seed=5).sampling()["seed"] == 5
    assert "seed" not in CompletionRequest(prompt="hi", temperature=0).sampling()  # greedy: no seed sent


def test_a_chat_request_without_max_tokens_gets_the_rest_of_the_context(tmp_path):
    """OpenAI's chat API and vLLM default max_tokens to what the context leaves (LangChain's ChatOpenAI
    sends none): not 16. /v1/completions keeps OpenAI's legacy 16; a sent value always wins, and the
    server's --openai-max-tokens caps the default."""
    from specbuild.triton_repo.openai_access import FrontLimits
    from specbuild.triton_repo.openai_frontend import (
        ChatCompletionRequest,
        CompletionRequest,
        FrontendConfig,
        _engine_max_seq_len,
        _max_tokens,
    )

    config = FrontendConfig("127.0.0.1:1", "m", "tok", max_seq_len=100)
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}])
    assert _max_tokens(chat, 30, config) == 70
    assert _max_tokens(chat, 30, FrontendConfig("127.0.0.1:1", "m", "tok", max_seq_len=100, limits=FrontLimits(max_tokens=50))) == 50
    assert _max_tokens(chat, 30, FrontendConfig("127.0.0.1:1", "m", "tok")) == 16  # context unknown
    sent = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], max_completion_tokens=5)
    assert _max_tokens(sent, 30, config) == 5
    assert _max_tokens(CompletionRequest(prompt="hi"), 30, config) == 16
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    (engine_dir / "config.json").write_text(json.dumps({"build_config": {"max_seq_len": 2048}}))
    assert _engine_max_seq_len({"parameters": {"engine_dir": {"string_value": str(engine_dir)}}}) == 2048
    assert _engine_max_seq_len({"parameters": {}}) is None
