"""Who may call the OpenAI front and how much: API key, body size, per-client concurrency.

An ASGI middleware in front of the FastAPI app, so a refused request costs neither JSON parsing nor
tokenising. For every request under ``/v1`` (``/health`` and ``/metrics`` stay open, as in vLLM):

1. **API key** (``--api-key`` / ``SPECBUILD_API_KEY``, vLLM's ``--api-key`` / ``VLLM_API_KEY``):
   ``Authorization: Bearer KEY`` compared with :func:`hmac.compare_digest` (time independent of where
   the bytes differ); missing or wrong -> 401 with ``WWW-Authenticate: Bearer``.
2. **Concurrency per client** (the client's address): more than ``max_concurrency_per_client``
   requests in flight -> 429 with ``Retry-After`` (seconds); a request counts from its headers (a
   client still sending its body holds its slot) until its last byte, a streamed one's last event, is sent.
3. **Body size**: a ``Content-Length`` over ``max_body_bytes`` -> 413 before a byte of the body is read;
   a body without one (chunked) is read chunk by chunk and refused with 413 as soon as it passes the
   limit, so memory stays under ``max_body_bytes`` plus one chunk whatever the client sends.

Errors have OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import hmac
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

API_KEY_ENV = "SPECBUILD_API_KEY"
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class FrontLimits:
    """What the front refuses before the deployment sees a request.

    Attributes:
        max_body_bytes: largest request body (bytes) -> 413 above it.
        max_prompt_tokens: most prompt tokens (after the chat template) -> 400 above; None = the
            deployment's own limit.
        max_tokens: largest ``max_tokens`` / ``max_completion_tokens`` -> 400 above; None = the
            deployment's own limit.
        max_concurrency_per_client: requests one client address may have in flight -> 429 above;
            None = no limit.
        retry_after_s: the ``Retry-After`` of a 429 (seconds).
    """

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_tokens: int | None = None
    max_tokens: int | None = None
    max_concurrency_per_client: int | None = None
    retry_after_s: int = 1


def key_matches(expected: str, authorization: bytes | None) -> bool:
    """True when the ``Authorization`` header is ``Bearer <expected>``; constant-time in the key's bytes."""
    scheme, _, given = (authorization or b"").partition(b" ")
    matches = hmac.compare_digest(given.strip(), expected.encode())  # compared whatever the scheme: no early exit
    return matches and scheme.lower() == b"bearer"


class AccessGuard:
    """The ASGI middleware (see the module docstring). ``api_key`` None = no key asked."""

    def __init__(self, app: Any, *, api_key: str | None, limits: FrontLimits, prefix: str = "/v1") -> None:
        self.app, self.api_key, self.limits, self.prefix = app, api_key, limits, prefix
        self.in_flight: Counter[str] = Counter()  # client address -> requests in flight (one event loop)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        if self.api_key is not None and not key_matches(self.api_key, headers.get(b"authorization")):
            missing = b"authorization" not in headers
            message = ("missing API key: send the header 'Authorization: Bearer KEY'" if missing
                       else "invalid API key in the Authorization header")
            await _refuse(send, 401, message, "authentication_error", extra=[(b"www-authenticate", b"Bearer")])
            return
        client = (scope.get("client") or ("unknown", 0))[0]
        limit = self.limits.max_concurrency_per_client
        if limit is not None and self.in_flight[client] >= limit:
            await _refuse(send, 429, f"too many concurrent requests from {client}: at most {limit} at a time; retry after "
                          f"{self.limits.retry_after_s} s", "rate_limit_error",
                          extra=[(b"retry-after", str(self.limits.retry_after_s).encode())])
            return
        self.in_flight[client] += 1  # from the first byte of the body: a slow sender holds its slot
        try:
            body = await self._bounded_body(headers, receive, send)
            if body is not None:
                await self.app(scope, _replay(body, receive), send)
        finally:
            self.in_flight[client] -= 1
            if not self.in_flight[client]:
                del self.in_flight[client]

    async def _bounded_body(self, headers: dict[bytes, bytes], receive: Any, send: Any) -> bytes | None:
        """The whole body, or None after answering 413 (reading no further than the limit)."""
        limit = self.limits.max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _refuse(send, 413, _too_large(int(declared), limit), "invalid_request_error")
            return None
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _refuse(send, 413, _too_large(None, limit), "invalid_request_error")
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


def _too_large(size: int | None, limit: int) -> str:
    what = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return f"request body is {what}; this server takes at most {limit} bytes (specbuild serve --openai-max-body-bytes)"


def _replay(body: bytes, receive: Any):
    """A ``receive`` that gives the app the body already read, then waits on the real one (disconnects)."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send: Any, status: int, message: str, kind: str, *, extra: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
