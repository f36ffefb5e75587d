"""``specbuild serve --restart on-failure``: bring tritonserver back when it dies.

Docker's ``--restart on-failure[:max-retries]`` semantics: a server that exits with a non-zero status
or is killed by a signal is started again on the same ports, after ``backoff_s * 2**(n-1)`` seconds
(capped at ``max_backoff_s``) for the n-th restart; a clean exit (status 0) is not restarted. Each
failure is logged with why (the exit status or signal, and the log's error lines); a restart that
fails to start counts as a failure too. After ``max_restarts`` restarts the next failure ends serving
with exit code 3 (``ExitCode.SERVER_UNAVAILABLE``). The count is :attr:`TritonServer.restarts`, which
the OpenAI front publishes as ``specbuild_server_restarts_total`` on its ``/metrics``.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass

GAVE_UP_EXIT_CODE = 3  # specbuild.exit_codes.ExitCode.SERVER_UNAVAILABLE


@dataclass(frozen=True)
class RestartPolicy:
    """How often and how soon to restart (seconds); ``max_restarts`` >= 0."""

    max_restarts: int = 5
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def delay_s(self, restart: int) -> float:
        """Seconds before restart number ``restart`` (1-based). Example: 1 s, 2 s, 4 s, ... up to 30 s."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** (restart - 1))


def exit_reason(code: int) -> str:
    """``"exited with status 1"`` / ``"was killed by SIGKILL"`` for a Popen return code."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def supervise(server, policy: RestartPolicy, *, log=lambda line: print(line, file=sys.stderr, flush=True)) -> int:
    """Wait on the running ``server`` (a :class:`~specbuild.triton_repo.tritonserver.TritonServer`) and
    restart it as ``policy`` says; return the CLI's exit code: 0 after a clean exit, 3 after giving up.
    Ctrl-C / a stop signal (KeyboardInterrupt) propagates to the caller, which stops the server."""
    from specbuild.triton_repo.tritonserver import ServerStartError

    while True:
        code = server.wait()
        if code == 0:
            log(f"tritonserver exited by itself with status 0; see {server.log_file}")
            return 0
        why = f"tritonserver (pid {server.pid}) {exit_reason(code)}" + _errors(server)
        while True:
            if server.restarts >= policy.max_restarts:
                log(f"{why}; giving up after {server.restarts} restart(s) (--max-restarts {policy.max_restarts}); "
                    f"see {server.log_file}")
                return GAVE_UP_EXIT_CODE
            delay = policy.delay_s(server.restarts + 1)
            log(f"{why}; restart {server.restarts + 1}/{policy.max_restarts} in {delay:g} s")
            time.sleep(delay)
            try:
                server.restart()
            except ServerStartError as exc:
                why = f"tritonserver failed to start again: {str(exc).splitlines()[0]}"
                continue
            log(f"tritonserver ready again (pid {server.pid}, restart {server.restarts}/{policy.max_restarts}): "
                f"HTTP {server.http_url}  gRPC {server.grpc_url}")
            break


def _errors(server) -> str:
    """``": E... | E..."``: the last error lines of the log's tail (this run's), known harmless ones left out."""
    from specbuild.triton_repo.tritonserver import ERROR_LINE, HARMLESS_ERRORS

    lines = [line.strip() for line in server.log_tail().splitlines()
             if ERROR_LINE.match(line) and not any(h in line for h in HARMLESS_ERRORS)]
    return (": " + " | ".join(lines[-3:])) if lines else ""
