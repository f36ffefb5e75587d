"""Access and limits of the OpenAI front: API key (401), body size (413), prompt tokens and max_tokens
(400), concurrency per client (429 + Retry-After), each against a real front on a real tritonserver.
The body limit is also checked on the middleware alone: a 100 MB body is refused after reading no more
than the limit."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from specbuild.triton_repo import openai_access
from specbuild.triton_repo.openai_access import AccessGuard, FrontLimits, key_matches
from test_strict_json import strict_loads

pytestmark = pytest.mark.e2e

KEY = "sk-test-0123456789abcdef"
LIMITS = FrontLimits(max_body_bytes=64 * 1024, max_prompt_tokens=40, max_tokens=20, max_concurrency_per_client=1)


@pytest.fixture(scope="module")
def front(decoupled_server):
    import dataclasses

    from specbuild.triton_repo.openai_frontend import OpenAIServer, config_from_deployment

    triton, _ = decoupled_server
    config = dataclasses.replace(config_from_deployment(triton.grpc_url, model="tiny"), api_key=KEY, limits=LIMITS)
    with OpenAIServer(config, port=0) as server:
        yield server


def _post(front, body, key: str | None = KEY, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.post(front.url + "/completions", json=body, headers=headers, timeout=60, **kw)


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return strict_loads(response.text)["error"]


def test_no_key_wrong_key_right_key(front):
    body = {"prompt": "hi", "max_tokens": 2}
    missing = _error(_post(front, body, key=None), 401)
    assert "missing API key" in missing["message"] and missing["type"] == "authentication_error"
    assert _post(front, body, key=None).headers["www-authenticate"] == "Bearer"
    for wrong in ("sk-test-0123456789abcdeX", "x", KEY + "0"):
        assert "invalid API key" in _error(_post(front, body, key=wrong), 401)["message"]
    assert _post(front, body).status_code == 200
    root = front.url.removesuffix("/v1")
    assert httpx.get(root + "/health").status_code == 200 and httpx.get(root + "/metrics").status_code == 200
    assert httpx.get(front.url + "/models").status_code == 401


def test_the_key_is_compared_with_compare_digest_on_the_whole_key(front, monkeypatch):
    """Timing safety: every comparison, whatever the given key, is one hmac.compare_digest of the whole
    given bytes against the whole key (no early exit on length or first differing byte)."""
    calls = []
    real = openai_access.hmac.compare_digest
    monkeypatch.setattr(openai_access.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    for given in ("X" + KEY[1:], KEY[:-1] + "X", "short", KEY):
        calls.clear()
        _post(front, {"prompt": "hi", "max_tokens": 1}, key=given)
        assert calls == [(given.encode(), KEY.encode())]
    assert key_matches(KEY, f"Bearer {KEY}".encode()) and not key_matches(KEY, KEY.encode()) and not key_matches(KEY, None)


def test_max_tokens_and_prompt_tokens_over_the_limits_are_400(front):
    error = _error(_post(front, {"prompt": "hi", "max_tokens": 21}), 400)
    assert error["param"] == "max_tokens" and "20" in error["message"] and "--openai-max-tokens" in error["message"]
    long_prompt = "def f(x):\n    return x\n" * 20  # ~100 tokens of the tiny tokenizer, well under 40 * longest token
    error = _error(_post(front, {"prompt": long_prompt, "max_tokens": 2}), 400)
    assert error["param"] == "prompt" and "at most 40 prompt tokens" in error["message"] and "tokens;" in error["message"]
    huge = "y" * 60_000  # more characters than 40 tokens can hold: refused before tokenising
    error = _error(_post(front, {"prompt": huge, "max_tokens": 2}), 400)
    assert "characters" in error["message"]
    chat = httpx.post(front.url + "/chat/completions", json={"messages": [{"role": "user", "content": long_prompt}]},
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert chat.status_code == 400  # the tiny tokenizer has no chat template, or the prompt is too long: never 500


def _raw_request(front, headers: str, body: bytes = b"") -> socket.socket:
    host, port = front.host, front.port
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
                 f"Content-Type: application/json\r\n{headers}\r\n".encode() + body)
    return sock


def _status(sock: socket.socket) -> tuple[int, str]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head = data.split(b"\r\n\r\n")[0].decode()
    return int(head.split()[1]), head


def test_a_100_mb_body_is_refused_at_once(front):
    start = time.monotonic()
    sock = _raw_request(front, "Content-Length: 100000000\r\n", b'{"prompt": "')
    status, _ = _status(sock)
    sock.close()
    assert status == 413 and time.monotonic() - start < 5
    big = _post(front, {"prompt": "z" * (70 * 1024), "max_tokens": 1})
    assert "at most 65536 bytes" in _error(big, 413)["message"]


def test_a_chunked_body_is_read_no_further_than_the_limit():
    """The middleware alone, fed 100 MB in 64 KiB chunks without a Content-Length: it answers 413 having
    read at most the limit plus one chunk, and the app behind it is never called."""
    chunk, total = b"x" * 65536, 100 * 1024 * 1024
    read, sent, reached = 0, [], []

    async def receive():
        nonlocal read
        read += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": read < total}

    async def send(message):
        sent.append(message)

    async def app(scope, receive, send):
        reached.append(scope)

    guard = AccessGuard(app, api_key=None, limits=FrontLimits(max_body_bytes=1024 * 1024))
    scope = {"type": "http", "path": "/v1/completions", "headers": [], "client": ("127.0.0.1", 1)}
    asyncio.run(guard(scope, receive, send))
    assert sent[0]["status"] == 413 and not reached
    assert read <= 1024 * 1024 + len(chunk)


def test_a_second_request_in_flight_from_one_client_gets_429(front):
    first = _raw_request(front, "Content-Length: 100\r\n", b'{"prompt": ')  # holds its slot while its body is unsent
    try:
        time.sleep(0.3)
        busy = _post(front, {"prompt": "hi", "max_tokens": 1})
        error = _error(busy, 429)
        assert busy.headers["retry-after"] == "1" and error["type"] == "rate_limit_error" and "at most 1" in error["message"]
    finally:
        first.close()
    deadline = time.monotonic() + 10
    while (response := _post(front, {"prompt": "hi", "max_tokens": 1})).status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert response.status_code == 200, response.text


def test_serving_beyond_loopback_without_a_key_warns():
    from specbuild.cli import _openai_key_warning

    assert "asks no API key" in _openai_key_warning("0.0.0.0", 9000, None)
    assert _openai_key_warning("0.0.0.0", 9000, KEY) is None
    assert _openai_key_warning("127.0.0.1", 9000, None) is None and _openai_key_warning("0.0.0.0", None, None) is None
