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
# (tensorrtllm_backend c2e65b8, all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt)
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
# What upstream's BLS (tensorrt_llm_bls/1/lib/triton_decoder.py, same commit; its model.py is copied
# into the repository by launch.sh) asks of the models it calls by hard-coded name.
BLS_PREPROC_REQUESTS = ["INPUT_ID", "DECODER_INPUT_ID", "REQUEST_INPUT_LEN", "REQUEST_DECODER_INPUT_LEN", "BAD_WORDS_IDS",
                        "STOP_WORDS_IDS", "EMBEDDING_BIAS", "OUT_PAD_ID", "OUT_END_ID", "OUT_PROMPT_TABLE_EXTRA_IDS",
                        "PIXEL_VALUES", "IMAGE_SIZES", "IS_VIDEO_INPUT", "VISION_INPUT_ID", "ATTENTION_MASK", "IMAGE_GRID_THW"]
BLS_PREPROC_SENDS = {"text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
                     "stop_words": "STOP_WORDS_DICT", "pad_id": "PAD_ID", "end_id": "END_ID"}
BLS_LLM_REQUESTS = ["output_ids", "sequence_length", "cum_log_probs", "output_log_probs", "context_logits", "generation_logits",
                    "batch_index", "sequence_index", "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks",
                    "kv_cache_alloc_total_blocks", "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                    "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"]
BLS_LLM_SENDS = {"top_k": "runtime_top_k", "top_p": "runtime_top_p", "temperature": "temperature", "seed": "seed",
                 "return_log_probs": "return_log_probs", "stream": "streaming", "exclude_input_in_output": "exclude_input_in_output",
                 "return_perf_metrics": "return_perf_metrics"}
BLS_LLM_ALWAYS = {"input_ids", "input_lengths", "request_output_len", "draft_input_ids", "draft_logits", "end_id", "pad_id",
                  "return_context_logits", "return_generation_logits"}
UPSTREAM_BLS_INPUT_NAMES = {
    "text_input", "decoder_text_input", "image_input", "image_bytes_input", "image_url_input", "video_bytes_input", "max_tokens",
    "bad_words", "stop_words", "end_id", "pad_id", "top_k", "top_p", "temperature", "length_penalty", "repetition_penalty",
    "min_tokens", "presence_penalty", "frequency_penalty", "seed", "return_log_probs", "return_context_logits",
    "return_generation_logits", "beam_width", "stream", "prompt_embedding_table", "prompt_vocab_size", "prompt_table_extra_id",
    "embedding_bias_words", "embedding_bias_weights", "num_draft_tokens", "use_draft_logits", "lora_task_id", "lora_weights",
    "lora_config", "exclude_input_in_output", "return_perf_metrics", "guided_decoding_guide_type", "guided_decoding_guide",
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


def test_upstream_bls_finds_every_tensor_it_asks_for(tmp_path):
    """Upstream's BLS calls preprocessing / tensorrt_llm(_draft) / postprocessing by fixed tensor
    names; Triton refuses any request or requested output a config does not declare."""
    _, configs = write("llama-draft", tmp_path)
    bls, pre, post = configs["tensorrt_llm_bls"], configs["preprocessing"], configs["postprocessing"]
    bls_inputs = {t.name for t in bls.input}
    assert bls_inputs <= UPSTREAM_BLS_INPUT_NAMES
    assert set(BLS_PREPROC_REQUESTS) <= {t.name for t in pre.output}
    assert {BLS_PREPROC_SENDS[n] for n in bls_inputs if n in BLS_PREPROC_SENDS} <= {t.name for t in pre.input}
    assert {"TOKENS_BATCH", "SEQUENCE_LENGTH"} <= {t.name for t in post.input} and "OUTPUT" in {t.name for t in post.output}
    for engine in ("tensorrt_llm", "tensorrt_llm_draft"):
        declared_in = {t.name for t in configs[engine].input}
        assert set(BLS_LLM_REQUESTS) <= {t.name for t in configs[engine].output}, engine
        assert {BLS_LLM_SENDS[n] for n in bls_inputs if n in BLS_LLM_SENDS} | BLS_LLM_ALWAYS <= declared_in, engine
    assert {t.name for t in bls.output} >= {"text_output", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"}


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
    # upstream's BLS (lib/decode.py) takes each target output as the next input: prompt included
    assert target["exclude_input_in_output"] == draft["exclude_input_in_output"] == "false"
    assert target["gpt_model_path"] == f"{tmp_path}/engines/target" and draft["gpt_model_path"] == f"{tmp_path}/engines/draft"
    assert "participant_ids" not in target and "participant_ids" not in draft  # spawned ranks (orchestrator mode)
    assert {"num_draft_tokens", "use_draft_logits"} <= {t.name for t in configs["tensorrt_llm_bls"].input}
    launch = (repo / "launch.sh").read_text().splitlines()
    argv = launch[-1].split()
    # orchestrator mode: launch_triton_server.py asserts world size 1; the backend spawns 4 ranks per model
    assert argv[argv.index("--world_size") + 1] == "1" and "--multi-model" in argv
    assert argv[argv.index("--tensorrt_llm_model_name") + 1] == "tensorrt_llm,tensorrt_llm_draft"
    assert {a for a in argv if a.startswith("--")} <= LAUNCH_FLAGS
    assert any(line.startswith("cp -r ") and "tensorrt_llm_bls/1" in line for line in launch)


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
    plan = plan_pytorch(llama("llama-eagle3"), tmp_path)
    repo = write_llmapi_repository(plan, tmp_path / "repo")
    model_yaml = (repo / "tensorrt_llm" / "1" / "model.yaml").read_text()
    assert "decoding_type: Eagle3" in model_yaml and "${" not in model_yaml
    launch = (repo / "launch.sh").read_text()
    assert "llmapi/tensorrt_llm/config.pbtxt" in launch and "--no-mpi" in launch


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
    assert set(engine) <= TENSORRT_LLM_PARAMETERS and engine["decoding_mode"] in DECODING_MODES
    assert params(configs["ensemble"])["tensorrt_llm_baseline_model_name"] == "tensorrt_llm_baseline"
    if "choices" in speculation:
        key = "medusa_choices" if "medusa" in speculation else "eagle_choices"
        assert engine[key] == "{0}, {0, 0}, {1}"
    assert "${" not in "".join(p.read_text() for p in repo.rglob("*") if p.is_file())
