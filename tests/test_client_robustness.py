"""The client against real servers that fail: killed mid-request, model not loaded, malformed
responses, peers that never answer or answer garbage, and 64 requests at once.

Every failure must surface as one of the SDK's typed errors, naming the server, within a bounded
time (no hang); under concurrency no request may be lost or answered with another's tokens.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import write_recipe
from specbuild.client.sdk import (
    AsyncSpecClient,
    ClientError,
    ModelNotReadyError,
    RequestError,
    RequestTimeoutError,
    ResponseError,
    ServerUnavailableError,
    SpecClient,
)
from specbuild.triton_repo.pbtxt import ModelConfig, Tensor, render
from specbuild.triton_repo.tritonserver import TritonServer

pytestmark = pytest.mark.e2e
PROTOCOLS = ["grpc", "http"]


@pytest.fixture(scope="module")
def tiny_repo(tiny_checkpoint, tmp_path_factory) -> Path:
    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine
    from specbuild.triton_repo.reference_repository import spec_from_engine_dir, write_reference_repository

    out = tmp_path_factory.mktemp("robust")
    loaded = load_recipe(str(write_recipe(out / "r.yaml", tiny_checkpoint)))
    engine_dir = build_reference_engine(loaded, out / "engine", log=lambda m: None).engine_dir
    return write_reference_repository(spec_from_engine_dir(engine_dir), out / "repo")


@pytest.fixture(scope="module")
def server(tiny_repo, tmp_path_factory):
    with TritonServer(tiny_repo, http_port=0, grpc_port=0, metrics_port=0, log_file=tmp_path_factory.mktemp("log") / "s.log") as s:
        yield s


def url_of(server: TritonServer, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


# --- server killed mid-request ---------------------------------------------------------------------


@pytest.mark.slow
def test_server_killed_mid_request_raises_unavailable_without_hanging(tiny_repo, tmp_path):
    """Long requests on both protocols (sync and async) are in flight when the server is SIGKILLed."""
    server = TritonServer(tiny_repo, http_port=0, grpc_port=0, metrics_port=0, log_file=tmp_path / "s.log").start()
    outcomes: dict[str, BaseException | object] = {}
    request = dict(max_tokens=450, end_id=-1, num_draft_tokens=0)  # several seconds of decoding
    give_up = time.monotonic() + 60

    # Each client sends requests back to back until one fails, so one is in flight when the server
    # dies however fast the machine decodes; a request that completes is not an outcome.
    def run(name, protocol):
        with SpecClient(url_of(server, protocol), protocol=protocol, timeout_s=60, retries=1, retry_backoff_s=0.1) as c:
            try:
                while time.monotonic() < give_up:
                    c.generate("def f():", **request)
                outcomes[name] = "still answering after the kill"
            except BaseException as e:  # noqa: BLE001 - recorded and checked below
                outcomes[name] = e

    async def run_async(protocol):
        async with AsyncSpecClient(url_of(server, protocol), protocol=protocol, timeout_s=60, retries=1, retry_backoff_s=0.1) as c:
            try:
                while time.monotonic() < give_up:
                    await c.generate("def f():", **request)
                return "still answering after the kill"
            except BaseException as e:  # noqa: BLE001
                return e

    threads = [threading.Thread(target=run, args=(p, p)) for p in PROTOCOLS]
    threads.append(threading.Thread(target=lambda: outcomes.update(
        {f"async-{p}": r for p, r in zip(PROTOCOLS, asyncio.run(_gather(*(run_async(p) for p in PROTOCOLS))))}
    )))  # fmt: skip
    try:
        for t in threads:
            t.start()
        time.sleep(2.0)  # all clients are sending
        assert server.returncode is None
        start = time.monotonic()
        os.killpg(server.pid, signal.SIGKILL)
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads), "a client hung after the server died"
        assert time.monotonic() - start < 30
    finally:
        server.stop()
    assert set(outcomes) == {"grpc", "http", "async-grpc", "async-http"}
    for name, outcome in outcomes.items():
        assert isinstance(outcome, ServerUnavailableError), f"{name}: {outcome!r}"
        assert not isinstance(outcome, (ModelNotReadyError, RequestTimeoutError)), f"{name}: {outcome!r}"
        assert "no answer from model 'ensemble'" in str(outcome) and server.grpc_url.split(":")[0] in str(outcome)


async def _gather(*coroutines):
    return await asyncio.gather(*coroutines)


# --- model not loaded ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def explicit_server(tiny_repo, tmp_path_factory):
    """The same repository with --model-control-mode=explicit and nothing loaded."""
    log = tmp_path_factory.mktemp("explicit") / "s.log"
    with TritonServer(tiny_repo, http_port=0, grpc_port=0, metrics_port=0, log_file=log, extra_args=["--model-control-mode=explicit"]) as s:
        yield s


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_not_loaded_is_a_clear_error(explicit_server, protocol):
    with SpecClient(url_of(explicit_server, protocol), protocol=protocol, retries=1, retry_backoff_s=0.05) as client:
        with pytest.raises(ModelNotReadyError) as info:
            client.generate("def f():", max_tokens=4)
        message = str(info.value)
        assert "model 'ensemble'" in message and "not loaded or not ready" in message
        assert "repository: ensemble (UNAVAILABLE" in message  # what the server knows about it
        assert info.value.attempts == 2  # retried once: a model may be loading
        start = time.monotonic()
        with pytest.raises(ModelNotReadyError, match="model 'ensemble' is not ready"):
            client.wait_ready(timeout_s=0.5, poll_s=0.1)
        assert time.monotonic() - start < 5


def test_unknown_model_name_is_a_clear_error(server):
    with SpecClient(server.grpc_url, model_name="ensembel", retries=0) as client:
        with pytest.raises(ModelNotReadyError, match="'ensembel'.*unknown model.*repository: ensemble \\(READY\\)"):
            client.generate("def f():", max_tokens=4)


# --- rejected requests ----------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rejected_request_carries_the_server_message_and_is_not_retried(server, protocol):
    with SpecClient(url_of(server, protocol), protocol=protocol, retries=3) as client:
        start = time.monotonic()
        with pytest.raises(RequestError) as info:
            client.generate("def f():", max_tokens=100_000)
        assert info.value.invalid_argument and info.value.attempts == 1
        assert "max_seq_len" in info.value.server_message and "max_seq_len" in str(info.value)
        assert time.monotonic() - start < 5
        assert client.generate("def f():", max_tokens=2, end_id=-1).num_tokens == 2  # the server kept serving


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_timeout_is_typed_and_not_retried(malformed_server, protocol):
    """A server that answers after 2 s (mode SLOW_MODE) against timeout_s=0.2: one attempt, typed error.

    The delay is the model's, not decoding speed's, so the test holds however fast the engine gets.
    """
    with SpecClient(url_of(malformed_server, protocol), protocol=protocol, model_name="malformed", timeout_s=0.2, retries=3) as client:
        start = time.monotonic()
        with pytest.raises(RequestTimeoutError, match="within timeout_s=0.2 s") as info:
            client.generate("x", max_tokens=SLOW_MODE)
        assert isinstance(info.value, TimeoutError) and info.value.attempts == 1
        assert time.monotonic() - start < 1.5  # not retried: 3 attempts would take >= 0.6 s plus backoff


# --- malformed responses ---------------------------------------------------------------------------

SLOW_MODE = 9  # max_tokens that makes the 'malformed' model answer well after 2 s

MALFORMED_MODEL = f'''
import time

import numpy as np
import triton_python_backend_utils as pb


class TritonPythonModel:
    """Answers with a malformed response chosen by max_tokens (1: no output_ids, 2: float ids, 3: bad length);
    max_tokens {SLOW_MODE} answers well after 2 s."""

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
            if mode == {SLOW_MODE}:
                time.sleep(2.0)
            text = pb.Tensor("text_output", np.array([[b"ok"]], dtype=np.object_))
            ids = pb.Tensor("output_ids", np.array([[[1, 2, 3]]], dtype=np.int32))
            length = pb.Tensor("sequence_length", np.array([[3]], dtype=np.int32))
            if mode == 1:
                tensors = [text, length]
            elif mode == 2:
                tensors = [text, pb.Tensor("output_ids", np.array([[[1.5, 2.5]]], dtype=np.float32)), length]
            elif mode == 3:
                tensors = [text, ids, pb.Tensor("sequence_length", np.array([[99]], dtype=np.int32))]
            else:
                tensors = [text, ids, length]
            responses.append(pb.InferenceResponse(output_tensors=tensors))
        return responses
'''


@pytest.fixture(scope="module")
def malformed_server(tmp_path_factory):
    """A real tritonserver whose model 'malformed' takes the ensemble's inputs and answers badly."""
    repo = tmp_path_factory.mktemp("malformed")
    t = lambda name, dtype, dims, optional=False: Tensor(name, dtype, dims, optional=optional)  # noqa: E731
    config = ModelConfig(
        name="malformed",
        backend="python",
        max_batch_size=4,
        inputs=(
            t("text_input", "TYPE_STRING", (1,)),
            t("max_tokens", "TYPE_INT32", (1,)),
            *(t(n, "TYPE_BOOL", (1,), True) for n in ("return_perf_metrics", "exclude_input_in_output")),
        ),
        outputs=(
            t("text_output", "TYPE_STRING", (-1,)),
            t("output_ids", "TYPE_INT32", (-1, -1)),
            t("sequence_length", "TYPE_INT32", (-1,)),
            t("acceptance_rate", "TYPE_FP32", (1,)),
            t("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
            t("total_draft_tokens", "TYPE_INT32", (1,)),
        ),
    )
    (repo / "malformed" / "1").mkdir(parents=True)
    (repo / "malformed" / "config.pbtxt").write_text(render(config))
    (repo / "malformed" / "1" / "model.py").write_text(textwrap.dedent(MALFORMED_MODEL))
    with TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=repo / "s.log") as s:
        yield s


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("mode", "message"),
    [
        (1, "has no output_ids tensor"),
        (2, r"output_ids must be an integer \[1, beam, n\] tensor, got float32"),
        (3, r"sequence_length 99 is outside \[0, 3\]"),
    ],
)
def test_malformed_response_is_a_response_error(malformed_server, protocol, mode, message):
    with SpecClient(url_of(malformed_server, protocol), protocol=protocol, model_name="malformed") as client:
        with pytest.raises(ResponseError, match=message):
            client.generate("x", max_tokens=mode)
        well_formed = client.generate("x", max_tokens=4)
        assert well_formed.output_ids == [1, 2, 3] and well_formed.acceptance_rate is None  # absent -> None


