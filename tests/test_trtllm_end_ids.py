"""Every end id on both TensorRT-LLM paths: Llama-3.1-Instruct's generation_config.json declares three
(128001 <|end_of_text|>, 128008 <|eom_id|>, 128009 <|eot_id|>); a chat answer ends with 128009.

tests/data/generation_config/meta-llama--Llama-3.1-8B-Instruct.json is the checkpoint's
generation_config.json as published (meta-llama/Llama-3.1-8B-Instruct; copy quoted in a public
issue, transformers 4.42.3), kept as test data: nothing is downloaded. The engine path sends
``end_id`` 128001 plus ``stop_words_list`` [[128008, 128009], [1, 2]] to the ``tensorrtllm`` model
(and its draft loop stops on any of the three); the PyTorch path sends ``end_id`` 128001 plus
``stop_token_ids`` [128008, 128009], kept in the output as the engine keeps its stop words.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import trtllm_standin
from google.protobuf import text_format
from specbuild.builder.recipe import load_recipe, parse_recipe
from specbuild.builder.trtllm_plan import plan_for, plan_pytorch
from specbuild.triton_repo.models.llmapi_front import BASELINE, SPECULATIVE, LlmApiFrontConfig, Request, run_requests, sampling_arguments
from specbuild.triton_repo.models.trtllm_front import EngineResult, FrontConfig, draft_loop_generate, end_inputs
from specbuild.triton_repo.tensorrtllm import checkpoint_end_ids, front_model, repo_spec_for, write_llmapi_repository
from tritonclient.grpc import model_config_pb2

DATA = Path(__file__).parent / "data" / "generation_config"
LLAMA_END_IDS = (128001, 128008, 128009)
STANDIN = Path(__file__).parent / "standin"


@pytest.fixture
def llama_checkpoint(tmp_path) -> Path:
    d = tmp_path / "hf-target"
    d.mkdir()
    shutil.copy(DATA / "meta-llama--Llama-3.1-8B-Instruct.json", d / "generation_config.json")
    return d


def test_the_checkpoint_declares_three_end_ids(llama_checkpoint):
    assert checkpoint_end_ids(llama_checkpoint) == LLAMA_END_IDS


def test_engine_path_configuration_and_requests_stop_on_every_end_id(llama_checkpoint, tmp_path):
    loaded = load_recipe("llama-eagle")
    plan = plan_for(loaded, tmp_path)
    spec = repo_spec_for(loaded, plan, end_id=128001, pad_id=128001, end_ids=checkpoint_end_ids(llama_checkpoint))
    params = front_model(spec).parameters
    assert params["end_ids"] == "128001,128008,128009" and params["end_id"] == "128001"
    config = FrontConfig.from_parameters(params)
    ends, extra = end_inputs(config.end_ids, None, int(params["end_id"]))
    assert ends == LLAMA_END_IDS and extra["end_id"] == 128001
    np.testing.assert_array_equal(extra["stop_words_list"], [[[128008, 128009], [1, 2]]])  # [1, 2, n], TensorRT-LLM's word list
    assert end_inputs(config.end_ids, 7, 128001) == ((7,), {"end_id": 7})  # the client's end_id is the only one
    assert end_inputs(config.end_ids, -1, 128001) == ((-1,), {"end_id": -1})


def test_engine_path_draft_loop_stops_on_any_end_id():
    """Draft-target / n-gram run the draft loop in the front: it stops at the first of the end ids,
    whichever of them the target produces."""
    prompt = [5, 6, 7]
    plain = trtllm_standin.run(trtllm_standin.target_next, prompt, 12, -1)
    ends = (1000, plain[6], plain[3])  # neither is the first end id

    def generate(model, ids, n, draft, extra):
        if draft is None and model == "tensorrt_llm_draft":
            return EngineResult(trtllm_standin.run(trtllm_standin.draft_next, list(ids), n, -1))
        out, accepted = trtllm_standin.verify(list(ids), list(draft or []), n, -1)
        return EngineResult(out, accepted, len(draft or []))

    config = FrontConfig(method="draft_target", max_draft_len=4, draft_model="tensorrt_llm_draft", end_ids=ends)
    gen = draft_loop_generate(generate, config, prompt, 12, 4, ends, {})
    first = next(i for i, t in enumerate(plain) if t in ends)
    assert first <= 3 and gen.tokens == plain[: first + 1]  # ends at the first end id it meets


def test_pytorch_path_configuration_and_requests_stop_on_every_end_id(llama_checkpoint, tmp_path):
    loaded = load_recipe("llama-eagle3")
    plan = plan_pytorch(loaded, tmp_path)
    repo = write_llmapi_repository(loaded, plan, tmp_path / "repo", end_ids=checkpoint_end_ids(llama_checkpoint))
    config = text_format.Parse((repo / "ensemble/config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["end_ids"] == "128001,128008,128009"
    front = LlmApiFrontConfig.from_parameters(params)
    assert sampling_arguments(64, end_ids=front.end_ids) == {
        "max_tokens": 64, "return_perf_metrics": True, "end_id": 128001, "stop_token_ids": [128008, 128009],
        "include_stop_str_in_output": True}
    assert "stop_token_ids" not in sampling_arguments(64, end_id=2, end_ids=front.end_ids)  # the client's end_id wins


def test_pytorch_path_stops_at_a_later_end_id_like_the_engine_path(tiny_checkpoint, tmp_path, monkeypatch):
    """Through the LLM API stand-in: the speculative and the baseline LLM both stop at the first of
    the end ids they meet, and at the same token as the engine path's draft loop."""
    monkeypatch.syspath_prepend(str(STANDIN))
    try:
        from tensorrt_llm import LLM, SamplingParams

        text = (f"name: t\ntarget: {{checkpoint: {tiny_checkpoint}, dtype: float32}}\nspeculation: {{method: ngram, max_draft_len: 3}}\n"
                "build: {backend: pytorch, trtllm_version: '1.2.1', baseline_engine: true}\n")
        parse_recipe(text, Path("t.yaml"))
        llms = {SPECULATIVE: LLM(str(tiny_checkpoint), speculative_config=type("C", (), {"max_draft_len": 3})()),
                BASELINE: LLM(str(tiny_checkpoint))}
        free = run_requests(llms, SamplingParams, [Request("def add(a, b):", 16, BASELINE, sampling_arguments(16, end_id=-1))])[0].output_ids
        ends = (next(t for t in range(trtllm_standin.VOCAB) if t not in free), free[5])  # the first end id never comes
        requests = [Request("def add(a, b):", 16, w, sampling_arguments(16, end_ids=ends)) for w in (SPECULATIVE, BASELINE)]
        spec, base = run_requests(llms, SamplingParams, requests, max_draft_len=3)
        first = next(i for i, t in enumerate(free) if t in ends)
        assert first <= 5 and free[first] != ends[0]
        assert spec.output_ids == base.output_ids == free[: first + 1]  # stopped on a later end id, kept in the output
    finally:
        for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
            del sys.modules[name]
