"""End-to-end tests of ``specbuild.triton_repo.tritonserver`` (the process) and ``triton_install`` (the binary
and its environment) against a real tritonserver (CPU, Python backend).

One server (an echo model whose model.py imports the editable-installed ``specbuild``) is shared by the
request tests; the lifecycle tests (stop, broken repository, start-up timeout, serve_forever) start their
own. About 20 s on a 2-core CPU machine.
"""

from __future__ import annotations

import os
import re
import signal
import textwrap
import threading
import socket
import time
from pathlib import Path

import numpy as np
import pytest

import specbuild
from specbuild.triton_repo import triton_install
from specbuild.triton_repo.triton_install import ServerNotFoundError, find_tritonserver, server_environment
from specbuild.triton_repo.tritonserver import ServerStartError, TritonServer, serve_forever

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.e2e

ECHO_CONFIG = """\
name: "echo"
backend: "python"
max_batch_size: 0
input [
  { name: "text" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "ids" data_type: TYPE_INT32 dims: [ -1 ] }
]
output [
  { name: "text" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "ids" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "specbuild_path" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# Imports the editable-installed specbuild with no sys.path bootstrap: the launcher's PATH makes the
# stub's interpreter use this virtual environment (see the server module's docstring).
ECHO_MODEL = textwrap.dedent('''
    import numpy as np
    import triton_python_backend_utils as pb_utils

    import specbuild


    class TritonPythonModel:
        def execute(self, requests):
            origin = np.array([specbuild.__file__.encode()], dtype=np.object_)
            responses = []
            for request in requests:
                text = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()
                ids = pb_utils.get_input_tensor_by_name(request, "ids").as_numpy()
                outputs = [
                    pb_utils.Tensor("text", text),
                    pb_utils.Tensor("ids", ids),
                    pb_utils.Tensor("specbuild_path", origin),
                ]
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            return responses
''')

BROKEN_MODEL = textwrap.dedent("""
    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("broken-model-marker: initialize refused")

        def execute(self, requests):
            return []
