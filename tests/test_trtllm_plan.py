"""TensorRT-LLM build plans: golden commands for every bundled llama-* recipe, every flag checked
against the argparse/LLM-API names TensorRT-LLM defines, validation errors, version gates."""

from __future__ import annotations

import os

from pathlib import Path

import pytest
import yaml
from specbuild.builder.recipe import (
    LoadedRecipe,
    RecipeError,
    load_recipe,
    parse_recipe,
)
from specbuild.builder.trtllm_plan import (
    max_num_tokens,
    plan_for,
    plan_pytorch,
    plan_tensorrt,
    require_installed,
)
from specbuild.builder.trtllm_version import (
    capability_error,
    installed_version,
    llm_api_decoding_type,
    parse_version,
)
from upstream_trtllm import check_speculative_config

OUT = Path("/out")
EX = "/app/examples"

# Reference flag sets, copied by hand from the upstream argparse/click definitions (NVIDIA/TensorRT-LLM);
# each names the file and the commit it was read at (1.x trees, engine path present).
# tensorrt_llm/commands/build.py parse_arguments() @ 008b2b8d (the only stored copy of build.py; re-read at the
# v1.2.1 tag when a full checkout is at hand) + tensorrt_llm/plugin/plugin.py add_plugin_argument
TRTLLM_BUILD_FLAGS = {
    "--checkpoint_dir", "--model_config", "--build_config", "--output_dir", "--max_batch_size", "--max_input_len",
    "--max_seq_len", "--max_beam_width", "--max_num_tokens", "--opt_num_tokens", "--workers", "--log_level",
    "--gather_context_logits", "--gather_generation_logits", "--speculative_decoding_mode", "--max_draft_len",
    "--gemm_plugin", "--gpt_attention_plugin", "--use_paged_context_fmha", "--use_fp8_context_fmha", "--paged_kv_cache",
    "--remove_input_padding", "--context_fmha", "--multiple_profiles", "--kv_cache_type",
}
SPECULATIVE_DECODING_MODES = {"draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"}
# examples/models/core/llama/convert_checkpoint.py parse_arguments()
LLAMA_CONVERT_FLAGS = {"--model_dir", "--tp_size", "--pp_size", "--dtype", "--use_weight_only", "--weight_only_precision",
                       "--output_dir", "--workers", "--use_fp8", "--fp8_kv_cache", "--int8_kv_cache", "--load_by_shard"}
# examples/medusa/convert_checkpoint.py parse_arguments()
MEDUSA_CONVERT_FLAGS = {"--model_dir", "--tp_size", "--pp_size", "--dtype", "--use_weight_only", "--weight_only_precision",
                        "--output_dir", "--workers", "--num_medusa_heads", "--num_medusa_layers", "--max_medusa_token_len",
                        "--medusa_hidden_act", "--medusa_model_dir"}
# examples/eagle/convert_checkpoint.py parse_arguments() (asserts pp_size == 1)
EAGLE_CONVERT_FLAGS = {"--model_dir", "--tp_size", "--pp_size", "--dtype", "--use_weight_only", "--weight_only_precision",
                       "--output_dir", "--workers", "--eagle_model_dir", "--max_draft_len", "--num_eagle_layers",
                       "--max_non_leaves_per_layer"}
# examples/redrafter/convert_checkpoint.py parse_arguments() @ 0e8b9484 (no --pp_size, no quantization)
REDRAFTER_CONVERT_FLAGS = {"--model_dir", "--drafter_model_dir", "--tp_size", "--dtype", "--storage-type", "--load_model_on_cpu",
                           "--use_parallel_embedding", "--embedding_sharding_dim", "--output_dir", "--workers",
                           "--dense_context_fmha", "--redrafter_draft_len_per_beam", "--redrafter_num_beams",
                           "--redrafter_no_greedy_search"}
# examples/quantization/quantize.py argparse @ 059c97c1 (ModelOpt; --qformat choices include fp8, int8_wo, int4_wo)
QUANTIZE_FLAGS = {"--model_dir", "--nemo_ckpt_path", "--decoder_type", "--device", "--device_map", "--calib_dataset",
                  "--calib_tp_size", "--calib_pp_size", "--dtype", "--qformat", "--seed", "--tokenizer_max_seq_length",
                  "--batch_size", "--calib_size", "--calib_max_seq_length", "--output_dir", "--tp_size", "--pp_size",
                  "--cp_size", "--awq_block_size", "--kv_cache_dtype", "--quantize_lm_head", "--num_medusa_heads",
                  "--num_medusa_layers", "--max_draft_len", "--medusa_hidden_act", "--medusa_model_dir",
                  "--quant_medusa_head", "--autoq_format", "--auto_quantize_bits", "--export_format"}
