"""The PyTorch path's repository model (specbuild's ``ensemble`` over ``tensorrt_llm.LLM``): it answers
with the client interface of every other deployment (``output_ids``, acceptance counts) and serves
``num_draft_tokens=0`` from a second, non-speculative LLM, so ``specbuild verify`` compares token ids.

TensorRT-LLM needs a GPU, so these tests load a stand-in ``tensorrt_llm`` package
(tests/standin/tensorrt_llm: the LLM API's call shapes over a toy greedy model) under the
repository, configs and ``model.yaml`` the plan really writes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from specbuild.builder.recipe import parse_recipe
from specbuild.builder.trtllm_plan import plan_pytorch
from specbuild.triton_repo.models.llmapi_front import (
    BASELINE,
    NOT_REPORTED,
    SPECULATIVE,
    Acceptance,
    LlmApiFrontConfig,
    Request,
    acceptance,
    choose_llm,
    generation,
    llm_arguments,
    run_requests,
    sampling_arguments,
)
from specbuild.triton_repo.tensorrtllm import write_llmapi_repository
from tritonclient.grpc import model_config_pb2

STANDIN = Path(__file__).parent / "standin"


@pytest.fixture
def standin_trtllm(monkeypatch):
    """``import tensorrt_llm`` finds the stand-in for this test only."""
    monkeypatch.syspath_prepend(str(STANDIN))
    yield
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


def recipe_text(checkpoint: Path, *, baseline: bool = True, method: str = "ngram") -> str:
    speculation = {"ngram": "{method: ngram, max_draft_len: 3}", "none": "{method: none}"}[method]
    return (f"name: tiny-llmapi\ntarget: {{checkpoint: {checkpoint}, dtype: float32}}\nspeculation: {speculation}\n"
            f"build: {{backend: pytorch, trtllm_version: '1.2.1', baseline_engine: {str(baseline).lower()}, max_batch_size: 4,"
            " max_input_len: 400, max_seq_len: 500}\nserve: {http_port: 0, grpc_port: 0, metrics_port: 0}\n")


def test_routing_by_num_draft_tokens():
    config = LlmApiFrontConfig(max_draft_len=3, baseline=True)
    assert [choose_llm(config, k) for k in (None, 3, 0)] == [SPECULATIVE, SPECULATIVE, BASELINE]
    with pytest.raises(ValueError, match="fixes the draft length when the LLM is built: send num_draft_tokens 0 or 3"):
        choose_llm(config, 2)
    with pytest.raises(ValueError, match=r"num_draft_tokens=0 needs the non-speculative baseline LLM.*build.baseline_engine: true"):
        choose_llm(LlmApiFrontConfig(max_draft_len=3), 0)


def test_llm_arguments_and_sampling_params():
    model_yaml = {"model": "/m", "backend": "pytorch", "kv_cache_config": {"free_gpu_memory_fraction": 0.9},
                  "speculative_config": {"decoding_type": "NGram", "max_draft_len": 3}, "triton_config": {"decoupled": False}}
    spec = llm_arguments(model_yaml, SPECULATIVE, baseline_loaded=True)
    base = llm_arguments(model_yaml, BASELINE, baseline_loaded=True)
    assert spec["speculative_config"] == model_yaml["speculative_config"] and "speculative_config" not in base
    assert spec["kv_cache_config"] == base["kv_cache_config"] == {"free_gpu_memory_fraction": 0.45}
    assert "triton_config" not in spec and model_yaml["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9
    assert llm_arguments(model_yaml, SPECULATIVE, baseline_loaded=False)["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9
    assert sampling_arguments(16, end_id=-1) == {"max_tokens": 16, "return_perf_metrics": True, "ignore_eos": True}
    assert sampling_arguments(8, end_id=2, top_k=1, seed=3) == {"max_tokens": 8, "return_perf_metrics": True, "end_id": 2,
                                                                "top_k": 1, "seed": 3}


def test_plan_model_yaml_loads_both_llms_and_speculation_equals_the_baseline(tiny_checkpoint, tmp_path, standin_trtllm):
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict

    plan = plan_pytorch(parse_recipe(recipe_text(tiny_checkpoint), Path("t.yaml")), tmp_path)
    model_yaml = yaml.safe_load(next(f for f in plan.files if f.path.name == "model.yaml").text)
    llms = {w: LLM(**update_llm_args_with_extra_dict({}, llm_arguments(model_yaml, w, baseline_loaded=True))) for w in (SPECULATIVE, BASELINE)}
    assert llms[SPECULATIVE].speculative_config.max_draft_len == 3 and llms[BASELINE].speculative_config is None
    prompts = ["def add(a, b):", "import os\n", "class A:"]
    requests = [Request(p, 20, w, sampling_arguments(20, end_id=-1)) for p in prompts for w in (SPECULATIVE, BASELINE)]
    results = run_requests(llms, SamplingParams, requests)
    for spec, base in zip(results[::2], results[1::2]):
        assert spec.output_ids == base.output_ids and len(spec.output_ids) == 20
        assert 0 < spec.accepted_draft_tokens < spec.draft_tokens and spec.acceptance_rate == spec.accepted_draft_tokens / spec.draft_tokens
        assert (base.accepted_draft_tokens, base.draft_tokens) == (0, 0)
    whole = run_requests(llms, SamplingParams, [Request(prompts[0], 5, BASELINE, sampling_arguments(5, end_id=-1), False)])[0]
    assert whole.output_ids[-5:] == results[1].output_ids[:5] and len(whole.output_ids) > 5  # prompt ids in front


def test_repository_parses_and_keeps_the_reference_interface(tiny_checkpoint, tmp_path):
    from google.protobuf import text_format

    loaded = parse_recipe(recipe_text(tiny_checkpoint), Path("t.yaml"))
    plan = plan_pytorch(loaded, tmp_path)
    repo = write_llmapi_repository(loaded, plan, tmp_path / "repo")
    config = text_format.Parse((repo / "ensemble/config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.backend == "python" and dict((k, v.string_value) for k, v in config.parameters.items()) == {
        "max_draft_len": "3", "baseline": "true"}
    assert {"text_input", "max_tokens", "num_draft_tokens", "end_id", "return_perf_metrics"} <= {t.name for t in config.input}
    assert {"output_ids", "sequence_length", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"} <= {t.name for t in config.output}
    assert yaml.safe_load((repo / "ensemble/1/model.yaml").read_text())["speculative_config"]["decoding_type"] == "NGram"
    assert "specbuild.triton_repo.models.llmapi_front" in (repo / "ensemble/1/model.py").read_text()
    launch = (repo / "launch.sh").read_text().splitlines()[-1].split()
    assert launch[:3] == ["tritonserver", "--model-repository", str(tmp_path / "repo")]
    # in the container: 0.0.0.0, the address `docker run -p` forwards to, and launch.sh says so
    assert launch[launch.index("--http-address") + 1] == launch[launch.index("--grpc-address") + 1] == "0.0.0.0"
    assert "# binds 0.0.0.0 inside the container: reachable through the ports `docker run -p` publishes" in (repo / "launch.sh").read_text()
    assert [launch[launch.index(f"--{p}-port") + 1] for p in ("http", "grpc", "metrics")] == ["8000", "8001", "8002"]  # not the free-port 0


@pytest.mark.e2e
@pytest.mark.slow
def test_verify_compares_token_ids_on_a_pytorch_path_repository(tiny_checkpoint, tmp_path):
    """``specbuild verify`` (its function, then the command) against the generated repository in a real tritonserver."""
    from specbuild.client.prompts import load_prompts
    from specbuild.client.sdk import RequestError, SpecClient
    from specbuild.client.verify import verify
    from specbuild.triton_repo.tritonserver import TritonServer

    loaded = parse_recipe(recipe_text(tiny_checkpoint), Path("t.yaml"))
    repo = write_llmapi_repository(loaded, plan_pytorch(loaded, tmp_path), tmp_path / "repo")
    shell = repo / "ensemble/1/model.py"
    shell.write_text(f"import sys\nsys.path.insert(0, {str(STANDIN)!r})\n" + shell.read_text())
    with TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=tmp_path / "server.log") as server:
        with SpecClient(server.grpc_url) as client:
            client.wait_ready()
            report = verify(client, load_prompts("humaneval:2"), max_tokens=24, end_id=-1)
            with pytest.raises(RequestError, match="fixes the draft length"):
                client.generate("def add(a, b):", max_tokens=8, num_draft_tokens=2)
        cli = subprocess.run([sys.executable, "-m", "specbuild.cli", "verify", "--url", server.grpc_url, "--prompts", "humaneval:1",
                              "--max-tokens", "12", "--end-id", "-1", "--report", str(tmp_path / "report.json")],
                             capture_output=True, text=True, timeout=300)
    summary = json.loads((tmp_path / "report.json").read_text())["summary"]
    assert cli.returncode == 0, cli.stderr
    assert summary["all_match"] and 0 < summary["total_accepted_draft_tokens"] < summary["total_draft_tokens"]
    assert report.all_match and len(report.results) == 2, [r.divergence for r in report.results if not r.match]
    assert 0 < report.total_accepted_draft_tokens < report.total_draft_tokens  # the stand-in's draft is wrong every third token
    assert all(len(r.speculative.output_ids) == 24 for r in report.results)


def _standin_llms(tiny_checkpoint, tmp_path):
    from tensorrt_llm import LLM
    from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict

    plan = plan_pytorch(parse_recipe(recipe_text(tiny_checkpoint), Path("t.yaml")), tmp_path)
    model_yaml = yaml.safe_load(next(f for f in plan.files if f.path.name == "model.yaml").text)
    return {w: LLM(**update_llm_args_with_extra_dict({}, llm_arguments(model_yaml, w, baseline_loaded=True))) for w in (SPECULATIVE, BASELINE)}


def test_zeroed_perf_metrics_give_derived_counts_equal_to_the_real_ones(tiny_checkpoint, tmp_path, standin_trtllm, monkeypatch):
    """1.2.1's PyTorch backend leaves request_perf_metrics.speculative_decoding at zero: the counts
    come from decoding_iter instead, labelled ``derived``, and equal what the metrics would say."""
    from tensorrt_llm import SamplingParams

    llms = _standin_llms(tiny_checkpoint, tmp_path)
    requests = [Request(p, n, SPECULATIVE, sampling_arguments(n, end_id=-1)) for p in ("def add(a, b):", "import os\n") for n in (1, 7, 20)]
    real = run_requests(llms, SamplingParams, requests, max_draft_len=3)
    monkeypatch.setenv("TRTLLM_STANDIN_SPEC_METRICS", "zero")
    derived = run_requests(llms, SamplingParams, requests, max_draft_len=3)
    # one token is the prefill's alone: no drafts, which the metrics cannot tell from "not counted"
    assert [g.source for g in real] == ["derived", "perf_metrics", "perf_metrics"] * 2 and {g.source for g in derived} == {"derived"}
    for r, d in zip(real, derived):
        assert (d.output_ids, d.accepted_draft_tokens, d.draft_tokens, d.acceptance_rate) == (
            r.output_ids, r.accepted_draft_tokens, r.draft_tokens, r.acceptance_rate)
    assert sum(g.accepted_draft_tokens for g in derived) > 0


def test_counts_nobody_reported_are_none_not_zero():
    from types import SimpleNamespace

    zero = SimpleNamespace(speculative_decoding=SimpleNamespace(total_accepted_draft_tokens=0, total_draft_tokens=0, acceptance_rate=0.0))
    out = SimpleNamespace(token_ids=[5, 6, 7, 8], text="x", request_perf_metrics=zero)
    bare = SimpleNamespace(outputs=[out], prompt_token_ids=[1])
    assert acceptance(bare, 3) == NOT_REPORTED and generation(bare, exclude_input_in_output=True, speculative=True, max_draft_len=3).source == "none"
    per_iter = SimpleNamespace(outputs=[out], prompt_token_ids=[1], avg_decoded_tokens_per_iter=2.0)  # 4 tokens in 2 iterations
    assert acceptance(per_iter, 3) == Acceptance(2, 3, "derived")
    assert generation(bare, exclude_input_in_output=True, speculative=False).source == "perf_metrics"  # the baseline drafts nothing


@pytest.mark.e2e
@pytest.mark.slow
def test_verify_reports_derived_acceptance_when_the_perf_metrics_read_zero(tiny_checkpoint, tmp_path, standin_trtllm):
    """N1: through tritonserver, with the stand-in's perf metrics zeroed as on 1.2.1, ``verify`` reports
    the real acceptance (the counts the metrics would have given), labelled ``derived``."""
    from specbuild.client.prompts import load_prompts
    from specbuild.client.sdk import SpecClient
    from specbuild.client.verify import verify
    from specbuild.triton_repo.tritonserver import TritonServer
    from tensorrt_llm import SamplingParams

    loaded = parse_recipe(recipe_text(tiny_checkpoint), Path("t.yaml"))
    repo = write_llmapi_repository(loaded, plan_pytorch(loaded, tmp_path), tmp_path / "repo")
    shell = repo / "ensemble/1/model.py"
    shell.write_text(f"import os, sys\nos.environ['TRTLLM_STANDIN_SPEC_METRICS'] = 'zero'\nsys.path.insert(0, {str(STANDIN)!r})\n"
                     + shell.read_text())
    prompts = load_prompts("humaneval:2")
    with TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=tmp_path / "server.log") as server:
        with SpecClient(server.grpc_url) as client:
            client.wait_ready()
            report = verify(client, prompts, max_tokens=24, end_id=-1)
        cli = subprocess.run([sys.executable, "-m", "specbuild.cli", "verify", "--url", server.grpc_url, "--prompts", "humaneval:2",
                              "--max-tokens", "24", "--end-id", "-1", "--report", str(tmp_path / "report.json")],
                             capture_output=True, text=True, timeout=300)
    real = run_requests(_standin_llms(tiny_checkpoint, tmp_path / "plan"), SamplingParams,
                        [Request(p.text, 24, SPECULATIVE, sampling_arguments(24, end_id=-1)) for p in prompts], max_draft_len=3)
    assert report.all_match and report.acceptance_source == "derived"
    assert report.total_accepted_draft_tokens == sum(g.accepted_draft_tokens for g in real) > 0
    assert report.total_draft_tokens == sum(g.draft_tokens for g in real)
    assert cli.returncode == 0, cli.stderr
    assert "from derived" in " ".join(cli.stdout.split())
    assert json.loads((tmp_path / "report.json").read_text())["summary"]["acceptance_source"] == "derived"


def test_layout_matches_tensorrt_llms_own_llmapi_model_where_it_has_one(tiny_checkpoint, tmp_path):
    """model.yaml has upstream's keys (LLM arguments + triton_config, with the values config.pbtxt
    declares); every request field and result both models have keeps upstream's data type, and
    the perf outputs keep upstream's names (tests/upstream_trtllm.py, TensorRT-LLM's
    triton_backend/all_models/llmapi). Where the names differ is docs/deploy-trtllm.md's table."""
    from google.protobuf import text_format
    from specbuild.triton_repo.tensorrtllm import LLMAPI_INTERFACE
    from upstream_trtllm import (LLMAPI_NAME_MAP, UPSTREAM_LLMAPI_INPUTS, UPSTREAM_LLMAPI_OUTPUTS, UPSTREAM_LLMAPI_YAML_KEYS,
                                 UPSTREAM_TRITON_CONFIG_KEYS)

    loaded = parse_recipe(recipe_text(tiny_checkpoint), Path("t.yaml"))
    repo = write_llmapi_repository(loaded, plan_pytorch(loaded, tmp_path), tmp_path / "repo")
    model_yaml = yaml.safe_load((repo / "ensemble/1/model.yaml").read_text())
    config = text_format.Parse((repo / "ensemble/config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert set(model_yaml) - {"max_batch_size", "max_seq_len", "kv_cache_config", "speculative_config"} <= UPSTREAM_LLMAPI_YAML_KEYS
    assert set(model_yaml["triton_config"]) == UPSTREAM_TRITON_CONFIG_KEYS
    assert model_yaml["triton_config"] == {"max_batch_size": config.max_batch_size, "decoupled": config.model_transaction_policy.decoupled}
    ours = {t.name: t.data_type for t in (*LLMAPI_INTERFACE.inputs, *LLMAPI_INTERFACE.outputs)}
    theirs = {**UPSTREAM_LLMAPI_INPUTS, **UPSTREAM_LLMAPI_OUTPUTS}
    for name, upstream in LLMAPI_NAME_MAP.items():
        assert ours[name] == theirs[upstream], (name, upstream)
    assert {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "text_output"} <= set(ours) & set(UPSTREAM_LLMAPI_OUTPUTS)


def test_bench_says_where_the_acceptance_counts_came_from(tmp_path):
    """bench's notes name each deployment's acceptance source; a derived count is labelled so."""
    from specbuild.bench import Deployment, PointResult, SweepPlan, summarize_point
    from specbuild.bench.report import SweepResult, notes
    from specbuild.bench.records import RequestRecord

    records = [RequestRecord("p", 1.0, 10, 6, 9, 6 / 9, acceptance_source="derived")]
    summary = summarize_point(records, wall_s=1.0, draft_len=3, max_tokens=10)
    point = PointResult(deployment="llama-eagle3", method="eagle3", prompt_set="chat:1", draft_len=3, concurrency=1,
                        acceptance_source="derived", **summary)
    result = SweepResult(SweepPlan(draft_lengths=(3,), concurrencies=(1,), prompt_sets=("chat:1",)), [Deployment("llama-eagle3", "h:1")], [point])
    assert any(line.startswith("Acceptance counts from: llama-eagle3 derived") for line in notes(result))
