"""Connecting as users type it: URLs with a scheme, the HTTP port given to gRPC (and back) answered with
a hint at once, bench's --wait-s, verify's report under its results folder. Against a real tritonserver."""

from __future__ import annotations

import json
import socket
import time

import pytest
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.bench.plan import is_url, url_deployments
from specbuild.client.connect import host_port
from specbuild.client.sdk import ServerUnavailableError, SpecClient


def test_host_port_drops_scheme_and_path():
    assert host_port("http://127.0.0.1:8000") == "127.0.0.1:8000"
    assert host_port(" grpc://gpu-1:8001/ ") == "gpu-1:8001"
    assert host_port("http://h:8000/v2/models/ensemble") == "h:8000"
    assert host_port("127.0.0.1:8001") == "127.0.0.1:8001"
    with pytest.raises(ValueError, match="TLS"):
        host_port("https://h:443")
    with pytest.raises(ValueError, match="host:port"):
        host_port("ftp://h:21")


def test_bench_takes_urls_with_a_scheme():
    assert is_url("http://127.0.0.1:8001") and is_url("grpc://127.0.0.1:8001/") and not is_url("smollm2-ngram")
    [d] = url_deployments(["http://127.0.0.1:8001/"], metrics_urls=["http://127.0.0.1:8002"])
    assert (d.url, d.metrics_url) == ("127.0.0.1:8001", "127.0.0.1:8002")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bench_gives_up_after_wait_s(tmp_path):
    start = time.monotonic()
    result = CliRunner().invoke(main, ["bench", f"127.0.0.1:{_closed_port()}", "--wait-s", "0.5", "--draft-lengths", "0",
                                       "--concurrency", "1", "--prompts", "humaneval:1", "--results-dir", str(tmp_path)])
    assert result.exit_code == 3, result.output
    assert time.monotonic() - start < 20 and "waited 0.5 s" in result.output


@pytest.mark.e2e
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_wrong_protocol_for_a_port_says_which_to_use(decoupled_server, protocol):
    triton, _ = decoupled_server
    url = triton.http_url if protocol == "grpc" else triton.grpc_url  # each port given to the other protocol
    right = "http" if protocol == "grpc" else "grpc"
    start = time.monotonic()
    with SpecClient(url, protocol=protocol, timeout_s=5) as client:
        with pytest.raises(ServerUnavailableError, match=f"use --protocol {right}, or the") as refused:
            client.wait_ready(timeout_s=30)
    assert time.monotonic() - start < 10  # at once, not after the 30 s wait
    assert "waited 30 s" not in str(refused.value) and "found after " in str(refused.value)  # says what happened (nc3 item 7)


@pytest.mark.e2e
def test_verify_takes_a_url_with_a_scheme_and_writes_under_its_results_dir(decoupled_server, tmp_path, monkeypatch):
    triton, _ = decoupled_server
    monkeypatch.chdir(tmp_path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "prompt": "def fib(n):"}) + "\n")
    result = CliRunner().invoke(main, ["verify", "--url", f"grpc://{triton.grpc_url}/", "--streaming", "--prompts", str(prompts),
                                       "--max-tokens", "4", "--end-id", "-1"])
    assert result.exit_code == 0, result.output
    report = tmp_path / "specbuild-out" / "verify" / "report.json"
    assert json.loads(report.read_text())["summary"]["num_match"] == 1 and not (tmp_path / "report.json").exists()


class _NotFound(__import__("http.server").server.BaseHTTPRequestHandler):
    """Answers every GET with 404: a plain body (as a Triton HTTP port does for /v1/...) on /plain, an OpenAI
    error object (as an OpenAI server does for an unknown model) elsewhere."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = (b"Not Found" if self.path.startswith("/plain")
                else json.dumps({"error": {"message": "The model `x` does not exist.", "type": "NotFoundError"}}).encode())
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_openai_url_that_is_not_an_openai_server_gets_a_hint():
    import threading
    from http.server import ThreadingHTTPServer

    from specbuild.client.openai_client import OpenAIClient
    from specbuild.client.sdk import RequestError

    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        with OpenAIClient(f"http://127.0.0.1:{port}/plain/v1", timeout_s=5) as client:
            with pytest.raises(RequestError, match=r"\(404\): Not Found\. Nothing answers /plain/v1/models there: "
                                                   r"is this an OpenAI-compatible front's base URL") as info:
                client.models()
            assert info.value.server_message == "Not Found"
        with OpenAIClient(f"http://127.0.0.1:{port}/v1", timeout_s=5) as client:
            with pytest.raises(RequestError) as info:  # an OpenAI server's own 404: its message, no hint
                client.models()
            assert "does not exist" in str(info.value) and "Nothing answers" not in str(info.value)
    finally:
        server.shutdown()
        server.server_close()
