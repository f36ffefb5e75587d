"""The OpenAI door both ways, end to end with real servers (no mocks).

(b) specbuild's FastAPI/uvicorn front in front of a real (decoupled) tritonserver on the tiny model:
/v1/models, /v1/completions and /v1/chat/completions, streamed and not, token ids and the
``spec_decode`` extension, errors in OpenAI's shape, strict JSON everywhere.
(a) specbuild's OpenAI client (verify, bench) against (b): the ids through the OpenAI door equal
the ids through Triton's own gRPC; ``specbuild verify --openai URL`` and ``--openai-baseline URL``
pass. About 60 s on 2 CPU cores.
"""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from specbuild.client.openai_client import OpenAIClient, PairedClient, normalize_base_url, parse_acceptance_metrics
from specbuild.client.prompts import Prompt
from test_strict_json import strict_loads

pytestmark = pytest.mark.e2e

PROMPTS = [
    "for i in range(10):\n    print(i, i * i)\nfor i in range(10):\n    print(i",
    "def fib(n):\n    if n < 2:\n        return n\n",
    "The quick brown fox jumps over the lazy dog.",
]
CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


@pytest.fixture(scope="module")
def deployment(decoupled_server, tmp_path_factory):
    """The shared decoupled tritonserver, a speculative OpenAI front and a speculation-off one on it."""
    from specbuild.triton_repo.openai_frontend import OpenAIServer, config_from_deployment

    triton, engine_dir = decoupled_server
    out = tmp_path_factory.mktemp("openai")
    config = config_from_deployment(triton.grpc_url, model="tiny-ngram")
    assert config.decoupled and config.tokenizer_dir == str((engine_dir / "tokenizer").resolve())
    # The tiny tokenizer has no chat template: give the front a copy that has one.
    tokenizer_dir = out / "chat-tokenizer"
    shutil.copytree(config.tokenizer_dir, tokenizer_dir)
    settings = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": CHAT_TEMPLATE}))
    config = type(config)(**{**config.__dict__, "tokenizer_dir": str(tokenizer_dir)})
    baseline_config = type(config)(**{**config.__dict__, "num_draft_tokens": 0, "model": "tiny-plain"})
    with OpenAIServer(config, port=0) as front, OpenAIServer(baseline_config, port=0) as baseline:
        yield triton, front, baseline


def _post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url, json=body, timeout=120)


def test_models_and_health(deployment):
    _, front, _ = deployment
    models = strict_loads(httpx.get(front.url + "/models").text)
    assert [m["id"] for m in models["data"]] == ["tiny-ngram"] and models["data"][0]["owned_by"] == "specbuild"
    root = front.url.removesuffix("/v1")
    assert httpx.get(root + "/health").status_code == 200


