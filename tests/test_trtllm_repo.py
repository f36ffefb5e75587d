"""The TensorRT-LLM Triton repository: configs parse with Triton's schema, the ensemble is wired
consistently and keeps the reference interface, every parameter key is one the backends define."""

from __future__ import annotations

from pathlib import Path

import pytest

from google.protobuf import text_format

from specbuild.builder.recipe import parse_recipe
from specbuild.builder.trtllm_plan import plan_pytorch, plan_tensorrt
from specbuild.triton_repo.generate import ReferenceRepoSpec, reference_models
from specbuild.triton_repo.tensorrtllm import (
    choices_string,
    launch_command,
    repo_spec_for,
    write_llmapi_repository,
    write_trtllm_repository,
)
from test_trtllm_plan import llama
from tritonclient.grpc import model_config_pb2

# Parameter keys of all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt
# (triton-inference-server/tensorrtllm_backend c2e65b8, 2025-05; now NVIDIA/TensorRT-LLM triton_backend/)
TENSORRT_LLM_PARAMETERS = {
    "max_beam_width", "FORCE_CPU_ONLY_INPUT_TENSORS", "gpt_model_type", "gpt_model_path", "encoder_model_path",
    "max_tokens_in_paged_kv_cache", "max_attention_window_size", "sink_token_length", "batch_scheduler_policy",
    "kv_cache_free_gpu_mem_fraction", "cross_kv_cache_fraction", "kv_cache_host_memory_bytes", "kv_cache_onboard_blocks",
    "exclude_input_in_output", "cancellation_check_period_ms", "stats_check_period_ms", "iter_stats_max_iterations",
    "request_stats_max_iterations", "enable_kv_cache_reuse", "normalize_log_probs", "enable_chunked_context",
    "gpu_device_ids", "participant_ids", "num_nodes", "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size",
    "lora_cache_gpu_memory_fraction", "lora_cache_host_memory_bytes", "lora_prefetch_dir", "decoding_mode",
    "executor_worker_path", "lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size",
    "medusa_choices", "eagle_choices", "gpu_weights_percent", "enable_context_fmha_fp32_acc", "multi_block_mode",
    "cuda_graph_mode", "cuda_graph_cache_size", "speculative_decoding_fast_logits", "tokenizer_dir",
    "guided_decoding_backend", "xgrammar_tokenizer_info_path", "logits_datatype",
}
DECODING_MODES = {"top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle"}
# all_models/inflight_batcher_llm/tensorrt_llm_bls/config.pbtxt (same commit)
BLS_PARAMETERS = {"accumulate_tokens", "tensorrt_llm_model_name", "tensorrt_llm_draft_model_name", "multimodal_encoders_name"}
# scripts/launch_triton_server.py (same commit)
LAUNCH_FLAGS = {"--world_size", "--tritonserver", "--grpc_port", "--http_port", "--metrics_port", "--force", "--log",
                "--log-file", "--no-mpi", "--model_repo", "--tensorrt_llm_model_name", "--multi-model",
                "--disable-spawn-processes", "--multimodal_gpu0_cuda_mem_pool_bytes", "--oversubscribe"}
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
            assert set(params(config)) <= TENSORRT_LLM_PARAMETERS
            assert params(config)["decoding_mode"] in DECODING_MODES
            assert params(config)["gpt_model_type"] == "inflight_fused_batching"
        if model_name == "tensorrt_llm_bls":
            assert set(params(config)) <= BLS_PARAMETERS
    for path in repo.rglob("*"):
        if path.is_file():
            assert "${" not in path.read_text(), path


@pytest.mark.parametrize("name", ENGINE_RECIPES)
def test_ensemble_steps_consume_only_inputs_or_earlier_outputs(name, tmp_path):
    _, configs = write(name, tmp_path, build="  baseline_engine: true\n")
    for ens in (c for c in configs.values() if c.platform == "ensemble"):
        available = {t.name for t in ens.input}
        used = set()
        for step in ens.ensemble_scheduling.step:
            model = configs[step.model_name]
            assert set(step.input_map) <= {t.name for t in model.input}, step.model_name
            assert set(step.output_map) <= {t.name for t in model.output}, step.model_name
            assert set(step.input_map.values()) <= available, step.model_name
            used |= set(step.input_map.values())
            available |= set(step.output_map.values())
        assert {t.name for t in ens.output} <= available
        assert {t.name for t in ens.input} <= used  # Triton refuses unused ensemble inputs


def test_ensemble_keeps_the_reference_interface(tmp_path):
    _, configs = write("llama-eagle", tmp_path)
    reference = reference_models(ReferenceRepoSpec(engine_dir=tmp_path, end_id=0, pad_id=0, max_batch_size=8))[0]
    ens = configs["ensemble"]
    assert [(t.name, t.data_type) for t in ens.output] == [(t.name, model_config_pb2.DataType.Value(t.data_type)) for t in reference.outputs]
    assert [t.name for t in ens.input] == [t.name for t in reference.inputs if t.name != "num_draft_tokens"]


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
    bls, target, draft = params(configs["tensorrt_llm_bls"]), params(configs["tensorrt_llm"]), params(configs["tensorrt_llm_draft"])
    assert (bls["tensorrt_llm_model_name"], bls["tensorrt_llm_draft_model_name"]) == ("tensorrt_llm", "tensorrt_llm_draft")
    assert target["enable_kv_cache_reuse"] == draft["enable_kv_cache_reuse"] == "true"
    assert target["gpt_model_path"] == f"{tmp_path}/engines/target" and draft["gpt_model_path"] == f"{tmp_path}/engines/draft"
    assert (target["participant_ids"], draft["participant_ids"]) == ("1,2,3,4", "5,6,7,8")
    assert {"num_draft_tokens", "use_draft_logits"} <= {t.name for t in configs["tensorrt_llm_bls"].input}
    launch = (repo / "launch.sh").read_text().splitlines()
    argv = launch[-1].split()
    assert argv[argv.index("--world_size") + 1] == "4" and "--multi-model" in argv
    assert argv[argv.index("--tensorrt_llm_model_name") + 1] == "tensorrt_llm,tensorrt_llm_draft"
    assert {a for a in argv if a.startswith("--")} <= LAUNCH_FLAGS
    assert any(line.startswith("cp -r ") and "tensorrt_llm_bls/1" in line for line in launch)


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
    plan = plan_pytorch(llama("llama-eagle3"), tmp_path)
    repo = write_llmapi_repository(plan, tmp_path / "repo")
    model_yaml = (repo / "tensorrt_llm" / "1" / "model.yaml").read_text()
    assert "decoding_type: Eagle3" in model_yaml and "${" not in model_yaml
    launch = (repo / "launch.sh").read_text()
    assert "llmapi/tensorrt_llm/config.pbtxt" in launch and "--no-mpi" in launch
