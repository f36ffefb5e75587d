"""`specbuild serve --restart on-failure`: a real tritonserver killed with SIGKILL comes back on the same
ports, the OpenAI front answers again and counts the restart on /metrics, and after --max-restarts the
next kill ends serving with exit code 3. About a minute (two server starts on the tiny model)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from specbuild.client.openai_client import OpenAIClient
from specbuild.triton_repo.supervise import RestartPolicy, exit_reason

pytestmark = pytest.mark.e2e


def test_restart_policy_backs_off_and_names_the_signal():
    policy = RestartPolicy(max_restarts=9, backoff_s=1.0, max_backoff_s=30.0)
    assert [policy.delay_s(n) for n in (1, 2, 3, 6, 7)] == [1.0, 2.0, 4.0, 30.0, 30.0]
    assert exit_reason(-signal.SIGKILL) == "was killed by SIGKILL" and exit_reason(1) == "exited with status 1"


def _lines(process: subprocess.Popen) -> queue.Queue:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    return lines


def _until(lines: queue.Queue, pattern: str, seen: list[str], timeout_s: float = 240) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        seen.append(line)
        if match := re.search(pattern, line):
            return match
    raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(seen)}")


def test_a_killed_tritonserver_is_restarted_then_given_up_on(decoupled_server, tmp_path):
    from specbuild.triton_repo.tritonserver import free_port

    triton, _ = decoupled_server
    port = free_port()
    command = [sys.executable, "-m", "specbuild.cli", "serve", str(triton.model_repository), "--http-port", "0",
               "--grpc-port", "0", "--metrics-port", "0", "--openai-port", str(port), "--openai-model", "tiny",
               "--log-file", str(tmp_path / "serve.log"), "--restart", "on-failure", "--max-restarts", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, seen = _lines(process), []
    try:
        first = int(_until(lines, r"tritonserver ready \(pid (\d+)\)", seen)[1])
        os.kill(first, signal.SIGKILL)
        _until(lines, rf"pid {first}\) was killed by SIGKILL; restart 1/1 in 1 s", seen, timeout_s=30)
        second = int(_until(lines, r"ready again \(pid (\d+), restart 1/1\)", seen)[1])
        assert second != first
        client = OpenAIClient(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while True:  # the front stayed up; its gRPC channel reconnects to the new server
            try:
                assert len(client.generate("def fib(n):", max_tokens=4, end_id=-1).output_ids) == 4
                break
            except Exception:  # noqa: BLE001 - 503 until the channel is back
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert "specbuild_server_restarts_total 1.0" in metrics
        os.kill(second, signal.SIGKILL)
        _until(lines, r"was killed by SIGKILL; giving up after 1 restart\(s\) \(--max-restarts 1\)", seen, timeout_s=30)
        assert process.wait(timeout=60) == 3
        assert "--- specbuild: restart 1 ---" in (tmp_path / "serve.log").read_text()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