def test_completion_ids_equal_the_triton_ids_and_carry_acceptance(deployment):
    from specbuild.client.sdk import SpecClient

    triton, front, _ = deployment
    with SpecClient(triton.grpc_url, decoupled=True) as client:
        expected = client.generate(PROMPTS[0], max_tokens=12, end_id=-1)
    body = {"model": "tiny-ngram", "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    data = strict_loads(_post(front.url + "/completions", body).text)
    choice = data["choices"][0]
    assert choice["token_ids"] == expected.output_ids and choice["text"] == expected.text
    assert choice["finish_reason"] == "length" and data["usage"]["completion_tokens"] == 12
    assert data["usage"]["prompt_tokens"] == len(choice["prompt_token_ids"]) > 0
    spec = data["spec_decode"]
    assert spec["total_draft_tokens"] == expected.total_draft_tokens
    assert spec["total_accepted_draft_tokens"] == expected.total_accepted_draft_tokens
    assert spec["num_spec_steps"] == 12 - 1 - spec["total_accepted_draft_tokens"]
    assert spec["mean_acceptance_length"] == expected.acceptance_length and spec["acceptance_source"] == "perf_metrics"
    # specbuild 0.1's keys, kept one release with the same values
    assert (spec["draft_tokens"], spec["accepted_draft_tokens"], spec["decode_steps"], spec["acceptance_length"]) == (
        spec["total_draft_tokens"], spec["total_accepted_draft_tokens"], spec["num_spec_steps"], spec["mean_acceptance_length"])
    off = strict_loads(_post(front.url + "/completions", {**body, "num_draft_tokens": 0}).text)
    assert off["choices"][0]["token_ids"] == expected.output_ids and off["spec_decode"]["total_draft_tokens"] == 0
    assert off["spec_decode"]["acceptance_rate"] is None  # nothing drafted: null, never NaN


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_events_concatenate_to_the_whole_answer(deployment, chat):
    _, front, _ = deployment
    client = OpenAIClient(front.url, chat=chat, draft_field=True)
    whole = client.generate(PROMPTS[1], max_tokens=10, end_id=-1)
    chunks = list(client.generate_stream(PROMPTS[1], max_tokens=10, end_id=-1))
    assert len(chunks) >= 2  # one event per decoding step
    assert [t for c in chunks for t in c.output_ids] == whole.output_ids and len(whole.output_ids) == 10
    assert "".join(c.text for c in chunks) == whole.text
    assert chunks[-1].total_draft_tokens == whole.total_draft_tokens
    assert all(b.latency_s >= a.latency_s for a, b in zip(chunks, chunks[1:]))
    client.close()


def test_raw_stream_is_openai_shaped_strict_json(deployment):
    _, front, _ = deployment
    body = {"prompt": PROMPTS[2], "max_tokens": 6, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}
    lines = [line for line in _post(front.url + "/completions", body).text.splitlines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    events = [strict_loads(line[5:]) for line in lines[:-1]]
    assert all(e["object"] == "text_completion" for e in events)
    assert "prompt_token_ids" in events[0]["choices"][0]
    assert events[-1]["usage"]["completion_tokens"] == sum(len(e["choices"][0].get("token_ids", [])) for e in events if e["choices"])
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")


def test_errors_are_openai_shaped(deployment):
    _, front, _ = deployment
    cases = [
        ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": "hi", "n": 2}, 400, "n"),
        ({"prompt": "hi", "n": 0}, 400, "n"),
        ({"prompt": "hi", "logprobs": 2}, 400, "logprobs"),
        ({"prompt": "hi", "top_logprobs": 2}, 400, "top_logprobs"),
        ({"prompt": "hi", "stop": ["ok", ""]}, 400, "stop"),
        ({"prompt": "hi", "model": "other"}, 404, "model"),
    ]
    for body, status, param in cases:
        response = _post(front.url + "/completions", body)
        assert response.status_code == status, response.text
        error = strict_loads(response.text)["error"]
        assert error["param"] == param and error["message"]


@pytest.mark.parametrize("body, name", [
    ({"max_tokens": 2**32 + 8}, "max_tokens"),  # used to run as 8 tokens, finish_reason "stop"
    ({"max_tokens": 4, "num_draft_tokens": 2**32}, "num_draft_tokens"),  # used to run as 0: no speculation
    ({"max_tokens": 4, "temperature": 1.0, "seed": 2**64}, "seed"),  # used to answer a plain-text 500
])
def test_values_the_tensors_cannot_carry_are_refused_by_name(deployment, body, name):
    _, front, _ = deployment
    response = _post(front.url + "/completions", {"prompt": "hi", **body})
    assert response.status_code == 400, response.text
    error = strict_loads(response.text)["error"]
    assert error["type"] == "invalid_request_error" and f"{name}=" in error["message"] and "does not fit" in error["message"]


def test_a_deployment_refusal_names_the_field_without_the_transport_chain(deployment):
    _, front, _ = deployment
    for route, body, param in [
        ("/completions", {"prompt": "hi", "max_tokens": 4, "num_draft_tokens": 99}, "num_draft_tokens"),
        ("/completions", {"prompt": "hi", "max_tokens": 100000}, "max_tokens"),
        ("/completions", {"prompt": "hi", "max_tokens": 4, "num_draft_tokens": 99, "stream": True}, "num_draft_tokens"),
    ]:
        response = _post(front.url + route, body)
        if body.get("stream"):  # refused after the stream began: an error event (docs/openai.md)
            error = _events(response)[-1]["error"]
            assert error["code"] == 400
        else:
            assert response.status_code == 400, response.text
            error = strict_loads(response.text)["error"]
        assert error["param"] == param and error["message"].startswith(("num_draft_tokens=99", "len(input_ids) + max_tokens"))
        assert "ensemble" not in error["message"] and "grpc" not in error["message"] and "Error:" not in error["message"]


def test_a_token_id_prompt_answers_as_its_text(deployment):
    _, front, _ = deployment
    text = {"prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    by_text = strict_loads(_post(front.url + "/completions", text).text)["choices"][0]
    ids = by_text["prompt_token_ids"]
    by_ids = strict_loads(_post(front.url + "/completions", {**text, "prompt": ids}).text)["choices"][0]
    assert by_ids["prompt_token_ids"] == ids and by_ids["token_ids"] == by_text["token_ids"] and by_ids["text"] == by_text["text"]


def test_logprobs_refusal_says_what_is_supported(deployment):
    _, front, _ = deployment
    response = _post(front.url + "/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True})
    error = strict_loads(response.text)["error"]
    assert response.status_code == 400 and error["param"] == "logprobs"
    assert "no log probabilities" in error["message"] and "return_token_ids" in error["message"]
    ok = _post(front.url + "/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                 "logprobs": False, "top_logprobs": 0})
    assert ok.status_code == 200, ok.text


def test_created_is_stamped_per_response(deployment):
    import time

    _, front, _ = deployment
    body = {"prompt": "hi", "max_tokens": 1, "temperature": 0}
    first = strict_loads(_post(front.url + "/completions", body).text)["created"]
    time.sleep(1.1)
    second = strict_loads(_post(front.url + "/completions", body).text)["created"]
    events = _events(_post(front.url + "/completions", {**body, "stream": True}))
    assert second > first and events[0]["created"] >= second
    assert abs(second - time.time()) < 30


def test_unseeded_sampling_differs_per_request_and_a_seed_repeats(deployment):
    """OpenAI and vLLM clients take an unseeded sampled request to be random (nc3 item 4: two unseeded
    requests used to give the same text). 24 tokens at temperature 1.5 over the tiny vocabulary: two
    independent draws agree with negligible probability; ignore_eos keeps the lengths equal."""
    _, front, _ = deployment
    body = {"prompt": "hi", "max_tokens": 24, "temperature": 1.5, "ignore_eos": True, "return_token_ids": True}
    ids = lambda extra: strict_loads(_post(front.url + "/completions", {**body, **extra}).text)["choices"][0]["token_ids"]  # noqa: E731
    unseeded = [ids({}), ids({})]
    assert len(unseeded[0]) == len(unseeded[1]) == 24 and unseeded[0] != unseeded[1]
    assert ids({"seed": 11}) == ids({"seed": 11})


def _events(response: httpx.Response) -> list[dict]:
    lines = [line for line in response.text.splitlines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    return [strict_loads(line[5:]) for line in lines[:-1]]


def _stop_case(front, chat: bool = False):
    """A route, a greedy request, its answer's ids and a stop string from the answer's middle, on a token boundary."""
    route = "/chat/completions" if chat else "/completions"
    body = {"max_tokens": 12, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
            **({"messages": [{"role": "user", "content": PROMPTS[0]}]} if chat else {"prompt": PROMPTS[0]})}
    ids = strict_loads(_post(front.url + route, body).text)["choices"][0]["token_ids"]
    tokenizer = front_tokenizer(front)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    piece = lambda k: decode(ids[:k + 1])[len(decode(ids[:k])):]  # noqa: E731 - the text token k adds
    cut = next(k for k in range(3, len(ids)) if piece(k).strip() and piece(k) not in decode(ids[:k]))
    return route, body, ids, decode, piece(cut)


def front_tokenizer(front):
    from specbuild.triton_repo.models.tokenization import load_tokenizer

    return load_tokenizer(front.config.tokenizer_dir)


@pytest.mark.parametrize("chat", [False, True])
def test_stop_cuts_text_ids_and_finish_reason(deployment, chat):
    _, front, _ = deployment
    route, body, ids, decode, stop = _stop_case(front, chat)
    text = decode(ids)
    expected_text = text[:text.index(stop)]
    expected_ids = ids[:next(k for k in range(len(ids) + 1) if decode(ids[:k]).startswith(expected_text))]
    assert decode(expected_ids) == expected_text and 0 < len(expected_ids) < len(ids)
    for stops in (stop, [stop, "never-generated-zzz"]):
        data = strict_loads(_post(front.url + route, {**body, "stop": stops}).text)
        choice = data["choices"][0]
        got_text = choice["message"]["content"] if chat else choice["text"]
        assert (got_text, choice["token_ids"]) == (expected_text, expected_ids)
        assert choice["finish_reason"] == "stop" and data["usage"]["completion_tokens"] == len(expected_ids)
        # the speculation figures cover what the engine generated, past the stop: said, not hidden
        assert data["spec_decode"]["num_generated_tokens"] == len(ids) > data["usage"]["completion_tokens"]
        events = _events(_post(front.url + route, {**body, "stop": stops, "stream": True,
                                                    "stream_options": {"include_usage": True}}))
        pieces = [e["choices"][0] for e in events if e["choices"]]
        streamed_text = "".join(p.get("text") or (p.get("delta") or {}).get("content") or "" for p in pieces)
        streamed_ids = [t for p in pieces for t in p.get("token_ids", [])]
        assert (streamed_text, streamed_ids) == (expected_text, expected_ids)
        assert pieces[-1]["finish_reason"] == "stop" and events[-1]["usage"]["completion_tokens"] == len(expected_ids)


def test_a_stop_never_generated_changes_nothing(deployment):
    _, front, _ = deployment
    route, body, ids, decode, _ = _stop_case(front)
    data = strict_loads(_post(front.url + route, {**body, "stop": "never-generated-zzz"}).text)["choices"][0]
    assert (data["text"], data["token_ids"], data["finish_reason"]) == (decode(ids), ids, "length")


def test_streaming_mode_is_in_a_header(deployment):
    _, front, _ = deployment
    response = _post(front.url + "/completions", {"prompt": "hi", "max_tokens": 2, "stream": True})
    assert response.headers["x-specbuild-streaming"] == "per-step"


def test_metrics_count_what_the_responses_said(deployment):
    _, front, _ = deployment
    before = parse_acceptance_metrics(httpx.get(front.url.removesuffix("/v1") + "/metrics").text)
    result = OpenAIClient(front.url, draft_field=True).generate(PROMPTS[0], max_tokens=8, end_id=-1)
    after = parse_acceptance_metrics(httpx.get(front.url.removesuffix("/v1") + "/metrics").text)
    assert after.source == "specbuild"
    assert after.values["generated_tokens"] - (before.values["generated_tokens"] if before else 0) == 8
    assert after.values["draft_tokens"] - (before.values["draft_tokens"] if before else 0) == result.total_draft_tokens


def test_verify_through_the_openai_door(deployment):
    from specbuild.client.verify import verify

    _, front, baseline = deployment
    prompts = [Prompt(f"p{i}", text) for i, text in enumerate(PROMPTS)]
    with OpenAIClient(front.url, draft_field=True) as client:
        report = verify(client, prompts, max_tokens=12, end_id=-1, margins=False)
    assert report.all_match and all(r.speculative.total_draft_tokens for r in report.results)
    paired = PairedClient(OpenAIClient(front.url), OpenAIClient(baseline.url))
    report = verify(paired, prompts, max_tokens=12, end_id=-1, margins=False)
    assert report.all_match
    assert all(r.baseline.total_draft_tokens == 0 and r.speculative.total_draft_tokens > 0 for r in report.results)
    paired.close()


def test_verify_cli_with_openai_urls(deployment, tmp_path):
    from click.testing import CliRunner

    from specbuild.cli import main

    _, front, baseline = deployment
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(PROMPTS)))
    for extra in ([], ["--openai-baseline", baseline.url]):
        report = tmp_path / f"report{len(extra)}.json"
        result = CliRunner().invoke(main, ["verify", "--openai", front.url, *extra, "--prompts", str(prompts),
                                           "--max-tokens", "10", "--end-id", "-1", "--report", str(report)])
        assert result.exit_code == 0, result.output
        data = json.loads(report.read_text())
        assert data["summary"]["num_prompts"] == 3 and data["summary"]["num_match"] == 3


def test_bench_sweeps_an_openai_target(deployment, tmp_path):
    from specbuild.bench import SweepPlan, openai_deployments, run_sweep

    _, front, _ = deployment
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(PROMPTS)))
    targets = openai_deployments([front.url], labels=["front"], stream=True)
    plan = SweepPlan(draft_lengths=(0, 2), concurrencies=(2,), prompt_sets=(str(prompts),), max_tokens=8, end_id=-1,
                     chat_template="never")
    result = run_sweep(targets, plan)
    assert [p.draft_len for p in result.points] == [0, 2]
    assert all(not p.problems for p in result.points), [p.problems for p in result.points]
    assert result.points[1].ids_match_baseline == 1.0 and result.points[1].ttft_ms_p50 is not None
    assert all(p.counters_checked for p in result.points)  # the front's /metrics rose by the client's sums
    for p in result.points:  # the server-side figures read the way a foreign server's are
        assert p.server_acceptance["source"] == "specbuild"
        assert p.server_acceptance["draft_tokens"] == sum(r["total_draft_tokens"] for r in result.requests if r["draft_len"] == p.draft_len)


def test_base_url_normalization():
    assert normalize_base_url("127.0.0.1:9000") == "http://127.0.0.1:9000/v1"
    assert normalize_base_url("http://h:1/v1/") == "http://h:1/v1"


def test_acceptance_metrics_of_other_servers():
    vllm = ('# TYPE vllm:spec_decode_num_draft_tokens_total counter\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 30.0\n')
    assert parse_acceptance_metrics(vllm).values == {"draft_tokens": 40.0, "accepted_tokens": 30.0}
    sglang = 'sglang:spec_accept_length{model_name="m",tp_rank="0"} 2.5\n'
    assert parse_acceptance_metrics(sglang).source == "sglang"
    trtllm = json.dumps([{"iter": 1, "specDecodingStats": {"numDraftTokens": 3, "numAcceptedTokens": 2}},
                         {"iter": 2, "specDecodingStats": {"numDraftTokens": 3, "numAcceptedTokens": 1}}])
    assert parse_acceptance_metrics(trtllm).values == {"draft_tokens": 6.0, "accepted_tokens": 3.0}
    assert parse_acceptance_metrics("up 1\n") is None


def test_acceptance_over_an_interval():
    from specbuild.client.openai_client import ServerAcceptance, acceptance_over

    before = ServerAcceptance("vllm", {"drafts": 10.0, "draft_tokens": 40.0, "accepted_tokens": 20.0})
    after = ServerAcceptance("vllm", {"drafts": 30.0, "draft_tokens": 120.0, "accepted_tokens": 80.0})
    over = acceptance_over(before, after)
    assert over["acceptance_rate"] == 0.75 and over["acceptance_length"] == 4.0 and over["drafts"] == 20.0
    gauge = acceptance_over(None, ServerAcceptance("sglang", {"acceptance_length": 2.5}))
    assert gauge == {"source": "sglang", "acceptance_length": 2.5}
    assert acceptance_over(before, None) is None


def test_specbuild_serve_starts_the_openai_front(deployment, tmp_path):
    """`specbuild serve REPO --openai-port N`: tritonserver and the front come up together, and go on SIGTERM."""
    import signal
    import subprocess
    import sys
    import time

    from specbuild.triton_repo.tritonserver import free_port

    triton, _, _ = deployment
    port = free_port()
    command = [sys.executable, "-m", "specbuild.cli", "serve", str(triton.model_repository), "--http-port", "0",
               "--grpc-port", "0", "--metrics-port", "0", "--openai-port", str(port), "--openai-model", "tiny",
               "--log-file", str(tmp_path / "serve.log")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = process.stdout.readline()
        deadline = time.monotonic() + 120
        while "ready" not in line and time.monotonic() < deadline and process.poll() is None:
            line = process.stdout.readline()
        assert f"OpenAI http://127.0.0.1:{port}/v1 (model 'tiny')" in line, line
        result = OpenAIClient(f"127.0.0.1:{port}").generate(PROMPTS[1], max_tokens=4, end_id=-1)
        assert len(result.output_ids) == 4
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
