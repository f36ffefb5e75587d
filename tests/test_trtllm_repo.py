"""The TensorRT-LLM Triton repository: configs parse with Triton's schema, the ensemble is wired
consistently and keeps the reference interface, every parameter key is one the backends define and
every parameter the backend needs is there (its reading replayed, tests/upstream_trtllm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from google.protobuf import text_format

from specbuild.builder.recipe import parse_recipe
from specbuild.builder.trtllm_plan import plan_pytorch, plan_tensorrt
from specbuild.triton_repo.reference_repository import ReferenceRepoSpec, reference_models
from specbuild.triton_repo.tensorrtllm import (
    choices_string,
    launch_command,
    repo_spec_for,
    write_llmapi_repository,
    write_trtllm_repository,
)
from test_trtllm_plan import llama
from tritonclient.grpc import model_config_pb2
from upstream_trtllm import BACKEND_PARAMETERS, KNOWN_PARAMETERS, replay_parameter_reading

DECODING_MODES = set(BACKEND_PARAMETERS["decoding_mode"].choices)
# triton_backend/scripts/launch_triton_server.py parse_arguments() (NVIDIA/TensorRT-LLM 0a2e2c1f)
LAUNCH_FLAGS = {"--world_size", "--tritonserver", "--grpc_port", "--http_port", "--metrics_port", "--force", "--log",
                "--log-file", "--no-mpi", "--model_repo", "--tensorrt_llm_model_name", "--multi-model",
                "--disable-spawn-processes", "--multimodal_gpu0_cuda_mem_pool_bytes", "--oversubscribe",
                "--trtllm_llmapi_launch", "--exit_timeout"}
ENGINE_RECIPES = ("llama-draft", "llama-eagle", "llama-lookahead", "llama-medusa")


def parse(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def write(name: str, tmp_path: Path, *, build: str = "") -> tuple[Path, dict[str, model_config_pb2.ModelConfig]]:
    """The recipe's repository; ``build`` adds lines under its ``build:`` section (e.g. baseline_engine)."""
    text = (Path(__file__).parents[1] / "recipes" / f"{name}.yaml").read_text()
    loaded = parse_recipe(text.replace("\nbuild:\n", f"\nbuild:\n{build}", 1), Path(f"{name}.yaml")) if build else llama(name)
    plan = plan_tensorrt(loaded, tmp_path)
    spec = repo_spec_for(loaded, plan, end_id=128009, pad_id=128009)
    repo = tmp_path / "triton_repo"
    write_trtllm_repository(spec, repo, launch_argv=launch_command(spec, repo, http_port=8000, grpc_port=8001, metrics_port=8002))
    return repo, {p.parent.name: parse(p) for p in sorted(repo.glob("*/config.pbtxt"))}


