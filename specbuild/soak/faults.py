"""The served process tree and the faults the soak injects into it.

    kill        SIGKILL tritonserver; ``specbuild serve --restart on-failure`` starts it again
    stall       SIGSTOP tritonserver for ``stall_s`` seconds, then SIGCONT
    disk-full   fill the filesystem under the results directory (a tmpfs mounted there when this
                process may mount, else a writer that fails with ENOSPC: ``mode`` says which) and
                write the live results through it; every file there must stay complete
    kv-exhaust  more long requests at once (near max_input_len, up to max_seq_len) than the engine
                has KV slots (max_batch_size), while the normal load goes on

Recovery is measured by a probe: a new gRPC client sending a 2-token plain request every
``probe_interval_s`` until one succeeds.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from specbuild.util.atomic import write_file_atomic

FAULTS = ("kill", "stall", "disk-full", "kv-exhaust")
STUB_NAME = "triton_python_backend_stub"
FILLER = ".filler"  # the file that fills the disk


class ServedTree:
    """The serving process tree: ``root_pid`` (``specbuild serve``, or tritonserver itself) and below it
    ``tritonserver`` and its Python-backend stubs, looked up afresh on every call (a restart changes them)."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid

    def tritonserver(self) -> psutil.Process | None:
        try:
            root = psutil.Process(self.root_pid)
            if root.name().startswith("tritonserver"):
                return root
            return next((p for p in root.children(recursive=True) if p.name().startswith("tritonserver")), None)
        except psutil.Error:
            return None

    def stubs(self, server: psutil.Process | None = None) -> list[psutil.Process]:
        server = server or self.tritonserver()
        if server is None:
            return []
        try:
            return [p for p in server.children(recursive=True) if p.name().startswith(STUB_NAME)]
        except psutil.Error:
            return []

    def sample(self) -> dict:
        """RSS (bytes) and threads of tritonserver, its stubs (summed) and the root (the front), and
        tritonserver's pid; zeros for what is not running."""
        server = self.tritonserver()
        out = {"pid": server.pid if server else None, "server_rss": 0, "server_threads": 0, "stub_rss": 0,
               "stub_threads": 0, "stubs": 0, "front_rss": 0, "front_threads": 0}
        for key, procs in (("server", [server] if server else []), ("stub", self.stubs(server))):
            for p in procs:
                try:
                    with p.oneshot():
                        out[f"{key}_rss"] += p.memory_info().rss
                        out[f"{key}_threads"] += p.num_threads()
                except psutil.Error:
                    pass
        out["stubs"] = len(self.stubs(server))
        if server is None or server.pid != self.root_pid:
            try:
                root = psutil.Process(self.root_pid)
                out["front_rss"], out["front_threads"] = root.memory_info().rss, root.num_threads()
            except psutil.Error:
                pass
        out["rss"] = out["server_rss"] + out["stub_rss"]
        return out


def probe_until_ok(grpc_url: str, *, since: float, clock: Callable[[], float], give_up_s: float,
                   interval_s: float = 0.5) -> float | None:
    """Seconds from ``since`` until a new client's 2-token plain request succeeds; None after ``give_up_s``."""
    from specbuild.client.sdk import SpecClient

    deadline = clock() + give_up_s
    while clock() < deadline:
        try:
            with SpecClient(grpc_url, timeout_s=5.0, retries=0, decoupled=True) as client:
                client.generate("ok", max_tokens=2, num_draft_tokens=0)
            return clock() - since
        except Exception:  # noqa: BLE001 - any failure (typed or tritonclient's own) means not yet
            time.sleep(interval_s)
    return None


@dataclass
class FaultResult:
    """One injected fault: when (seconds since the run started), how long to recover (None: never),
    and the details (``detail``); ``clients`` is filled from the ledger after the run."""

    name: str
    start: float
    end: float | None = None
    recovery_s: float | None = None
    detail: dict = field(default_factory=dict)
    clients: dict = field(default_factory=dict)