class Peer:
    """A TCP listener on 127.0.0.1 that accepts and then either never answers or sends garbage."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)
            if self.behaviour == "garbage":
                try:
                    conn.recv(65536)
                    conn.sendall(b"\x00\x01garbage that is neither HTTP/1.1 nor HTTP/2\r\n\r\n")
                finally:
                    conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.connections:
            conn.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_peer_that_never_answers_times_out(protocol):
    peer = Peer("silent")
    try:
        with SpecClient(peer.url, protocol=protocol, timeout_s=1.0, retries=2) as client:
            start = time.monotonic()
            with pytest.raises(RequestTimeoutError, match=peer.url):
                client.generate("x", max_tokens=4)
            assert time.monotonic() - start < 5
    finally:
        peer.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_peer_that_answers_garbage_is_a_client_error(protocol):
    peer = Peer("garbage")
    try:
        with SpecClient(peer.url, protocol=protocol, timeout_s=3.0, retries=1, retry_backoff_s=0.05) as client:
            start = time.monotonic()
            with pytest.raises(ClientError, match=peer.url) as info:
                client.generate("x", max_tokens=4)
            assert isinstance(info.value, (ServerUnavailableError, ResponseError)), repr(info.value)
            assert time.monotonic() - start < 10
    finally:
        peer.close()


# --- 64 requests at once ---------------------------------------------------------------------------


def requests_64() -> list[dict]:
    """64 distinct requests: greedy plain and speculative, and seeded sampling, several lengths."""
    prompts = ["def fib(n):", "for i in range(10):\n    print(i", "The quick brown fox", "class Stack:"]
    requests = []
    for i in range(64):
        request = dict(prompt=prompts[i % 4], max_tokens=3 + i % 5, end_id=-1, num_draft_tokens=None if i % 2 else 0)
        if i % 3 == 0:
            request |= dict(temperature=0.9, top_k=20, seed=1000 + i)
        requests.append(request)
    return requests


def ids_of(result) -> list[int]:
    return result.output_ids


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_64_concurrent_requests_none_lost_each_equal_to_its_sequential_result(server, protocol):
    requests = requests_64()
    url = url_of(server, protocol)
    with SpecClient(url, protocol=protocol) as client:
        sequential = [ids_of(client.generate(**r)) for r in requests]
        with ThreadPoolExecutor(max_workers=64) as pool:  # one shared client, 64 threads
            threaded = list(pool.map(lambda r: ids_of(client.generate(**r)), requests))

    async def all_at_once():
        async with AsyncSpecClient(url, protocol=protocol) as aclient:
            return [ids_of(r) for r in await asyncio.gather(*(aclient.generate(**r) for r in requests))]

    gathered = asyncio.run(all_at_once())
    assert len(threaded) == len(gathered) == 64
    for i, r in enumerate(requests):
        assert len(sequential[i]) == r["max_tokens"], f"request {i} came back short"
        assert threaded[i] == sequential[i], f"request {i} ({r}) differs when 64 threads share the client"
        assert gathered[i] == sequential[i], f"request {i} ({r}) differs under asyncio.gather"
    assert len({tuple(s) for s in sequential}) > 16  # distinct answers: a mixed-up reply would show