def params(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


@pytest.mark.parametrize("name", ENGINE_RECIPES)
def test_every_config_parses_and_uses_known_parameters(name, tmp_path):
    repo, configs = write(name, tmp_path)
    for model_name, config in configs.items():
        assert config.name == model_name
        if config.backend == "tensorrtllm":
            assert set(params(config)) <= KNOWN_PARAMETERS
            assert params(config)["decoding_mode"] in DECODING_MODES
            assert params(config)["gpt_model_type"] == "inflight_fused_batching"
    for path in repo.rglob("*"):
        if path.is_file():
            assert "${" not in path.read_text(), path


@pytest.mark.parametrize("name", ENGINE_RECIPES)
def test_front_names_models_that_exist(name, tmp_path):
    repo, configs = write(name, tmp_path, build="  baseline_engine: true\n")
    front = params(configs["ensemble"])
    for key in ("tensorrt_llm_model_name", "tensorrt_llm_draft_model_name", "tensorrt_llm_baseline_model_name"):
        if key in front:
            assert configs[front[key]].backend == "tensorrtllm", key
    assert "specbuild.triton_repo.models.trtllm_front" in (repo / "ensemble/1/model.py").read_text()
    assert int(front["max_draft_len"]) > 0 and front["method"] in {"draft_target", "eagle", "lookahead", "medusa"}


CLIENT_INPUTS = {"text_input", "max_tokens", "end_id", "pad_id", "num_draft_tokens", "return_perf_metrics",
                 "exclude_input_in_output", "temperature", "top_k", "top_p", "seed"}
CLIENT_OUTPUTS = {"text_output", "output_ids", "sequence_length", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"}


def test_ensemble_keeps_the_reference_interface(tmp_path):
    """What the client SDK sends and reads is there, num_draft_tokens included, with the reference
    repository's names, types and dims."""
    _, configs = write("llama-eagle", tmp_path)
    reference = reference_models(ReferenceRepoSpec(engine_dir=tmp_path, end_id=0, pad_id=0, max_batch_size=8))[0]
    ens = configs["ensemble"]
    ref_in = {t.name: (model_config_pb2.DataType.Value(t.data_type), list(t.dims)) for t in reference.inputs}
    ref_out = {t.name: (model_config_pb2.DataType.Value(t.data_type), list(t.dims)) for t in reference.outputs}
    assert {t.name: (t.data_type, list(t.dims)) for t in ens.input}.items() <= ref_in.items()
    assert {t.name: (t.data_type, list(t.dims)) for t in ens.output}.items() <= ref_out.items()
    assert CLIENT_INPUTS <= {t.name for t in ens.input} and CLIENT_OUTPUTS <= {t.name for t in ens.output}
    assert ens.backend == "python" and ens.instance_group[0].count == ens.max_batch_size


# tensorrt_llm inputs as upstream declares them: name -> (data type, dims, reshape or None, optional)
# (NVIDIA/TensorRT-LLM 0c8de69a, triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt)
UPSTREAM_ENGINE_INPUTS = {
    "input_ids": ("TYPE_INT32", [-1], None, True), "input_lengths": ("TYPE_INT32", [1], [], False),
    "request_output_len": ("TYPE_INT32", [1], [], False), "draft_input_ids": ("TYPE_INT32", [-1], None, True),
    "draft_logits": ("TYPE_FP32", [-1, -1], None, True), "draft_acceptance_threshold": ("TYPE_FP32", [1], [], True),
    "end_id": ("TYPE_INT32", [1], [], True), "pad_id": ("TYPE_INT32", [1], [], True),
    "stop_words_list": ("TYPE_INT32", [2, -1], None, True), "bad_words_list": ("TYPE_INT32", [2, -1], None, True),
    "beam_width": ("TYPE_INT32", [1], [], True), "temperature": ("TYPE_FP32", [1], [], True),
    "runtime_top_k": ("TYPE_INT32", [1], [], True), "runtime_top_p": ("TYPE_FP32", [1], [], True),
    "seed": ("TYPE_UINT64", [1], [], True), "return_log_probs": ("TYPE_BOOL", [1], [], True),
    "return_context_logits": ("TYPE_BOOL", [1], [], True), "return_generation_logits": ("TYPE_BOOL", [1], [], True),
    "return_perf_metrics": ("TYPE_BOOL", [1], [], True), "exclude_input_in_output": ("TYPE_BOOL", [1], [], True),
    "stop": ("TYPE_BOOL", [1], [], True), "streaming": ("TYPE_BOOL", [1], [], True),
    "lookahead_window_size": ("TYPE_INT32", [1], None, True), "lookahead_ngram_size": ("TYPE_INT32", [1], None, True),
    "lookahead_verification_set_size": ("TYPE_INT32", [1], None, True),
}
def shape(t) -> tuple:
    return (model_config_pb2.DataType.Name(t.data_type), list(t.dims), list(t.reshape.shape) if t.HasField("reshape") else None, t.optional)


@pytest.mark.parametrize("name", ENGINE_RECIPES)
def test_engine_model_tensors_and_batching_match_upstream(name, tmp_path):
    _, configs = write(name, tmp_path)
    for model in (c for c in configs.values() if c.backend == "tensorrtllm"):
        assert {t.name: shape(t) for t in model.input} == {k: v for k, v in UPSTREAM_ENGINE_INPUTS.items() if k in {t.name for t in model.input}}
        assert set(UPSTREAM_ENGINE_INPUTS) == {t.name for t in model.input}
        assert list(model.dynamic_batching.preferred_batch_size) == [model.max_batch_size]
        assert {"output_ids", "sequence_length"} <= {t.name for t in model.output}


def test_medusa_eagle_lookahead_parameters(tmp_path):
    assert choices_string([[0], [0, 0], [1], [0, 1]]) == "{0}, {0, 0}, {1}, {0, 1}"
    lookahead = params(write("llama-lookahead", tmp_path / "l")[1]["tensorrt_llm"])
    assert (lookahead["decoding_mode"], lookahead["lookahead_window_size"], lookahead["lookahead_ngram_size"],
            lookahead["lookahead_verification_set_size"]) == ("lookahead", "7", "7", "7")
    assert params(write("llama-medusa", tmp_path / "m")[1]["tensorrt_llm"])["decoding_mode"] == "medusa"
    eagle = params(write("llama-eagle", tmp_path / "e")[1]["tensorrt_llm"])
    assert eagle["decoding_mode"] == "eagle" and "eagle_choices" not in eagle  # default tree from the engine


def test_draft_target_models_refer_to_each_other(tmp_path):
    repo, configs = write("llama-draft", tmp_path)
    front, target, draft = params(configs["ensemble"]), params(configs["tensorrt_llm"]), params(configs["tensorrt_llm_draft"])
    assert (front["tensorrt_llm_model_name"], front["tensorrt_llm_draft_model_name"]) == ("tensorrt_llm", "tensorrt_llm_draft")
    assert target["enable_kv_cache_reuse"] == draft["enable_kv_cache_reuse"] == "true"
    assert target["gpt_model_path"] == f"{tmp_path}/engines/target" and draft["gpt_model_path"] == f"{tmp_path}/engines/draft"
    assert "participant_ids" not in target and "participant_ids" not in draft  # spawned ranks (orchestrator mode)
    assert "num_draft_tokens" in {t.name for t in configs["ensemble"].input}
    launch = (repo / "launch.sh").read_text().splitlines()
    argv = launch[-1].split()
    # orchestrator mode: launch_triton_server.py asserts world size 1; the backend spawns 4 ranks per model
    assert argv[argv.index("--world_size") + 1] == "1" and "--multi-model" in argv
    assert argv[argv.index("--tensorrt_llm_model_name") + 1] == "tensorrt_llm,tensorrt_llm_draft"
    assert {a for a in argv if a.startswith("--")} <= LAUNCH_FLAGS
    # the ensemble is the one entry point: upstream's tensorrt_llm_bls is neither generated nor copied in
    assert "tensorrt_llm_bls" not in configs and not (repo / "tensorrt_llm_bls").exists()
    assert not any(line.startswith("cp ") for line in launch)


def test_tensor_parallel_single_model_launches_in_leader_mode_with_world_size_tp_pp(tmp_path):
    text = (Path(__file__).parents[1] / "recipes" / "llama-lookahead.yaml").read_text()
    loaded = parse_recipe(text.replace("  backend: tensorrt\n", "  backend: tensorrt\n  tp_size: 2\n  pp_size: 2\n"), Path("l.yaml"))
    plan = plan_tensorrt(loaded, tmp_path)
    argv = launch_command(repo_spec_for(loaded, plan, end_id=2, pad_id=0), tmp_path, http_port=8000, grpc_port=8001, metrics_port=8002)
    assert argv[argv.index("--world_size") + 1] == "4" and "--multi-model" not in argv


def test_single_gpu_launch_is_leader_mode_and_gpu_ids_render(tmp_path):
    text = (Path(__file__).parents[1] / "recipes" / "llama-medusa.yaml").read_text()
    loaded = parse_recipe(text + "serve:\n  gpu_device_ids: [[0], [1]]\n", Path("llama-medusa.yaml"))
    plan = plan_tensorrt(loaded, tmp_path)
    spec = repo_spec_for(loaded, plan, end_id=2, pad_id=0)
    argv = launch_command(spec, tmp_path, http_port=8000, grpc_port=8001, metrics_port=8002)
    assert "--multi-model" not in argv and argv[argv.index("--world_size") + 1] == "1"
    assert spec.target.gpu_device_ids == ((0,), (1,))
    from specbuild.triton_repo.tensorrtllm import engine_parameters
    assert engine_parameters(spec.target, spec)["gpu_device_ids"] == "0;1"


def test_llmapi_repository_for_the_pytorch_path(tmp_path):
    loaded = llama("llama-eagle3")
    plan = plan_pytorch(loaded, tmp_path)
    repo = write_llmapi_repository(loaded, plan, tmp_path / "repo")
    model_yaml = (repo / "ensemble" / "1" / "model.yaml").read_text()
    assert "decoding_type: Eagle\n" in model_yaml and "${" not in model_yaml  # planned for the recipe's 1.2.1
    assert parse(repo / "ensemble" / "config.pbtxt").backend == "python"
    assert not (repo / "tensorrt_llm").exists()  # TensorRT-LLM's text-only llmapi model is not used
    assert (repo / "launch.sh").read_text().splitlines()[-1].startswith("tritonserver --model-repository ")


@pytest.mark.parametrize("speculation", [
    "  method: ngram\n  max_draft_len: 5\n",
    "  method: redrafter\n  drafter_model: org/drafter\n",
    "  method: medusa\n  medusa_model: org/heads\n  medusa_choices: [[0], [0, 0], [1]]\n",
    "  method: eagle\n  eagle_model: org/head\n  num_eagle_layers: 2\n  eagle_choices: [[0], [0, 0], [1]]\n",
])
def test_other_engine_methods_render_parseable_configs(speculation, tmp_path):
    text = f"name: t\ntarget: {{checkpoint: org/target, dtype: float16}}\nspeculation:\n{speculation}build: {{backend: tensorrt, baseline_engine: true}}\n"
    loaded = parse_recipe(text, Path("t.yaml"))
    plan = plan_tensorrt(loaded, tmp_path)
    spec = repo_spec_for(loaded, plan, end_id=2, pad_id=0)
    repo = tmp_path / "repo"
    write_trtllm_repository(spec, repo, launch_argv=launch_command(spec, repo, http_port=8000, grpc_port=8001, metrics_port=8002))
    configs = {p.parent.name: parse(p) for p in repo.glob("*/config.pbtxt")}
    engine = params(configs["tensorrt_llm"])
    assert set(engine) <= KNOWN_PARAMETERS and engine["decoding_mode"] in DECODING_MODES
    assert params(configs["ensemble"])["tensorrt_llm_baseline_model_name"] == "tensorrt_llm_baseline"
    if "choices" in speculation:
        key = "medusa_choices" if "medusa" in speculation else "eagle_choices"
        assert engine[key] == "{0}, {0, 0}, {1}"
    assert "${" not in "".join(p.read_text() for p in repo.rglob("*") if p.is_file())


def engine_configs(tmp_path: Path) -> list[tuple[str, str, model_config_pb2.ModelConfig]]:
    """Every ``tensorrtllm`` config the bundled engine recipes emit, with and without a baseline engine,
    and for the other engine-path methods."""
    out = []
    for name in ENGINE_RECIPES:
        for build in ("", "  baseline_engine: true\n"):
            _, configs = write(name, tmp_path / f"{name}{len(build)}", build=build)
            out += [(name, model, c) for model, c in configs.items() if c.backend == "tensorrtllm"]
    for i, speculation in enumerate(("  method: ngram\n  max_draft_len: 5\n", "  method: redrafter\n  drafter_model: org/drafter\n",
                                     "  method: none\n")):
        text = f"name: t\ntarget: {{checkpoint: org/target, dtype: float16}}\nspeculation:\n{speculation}build: {{backend: tensorrt}}\n"
        loaded = parse_recipe(text, Path("t.yaml"))
        spec = repo_spec_for(loaded, plan_tensorrt(loaded, tmp_path / f"o{i}"), end_id=2, pad_id=0)
        repo = tmp_path / f"o{i}" / "repo"
        write_trtllm_repository(spec, repo, launch_argv=launch_command(spec, repo, http_port=8000, grpc_port=8001, metrics_port=8002))
        out += [(speculation.split()[1], p.parent.name, parse(p)) for p in repo.glob("*/config.pbtxt") if parse(p).backend == "tensorrtllm"]
    return out


def test_backend_parameter_reading_replayed_on_every_emitted_engine_config(tmp_path):
    """The backend's own reading (upstream_trtllm.BACKEND_PARAMETERS, from model_instance_state.cc
    and model_state.cc) finds every key it needs and acts on every value: required <= emitted."""
    configs = engine_configs(tmp_path)
    assert len(configs) >= 14  # 4 recipes (draft: two engines) x with/without baseline + 3 methods
    for recipe_name, model, config in configs:
        emitted = params(config)
        assert replay_parameter_reading(emitted) == [], (recipe_name, model)
        assert {n for n, r in BACKEND_PARAMETERS.items() if r.required} <= set(emitted), (recipe_name, model)
        assert emitted["guided_decoding_backend"] == emitted["xgrammar_tokenizer_info_path"] == ""  # guided decoding off
        assert "logits_datatype" not in emitted
        # the backend takes the logits type from these outputs' data_type (ModelState::LoadParameters)
        logits = {t.name: model_config_pb2.DataType.Name(t.data_type) for t in config.output if t.name.endswith("_logits")}
        assert logits == {"context_logits": "TYPE_FP32", "generation_logits": "TYPE_FP32"}


def test_replay_reports_what_fails_a_model_load(tmp_path):
    """The replay is not a rubber stamp: the keys missing before this fix fail the load in the backend's words."""
    _, configs = write("llama-eagle", tmp_path)
    emitted = params(configs["tensorrt_llm"])
    broken = {k: v for k, v in emitted.items() if k not in ("guided_decoding_backend", "xgrammar_tokenizer_info_path")}
    assert replay_parameter_reading(broken) == ["Cannot find parameter with name: xgrammar_tokenizer_info_path",
                                                "Cannot find parameter with name: guided_decoding_backend"]
    assert replay_parameter_reading({**emitted, "logits_datatype": "TYPE_FP32"}) == [
        "logits_datatype: not a parameter the backend reads or its template defines"]
    assert replay_parameter_reading({**emitted, "decoding_mode": "lookahead"})[0].startswith("Decoding mode is set to lookahead")
    assert "enable_kv_cache_reuse: 'yes' is not a valid bool" in replay_parameter_reading({**emitted, "enable_kv_cache_reuse": "yes"})
    # upstream's unfilled template placeholders count as unset, as the backend treats them
    assert replay_parameter_reading({**emitted, "guided_decoding_backend": "${guided_decoding_backend}"}) == []


class _FakeTensor:
    def __init__(self, name, array):
        self.name, self.array = name, array

    def as_numpy(self):
        return self.array


class _FakePbUtils:
    """The calls trtllm_front makes on triton_python_backend_utils; records each engine request."""

    Tensor = _FakeTensor

    def __init__(self):
        self.requests = []
        pb = self

        class InferenceRequest:
            def __init__(self, model_name, inputs, requested_output_names):
                pb.requests.append((model_name, [t.name for t in inputs], list(requested_output_names)))

            def exec(self, decoupled=False):
                import numpy as np

                response = type("R", (), {"has_error": lambda s: False, "output_tensors": lambda s: [1]})()
                response.outputs = {"output_ids": np.array([[[5, 6]]], dtype=np.int32), "sequence_length": np.array([[2]]),
                                    "total_accepted_draft_tokens": np.array([[1]]), "total_draft_tokens": np.array([[2]])}
                return [response] if decoupled else response

        self.InferenceRequest = InferenceRequest

    @staticmethod
    def get_output_tensor_by_name(response, name):
        return _FakeTensor(name, response.outputs[name]) if name in response.outputs else None


@pytest.mark.parametrize("name", ENGINE_RECIPES)
def test_every_tensor_the_front_sends_or_requests_is_declared(name, tmp_path):
    """The ensemble (the one entry point) calls the engine models by name: every input it sends and
    every output it requests must be declared there, or Triton rejects the call."""
    from specbuild.triton_repo.models import trtllm_front

    _, configs = write(name, tmp_path, build="  baseline_engine: true\n")
    front = trtllm_front.TritonPythonModel()
    front.pb_utils = _FakePbUtils()
    front.config = trtllm_front.FrontConfig.from_parameters(params(configs["ensemble"]))
    extra = {"end_id": 2, "pad_id": 0, "temperature": 0.5, "runtime_top_k": 4, "runtime_top_p": 0.9, "seed": 7,
             "lookahead_window_size": 1, "lookahead_ngram_size": 1, "lookahead_verification_set_size": 0}
    assert set(extra) - {"end_id", "pad_id"} == set(trtllm_front.PASSTHROUGH.values())
    for model in ("tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_baseline"):
        if model in configs:
            front._generate(model, [1, 2, 3], 4, [7, 8], extra)
    for model, sent, requested in front.pb_utils.requests:
        assert set(sent) <= {t.name for t in configs[model].input}, model
        assert set(requested) <= {t.name for t in configs[model].output}, model
    assert {"draft_input_ids", "input_ids", "request_output_len"} <= set(front.pb_utils.requests[0][1])
