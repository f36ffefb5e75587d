"""Run a real Triton Inference Server on a model repository, from tests or from the CLI.

:class:`TritonServer` is the ``tritonserver`` process: free ports, start and wait until ready,
the log's errors, an orderly stop (its whole process group). :func:`serve_forever` runs one until
Ctrl-C or a stop signal. Which binary runs, and the environment it needs, is
:mod:`specbuild.triton_repo.triton_install`'s.

Example::

    with TritonServer("repo", http_port=0, grpc_port=0, metrics_port=0) as server:
        client = tritonclient.http.InferenceServerClient(server.http_url)
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from contextlib import ExitStack, contextmanager
from functools import cached_property
from pathlib import Path
from typing import Sequence

from specbuild.triton_repo.triton_install import (  # noqa: F401 - ServerNotFoundError: raised through here
    ServerNotFoundError,
    TritonInstall,
    find_tritonserver,
    server_environment,
)

LOG_TAIL_LINES = 40
POLL_INTERVAL_S = 0.25
TERM_TIMEOUT_S = 10.0
ERROR_LINE = re.compile(r"E\d{4} ")  # Triton's glog prefix: E1130 01:11:04.709866 6726 file.cc:642] "..."
# Logged on every CPU-only start; never the reason a start failed.
HARMLESS_ERRORS = ("CudaDriverHelper has not been initialized", "CUDA driver version is insufficient")


class ServerStartError(RuntimeError):
    """The server exited or did not become ready in time; the message quotes its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free now (another process may still take it before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """Whether binding ``host:port`` fails now (something else listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class TritonServer:
    """A ``tritonserver`` process serving ``model_repository``; a context manager.

    Ports set to 0 are replaced by free ports when the server starts; the attributes ``http_port``,
    ``grpc_port`` and ``metrics_port`` then hold the real ones. The server's stdout and stderr go to
    ``log_file`` (default: a new ``tritonserver-*.log`` in the system temp directory, made at start).
    The server binds ``host`` (default loopback only); ``startup_timeout_s`` is in seconds.
    ``install`` defaults to ``find_tritonserver()``.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        log_file: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = 300.0,
        log_verbose: int = 0,
        extra_args: Sequence[str] = (),
        install: TritonInstall | None = None,
    ) -> None:
        self.model_repository = Path(model_repository).resolve()
        self.host = host
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.metrics_port = metrics_port
        self._log_file = Path(log_file) if log_file is not None else None
        self.startup_timeout_s = startup_timeout_s
        self.log_verbose = log_verbose
        self.extra_args = tuple(extra_args)
        self._install = install
        self._process: subprocess.Popen[bytes] | None = None
        self._group_reaped = False
        self._append_log = False
        self.restarts = 0  # times restart() brought it back (specbuild serve --restart)

    @property
    def install(self) -> TritonInstall:
        """The installation used; found on first access. Raises ServerNotFoundError."""
        if self._install is None:
            self._install = find_tritonserver()
        return self._install

    @property
    def log_file(self) -> Path | None:
        """Where the server's output goes; None before ``start`` when no path was given."""
        return self._log_file

    @property
    def http_url(self) -> str:
        return f"{self._client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"{self._client_host}:{self.metrics_port}"

    @property
    def _client_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

    @property
    def command(self) -> list[str]:
        """The command line (with the ports as they are now: 0 until ``start`` picks them)."""
        address_flags = ["--http-address", self.host, "--grpc-address", self.host]
        if self._supports_metrics_address:
            address_flags += ["--metrics-address", self.host]
        return [
            str(self.install.binary),
            "--model-repository", str(self.model_repository),
            "--backend-directory", str(self.install.backend_directory),
            *address_flags,
            "--http-port", str(self.http_port),
            "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port),
            "--log-verbose", str(self.log_verbose),
            "--exit-on-error=true",
            "--strict-readiness=true",
            *self.extra_args,
        ]  # fmt: skip

    @cached_property
    def _supports_metrics_address(self) -> bool:
        # Older binaries reject unknown flags, so ask this one.
        result = subprocess.run(
            [str(self.install.binary), "--help"],
            capture_output=True,
            env=server_environment(self.install),
            timeout=30,
        )
        return b"--metrics-address" in result.stdout + result.stderr

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has ended (negative: killed by that signal), else None."""
        return None if self._process is None else self._process.poll()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> TritonServer:
        """Launch the server and wait until ``/v2/health/ready`` answers 200 (all models loaded).

        Raises:
            FileNotFoundError: the model repository does not exist.
            ServerNotFoundError: no server is installed.
            ServerStartError: the process exited, or was not ready within ``startup_timeout_s`` seconds;
                the message holds the log's error lines and ends with its last lines. On this and on
                any other exception while waiting (Ctrl-C), the process is stopped first.
            RuntimeError: the server is already running.
        """
        if self._process is not None and self._process.poll() is None:
            raise RuntimeError(f"tritonserver already running (pid {self._process.pid})")
        if not self.model_repository.is_dir():
            raise FileNotFoundError(f"model repository {self.model_repository} does not exist")
        self._resolve_ports()
        self._check_ports_free()
        self._launch()
        try:
            self._wait_until_ready()
        except BaseException:  # not ready, or Ctrl-C while waiting: leave no process behind
            self.stop()
            raise
        return self

    def _resolve_ports(self) -> None:
        if self.http_port == 0:
            self.http_port = free_port(self._client_host)
        if self.grpc_port == 0:
            self.grpc_port = self._free_port_other_than(self.http_port)
        if self.metrics_port == 0:
            self.metrics_port = self._free_port_other_than(self.http_port, self.grpc_port)

    def _check_ports_free(self) -> None:
        """Fail before loading any model when a port is taken (Triton would find out after)."""
        for name, port in (("http", self.http_port), ("grpc", self.grpc_port), ("metrics", self.metrics_port)):
            if port_in_use(self.host or "0.0.0.0", port):
                raise ServerStartError(
                    f"{name} port {port} on {self._client_host} is already in use; choose another "
                    f"(--{name}-port, or serve.{name}_port in a recipe), or 0 for a free port"
                )

    def _free_port_other_than(self, *taken: int) -> int:
        port = free_port(self._client_host)
        while port in taken:
            port = free_port(self._client_host)
        return port

    def _launch(self) -> None:
        if self._log_file is None:
            handle, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(handle)
            self._log_file = Path(name)
        self._log_file.parent.mkdir(parents=True, exist_ok=True)
        command = self.command
        env = server_environment(self.install)
        with open(self._log_file, "ab" if self._append_log else "wb") as log:
            log.write(f"$ {' '.join(command)}\n".encode())
            log.flush()
            # Own session: a terminal's Ctrl-C reaches only us, and stop() shuts the server down in order.
            self._group_reaped = False
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )  # fmt: skip

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        url = f"http://{self.http_url}/v2/health/ready"
        while True:
            code = self._process.poll()
            if code is not None:
                raise ServerStartError(self._failure(f"tritonserver exited with status {code} while starting"))
            if _answers_ok(url):
                return
            if time.monotonic() > deadline:
                raise ServerStartError(self._failure(f"tritonserver not ready after {self.startup_timeout_s:g} s"))
            time.sleep(POLL_INTERVAL_S)

    def _failure(self, what: str) -> str:
        errors = "".join(self.log_errors())
        return (
            f"{what}\ncommand: {' '.join(self.command)}\n"
            + (f"errors in {self._log_file}:\n{errors}" if errors else "")
            + f"last {LOG_TAIL_LINES} lines of {self._log_file}:\n{self.log_tail()}"
        )

    def log_errors(self, limit: int = 10) -> list[str]:
        """The first ``limit`` error lines (``E<mmdd> ...``) of the server log, known harmless ones left out."""
        if self._log_file is None or not self._log_file.exists():
            return []
        with open(self._log_file, encoding="utf-8", errors="replace") as log:
            errors = (line for line in log if ERROR_LINE.match(line) and not any(h in line for h in HARMLESS_ERRORS))
            return list(itertools.islice(errors, limit))

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log ('' when there is none yet)."""
        if self._log_file is None or not self._log_file.exists():
            return ""
        with open(self._log_file, encoding="utf-8", errors="replace") as log:
            return "".join(deque(log, maxlen=lines))

    def restart(self) -> TritonServer:
        """Stop what is left of the server (its process group) and start it again on the same ports,
        appending to the same log; counts :attr:`restarts`. Raises as :meth:`start`."""
        self.stop()
        self.restarts += 1
        self._append_log = True
        with open(self.log_file, "ab") as log:
            log.write(f"\n--- specbuild: restart {self.restarts} ---\n".encode())
        return self.start()

    def wait(self, timeout_s: float | None = None) -> int:
        """Block until the process ends (at most ``timeout_s`` seconds) and return its exit status.

        Raises:
            RuntimeError: the server was never started.
            subprocess.TimeoutExpired: it is still running after ``timeout_s`` seconds.
        """
        if self._process is None:
            raise RuntimeError("tritonserver was not started")
        return self._process.wait(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server: SIGINT (Triton unloads its models), then after ``timeout_s`` seconds SIGTERM,
        then after ``TERM_TIMEOUT_S`` more SIGKILL to its whole process group (stubs included).

        Safe to call any number of times, and on a server that never started or already exited.
        Python-backend stubs left in the server's process group once it has exited (a stub still
        starting up when the server was stopped outlives it) are killed too.
        """
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            self._signal_until_exit(process, timeout_s)
        if not self._group_reaped:
            self._group_reaped = True
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _signal_until_exit(self, process: subprocess.Popen, timeout_s: float) -> None:
        for sig, wait_s in ((signal.SIGINT, timeout_s), (signal.SIGTERM, TERM_TIMEOUT_S)):
            process.send_signal(sig)
            try:
                process.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                pass
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "not started" if self._process is None else f"pid {self._process.pid}, returncode {self.returncode}"
        return f"TritonServer({str(self.model_repository)!r}, http={self.http_url}, {state})"


def _answers_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def serve_forever(server: TritonServer, *, companion=None, restart=None) -> int:
    """Start ``server``, print its URLs, and block until Ctrl-C, SIGINT, SIGTERM or SIGHUP; then stop it.

    ``companion(server)``: called once the server is ready; returns a context manager (e.g. the
    OpenAI front, :class:`specbuild.triton_repo.openai_frontend.OpenAIServer`) entered for as long
    as the server runs, and a function that returns what to add to the ready line. Call from the main thread: it handles those signals
    itself for the duration (SIGINT too, since a shell starts background jobs with it ignored).
    Returns an exit code for the CLI: 0 after a signal, 1 if the server (or the companion) failed to
    start, else the server's own status if it ended by itself (128 + N if signal N killed it).
    ``restart``: a :class:`~specbuild.triton_repo.supervise.RestartPolicy`: a server that fails is
    started again with backoff (:func:`~specbuild.triton_repo.supervise.supervise`), and when it has
    failed more than ``max_restarts`` times the exit code is 3 (``ExitCode.SERVER_UNAVAILABLE``).
    """
    with stop_signals_interrupt():
        return _serve_until_interrupted(server, companion, restart)


def _serve_until_interrupted(server: TritonServer, companion=None, restart=None) -> int:
    stack = ExitStack()
    try:
        server.start()
        extra = ""
        if companion is not None:
            context, describe = companion(server)
            stack.enter_context(context)
            extra = describe()
        print(
            f"tritonserver ready (pid {server.pid}): HTTP {server.http_url}  gRPC {server.grpc_url}  "
            f"metrics {server.metrics_url}{extra}\nlog: {server.log_file}\nCtrl-C to stop",
            flush=True,
        )
        if restart is not None:
            from specbuild.triton_repo.supervise import supervise

            return supervise(server, restart)
        code = server.wait()
        print(f"tritonserver exited by itself with status {code}; see {server.log_file}", file=sys.stderr)
        return code if code >= 0 else 128 - code
    except (ServerStartError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping tritonserver ...", file=sys.stderr, flush=True)
        return 0
    finally:
        stack.close()
        server.stop()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def stop_signals_interrupt():
    """Within the block, SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, so
    ``finally: server.stop()`` runs however the process is asked to stop (Ctrl-C, ``kill``,
    ``timeout``, a closed terminal). The server runs in its own session and would otherwise outlive
    us. Previous handlers are restored on exit."""
    previous = {sig: signal.signal(sig, _raise_keyboard_interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
