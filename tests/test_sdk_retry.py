"""The SDK's one retry policy (tenacity), sync and async: back-off with jitter while no server answers,
then a clear error; never a retry for a rejected request or a timeout. No model needed."""

from __future__ import annotations

import asyncio
import dataclasses
import socket

import pytest
from tritonclient.utils import InferenceServerException

from specbuild.client.sdk import (
    AsyncSpecClient,
    RequestError,
    RequestTimeoutError,
    RetryPolicy,
    ServerUnavailableError,
    SpecClient,
    translate_error,
)

BACKOFF_S = 0.05


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def assert_backoff_with_jitter(waits: list[float], retries: int) -> None:
    """Wait i (from 0) is backoff * 2**i plus a jitter in [0, backoff]."""
    assert len(waits) == retries
    for i, wait in enumerate(waits):
        assert BACKOFF_S * 2**i <= wait <= BACKOFF_S * 2**i + BACKOFF_S, (i, wait)


def translate(exc: Exception):
    return translate_error(exc, what="inference", where="model 'ensemble' at h:1", timeout_s=1)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_no_server_yet_is_retried_with_backoff_then_a_clear_error(protocol):
    waits: list[float] = []
    url = closed_port_url()
    with SpecClient(url, protocol=protocol, retries=3, retry_backoff_s=BACKOFF_S) as client:
        client.retry = dataclasses.replace(client.retry, sleep=waits.append)
        with pytest.raises(ServerUnavailableError, match=rf"{url}.*after 4 attempts") as info:
            client.generate("x", max_tokens=2)
    assert info.value.attempts == 4
    assert_backoff_with_jitter(waits, 3)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_async_client_retries_the_same_way(protocol):
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    async def run():
        async with AsyncSpecClient(closed_port_url(), protocol=protocol, retries=2, retry_backoff_s=BACKOFF_S) as client:
            client.retry = dataclasses.replace(client.retry, sleep=record)
            await client.generate("x", max_tokens=2)

    with pytest.raises(ServerUnavailableError, match="after 3 attempts") as info:
        asyncio.run(run())
    assert info.value.attempts == 3
    assert_backoff_with_jitter(waits, 2)


def test_a_server_that_comes_up_while_retrying_answers():
    calls, waits = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError(111, "Connection refused")
        return "answer"

    policy = RetryPolicy(retries=5, backoff_s=BACKOFF_S, sleep=waits.append)
    assert policy.call(flaky, translate) == "answer"
    assert len(calls) == 3 and len(waits) == 2


@pytest.mark.parametrize(("status", "error"), [("400", RequestError), ("StatusCode.INVALID_ARGUMENT", RequestError),
                                               ("StatusCode.DEADLINE_EXCEEDED", RequestTimeoutError)])
def test_bad_requests_and_timeouts_are_not_retried(status, error):
    calls, waits = [], []

    def rejected():
        calls.append(1)
        raise InferenceServerException("InvalidRequestError: max_tokens", status=status)

    policy = RetryPolicy(retries=3, backoff_s=BACKOFF_S, sleep=waits.append)
    with pytest.raises(error) as info:
        policy.call(rejected, translate)
    assert len(calls) == 1 and waits == [] and info.value.attempts == 1
    assert "attempts" not in str(info.value)


def test_async_bad_request_is_not_retried():
    calls = []

    async def rejected():
        calls.append(1)
        raise InferenceServerException("InvalidRequestError: max_tokens", status="400")

    with pytest.raises(RequestError):
        asyncio.run(RetryPolicy(retries=3, backoff_s=BACKOFF_S).call_async(rejected, translate))
    assert len(calls) == 1


def test_programming_errors_pass_through_untranslated():
    with pytest.raises(ZeroDivisionError):
        RetryPolicy(retries=3, backoff_s=BACKOFF_S).call(lambda: 1 / 0, translate)


def test_policy_arguments_are_checked():
    with pytest.raises(ValueError, match="retries"):
        RetryPolicy(retries=-1)
    with pytest.raises(ValueError, match="retry_backoff_s"):
        SpecClient(closed_port_url(), retry_backoff_s=-0.1)
