"""Bad input to the commands' options (durations, rates, server addresses, tokenizers, output paths,
bench.json rows) and output into a closed pipe: exit 2 naming the option or file and the value, never a
traceback or a hang; a failed `migrate` leaves the user's file as it was; an unreachable OpenAI server is
exit 3 like a Triton one."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.exit_codes import ExitCode

ROOT = Path(__file__).resolve().parents[1]
BENCH_JSON = ROOT / "benchmarks" / "results" / "tune-cpu-smollm2" / "bench.json"
FAST_S = 5.0  # a refusal at parsing; a bug here waits --wait-s (30 s) or forever


def free_port() -> int:
    """A port where nothing listens (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*args: str):
    """``specbuild ARGS`` in-process: (exit code, stdout and stderr together, seconds)."""
    start = time.perf_counter()
    result = CliRunner().invoke(main, list(args))
    elapsed = time.perf_counter() - start
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output, elapsed


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m specbuild.cli ARGS`` in a subprocess (a hang fails the test instead of stalling it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "specbuild.cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)


# --- 1. durations and rates: finite, not negative ---------------------------------------------------
@pytest.mark.parametrize("command", ["verify", "bench"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_wait_s_nan_or_inf_is_refused_instead_of_waiting_forever(command, value):
    url = f"127.0.0.1:{free_port()}"
    args = ["verify", "--url", url] if command == "verify" else ["bench", url, "--concurrency", "1"]
    done = cli(*args, "--wait-s", value, "--prompts", "humaneval:1", timeout=60)
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    assert "--wait-s" in done.stderr and value in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("args, option", [
    (["verify", "--wait-s", "-1"], "--wait-s"),
    (["verify", "--stagger-s", "nan"], "--stagger-s"),
    (["verify", "--temperature", "nan"], "--temperature"),
    (["verify", "--near-tie-margin", "inf"], "--near-tie-margin"),
    (["bench", "x", "--timeout-s", "inf"], "--timeout-s"),
    (["bench", "x", "--ramp", "1,2", "--ramp-step-s", "nan"], "--ramp-step-s"),
    (["bench", "x", "--request-rate", "nan"], "--request-rate"),
    (["bench", "x", "--request-rate", "-2"], "--request-rate"),
    (["bench", "x", "--request-rate-sweep", "1,nan"], "--request-rate-sweep"),
    (["bench", "x", "--request-rate-sweep", "1,-3"], "--request-rate-sweep"),
    (["bench", "x", "--burstiness", "inf"], "--burstiness"),
    (["bench", "x", "--stability-percentage", "nan"], "--stability-percentage"),
    (["tune", "x", "--max-latency-ms", "nan"], "--max-latency-ms"),
    (["tune", "x", "--min-gain", "nan"], "--min-gain"),
])
def test_every_duration_and_rate_refuses_non_finite_and_negative_values(args, option):
    code, out, elapsed = run(*args)
    assert code == ExitCode.BAD_INPUT, out
    assert option in out, out
    assert elapsed < FAST_S


# --- 2. --tokenizer: a folder with no tokenizer or a broken one ---------------------------------------
@pytest.mark.parametrize("command", ["verify", "bench"])
@pytest.mark.parametrize("contents, words", [({}, "holds no tokenizer"), ({"tokenizer.json": "{bad"}, "cannot be loaded")])
def test_tokenizer_folder_without_a_usable_tokenizer_is_named(tmp_path, command, contents, words):
    folder = tmp_path / "tok"
    folder.mkdir()
    for name, text in contents.items():
        (folder / name).write_text(text)
    url = f"127.0.0.1:{free_port()}"
    args = ["verify", "--url", url] if command == "verify" else ["bench", url, "--concurrency", "1"]
    code, out, _ = run(*args, "--tokenizer", str(folder), "--wait-s", "0", "--prompts", "humaneval:1")
    assert code == ExitCode.BAD_INPUT, out
    assert "--tokenizer" in out and str(folder) in out and words in out, out


def test_a_good_tokenizer_folder_still_passes(tiny_checkpoint):
    code, out, _ = run("verify", "--url", f"127.0.0.1:{free_port()}", "--tokenizer", str(tiny_checkpoint), "--wait-s", "0",
                       "--prompts", "humaneval:1")
    assert code == ExitCode.SERVER_UNAVAILABLE, out  # past the tokenizer, on to the (absent) server


# --- 3. tune --from: rows that are not measurements --------------------------------------------------
@pytest.mark.parametrize("field, value", [("total_tok_s", "fast"), ("latency_ms_p50", None), ("total_tok_s", -5.0),
                                          ("latency_ms_p50", float("nan")), ("draft_len", 1.5)])
def test_tune_from_a_bench_json_with_a_bad_figure_names_file_row_and_field(tmp_path, field, value):
    data = json.loads(BENCH_JSON.read_text())
    data["points"][3][field] = value
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    code, out, _ = run("tune", "--from", str(path), "--results-dir", str(tmp_path / "tune"))
    assert code == ExitCode.BAD_INPUT, out
    assert str(path) in out and "points[3]" in out and field in out, out
    assert not (tmp_path / "tune" / "tune.json").exists()


def test_tune_from_the_bundled_bench_json_still_tunes(tmp_path):
    code, out, _ = run("tune", "--from", str(BENCH_JSON), "--results-dir", str(tmp_path))
    assert code == ExitCode.OK, out
    assert (tmp_path / "tune.json").is_file()


# --- 4. migrate: nothing the user had is lost ---------------------------------------------------------
@pytest.fixture
def engine_recipe(tmp_path) -> Path:
    path = tmp_path / "x.yaml"
    shutil.copy(ROOT / "recipes" / "llama-eagle.yaml", path)
    return path


@pytest.mark.parametrize("flag, value", [("--trtllm-version", "abc"), ("--trtllm-version", "2.0")])
def test_failed_migrate_over_its_own_recipe_leaves_it_unchanged_and_names_the_flag(engine_recipe, flag, value):
    before = engine_recipe.read_bytes()
    code, out, _ = run("migrate", str(engine_recipe), "-o", str(engine_recipe), flag, value)
    assert code == ExitCode.BAD_INPUT, out
    assert f"{flag} {value}" in out.replace(f"'{value}'", value), out
    assert engine_recipe.read_bytes() == before
    assert [p.name for p in engine_recipe.parent.iterdir()] == ["x.yaml"]  # no half-written or temporary file


def test_failed_migrate_to_a_new_path_writes_nothing(engine_recipe):
    out_path = engine_recipe.parent / "new.yaml"
    code, out, _ = run("migrate", str(engine_recipe), "-o", str(out_path), "--trtllm-version", "abc")
    assert code == ExitCode.BAD_INPUT, out
    assert not out_path.exists()


def test_migrate_whose_write_fails_keeps_the_old_file(engine_recipe, monkeypatch):
    import errno

    before = engine_recipe.read_bytes()

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    code, out, _ = run("migrate", str(engine_recipe), "-o", str(engine_recipe))
    assert code == ExitCode.BAD_INPUT, out
    assert "No space left on device" in out and str(engine_recipe) in out
    assert engine_recipe.read_bytes() == before
    assert [p.name for p in engine_recipe.parent.iterdir()] == ["x.yaml"]


def test_migrate_over_its_own_recipe_replaces_it_with_a_valid_one(engine_recipe):
    code, out, _ = run("migrate", str(engine_recipe), "-o", str(engine_recipe))
    assert code == ExitCode.OK, out
    assert run("plan", str(engine_recipe))[0] == ExitCode.OK
    assert [p.name for p in engine_recipe.parent.iterdir()] == ["x.yaml"]


@pytest.mark.parametrize("output, words", [("{dir}", "is a folder"), ("", "is empty"), ("{dir}/no/such/x.yaml", "does not exist"),
                                           ("{dir}/x.yaml/y.yaml", "is not a folder")])
def test_migrate_output_that_cannot_be_a_file_is_refused(engine_recipe, output, words):
    output = output.replace("{dir}", str(engine_recipe.parent))
    code, out, _ = run("migrate", "llama-eagle", "-o", output)
    assert code == ExitCode.BAD_INPUT, out
    assert "-o" in out and words in out, out


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="Linux /proc")
def test_migrate_output_where_nothing_can_be_written():
    code, out, _ = run("migrate", "llama-eagle", "-o", "/proc/x.yaml")
    assert code == ExitCode.BAD_INPUT, out
    assert "-o /proc/x.yaml: cannot write there" in out, out


# --- 5. server addresses ---------------------------------------------------------------------------------
def test_unreachable_openai_server_is_exit_3_for_verify_and_bench():
    url = f"http://127.0.0.1:{free_port()}/v1"
    code, out, _ = run("verify", "--openai", url, "--wait-s", "0", "--prompts", "humaneval:1")
    assert code == ExitCode.SERVER_UNAVAILABLE and f"OpenAI server at {url} is not reachable" in out, out
    code, out, _ = run("bench", "--openai", url, "--wait-s", "0", "--concurrency", "1", "--prompts", "humaneval:1")
    assert code == ExitCode.SERVER_UNAVAILABLE and f"OpenAI server at {url} is not reachable" in out, out


def test_a_reachable_openai_server_gets_past_the_wait():
    """A server that answers /v1/models is not "unreachable": verify goes on to ask what it is (here not
    specbuild's front, so it needs --openai-baseline: exit 1 with that advice, as before)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Models(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "someone"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Models) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/v1"
            code, out, _ = run("verify", "--openai", url, "--wait-s", "5", "--prompts", "humaneval:1")
        finally:
            server.shutdown()
    assert code == ExitCode.FAILED and "--openai-baseline" in out, out


@pytest.mark.parametrize("url, words", [("127.0.0.1:99999", "port '99999'"), ("127.0.0.1:-1", "port '-1'"),
                                        ("", "names no server"), ("http://", "names no server")])
def test_verify_url_that_is_no_server_address_is_refused(url, words):
    code, out, elapsed = run("verify", "--url", url, "--wait-s", "30", "--prompts", "humaneval:1")
    assert code == ExitCode.BAD_INPUT, out
    assert "--url" in out and words in out, out
    assert elapsed < FAST_S


@pytest.mark.parametrize("args, option", [(["bench", "127.0.0.1:99999"], "TARGET"),
                                          (["bench", "127.0.0.1:8001", "--metrics-url", "h:0"], "--metrics-url"),
                                          (["verify", "--openai", ""], "--openai"),
                                          (["verify", "--openai", "http://h:99999/v1"], "--openai"),
                                          (["bench", "--openai", "http://h:70000/v1"], "--openai")])
def test_other_server_addresses_out_of_range_are_refused(args, option):
    code, out, _ = run(*args, "--wait-s", "0")
    assert code == ExitCode.BAD_INPUT, out
    assert option in out, out


def test_verify_url_and_openai_together_is_a_conflict():
    code, out, _ = run("verify", "--url", "127.0.0.1:8001", "--openai", "http://127.0.0.1:9000/v1", "--wait-s", "30")
    assert code == ExitCode.BAD_INPUT and "--url" in out and "--openai" in out, out


# --- 6. build -o a file ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["build"], ["recipe", "--dry-run"], ["plan"]])
def test_output_dir_that_is_a_file_is_refused_and_left_alone(tmp_path, command):
    path = tmp_path / "fileout.txt"
    path.write_text("mine\n")
    code, out, _ = run(command[0], "smollm2-ngram", *command[1:], "-o", str(path))
    assert code == ExitCode.BAD_INPUT, out
    assert f"-o {path} is a file; give a directory" in out, out
    assert path.read_text() == "mine\n"


# --- 7. a closed pipe -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["recipes"], ["recipes", "--json"], ["plan", "smollm2-ngram"]])
def test_output_into_a_closed_pipe_ends_quietly(args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "specbuild.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=ROOT, env=env)
    process.stdout.close()  # the reader is gone before the first line (`specbuild recipes | head -0`)
    _, err = process.communicate(timeout=120)
    err = err.decode()
    assert process.returncode == 141, err  # as a process killed by SIGPIPE: not 0, not a failure of its own
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


# --- 8. load levels and objectives ------------------------------------------------------------------------
@pytest.mark.parametrize("args, option", [
    (["verify", "--concurrency", "0"], "--concurrency"),
    (["verify", "--concurrency", "1,,4"], "--concurrency"),
    (["verify", "--concurrency", ""], "--concurrency"),
    (["bench", "x", "--concurrency", "0"], "--concurrency"),
    (["bench", "x", "--concurrency-sweep", "1,0"], "--concurrency-sweep"),
    (["bench", "x", "--num-draft-tokens", "0,,2"], "--num-draft-tokens"),
    (["bench", "x", "--slo", ""], "--slo"),
    (["bench", "x", "--slo", "ttft=nan"], "--slo"),
    (["bench", "x", "--slo", "fast=1"], "--slo"),
    (["bench", "x", "--ramp", ""], "--ramp"),
    (["bench", "x", "--ramp", "1,0,2"], "--ramp"),
])
def test_load_levels_and_objectives_are_refused_at_parsing(args, option):
    code, out, elapsed = run(*args, "--wait-s", "30")
    assert code == ExitCode.BAD_INPUT, out
    assert option in out, out
    assert elapsed < FAST_S  # before any server is tried


@pytest.mark.parametrize("load", [["--concurrency-sweep", "1,2"], ["--concurrency", "2"], ["--request-rate", "1"],
                                  ["--request-rate-sweep", "1,2"]])
def test_ramp_with_another_load_flag_is_a_conflict(load):
    code, out, _ = run("bench", "x", "--ramp", "1,2", *load)
    assert code == ExitCode.BAD_INPUT, out
    assert "--ramp" in out and load[0] in out, out