""")


def write_model(repository: Path, model_py: str) -> Path:
    (repository / "echo" / "1").mkdir(parents=True)
    (repository / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    (repository / "echo" / "1" / "model.py").write_text(model_py)
    return repository


@pytest.fixture(scope="module")
def install():
    try:
        return find_tritonserver()
    except ServerNotFoundError as error:
        pytest.skip(f"no tritonserver: {error}")


@pytest.fixture(scope="module")
def server(install, tmp_path_factory):
    repository = write_model(tmp_path_factory.mktemp("server") / "repo", ECHO_MODEL)
    with local_server(repository, install) as server:
        yield server


def local_server(repository: Path, install, *, startup_timeout_s: float = 90) -> TritonServer:
    """A server on free ports, logging next to ``repository``."""
    log_file = repository.parent / "tritonserver.log"
    return TritonServer(
        repository, http_port=0, grpc_port=0, metrics_port=0, log_file=log_file,
        startup_timeout_s=startup_timeout_s, install=install,
    )  # fmt: skip


def echo_inputs(module, text: list[bytes], ids: list[int]):
    text_input = module.InferInput("text", [len(text)], "BYTES")
    text_input.set_data_from_numpy(np.array(text, dtype=np.object_))
    ids_input = module.InferInput("ids", [len(ids)], "INT32")
    ids_input.set_data_from_numpy(np.array(ids, dtype=np.int32))
    return [text_input, ids_input]


def check_echo(result, text: list[bytes], ids: list[int]) -> None:
    assert result.as_numpy("text").tolist() == text
    assert result.as_numpy("ids").tolist() == ids
    assert result.as_numpy("ids").dtype == np.int32


def test_find_tritonserver_locates_the_bundled_binary(install):
    assert install.binary.is_file() and os.access(install.binary, os.X_OK)
    if install.source == "nvidia-pytriton":
        assert install.binary.parts[-4:] == ("pytriton", "tritonserver", "bin", "tritonserver")
        assert (install.backend_directory / "python" / "libtriton_python.so").is_file()
        assert (install.backend_directory / "python" / "triton_python_backend_stub").is_file()
        env = server_environment(install, base={"LD_LIBRARY_PATH": "/existing", "PATH": "/usr/bin"})
        assert env["LD_LIBRARY_PATH"].split(os.pathsep)[-2:] == [str(install.library_path[-1]), "/existing"]
        assert env["PATH"].split(os.pathsep) == [str(install.bin_path[0]), "/usr/bin"]
        assert env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # the log gets no tqdm bars
        assert server_environment(install, base={"HF_HUB_DISABLE_PROGRESS_BARS": "0"})["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"
        assert find_tritonserver() == install  # the cached backend directory is reused


@pytest.fixture
def http(server):
    # An open keep-alive connection makes Triton wait up to its exit timeout (30 s) on shutdown.
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


def test_backend_directory_is_made_once(tmp_path):
    first = find_tritonserver(cache_dir=tmp_path)
    if first.source != "nvidia-pytriton":
        pytest.skip("tritonserver on PATH uses its own backends")
    assert first.backend_directory.parent == tmp_path
    assert find_tritonserver(cache_dir=tmp_path) == first
    assert [p.name for p in tmp_path.iterdir()] == [first.backend_directory.name]  # no partial copies


def test_missing_server_says_how_to_install(monkeypatch):
    monkeypatch.setattr(triton_install.shutil, "which", lambda name: None)
    monkeypatch.setattr(triton_install.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ServerNotFoundError, match=re.escape("pip install 'specbuild[server]'")):
        find_tritonserver()


def test_http_echo_and_editable_import(http):
    client = http
    text, ids = [b"hello", "caf\u00e9".encode()], [1, -2, 2**31 - 1]
    result = client.infer("echo", echo_inputs(httpclient, text, ids))
    check_echo(result, text, ids)
    assert Path(result.as_numpy("specbuild_path")[0].decode()) == Path(specbuild.__file__)


def test_grpc_echo(server):
    text, ids = [b"grpc"], [7]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        check_echo(client.infer("echo", echo_inputs(grpcclient, text, ids)), text, ids)


def test_bad_request_fails_and_server_keeps_serving(http):
    client = http
    wrong = httpclient.InferInput("no_such_input", [1], "INT32")
    wrong.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="no_such_input"):
        client.infer("echo", [wrong])
    check_echo(client.infer("echo", echo_inputs(httpclient, [b"after"], [3])), [b"after"], [3])


def test_real_ports_and_metrics(server):
    ports = {server.http_port, server.grpc_port, server.metrics_port}
    assert len(ports) == 3 and 0 not in ports
    assert server.http_url == f"127.0.0.1:{server.http_port}"
    assert "--http-address" in server.command and "127.0.0.1" in server.command


def test_stop_leaves_no_process_and_a_log(install, tmp_path):
    repository = write_model(tmp_path / "repo", ECHO_MODEL)
    server = local_server(repository, install, startup_timeout_s=90)
    with server:
        stubs = child_pids(server.pid)
        assert stubs, "the Python backend runs each model instance in a stub process"
    assert server.returncode is not None
    assert not any(alive(pid) for pid in [server.pid, *stubs])
    assert "echo" in server.log_file.read_text()
    server.stop()  # idempotent


def test_broken_repository_fails_fast_with_the_error(install, tmp_path):
    repository = write_model(tmp_path / "repo", BROKEN_MODEL)
    server = local_server(repository, install, startup_timeout_s=90)
    began = time.monotonic()
    with pytest.raises(ServerStartError, match="(?s)exited with status 1.*broken-model-marker"):
        server.start()
    assert any("failed to load 'echo'" in line and "broken-model-marker" in line for line in server.log_errors())
    assert time.monotonic() - began < 60
    assert server.returncode is not None
    server.stop()


def test_port_in_use_fails_before_launch_and_names_the_fix(install, tmp_path):
    repository = write_model(tmp_path / "repo", ECHO_MODEL)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = TritonServer(repository, http_port=port, grpc_port=0, metrics_port=0, install=install)
        with pytest.raises(ServerStartError, match=f"http port {port} on 127.0.0.1 is already in use.*0 for a free port"):
            server.start()
    assert server.pid is None  # nothing was launched


def child_pids(parent: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may contain spaces.
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            children.append(int(entry.name))
    return children


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_startup_timeout_stops_the_server(install, tmp_path):
    repository = write_model(tmp_path / "repo", ECHO_MODEL)
    server = local_server(repository, install, startup_timeout_s=0.1)
    with pytest.raises(ServerStartError, match="not ready after 0.1 s"):
        server.start()
    assert server.returncode is not None
    assert wait_for(lambda: not group_members(server.pid)), "a backend stub outlived the server"


def group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid`` (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_serve_forever_stops_on_sigterm(install, tmp_path, capsys):
    repository = write_model(tmp_path / "repo", ECHO_MODEL)
    server = local_server(repository, install, startup_timeout_s=90)

    def terminate_when_ready() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "ready" not in capsys.readouterr().out:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    handlers_before = [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)]
    threading.Thread(target=terminate_when_ready, daemon=True).start()
    assert serve_forever(server) == 0
    assert server.returncode == 0
    assert [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)] == handlers_before


def test_expected_cuda_error_lines_of_a_cpu_start_are_counted_apart(tmp_path):
    from specbuild.triton_repo.tritonserver import expected_error_lines

    log = tmp_path / "tritonserver.log"
    log.write_text(
        'E1204 17:03:11.589228 13683 server.cc:241] "CudaDriverHelper has not been initialized."\n'
        'I1204 17:03:11.591091 13683 model_lifecycle.cc:472] "loading: postprocessing:1"\n'
        'E1204 17:03:40.110649 13683 ensemble_scheduler.cc:1468] "unable to create stream for ensemble: CUDA driver '
        'version is insufficient for CUDA runtime version"\n'
        'E1204 17:03:41.000000 13683 model.cc:1] "failed to load model"\n'
    )
    assert expected_error_lines(log) == 2 and expected_error_lines(tmp_path / "missing.log") == 0


@pytest.mark.parametrize("system, machine, libc, problem", [
    ("Linux", "x86_64", ("glibc", "2.35"), None),
    ("Linux", "x86_64", ("glibc", "2.39"), None),
    ("Linux", "x86_64", ("glibc", "2.31"), "this Linux has glibc 2.31"),
    ("Linux", "x86_64", ("", ""), "this Linux has no glibc"),  # musl (Alpine)
    ("Linux", "aarch64", ("glibc", "2.39"), "this is Linux on aarch64"),
    ("Darwin", "arm64", ("", ""), "this is Darwin on arm64"),
    ("Windows", "AMD64", ("", ""), "this is Windows on AMD64"),
])
def test_platform_that_cannot_run_the_bundled_tritonserver_is_named(system, machine, libc, problem):
    from specbuild.triton_repo.triton_install import platform_problem

    found = platform_problem(system, machine, libc)
    if problem is None:
        assert found is None
    else:
        assert found.startswith(problem) and "Linux on x86-64 with glibc 2.35 or newer" in found


def test_missing_server_on_an_unsupported_platform_says_why_pip_cannot_help(monkeypatch):
    import importlib.util
    import platform
    import shutil

    from specbuild.triton_repo import triton_install

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    with pytest.raises(ServerNotFoundError, match="this is Darwin on arm64; tritonserver from PyPI"):
        triton_install.find_tritonserver()


def test_the_tests_server_start_timeout_comes_from_the_environment(tmp_path, server_start_timeout):
    """$SPECBUILD_TEST_SERVER_START_S (README, "Tests") sets how long the end-to-end fixtures wait for
    tritonserver; a test's own startup_timeout_s still wins; a bad value is a usage error, not a silent 300."""
    from conftest import server_start_timeout_s

    assert TritonServer(tmp_path, http_port=0, grpc_port=0, metrics_port=0).startup_timeout_s == server_start_timeout
    assert TritonServer(tmp_path, startup_timeout_s=0.1).startup_timeout_s == 0.1
    assert server_start_timeout_s({"SPECBUILD_TEST_SERVER_START_S": "900"}) == 900.0
    assert server_start_timeout_s({}, load=0.5, cores=2) == 300.0  # idle: TritonServer's default
    assert server_start_timeout_s({}, load=3.0, cores=2) == 450.0  # busy: scaled by load per core
    assert server_start_timeout_s({}, load=10.0, cores=2) == 1200.0  # the nc3 trial's machine: capped at x4
    assert server_start_timeout_s({"SPECBUILD_TEST_SERVER_START_S": "200"}, load=10.0, cores=2) == 200.0  # the knob wins
    for bad in ("0", "-5", "five minutes"):
        with pytest.raises(pytest.UsageError, match="SPECBUILD_TEST_SERVER_START_S"):
            server_start_timeout_s({"SPECBUILD_TEST_SERVER_START_S": bad})