def kill(tree: ServedTree, grpc_url: str, clock, *, give_up_s: float) -> FaultResult:
    server = tree.tritonserver()
    if server is None:
        raise RuntimeError("no tritonserver process to kill")
    result = FaultResult("kill", clock(), detail={"killed_pid": server.pid})
    os.kill(server.pid, signal.SIGKILL)
    result.recovery_s = probe_until_ok(grpc_url, since=result.start, clock=clock, give_up_s=give_up_s)
    result.end = clock()
    after = tree.tritonserver()
    result.detail["new_pid"] = after.pid if after else None
    return result


def stall(tree: ServedTree, grpc_url: str, clock, *, stall_s: float, give_up_s: float) -> FaultResult:
    server = tree.tritonserver()
    if server is None:
        raise RuntimeError("no tritonserver process to stop")
    result = FaultResult("stall", clock(), detail={"pid": server.pid, "stopped_s": stall_s})
    os.kill(server.pid, signal.SIGSTOP)
    try:
        time.sleep(stall_s)
    finally:
        os.kill(server.pid, signal.SIGCONT)
    resumed = clock()
    result.detail["resumed_at_s"] = resumed
    recovery = probe_until_ok(grpc_url, since=resumed, clock=clock, give_up_s=give_up_s)
    result.recovery_s = None if recovery is None else recovery
    result.end = clock()
    return result


class LiveResults:
    """The soak's results written while it runs (``soak-live.json`` under ``directory``, atomically);
    write failures (a full disk) are counted, never raised."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.writes = 0
        self.failures: list[str] = []
        self._fail_with: int | None = None  # simulated errno while set
        self._lock = threading.Lock()

    def write(self, payload: dict) -> bool:
        data = json.dumps(payload, indent=1).encode()
        with self._lock:
            try:
                if self._fail_with is not None:
                    raise OSError(self._fail_with, os.strerror(self._fail_with), str(self.directory))
                write_file_atomic(self.directory / "soak-live.json", data)
                self.writes += 1
                return True
            except OSError as exc:
                self.failures.append(f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}")
                return False


def check_complete(directory: Path) -> dict:
    """Every visible file under ``directory`` parses as whole JSON; hidden temporaries are listed."""
    files = [p for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".") and p.suffix == ".json"]
    broken = []
    for p in files:
        try:
            json.loads(p.read_bytes())
        except (ValueError, OSError):
            broken.append(p.name)
    hidden = [p.name for p in directory.rglob(".*") if p.is_file() and p.name != FILLER]
    return {"json_files": len(files), "incomplete": broken, "temporaries": hidden}


@dataclass
class SmallDisk:
    """A small tmpfs mounted at ``path`` (root only), or None where mounting is not allowed."""

    path: Path
    size: str = "4m"
    mounted: bool = False

    def mount(self) -> bool:
        self.path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0 or shutil.which("mount") is None:
            return False
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.path)],
                              capture_output=True, timeout=30)
        self.mounted = done.returncode == 0
        return self.mounted

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=30)
            self.mounted = False


def disk_full(live: LiveResults, disk: SmallDisk, payload: Callable[[], dict], clock, *, hold_s: float) -> FaultResult:
    """Fill the live results' filesystem, keep writing for ``hold_s`` seconds, free it, write again."""
    result = FaultResult("disk-full", clock(), detail={"mode": "tmpfs" if disk.mounted else "simulated ENOSPC"})
    filler = live.directory / FILLER
    before = len(live.failures)
    if disk.mounted:
        try:
            with open(filler, "wb") as f:
                while True:
                    f.write(b"\0" * (1 << 16))
                    f.flush()
        except OSError as exc:
            result.detail["filled"] = errno.errorcode.get(exc.errno, str(exc.errno))
    else:
        live._fail_with = errno.ENOSPC
    deadline = clock() + hold_s
    attempts = 0
    while clock() < deadline:
        live.write(payload())
        attempts += 1
        time.sleep(min(1.0, hold_s / 4))
    result.detail["during"] = check_complete(live.directory)
    result.detail["write_attempts"], result.detail["write_failures"] = attempts, live.failures[before:][:3]
    result.detail["failed_writes"] = len(live.failures) - before
    freed = clock()
    filler.unlink(missing_ok=True)
    live._fail_with = None
    ok = live.write(payload())
    result.end = clock()
    result.recovery_s = result.end - freed if ok else None
    result.detail["after"] = check_complete(live.directory)
    return result
