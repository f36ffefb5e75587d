"""``specbuild verify --concurrency``: the greedy check under load, with a scripted client and end to end
(a real tritonserver over the tiny n-gram engine, through Triton and through the OpenAI front)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest
from click.testing import CliRunner

from fake_client import ReadyClient
from specbuild.cli import main
from specbuild.client.prompts import Prompt
from specbuild.client.sdk import GenerateResult
from specbuild.client.verify_load import LoadedRun, in_flight_range, verify_under_load


def _run(start, end):
    return LoadedRun("p", GenerateResult([1], "", end - start), start, end)


def test_in_flight_range_counts_the_requests_overlapping_each_moment():
    me, short, late = _run(0, 10), _run(2, 4), _run(3, 12)
    assert in_flight_range(me, [me, short, late]) == (1, 3)
    assert in_flight_range(short, [me, short, late]) == (2, 3)
    assert in_flight_range(_run(20, 21), [me, _run(20, 21)]) == (1, 1)


class LoadScriptedClient(ReadyClient):
    """Plain runs give the reference; speculative runs diverge at position 1 for prompt "q" only when
    another request is in flight (what a schedule bug looks like). Logit margins on request."""

    in_flight = 0
    lock = threading.Lock()

    def generate(self, prompt, *, max_tokens, num_draft_tokens=None, end_id=None, **asks):
        ids = [7, 8, 9][:max_tokens]
        if asks:
            return GenerateResult(ids, "", 0.01, logit_margin=[5.0, 0.5, 3.0], runner_up_ids=[1, 4, 2])
        if num_draft_tokens == 0:
            return GenerateResult(ids, "", 0.04, total_accepted_draft_tokens=0, total_draft_tokens=0)
        with self.lock:
            type(self).in_flight += 1
            crowded = type(self).in_flight > 1
        deadline = time.monotonic() + 2.0  # decode until a neighbour arrives (or 2 s): overlap, not timing luck
        while not crowded and time.monotonic() < deadline:
            time.sleep(0.02)
            with self.lock:
                crowded = type(self).in_flight > 1
        time.sleep(0.05)
        with self.lock:
            crowded = crowded or type(self).in_flight > 1
            type(self).in_flight -= 1
        out = [7, 4, 9] if prompt == "q" and crowded else ids
        return GenerateResult(out, "", 0.04, total_accepted_draft_tokens=1, total_draft_tokens=2)


def test_a_divergence_only_under_load_is_found_with_its_margin_and_the_level():
    prompts = [Prompt("P", "p"), Prompt("Q", "q")]
    report = verify_under_load(LoadScriptedClient, prompts, levels=(1, 2), max_tokens=3, stagger_s=0.0)
    alone, crowded = report.levels
    assert alone.num_match == 2 and crowded.concurrency == 2 and len(crowded.runs) == 2
    (bad,) = [r for r in crowded.runs if not r.match]
    assert (bad.prompt_id, bad.divergence.position, bad.divergence.logit_margin, bad.divergence.runner_up_token) == ("Q", 1, 0.5, 4)
    assert bad.divergence.speculative_took_runner_up and not report.passed
    assert bad.in_flight[1] == 2 and crowded.num_crossed <= 2 and crowded.acceptance_rate == 0.5
    relaxed = verify_under_load(LoadScriptedClient, prompts, levels=(2,), max_tokens=3, stagger_s=0.0, near_tie_margin=1.0)
    assert relaxed.passed and not relaxed.all_match
    data = report.to_json()
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2] and data["levels"][1]["num_match"] == 1


def test_levels_below_one_are_refused():
    with pytest.raises(ValueError, match="levels must be >= 1"):
        verify_under_load(LoadScriptedClient, [Prompt("P", "p")], levels=(0,), max_tokens=3)


@pytest.mark.e2e
def test_verify_under_load_through_triton_and_the_openai_front(decoupled_server, tmp_path):
    from specbuild.triton_repo.openai_frontend import OpenAIServer, config_from_deployment

    triton, _ = decoupled_server
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in (
        "for i in range(10):\n    print(i, i * i)\nfor i in range(10):\n    print(i", "def fib(n):\n    if n < 2:\n")))
    common = ["verify", "--prompts", str(prompts), "--max-tokens", "16", "--end-id", "-1", "--concurrency", "1,3"]
    runner = CliRunner()
    result = runner.invoke(main, [*common, "--url", triton.grpc_url, "--streaming", "--report", str(tmp_path / "t.json")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "t.json").read_text())
    assert report["passed"] and [lv["concurrency"] for lv in report["levels"]] == [1, 3]
    crowded = report["levels"][1]
    assert crowded["requests"] == 3 and crowded["max_in_flight"] >= 2
    assert all(run["speculative"]["total_draft_tokens"] for run in crowded["runs"])
    assert "LOSSLESS UNDER LOAD" in result.output and "C=3" in result.output
    with OpenAIServer(config_from_deployment(triton.grpc_url, model="tiny-ngram"), port=0) as front:
        result = runner.invoke(main, [*common, "--openai", front.url, "--report", str(tmp_path / "o.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o.json").read_text())["passed"]


@pytest.mark.e2e
def test_lossless_under_load_with_a_schedule_and_the_ramp_sees_drafting_stop(tiny_checkpoint, tmp_path):
    """The tiny n-gram engine with draft_len_schedule {1: 4, 2: 2} and max_concurrency 2: requests cross
    K=4 -> 2 -> 0 and back while they decode; every output still equals its plain run, and the ramp's
    derived draft length follows the schedule (0 at C=3)."""
    from conftest import write_recipe
    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine
    from specbuild.triton_repo.reference_repository import spec_from_engine_dir, write_reference_repository
    from specbuild.triton_repo.tritonserver import TritonServer

    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint, extra="")
    text = recipe.read_text().replace("build:\n", "build:\n  draft_len_schedule: {1: 4, 2: 2}\n  max_concurrency: 2\n")
    recipe.write_text(text)
    engine_dir = build_reference_engine(load_recipe(str(recipe)), tmp_path / "engine", log=lambda m: None).engine_dir
    repo = write_reference_repository(spec_from_engine_dir(engine_dir, decoupled=True), tmp_path / "repo")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in (
        "for i in range(10):\n    print(i, i * i)\nfor i in range(10):\n    print(i", "def fib(n):\n    if n < 2:\n",
        "x = [1, 2, 3]\nx = [1, 2, 3]\nx = [")))
    runner = CliRunner()
    with TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=tmp_path / "server.log") as server:
        result = runner.invoke(main, ["verify", "--url", server.grpc_url, "--streaming", "--prompts", str(prompts), "--max-tokens", "24",
                                      "--end-id", "-1", "--concurrency", "1,2,3", "--report", str(tmp_path / "v.json")])
        assert result.exit_code == 0, result.output
        levels = json.loads((tmp_path / "v.json").read_text())["levels"]
        assert all(lv["num_match"] == lv["requests"] for lv in levels)
        assert levels[2]["num_crossed"] > 0  # requests decoded while the load (and so K) changed
        ramp = runner.invoke(main, ["bench", server.grpc_url, "--streaming", "--tokenizer", str(engine_dir / "tokenizer"),
                                    "--prompts", str(prompts), "--max-tokens", "24", "--end-id", "-1", "--chat-template", "never",
                                    "--ramp", "1,3,1", "--ramp-step-s", "4", "--results-dir", str(tmp_path / "ramp")])
    assert ramp.exit_code == 0, ramp.output
    ivs = json.loads((tmp_path / "ramp" / "ramp.json").read_text())["intervals"]
    assert ivs[0]["draft_len_max"] and ivs[0]["draft_len_max"] <= 4
    assert ivs[1]["draft_lens"].get("0", 0) > sum(ivs[1]["draft_lens"].values()) / 2  # above max_concurrency the engine drafts nothing
