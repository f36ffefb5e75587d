"""Every response of a reference deployment is strict JSON: no NaN, no Infinity, no placeholders.

NaN and Infinity are not JSON (RFC 8259), so strict parsers (orjson, JavaScript's JSON.parse, Go's
encoding/json) and the benchmark clients built on them reject a body that carries them. The parser
here is the standard library's with ``parse_constant`` raising, which refuses exactly those tokens.
Outputs a request did not ask for (perf metrics, logit margins) must be absent, not zero/NaN/-1.

Two real tritonservers (tiny random model): one plain (HTTP generate, HTTP infer, gRPC infer) and one
decoupled (HTTP generate_stream as server-sent events, gRPC stream). About 40 s on 2 CPU cores.
"""

from __future__ import annotations

import json
import math
import urllib.request

import numpy as np
import pytest

pytestmark = pytest.mark.e2e

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"


def strict_loads(text: str):
    """``json.loads`` that refuses NaN, Infinity and -Infinity (what strict parsers refuse)."""

    def refuse(token: str):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def server(plain_server):
    return plain_server[0]




def _post(url: str, body: dict) -> str:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read().decode()


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


ASKS = [
    ({}, set()),
    ({"return_perf_metrics": True}, {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"}),
    ({"return_logit_margin": True}, {"logit_margin", "runner_up_ids"}),
    ({"num_draft_tokens": 0, "return_perf_metrics": True, "return_logit_margin": True},
     {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "logit_margin", "runner_up_ids"}),
]
OPTIONAL_OUTPUTS = {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "logit_margin", "runner_up_ids"}


@pytest.mark.parametrize("asked,expected", ASKS)
def test_http_generate_is_strict_json_with_only_the_outputs_asked_for(server, asked, expected):
    body = strict_loads(_post(f"http://{server.http_url}/v2/models/ensemble/generate",
                              {"text_input": PROMPT, "max_tokens": 6, "end_id": -1, **asked}))
    assert isinstance(body["text_output"], str) and body["text_output"]
    assert OPTIONAL_OUTPUTS & set(body) == expected
    assert all(_finite(v) for v in body.values())
    if "logit_margin" in expected:
        assert len(body["logit_margin"]) == len(body["runner_up_ids"]) == 6
        assert min(body["logit_margin"]) >= 0 and min(body["runner_up_ids"]) >= 0


def test_http_infer_and_grpc_carry_no_placeholder(server):
    import tritonclient.grpc as grpcclient

    infer = {
        "inputs": [
            {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [PROMPT]},
            {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [5]},
        ]
    }
    body = strict_loads(_post(f"http://{server.http_url}/v2/models/ensemble/infer", infer))
    names = {o["name"] for o in body["outputs"]}
    assert "text_output" in names and not names & OPTIONAL_OUTPUTS
    for output in body["outputs"]:
        assert _finite(output["data"])

    client = grpcclient.InferenceServerClient(server.grpc_url)
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[PROMPT.encode()]], dtype=np.object_))
    tokens = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
    tokens.set_data_from_numpy(np.array([[5]], dtype=np.int32))
    result = client.infer("ensemble", [text, tokens])
    response = result.get_response(as_json=True)
    strict_loads(json.dumps(response, allow_nan=False))
    names = {o["name"] for o in response["outputs"]}
    assert "text_output" in names and not names & OPTIONAL_OUTPUTS
    client.close()


def test_streamed_http_events_are_strict_json(decoupled_server):
    decoupled_server, _ = decoupled_server
    body = {"text_input": PROMPT, "max_tokens": 6, "end_id": -1, "stream": True, "return_perf_metrics": True}
    text = _post(f"http://{decoupled_server.http_url}/v2/models/ensemble/generate_stream", body)
    events = [strict_loads(line[len("data:"):]) for line in text.splitlines() if line.startswith("data:")]
    assert len(events) >= 2
    assert "".join(e["text_output"] for e in events)
    for event in events:
        assert "error" not in event, event
        assert not {"logit_margin", "runner_up_ids"} & set(event)
        assert all(_finite(v) for v in event.values())


def test_openai_front_on_a_plain_deployment_streams_one_event_and_says_so(server):
    """Not decoupled: stream=true gets the whole answer in one strict-JSON event, the header says
    ``one-event``, and a stop string still cuts it."""
    import httpx

    from specbuild.triton_repo.openai_frontend import OpenAIServer, config_from_deployment

    config = config_from_deployment(server.grpc_url, model="plain")
    assert not config.decoupled
    with OpenAIServer(config, port=0) as front:
        body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        whole = strict_loads(httpx.post(front.url + "/completions", json=body, timeout=120).text)["choices"][0]
        response = httpx.post(front.url + "/completions", json={**body, "stream": True}, timeout=120)
        assert response.headers["x-specbuild-streaming"] == "one-event"
        events = [strict_loads(line[5:]) for line in response.text.splitlines() if line.startswith("data: {")]
        assert len(events) == 2 and events[0]["choices"][0]["text"] == whole["text"]  # the answer, then the finish
        stop = whole["text"][len(whole["text"]) // 2:][:2]
        cut = httpx.post(front.url + "/completions", json={**body, "stream": True, "stop": stop}, timeout=120)
        pieces = [strict_loads(line[5:])["choices"][0] for line in cut.text.splitlines() if line.startswith("data: {")]
        assert "".join(p["text"] for p in pieces) == whole["text"][:whole["text"].index(stop)]
        assert pieces[-1]["finish_reason"] == "stop"
