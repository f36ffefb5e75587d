"""The TensorRT-LLM runner: steps run as subprocesses with logs, resume by stamps, fail without
leaving anything that looks finished, and `specbuild recipe` drives it when TensorRT-LLM is there.

TensorRT-LLM cannot run here (no GPU), so its commands are stand-ins: a ``trtllm-build`` on PATH and
``convert_checkpoint.py`` scripts under ``$TRTLLM_EXAMPLES_DIR`` that parse the same flags and write
the files the real ones write; a fake ``tensorrt_llm`` distribution (version 1.2.1) makes the
version detection find it. Everything else (planning, stamps, staging, logs, vocabulary check,
repository, CLI) is the real code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from specbuild.builder.recipe import RecipeError, parse_recipe
from specbuild.builder.trtllm_plan import plan_tensorrt
from specbuild.builder.trtllm_run import STAMP_DIR, StageError, fingerprint, run_trtllm, special_ids

STUB = '''#!{python}
"""Stand-in for {what}: parses its flags, writes what the real command writes into --output_dir."""
import argparse, os, sys
p = argparse.ArgumentParser()
p.add_argument("--output_dir", required=True)
p.add_argument("--checkpoint_dir")
p.add_argument("--model_dir")
args, _ = p.parse_known_args()
source = args.checkpoint_dir or args.model_dir
if not os.path.isdir(source):
    sys.exit(f"no such directory: {{source}}")
print("{what}", " ".join(sys.argv[1:]))
if os.environ.get("STUB_FAIL") and os.environ["STUB_FAIL"] in source:
    print("error: out of GPU memory (stub)", file=sys.stderr)
    sys.exit(3)
os.makedirs(args.output_dir, exist_ok=True)
for name in {files!r}:
    with open(os.path.join(args.output_dir, name), "w") as f:
        f.write("{{}}")
'''
RECIPE = """name: tiny-draft
target: {checkpoint: target, dtype: float16}
speculation: {method: draft_target, draft_checkpoint: draft, max_draft_len: 4}
build: {backend: tensorrt, tp_size: 2, max_batch_size: 2, max_input_len: 64, max_seq_len: 128}
"""


def write_stub(path: Path, what: str, files: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STUB.format(python=sys.executable, what=what, files=files))
    path.chmod(0o755)


@pytest.fixture()
def gpu_box(tmp_path):
    """Checkpoints, stub commands and the environment a run sees."""
    for role, vocab in (("target", 128), ("draft", 128)):
        d = tmp_path / "recipe" / role
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"vocab_size": vocab, "eos_token_id": [7, 8], "pad_token_id": None}))
    (tmp_path / "recipe" / "recipe.yaml").write_text(RECIPE)
    write_stub(tmp_path / "bin" / "trtllm-build", "trtllm-build", ["config.json", "rank0.engine", "rank1.engine"])
    write_stub(tmp_path / "examples" / "models/core/llama/convert_checkpoint.py", "convert_checkpoint.py",
               ["config.json", "rank0.safetensors", "rank1.safetensors"])
    site = tmp_path / "site"
    (site / "tensorrt_llm").mkdir(parents=True)
    (site / "tensorrt_llm" / "__init__.py").write_text("raise ImportError('stand-in: never imported')\n")
    (site / "tensorrt_llm-1.2.1.dist-info").mkdir()
    (site / "tensorrt_llm-1.2.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 1.2.1\n")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "TRTLLM_EXAMPLES_DIR": str(tmp_path / "examples"), "PYTHONPATH": str(site)}
    return tmp_path, env


def load(root: Path, text: str | None = None):
    path = root / "recipe" / "recipe.yaml"
    return parse_recipe(text or path.read_text(), path)


def run(root: Path, env: dict, out: Path, **kwargs):
    loaded = load(root)
    plan = plan_tensorrt(loaded, out, examples_dir=root / "examples")
    lines: list[str] = []
    result = run_trtllm(loaded, plan, out / "triton_repo", status=lines.append, log=lines.append, env=env, **kwargs)
    return result, lines


def test_runs_every_step_with_logs_then_resumes(gpu_box):
    root, env = gpu_box
    out = root / "out"
    result, lines = run(root, env, out)
    names = ["convert-target", "convert-draft", "build-draft", "build-target"]
    assert list(result.record.ran) == names and result.record.skipped == []
    for name in names:
        log = (out / "logs" / f"{name}.log").read_text()
        assert log.startswith("$ ") and ("trtllm-build" in log or "convert_checkpoint.py" in log)
        assert (out / STAMP_DIR / f"{name}.json").is_file()
    assert (out / "engines/target/rank1.engine").is_file() and (out / "checkpoints/draft/config.json").is_file()
    launch = (result.launch_script).read_text()
    assert "--world_size 1" in launch and "--multi-model" in launch  # orchestrator mode: ranks spawned per model
    assert "[1/4] convert-target" in lines and any("done in" in line for line in lines)
    preprocessing = (out / "triton_repo/preprocessing/config.pbtxt").read_text()
    assert 'key: "end_id"' in preprocessing and 'string_value: "7"' in preprocessing  # eos from config.json
    assert not [p for p in out.rglob(".*tmp-*")]  # no staging directories left behind

    again, lines = run(root, env, out)
    assert again.record.ran == {} and again.record.skipped == names
    assert "[4/4] build-target: up to date, skipped" in lines


def test_changed_input_reruns_only_the_steps_downstream(gpu_box):
    root, env = gpu_box
    out = root / "out"
    run(root, env, out)
    (root / "recipe/draft/tokenizer.json").write_text("{}")  # the draft checkpoint changed
    result, _ = run(root, env, out)
    assert list(result.record.ran) == ["convert-draft", "build-draft"]
    assert result.record.skipped == ["convert-target", "build-target"]


def test_failed_step_leaves_nothing_that_looks_finished(gpu_box):
    root, env = gpu_box
    out = root / "out"
    run(root, env, out)
    with pytest.raises(StageError, match=r"step build-target failed \(exit status 3\); see .*logs/build-target.log"):
        run(root, {**env, "STUB_FAIL": "checkpoints/target"}, out, force=True)
    assert not (out / "engines/target").exists() and not (out / STAMP_DIR / "build-target.json").exists()
    assert "out of GPU memory (stub)" in (out / "logs/build-target.log").read_text()
    assert not [p for p in out.rglob(".*tmp-*")]
    result, _ = run(root, env, out)  # the next run redoes only the failed step
    assert list(result.record.ran) == ["build-target"]


def test_missing_command_is_a_stage_error(gpu_box):
    root, env = gpu_box
    with pytest.raises(StageError, match="step build-draft could not start: .*'trtllm-build'"):
        run(root, {**env, "PATH": os.environ["PATH"]}, root / "out")


def test_vocabulary_mismatch_stops_before_any_step(gpu_box):
    root, env = gpu_box
    (root / "recipe/draft/config.json").write_text(json.dumps({"vocab_size": 100, "eos_token_id": 7}))
    with pytest.raises(RecipeError, match=r"speculation.draft_checkpoint: .*vocab_size=100 but the target has vocab_size=128"):
        run(root, env, root / "out")
    assert not (root / "out/logs").exists()


def test_fingerprint_and_special_ids(tmp_path):
    (tmp_path / "a").write_text("x")
    first = fingerprint((tmp_path, tmp_path / "missing"))
    assert first[str(tmp_path / "missing")] == "missing"
    (tmp_path / "a").write_text("xy")
    assert fingerprint((tmp_path,)) != {str(tmp_path): first[str(tmp_path)]}
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128009], "pad_token_id": 0}))
    assert special_ids(tmp_path) == (128001, 0)


def test_cli_recipe_runs_the_stages_when_tensorrt_llm_is_installed(gpu_box):
    """`specbuild recipe` on a (stand-in) GPU box: builds, writes the repository, prints how to serve."""
    root, env = gpu_box
    out = root / "cli-out"
    cmd = [sys.executable, "-m", "specbuild.cli", "recipe", str(root / "recipe/recipe.yaml"), "-o", str(out)]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0, first.stderr + first.stdout
    assert (out / "triton_repo/launch.sh").is_file() and (out / "build.sh").is_file()
    assert "launch.sh" in first.stdout and "specbuild verify" in first.stdout
    serve = subprocess.run([sys.executable, "-m", "specbuild.cli", "serve", str(out / "triton_repo")], capture_output=True,
                           text=True, env=env, timeout=60)
    assert serve.returncode == 0 and "launch_triton_server.py --world_size 1" in serve.stdout and "--multi-model" in serve.stdout
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert second.returncode == 0 and "up to date, skipped" in second.stdout
    build = subprocess.run([sys.executable, "-m", "specbuild.cli", "build", str(root / "recipe/recipe.yaml"), "-o", str(out)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert build.returncode == 0 and "up to date, skipped" in build.stdout and "launch.sh" in build.stdout
    failed = subprocess.run(cmd + ["--rebuild"], capture_output=True, text=True, env={**env, "STUB_FAIL": "checkpoints/draft"}, timeout=120)
    assert failed.returncode == 1 and "step build-draft failed" in failed.stderr and "build-draft.log" in failed.stderr


def test_engine_path_on_tensorrt_llm_1_3_stops_before_any_work(gpu_box):
    root, env = gpu_box
    dist = root / "site" / "tensorrt_llm-1.2.1.dist-info"
    dist.rename(root / "site" / "tensorrt_llm-1.3.0.dist-info")
    (root / "site" / "tensorrt_llm-1.3.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 1.3.0\n")
    out = root / "cli-out"
    cmd = [sys.executable, "-m", "specbuild.cli", "recipe", str(root / "recipe/recipe.yaml"), "-o", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2  # the recipe cannot be built by this version: bad input
    assert "build.backend 'tensorrt' needs TensorRT-LLM <= 1.2.x" in run.stderr and "installed: 1.3.0" in run.stderr
    assert "set build.backend: pytorch" in run.stderr and not (out / "logs").exists()


def test_pytorch_path_writes_the_llmapi_repository_and_checks_the_draft(gpu_box):
    root, env = gpu_box
    text = RECIPE.replace("backend: tensorrt, tp_size: 2,", "backend: pytorch,")
    loaded = load(root, text)
    from specbuild.builder.trtllm_plan import plan_pytorch

    plan = plan_pytorch(loaded, root / "out", version="1.2.1")  # the box's TensorRT-LLM
    result = run_trtllm(loaded, plan, root / "out/triton_repo", status=lambda _: None, log=lambda _: None, env=env)
    assert result.record.ran == {} and (root / "out/triton_repo/ensemble/1/model.yaml").is_file()
    assert "decoding_type: DraftTarget" in (root / "out/extra_llm_api_options.yaml").read_text()
    (root / "recipe/draft/config.json").write_text(json.dumps({"vocab_size": 100, "eos_token_id": 7}))
    with pytest.raises(RecipeError, match="vocab_size=100 but the target has vocab_size=128"):
        run_trtllm(loaded, plan_pytorch(loaded, root / "out", version="1.2.1"), root / "out/triton_repo", status=lambda _: None, log=lambda _: None, env=env)


HUB_STUB = '''#!/usr/bin/env python3
"""Stand-in for huggingface_hub's `hf download REPO --local-dir DIR --exclude ...`: copies $STUB_HUB/<org>--<name>."""
import os, shutil, sys