QUANTIZE_QFORMATS = {"nvfp4", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "full_prec"}
# tensorrt_llm/commands/serve.py `serve` click options @ 00209af1 (aliases listed too: --tp_size of
# --tensor_parallel_size, --config of --extra_llm_api_options, --kv_cache_free_gpu_memory_fraction of
# --free_gpu_memory_fraction)
TRTLLM_SERVE_FLAGS = {"--tokenizer", "--custom_tokenizer", "--host", "--port", "--backend", "--custom_module_dirs", "--log_level",
                      "--max_beam_width", "--max_batch_size", "--max_num_tokens", "--max_seq_len", "--tensor_parallel_size",
                      "--tp_size", "--pipeline_parallel_size", "--pp_size", "--context_parallel_size", "--cp_size",
                      "--moe_expert_parallel_size", "--ep_size", "--gpus_per_node", "--free_gpu_memory_fraction",
                      "--kv_cache_free_gpu_memory_fraction", "--num_postprocess_workers", "--trust_remote_code", "--revision",
                      "--config", "--extra_llm_api_options", "--reasoning_parser", "--tool_parser", "--chat_template"}
TRTLLM_SERVE_BACKENDS = {"pytorch", "tensorrt", "_autodeploy"}
LLM_ARGS = {"max_batch_size", "max_seq_len", "kv_cache_config", "speculative_config"}
KV_CACHE_CONFIG_FIELDS = {"free_gpu_memory_fraction", "enable_block_reuse"}
# triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml (its LLM arguments; triton_config is that model's own)
MODEL_YAML_KEYS = {"model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "triton_config"} | LLM_ARGS
TRITON_CONFIG_KEYS = {"max_batch_size", "decoupled"}  # model.yaml's triton_config there


def llama(name: str) -> LoadedRecipe:
    return load_recipe(name)


def argvs(plan) -> list[list[str]]:
    return [list(s.argv) for s in plan.steps]


def flags(argv: list[str]) -> set[str]:
    return {a for a in argv if a.startswith("--")}


def download(repo: str, role: str) -> list[str]:
    return ["hf", "download", repo, "--local-dir", f"/out/hf/{role}", "--exclude", "original/*", "--exclude", "*.pth"]


def convert(script: str, role: str, *extra: str, dtype: str, tp: int = 1, workers: int = 1) -> list[str]:
    return ["python3", f"{EX}/{script}", "--model_dir", f"/out/hf/{role}", *extra, "--dtype", dtype, "--tp_size", str(tp),
            "--pp_size", "1", "--output_dir", f"/out/checkpoints/{role}", "--workers", str(workers)]


def build(role: str, *extra: str, batch: int, inp: int, seq: int, dtype: str, workers: int = 1, tokens: int = 8192) -> list[str]:
    return ["trtllm-build", "--checkpoint_dir", f"/out/checkpoints/{role}", "--output_dir", f"/out/engines/{role}",
            "--max_batch_size", str(batch), "--max_input_len", str(inp), "--max_seq_len", str(seq), "--max_num_tokens", str(tokens),
            "--max_beam_width", "1", "--gemm_plugin", dtype, *extra, "--workers", str(workers)]


GOLDEN_TENSORRT = {
    "llama-eagle": [
        download("meta-llama/Llama-3.1-8B-Instruct", "target"),
        download("yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "eagle"),
        convert("eagle/convert_checkpoint.py", "target", "--eagle_model_dir", "/out/hf/eagle", "--max_draft_len", "63",
                "--num_eagle_layers", "4", "--max_non_leaves_per_layer", "10", dtype="float16"),
        build("target", "--use_paged_context_fmha", "enable", "--speculative_decoding_mode", "eagle", "--max_draft_len", "63",
              batch=8, inp=2048, seq=4096, dtype="float16"),
    ],
    "llama-medusa": [
        download("lmsys/vicuna-7b-v1.3", "target"),
        download("FasterDecoding/medusa-vicuna-7b-v1.3", "medusa"),
        convert("medusa/convert_checkpoint.py", "target", "--medusa_model_dir", "/out/hf/medusa", "--num_medusa_heads", "4",
                "--num_medusa_layers", "1", "--max_medusa_token_len", "63", dtype="float16"),
        build("target", "--speculative_decoding_mode", "medusa", "--max_draft_len", "63", batch=4, inp=1024, seq=2048, dtype="float16"),
    ],
    "llama-lookahead": [
        download("meta-llama/Llama-3.1-8B-Instruct", "target"),
        convert("models/core/llama/convert_checkpoint.py", "target", dtype="float16"),
        build("target", "--speculative_decoding_mode", "lookahead_decoding", "--max_draft_len", "83",
              batch=4, inp=2048, seq=4096, dtype="float16"),
    ],
    "llama-draft": [
        download("meta-llama/Llama-3.1-70B-Instruct", "target"),
        convert("models/core/llama/convert_checkpoint.py", "target", dtype="bfloat16", tp=4, workers=4),
        download("meta-llama/Llama-3.2-1B-Instruct", "draft"),
        convert("models/core/llama/convert_checkpoint.py", "draft", dtype="bfloat16", tp=4, workers=4),
        build("draft", "--use_paged_context_fmha", "enable", batch=8, inp=2048, seq=4096, dtype="bfloat16", workers=4),
        build("target", "--use_paged_context_fmha", "enable", "--speculative_decoding_mode", "draft_tokens_external",
              "--max_draft_len", "4", batch=8, inp=2048, seq=4096, dtype="bfloat16", workers=4),
    ],
}


@pytest.mark.parametrize("name", sorted(GOLDEN_TENSORRT))
def test_engine_path_golden_commands(name):
    plan = plan_tensorrt(llama(name), OUT)
    assert argvs(plan) == GOLDEN_TENSORRT[name]
    assert all(s.log == OUT / "logs" / f"{s.name}.log" and s.outputs for s in plan.steps)


@pytest.mark.parametrize("name", sorted(GOLDEN_TENSORRT))
def test_every_flag_is_one_tensorrt_llm_defines(name):
    known = {"eagle/": EAGLE_CONVERT_FLAGS, "medusa/": MEDUSA_CONVERT_FLAGS, "llama/": LLAMA_CONVERT_FLAGS, "quantization/": QUANTIZE_FLAGS}
    for argv in argvs(plan_tensorrt(llama(name), OUT)):
        if argv[0] == "trtllm-build":
            assert flags(argv) <= TRTLLM_BUILD_FLAGS, argv
            if "--speculative_decoding_mode" in argv:
                assert argv[argv.index("--speculative_decoding_mode") + 1] in SPECULATIVE_DECODING_MODES
        elif argv[0] == "hf":
            assert argv[1] == "download" and flags(argv) <= hf_download_flags(), argv
        else:
            reference = next(v for k, v in known.items() if k in argv[1])
            assert flags(argv) <= reference, argv


def hf_download_flags() -> set[str]:
    """The options of the installed huggingface_hub's ``hf download`` (its own --help)."""
    import re
    import subprocess
    import sys

    text = subprocess.run([sys.executable, "-m", "huggingface_hub.cli.hf", "download", "--help"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "200"}).stdout
    return set(re.findall(r"--[a-z][a-z-]*", text))


GOLDEN_PYTORCH = {  # planned for the recipes' build.trtllm_version 1.2.1: EAGLE-3 is decoding_type Eagle there
    "llama-eagle3": {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model_dir": "/out/hf/draft", "eagle3_one_model": True},
    "llama-ngram": {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3, "is_use_oldest": True},
}


@pytest.mark.parametrize("name", sorted(GOLDEN_PYTORCH))
def test_pytorch_path_golden_configs(name, tmp_path):
    plan = plan_pytorch(llama(name), tmp_path)
    written = plan.write()
    options = yaml.safe_load((tmp_path / "extra_llm_api_options.yaml").read_text())
    model = yaml.safe_load((tmp_path / "model.yaml").read_text())
    golden = {k: (v.replace("/out", str(tmp_path)) if isinstance(v, str) else v) for k, v in GOLDEN_PYTORCH[name].items()}
    assert options == {"max_batch_size": 8, "max_seq_len": 4096, "kv_cache_config": {"free_gpu_memory_fraction": 0.9},
                       "speculative_config": golden}
    assert model == {"model": f"{tmp_path}/hf/target", "backend": "pytorch", "tensor_parallel_size": 1,
                     "pipeline_parallel_size": 1, **options, "triton_config": {"max_batch_size": 8, "decoupled": False}}
    assert set(model) <= MODEL_YAML_KEYS and set(options) <= LLM_ARGS and set(model["triton_config"]) <= TRITON_CONFIG_KEYS
    assert set(options["kv_cache_config"]) <= KV_CACHE_CONFIG_FIELDS
    assert check_speculative_config(options["speculative_config"], "1.2.1") == []
    assert plan.trtllm_version.startswith("TensorRT-LLM 1.2.1 ")
    assert flags(list(plan.serve_argv)) <= TRTLLM_SERVE_FLAGS
    assert plan.serve_argv[plan.serve_argv.index("--backend") + 1] in TRTLLM_SERVE_BACKENDS
    assert [p.name for p in written] == ["build.sh", "extra_llm_api_options.yaml", "model.yaml"]


def test_build_script_logs_and_skips_finished_steps(tmp_path):
    plan = plan_tensorrt(llama("llama-lookahead"), tmp_path)
    script = plan.write()[0].read_text()
    assert script.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in script
    assert f"if [ -e {tmp_path}/engines/target/config.json ] && [ -e {tmp_path}/engines/target/rank0.engine ]; then" in script
    assert f"> {tmp_path}/logs/build-target.log 2>&1" in script
    text = script + "\n".join(plan.lines())
    assert "${" not in text


def test_lookahead_engine_draft_len_matches_wng():
    argv = argvs(plan_tensorrt(llama("llama-lookahead"), OUT))[-1]
    assert argv[argv.index("--max_draft_len") + 1] == str((7 - 2) + (7 - 1 + 7) * (7 - 1))


def test_target_engine_always_has_a_draft_budget():
    for name in ("llama-draft", "llama-eagle", "llama-medusa", "llama-lookahead"):
        argv = argvs(plan_tensorrt(llama(name), OUT))[-1]
        assert int(argv[argv.index("--max_draft_len") + 1]) > 0, name


def test_max_num_tokens_covers_a_full_speculative_batch():
    assert max_num_tokens(8, 63) == 8192
    assert max_num_tokens(256, 63) == 256 * 64


def recipe(body: str, backend: str = "tensorrt", build: str = "") -> LoadedRecipe:
    text = f"name: t\ntarget: {{checkpoint: meta-llama/Llama-3.1-8B-Instruct, dtype: float16}}\nspeculation:\n{body}build: {{backend: {backend}{build}}}\n"
    return parse_recipe(text, Path("t.yaml"))


def test_eagle_choices_depth_and_budget_are_rejected():
    with pytest.raises(RecipeError, match="eagle_choices are 2 deep but num_eagle_layers is 4"):
        recipe("  method: eagle\n  eagle_model: e/h\n  eagle_choices: [[0], [0, 0]]\n")
    with pytest.raises(RecipeError, match="max_draft_len"):
        recipe("  method: eagle\n  eagle_model: e/h\n  max_draft_len: 300\n")


def test_lookahead_draft_len_inconsistent_with_wng_is_rejected():
    with pytest.raises(RecipeError, match=r"t.yaml:\d+: speculation.*max_draft_len 50 does not match \(W, N, G\) = \(4, 3, 4\).*= 15"):
        recipe("  method: lookahead\n  max_window_size: 4\n  max_ngram_size: 3\n  max_verification_set_size: 4\n  max_draft_len: 50\n")
    assert recipe("  method: lookahead\n  max_window_size: 4\n  max_ngram_size: 3\n  max_verification_set_size: 4\n").recipe.speculation.max_draft_len == 15


def test_eagle_with_pipeline_parallel_is_rejected():
    with pytest.raises(RecipeError, match=r"t.yaml:\d+: build.pp_size: EAGLE supports no pipeline parallelism"):
        recipe("  method: eagle\n  eagle_model: e/h\n", build=", pp_size: 2")


def test_beam_search_with_speculation_is_rejected():
    with pytest.raises(RecipeError, match="build.max_beam_width: beam search is unsupported with speculation"):
        recipe("  method: lookahead\n", build=", max_beam_width: 2")


def test_methods_on_the_wrong_path_name_the_right_one():
    with pytest.raises(RecipeError, match=r"speculation.method: method 'medusa' is not available on build.backend 'pytorch'.*use build.backend: tensorrt"):
        plan_pytorch(recipe("  method: medusa\n  medusa_model: m/h\n", "pytorch"), OUT)
    with pytest.raises(RecipeError, match=r"'mtp' is not available on build.backend 'tensorrt'.*use build.backend: pytorch"):
        plan_tensorrt(recipe("  method: mtp\n"), OUT)


def test_engine_path_with_tensorrt_llm_1_3_is_rejected():
    assert capability_error("eagle", "tensorrt", "1.2.1") is None
    for installed in ("1.3.0rc2", "1.3.0", "1.4.0rc1"):
        with pytest.raises(RecipeError, match=r"build.backend: build.backend 'tensorrt' needs TensorRT-LLM <= 1.2.x.*installed: " + installed):
            plan_tensorrt(llama("llama-lookahead"), OUT, version=installed)
    with pytest.raises(RecipeError, match="needs TensorRT-LLM >= 1.0; installed: 0.21.0"):
        plan_pytorch(llama("llama-ngram"), OUT, version="0.21.0")


def test_version_parsing_and_eagle3_name():
    assert parse_version("1.3.0rc2") == parse_version("1.3") > parse_version("1.2.1")
    assert llm_api_decoding_type("Eagle3", "1.2.1") == "Eagle" and llm_api_decoding_type("Eagle3", "1.3.0rc2") == "Eagle3"
    with pytest.raises(ValueError, match="not a TensorRT-LLM version"):
        parse_version("latest")


def test_non_dry_run_without_tensorrt_llm_points_to_dry_run():
    with pytest.raises(RecipeError, match=r"not installed here.*--dry-run.*build.backend: reference"):
        require_installed(llama("llama-eagle"), None)


def test_plan_for_dispatches_on_backend():
    assert plan_for(llama("llama-ngram"), OUT).backend == "pytorch"
    assert plan_for(llama("llama-medusa"), OUT).backend == "tensorrt"
    with pytest.raises(RecipeError, match="not a TensorRT-LLM backend"):
        plan_for(load_recipe("smollm2-ngram"), OUT)


def test_quantization_and_baseline_engine():
    loaded = recipe("  method: lookahead\n", build=", quantization: int4_wo, baseline_engine: true")
    steps = argvs(plan_tensorrt(loaded, OUT))
    assert steps[1][-7:] == ["--use_weight_only", "--weight_only_precision", "int4", "--output_dir", "/out/checkpoints/target", "--workers", "1"]
    assert steps[-1][:5] == ["trtllm-build", "--checkpoint_dir", "/out/checkpoints/target", "--output_dir", "/out/engines/baseline"]
    assert "--speculative_decoding_mode" not in steps[-1]
    fp8 = recipe("  method: lookahead\n", build=", quantization: fp8")
    quantize = argvs(plan_tensorrt(fp8, OUT))[1]
    assert quantize[1].endswith("quantization/quantize.py") and flags(quantize) <= QUANTIZE_FLAGS
    assert quantize[quantize.index("--qformat") + 1] in QUANTIZE_QFORMATS
    assert "--gemm_plugin" not in argvs(plan_tensorrt(fp8, OUT))[-1]


def test_cli_plans_without_tensorrt_llm_and_refuses_to_run():
    """No GPU here: `plan` prints the exact commands; a real run stops before any work and says why."""
    import subprocess
    import sys

    if installed_version() is not None:
        pytest.skip("TensorRT-LLM is installed here")
    plan = subprocess.run([sys.executable, "-m", "specbuild.cli", "plan", "llama-eagle"], capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0 and "trtllm-build" in plan.stdout and "--speculative_decoding_mode eagle" in plan.stdout
    assert "triton_repo/tensorrt_llm/config.pbtxt (backend tensorrtllm)" in plan.stdout and "decoding_mode = eagle" in plan.stdout
    assert "launch: $ python3 /app/scripts/launch_triton_server.py --world_size 1 " in plan.stdout
    draft = subprocess.run([sys.executable, "-m", "specbuild.cli", "recipe", "llama-draft", "--dry-run"], capture_output=True, text=True, timeout=60)
    assert draft.returncode == 0 and "tensorrt_llm_draft/config.pbtxt" in draft.stdout and "tensorrt_llm_draft_model_name = tensorrt_llm_draft" in draft.stdout
    assert "tensorrt_llm_bls" not in draft.stdout and "# planned for TensorRT-LLM 1.2.1 " in draft.stdout
    eagle3 = subprocess.run([sys.executable, "-m", "specbuild.cli", "plan", "llama-eagle3", "--trtllm-version", "1.3.0"],
                            capture_output=True, text=True, timeout=60)
    assert eagle3.returncode == 0 and "decoding_type: Eagle3" in eagle3.stdout and "# planned for TensorRT-LLM 1.3.0 " in eagle3.stdout
    assert "--multi-model" in draft.stdout.replace("\n", " ")
    run = subprocess.run([sys.executable, "-m", "specbuild.cli", "recipe", "llama-eagle"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "needs TensorRT-LLM, which is not installed" in run.stderr and "--dry-run" in run.stderr


REDRAFTER = "  method: redrafter\n  drafter_model: org/vicuna-7b-drafter\n  redrafter_num_beams: 4\n  redrafter_draft_len_per_beam: 5\n"


def test_redrafter_engine_plan():
    steps = argvs(plan_tensorrt(recipe(REDRAFTER, build=", tp_size: 2"), OUT))
    assert steps[2] == ["python3", f"{EX}/redrafter/convert_checkpoint.py", "--model_dir", "/out/hf/target",
                        "--drafter_model_dir", "/out/hf/drafter", "--redrafter_num_beams", "4", "--redrafter_draft_len_per_beam", "5",
                        "--dtype", "float16", "--tp_size", "2", "--output_dir", "/out/checkpoints/target", "--workers", "2"]
    assert flags(steps[2]) <= REDRAFTER_CONVERT_FLAGS
    build = steps[-1]
    assert build[build.index("--speculative_decoding_mode") + 1] == "explicit_draft_tokens" and "--max_draft_len" not in build
    assert flags(build) <= TRTLLM_BUILD_FLAGS
    assert recipe(REDRAFTER).recipe.speculation.max_draft_len == 20


def test_redrafter_refusals(tmp_path):
    with pytest.raises(RecipeError, match=r"'redrafter' is not available on build.backend 'pytorch'.*use build.backend: tensorrt"):
        plan_pytorch(recipe(REDRAFTER, "pytorch"), OUT)
    with pytest.raises(RecipeError, match="build.pp_size: ReDrafter's converter .* has no pipeline parallelism"):
        plan_tensorrt(recipe(REDRAFTER, build=", pp_size: 2"), OUT)
    with pytest.raises(RecipeError, match="build.quantization: ReDrafter's converter has no quantization options"):
        plan_tensorrt(recipe(REDRAFTER, build=", quantization: int8_wo"), OUT)
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "model.pt").write_bytes(b"pickle")
    with pytest.raises(RecipeError, match="speculation.drafter_model: .*has no model.safetensors.*never lets a pickle be loaded"):
        plan_tensorrt(recipe(REDRAFTER.replace("org/vicuna-7b-drafter", str(drafter))), OUT)


def test_ngram_engine_plan_is_one_target_with_external_drafts(tmp_path):
    loaded = recipe("  method: ngram\n  max_draft_len: 5\n  max_matching_ngram_size: 2\n")
    plan = plan_tensorrt(loaded, OUT)
    build = argvs(plan)[-1]
    assert [s.name for s in plan.steps] == ["download-target", "convert-target", "build-target"]  # no draft engine
    assert build[build.index("--speculative_decoding_mode") + 1] == "draft_tokens_external"
    assert build[build.index("--max_draft_len") + 1] == "5" and "--use_paged_context_fmha" in build
    from specbuild.triton_repo.tensorrtllm import repo_spec_for, trtllm_models

    models = {m.name: m for m in trtllm_models(repo_spec_for(loaded, plan_tensorrt(loaded, tmp_path), end_id=2, pad_id=0))}
    front = models["ensemble"].parameters
    assert (front["method"], front["max_draft_len"], front["max_matching_ngram_size"]) == ("ngram", "5", "2")
    assert models["tensorrt_llm"].parameters["enable_kv_cache_reuse"] == "true" and "tensorrt_llm_draft" not in models


def test_eagle_runtime_options_the_triton_backend_lacks_are_rejected():
    """tensorrt_llm/config.pbtxt has eagle_choices but no dynamic-tree or posterior-threshold key."""
    with pytest.raises(RecipeError, match=r"speculation.use_dynamic_tree: use_dynamic_tree is a TensorRT-LLM runtime option that its Triton backend does not take"):
        plan_tensorrt(recipe("  method: eagle\n  eagle_model: e/h\n  use_dynamic_tree: true\n  dynamic_tree_max_topK: 8\n"), OUT)
    with pytest.raises(RecipeError, match=r"speculation.posterior_threshold: .*remove it"):
        plan_tensorrt(recipe("  method: eagle\n  eagle_model: e/h\n  posterior_threshold: 0.09\n"), OUT)


LLAMA_RECIPES = ("llama-draft", "llama-eagle", "llama-eagle3", "llama-lookahead", "llama-medusa", "llama-ngram")


@pytest.mark.parametrize("name", LLAMA_RECIPES)
def test_every_llama_plan_states_the_tensorrt_llm_version_it_assumed(name, tmp_path):
    """Without TensorRT-LLM installed: the recipe's build.trtllm_version, in the printed plan header;
    installed, the installed version wins and a different pin is noted."""
    from specbuild.pipeline import RunPaths, plan_lines

    if installed_version() is None:
        lines = plan_lines(llama(name), RunPaths(tmp_path))
        assert lines[1] == "# planned for TensorRT-LLM 1.2.1 (build.trtllm_version / --trtllm-version; not installed here)"
    plan = plan_for(llama(name), tmp_path, version="1.2.0")
    assert plan.lines()[1] == "# planned for TensorRT-LLM 1.2.0 (installed)"
    assert plan.notes == ("build.trtllm_version 1.2.1 not used: TensorRT-LLM 1.2.0 is installed and is what runs",)


def test_engine_path_default_is_1_2_without_a_version():
    text = (Path(__file__).parents[1] / "recipes" / "llama-medusa.yaml").read_text()
    loaded = parse_recipe(text.replace("  trtllm_version: '1.2.1'", "  # no version"), Path("m.yaml"))
    assert plan_tensorrt(loaded, OUT).lines()[1] == "# planned for TensorRT-LLM 1.2.x (engine path default; not installed here)"


def unpinned(name: str) -> LoadedRecipe:
    text = (Path(__file__).parents[1] / "recipes" / f"{name}.yaml").read_text()
    return parse_recipe(text.replace("  trtllm_version: '1.2.1'", "  # no version"), Path(f"{name}.yaml"))


def test_pytorch_plan_refuses_when_its_output_depends_on_an_unknown_version(tmp_path):
    with pytest.raises(RecipeError, match=r"llama-eagle3.yaml:\d+: build.trtllm_version: the LLM-API configuration for method "
                                          r"'eagle3' differs by TensorRT-LLM version \(1.2.1: decoding_type Eagle, 1.3.0: decoding_type "
                                          r"Eagle3, 1.4.0: decoding_type Eagle3\).*set build.trtllm_version .*--trtllm-version"):
        plan_pytorch(unpinned("llama-eagle3"), tmp_path)
    ngram = plan_pytorch(unpinned("llama-ngram"), tmp_path)  # NGram's YAML is the same on every line
    assert "this plan's files are the same for every version" in ngram.lines()[1]
    options = yaml.safe_load(ngram.files[0].text)
    assert check_speculative_config(options["speculative_config"], "1.2.1") == check_speculative_config(options["speculative_config"], "1.3.0") == []


@pytest.mark.parametrize(("version", "decoding_type"), [("1.2.1", "Eagle"), ("1.3.0rc2", "Eagle3"), ("1.3.0", "Eagle3")])
def test_eagle3_yaml_validates_for_the_version_planned_for(version, decoding_type, tmp_path):
    """The YAML a plan writes is one that version's LLM API accepts (decoding_type registry and
    fields, tests/upstream_trtllm.py), and not the other line's where they differ."""
    from specbuild.builder.trtllm_plan import with_trtllm_version

    plan = plan_for(with_trtllm_version(unpinned("llama-eagle3"), version), tmp_path)
    for f in plan.files:
        config = yaml.safe_load(f.text)["speculative_config"]
        assert config["decoding_type"] == decoding_type
        assert check_speculative_config(dict(config), version) == []
    if decoding_type == "Eagle3":  # what a version-blind plan used to write: 1.2.x rejects it
        assert check_speculative_config(dict(config), "1.2.1") == ["Invalid decoding type: Eagle3"]
    assert f"TensorRT-LLM {version} " in plan.lines()[1]


def test_trtllm_version_must_be_a_version_string():
    with pytest.raises(RecipeError, match=r"build.trtllm_version: .*quoted string"):
        recipe("  method: ngram\n", "pytorch", build=", trtllm_version: 1.3")
    with pytest.raises(RecipeError, match=r"build.trtllm_version"):
        recipe("  method: ngram\n", "pytorch", build=", trtllm_version: latest")
    with pytest.raises(RecipeError, match=r"t.yaml:\d+: build.trtllm_version: build.backend 'tensorrt' needs TensorRT-LLM <= 1.2.x.*build.trtllm_version: 1.3.0"):
        plan_tensorrt(recipe("  method: lookahead\n", build=", trtllm_version: '1.3.0'"), OUT)


def test_draft_target_decoding_type_follows_the_version(tmp_path):
    """1.2.x registers DraftTarget; the 1.3 line's class literal is Draft_Target."""
    loaded = recipe("  method: draft_target\n  draft_checkpoint: meta-llama/Llama-3.2-1B-Instruct\n  max_draft_len: 4\n", "pytorch")
    for version, expected in (("1.2.1", "DraftTarget"), ("1.3.0", "Draft_Target")):
        config = yaml.safe_load(plan_pytorch(loaded, tmp_path, version=version).files[0].text)["speculative_config"]
        assert config["decoding_type"] == expected and check_speculative_config(config, version) == []
    with pytest.raises(RecipeError, match="differs by TensorRT-LLM version"):
        plan_pytorch(loaded, tmp_path)


def test_a_version_from_the_command_line_is_blamed_on_the_option_not_the_recipe_line():
    from click.testing import CliRunner

    from specbuild.cli import main

    result = CliRunner().invoke(main, ["plan", "llama-eagle", "--trtllm-version", "1.3.0"])
    assert result.exit_code != 0
    assert "--trtllm-version 1.3.0 (replaces build.trtllm_version of " in result.output, result.output
    assert "llama-eagle.yaml:" not in result.output  # the recipe's own line says 1.2.1: it is not what is wrong
    assert "needs TensorRT-LLM <= 1.2.x" in result.output


LLAMA_RECIPES = sorted(n for n in __import__("specbuild.builder.recipe", fromlist=["bundled_recipes"]).bundled_recipes() if n.startswith("llama-"))


@pytest.mark.parametrize("version", ["1.2.1", "1.3.0", "1.4.0"])
@pytest.mark.parametrize("name", LLAMA_RECIPES)
def test_plan_json_speculative_config_is_the_written_file(name, version, tmp_path):
    """``plan --json``'s ``speculative_config`` is what the run writes for the planned version (nc3
    item 3: it used to be the recipe's version-blind view, ``Eagle3`` / ``eagle3_one_model`` on 1.2.1)."""
    import json

    from click.testing import CliRunner
    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.trtllm_plan import with_trtllm_version
    from specbuild.cli import main

    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["plan", name, "--json", "--trtllm-version", version, "-o", str(out)])
    loaded = load_recipe(name)
    if loaded.recipe.build.backend == "tensorrt" and version != "1.2.1":
        assert result.exit_code == 2 and "1.2" in result.output  # the engine path ends at 1.2.x: refused, no JSON
        return
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    written = plan_for(with_trtllm_version(loaded, version), out).write()
    assert out / "build.sh" in written
    options = [p for p in written if p.name == "extra_llm_api_options.yaml"]
    if loaded.recipe.build.backend == "tensorrt":  # speculation is built into the engine: no file holds a speculative_config
        assert options == [] and got["speculative_config"] is None and got["speculative_config_file"] is None
        return
    (path,) = options
    assert got["speculative_config_file"] == str(path)
    assert got["speculative_config"] == yaml.safe_load(path.read_text())["speculative_config"]
    assert check_speculative_config(dict(got["speculative_config"]), version) == []
    if loaded.recipe.speculation.method == "eagle3":
        assert got["speculative_config"]["decoding_type"] == ("Eagle" if version == "1.2.1" else "Eagle3")
        assert ("eagle3_one_model" in got["speculative_config"]) is (version == "1.2.1")
        assert ("speculative_model" in got["speculative_config"]) is (version != "1.2.1")


@pytest.mark.parametrize("name", LLAMA_RECIPES)
def test_plan_json_stages_are_the_commands_build_sh_runs(name, tmp_path):
    """``plan --json``'s ``stages`` are objects a script runs without parsing text (nc4 item 1): each
    build stage's ``argv`` is the command ``build.sh`` runs, in order, and the serve stages say which
    launches are alternatives."""
    import json
    import shlex

    from click.testing import CliRunner
    from specbuild.builder.recipe import load_recipe
    from specbuild.cli import main

    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["plan", name, "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    plan = plan_for(load_recipe(name), out)
    script = plan.build_script()
    build = [s for s in got["stages"] if s["kind"] != "serve"]
    assert [s["name"] for s in build] == [step.name for step in plan.steps]
    positions = [script.index(f"  {shlex.join(s['argv'])} > ") for s in build]
    assert positions == sorted(positions)  # build.sh runs them in this order
    assert all(s["outputs"] and s["log"] for s in build)
    serve = {s["name"]: s for s in got["stages"] if s["kind"] == "serve"}
    assert "serve-triton" in serve and serve["serve-triton"]["argv"]
    if plan.serve_argv:  # PyTorch path: trtllm-serve or Triton, not both
        assert serve["serve-trtllm-serve"]["alternative_to"] == "serve-triton"
        assert serve["serve-triton"]["alternative_to"] == "serve-trtllm-serve"
    # files: everything the run writes (trial 7: the engine path listed none): build.sh, the config
    # files, then the Triton repository's config.pbtxt files (Triton's schema parses them) and launch.sh
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    files = got["files"]
    assert files[0]["path"].endswith("/build.sh") and files[0]["text"] == script
    assert [f["path"] for f in files[1 : 1 + len(plan.files)]] == [str(f.path) for f in plan.files]
    repo = files[1 + len(plan.files) :]
    assert repo[-1]["path"].endswith("/launch.sh") and shlex.join(serve["serve-triton"]["argv"]) in repo[-1]["text"]
    configs = [f for f in repo[:-1]]
    assert configs and all(f["path"].endswith("/config.pbtxt") for f in configs)
    names = {text_format.Parse(f["text"], model_config_pb2.ModelConfig()).name for f in configs}
    assert "ensemble" in names and (plan.backend == "pytorch" or "tensorrt_llm" in names)
    assert all("at run time" in f["note"] for f in configs if 'key: "end_id"' in f["text"])
    assert got["lines"] and all(isinstance(line, str) for line in got["lines"])