args = sys.argv[1:]
assert args[0] == "download" and args.count("--exclude") == 2 and "original/*" in args and "*.pth" in args, args
repo_id, local_dir = args[1], args[args.index("--local-dir") + 1]
os.makedirs(local_dir, exist_ok=True)
with open(os.path.join(local_dir, "calls"), "a") as f:  # what a resumed download finds already there
    f.write(",".join(sorted(os.listdir(local_dir))) + "\\n")
if os.environ.get("STUB_HUB_FAIL"):
    open(os.path.join(local_dir, "model-00001.safetensors.incomplete"), "w").close()
    sys.exit("network down (stub)")
shutil.copytree(os.path.join(os.environ["STUB_HUB"], repo_id.replace("/", "--")), local_dir, dirs_exist_ok=True)
'''


def test_downloads_resume_in_place_and_finish_only_with_their_marker(gpu_box):
    root, env = gpu_box
    (root / "bin/hf").write_text(HUB_STUB)
    (root / "bin/hf").chmod(0o755)
    shutil.copytree(root / "recipe/target", root / "hub/org--target")
    env = {**env, "STUB_HUB": str(root / "hub")}
    text = RECIPE.replace("checkpoint: target", "checkpoint: org/target")
    loaded = load(root, text)
    out = root / "out"

    def run_once(extra_env):
        plan = plan_tensorrt(loaded, out, examples_dir=root / "examples")
        return run_trtllm(loaded, plan, out / "triton_repo", status=lambda _: None, log=lambda _: None, env={**env, **extra_env})

    with pytest.raises(StageError, match="step download-target failed"):
        run_once({"STUB_HUB_FAIL": "1"})
    assert (out / "hf/target/model-00001.safetensors.incomplete").exists()  # kept for the resume
    assert not (out / "hf/target/.specbuild-download-complete").exists() and not (out / STAMP_DIR / "download-target.json").exists()
    result = run_once({})
    assert list(result.record.ran)[0] == "download-target" and (out / "hf/target/.specbuild-download-complete").exists()
    assert "model-00001.safetensors.incomplete" in (out / "hf/target/calls").read_text().splitlines()[-1]
    assert run_once({}).record.ran == {}


def test_engine_path_launch_sh_names_its_image_and_is_reachable_through_docker_publish(gpu_box):
    """launch_triton_server.py starts tritonserver with its default address, 0.0.0.0 (what `docker
    run -p` forwards to); launch.sh says so and names the image that carries TensorRT-LLM 1.2.1."""
    root, env = gpu_box
    result, _ = run(root, env, root / "out")
    text = result.launch_script.read_text()
    assert "# container: nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3" in text
    assert "binds 0.0.0.0 inside the container" in text and "importlib.metadata" in text
    argv = text.splitlines()[-1].split()
    assert "--http-address" not in argv and argv[argv.index("--http_port") + 1] == "8000"
