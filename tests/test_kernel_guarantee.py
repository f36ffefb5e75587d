"""The kernels' guarantee is visible and can be required (engine/native.py, engine/guarantee.py, builder/reference.py).

- The C prototypes in engine/csrc/rowgemm.c match the one ctypes table (``native.SIGNATURES``), parsed from the
  source, so a changed argument list fails here and not as a crash inside a served model.
- Without a C compiler ``build.kernels: auto`` falls back and says so (build output, config.json: near-ties,
  with the reason); ``build.kernels: rowgemm`` is refused before any long work, naming the compiler and the fix.
- With a compiler the build records the bitwise kernels, the loaded engine runs them, and an engine directory
  recording them refuses to load where they cannot be built instead of silently falling back.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import write_recipe
from specbuild.engine import native, rowgemm

needs_kernel = pytest.mark.skipif(rowgemm.library() is None, reason=f"rowgemm not built here: {rowgemm.unavailable_reason()}")
C_TYPES = {"long": ctypes.c_long, "int": ctypes.c_int, "float": ctypes.c_float, "double": ctypes.c_double}
# A top-level function definition: return type and name at the start of a line, parameters, then its body.
C_DEFINITION = re.compile(r"^(?!static\b)([A-Za-z_][\w ]*?[\s*]+)([A-Za-z_]\w*)\s*\(([^)]*)\)\s*\{", re.MULTILINE)


def c_prototypes(source: str) -> dict[str, tuple[type | None, tuple[type, ...]]]:
    """The exported (non-``static``) functions of a C source as ctypes ``(restype, argtypes)``: any pointer is
    ``c_void_p``, ``void`` returns None. Raises ValueError for a parameter type this table has no ctypes for."""
    prototypes = {}
    for returns, name, params in C_DEFINITION.findall(re.sub(r"/\*.*?\*/|//[^\n]*", "", source, flags=re.DOTALL)):
        argtypes = []
        for param in (p.strip() for p in params.split(",") if p.strip() not in ("", "void")):
            if "*" in param:
                argtypes.append(ctypes.c_void_p)
                continue
            words = [w for w in param.split()[:-1] if w != "const"]  # the type, without the parameter's name
            if " ".join(words) not in C_TYPES:
                raise ValueError(f"{name}: no ctypes type for parameter {param!r}")
            argtypes.append(C_TYPES[" ".join(words)])
        restype = None if returns.strip() == "void" else "*" if "*" in returns else C_TYPES[returns.strip()]
        prototypes[name] = (restype, tuple(argtypes))
    return prototypes


def test_the_c_prototypes_match_the_one_ctypes_table():
    """Every exported function of csrc/rowgemm.c is in native.SIGNATURES with its exact argument types, and the
    table names nothing else (26 arguments for the attention kernel: the KV pool as buffers, three strides and slot and position tables)."""
    declared = c_prototypes(native.SOURCE.read_text())
    assert declared == native.SIGNATURES
    assert len(declared["specbuild_attention_f32"][1]) == 26


def test_a_drifted_prototype_fails_the_check():
    """The check is not vacuous: the attention kernel with one ``long`` argument fewer (or a new export) differs."""
    source = native.SOURCE.read_text()
    drifted = source.replace("long room, int num_threads) {", "int num_threads) {", 1)
    assert drifted != source
    assert c_prototypes(drifted)["specbuild_attention_f32"] != native.SIGNATURES["specbuild_attention_f32"]
    extra = source + "\nvoid specbuild_new_kernel(const float *x, long n) {}\n"
    assert set(c_prototypes(extra)) - set(native.SIGNATURES) == {"specbuild_new_kernel"}


@needs_kernel
def test_the_loaded_library_carries_the_table():
    lib = rowgemm.library()
    for name, (restype, argtypes) in native.SIGNATURES.items():
        fn = getattr(lib, name)
        assert fn.restype is restype and fn.argtypes == list(argtypes), name
    with pytest.raises(ctypes.ArgumentError):  # ctypes now refuses a wrong argument instead of passing garbage
        lib.specbuild_rmsnorm_f32(0, 0, 0, 1, 1, "eps")


def _cli_build(recipe: Path, out: Path, env: dict, *, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specbuild.cli", "build", str(recipe), "-o", str(out)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def _record(out: Path) -> dict:
    return json.loads((out / "engine" / "config.json").read_text())["specbuild"]["kernel_guarantee"]


def _env(tmp_path: Path, **changes: str | None) -> dict:
    env = {**os.environ, "SPECBUILD_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("CC", None)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def test_without_a_compiler_auto_falls_back_and_says_so_then_a_compiler_makes_it_bitwise(tiny_checkpoint, tmp_path):
    """No C compiler (``$CC`` unset, no cc/gcc on PATH): the build prints and records the fallback, greedy
    equality up to near-ties, with the reason and what verify does. Built again where the compiler works, the
    recorded engine no longer holds: it is rebuilt and records the bitwise kernels."""
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint)
    empty = tmp_path / "bin"
    empty.mkdir()
    done = _cli_build(recipe, tmp_path / "out", _env(tmp_path, PATH=str(empty)))
    assert done.returncode == 0, done.stdout + done.stderr
    record = _record(tmp_path / "out")
    assert record["greedy_equality"] == "near-ties" and record["linear"] in ("onednn", "eager") and record["attention"] == "sdpa"
    assert "no C compiler" in record["fallback_reason"] and "install" in record["fallback_reason"]
    assert "near-tie" in record["verify"] and "--near-tie-margin" in record["verify"]
    assert "greedy equality near-ties" in done.stdout and "no C compiler" in done.stdout
    assert not list((tmp_path / "cache").glob("kernels/*.so"))
    if rowgemm.library() is None:
        pytest.skip(f"no working compiler here for the bitwise half: {rowgemm.unavailable_reason()}")
    again = _cli_build(recipe, tmp_path / "out", _env(tmp_path))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "rebuilding" in again.stdout and "greedy equality bitwise" in again.stdout
    record = _record(tmp_path / "out")
    assert (record["linear"], record["attention"], record["greedy_equality"], record["fallback_reason"]) == \
        ("rowgemm", "specbuild", "bitwise", None)


@pytest.mark.parametrize(("changes", "named"), [
    ({"CC": "/nonexistent/cc"}, "$CC='/nonexistent/cc' is not an executable"),
    ({"PATH": "EMPTY"}, "no C compiler"),
])
def test_required_bitwise_kernels_without_a_compiler_fail_before_any_work(tiny_checkpoint, tmp_path, changes, named):
    """``build.kernels: rowgemm`` and no compiler: exit 2 at the recipe line, naming the compiler and the fix;
    nothing is built and torch is never imported (milliseconds of checks)."""
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint, extra="")
    recipe.write_text(recipe.read_text().replace("build:\n", "build:\n  kernels: rowgemm\n"))
    if changes.get("PATH") == "EMPTY":
        (tmp_path / "bin").mkdir()
        changes = {"PATH": str(tmp_path / "bin")}
    done = _cli_build(recipe, tmp_path / "out", _env(tmp_path, **changes), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert "r.yaml" in message and "build.kernels: rowgemm requires the engine's bitwise kernels" in message
    assert named in message and "apt-get install gcc" in message and "set $CC" in message
    assert "build.kernels: auto" in message  # the other way out
    assert not (tmp_path / "out" / "engine").exists()


def test_required_bitwise_kernels_with_a_failing_compiler_fail_at_validation(tiny_checkpoint, tmp_path):
    """A compiler that exists but fails (``CC=false``: clang without OpenMP behaves alike) is found by compiling
    in the validate stage, before the engine is written."""
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint)
    recipe.write_text(recipe.read_text().replace("build:\n", "build:\n  kernels: rowgemm\n"))
    done = _cli_build(recipe, tmp_path / "out", _env(tmp_path, CC="false"), timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert "build.kernels: rowgemm requires the engine's bitwise kernels" in message and "failed to build rowgemm.c" in message
    assert not (tmp_path / "out" / "engine").exists()


@needs_kernel
def test_the_engine_runs_what_config_json_records_and_refuses_a_record_it_cannot_keep(tiny_checkpoint, tmp_path):
    """The normal path records the bitwise kernels and the loaded engine runs them. The same directory where no
    compiler works refuses to load, saying how to fix it, rather than serving near-ties under a bitwise record."""
    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine
    from specbuild.runtime import ReferenceEngine

    loaded = load_recipe(str(write_recipe(tmp_path / "r.yaml", tiny_checkpoint)))
    lines = []
    engine_dir = build_reference_engine(loaded, tmp_path / "engine", log=lines.append).engine_dir
    assert _record(tmp_path)["greedy_equality"] == "bitwise"
    assert "kernels: rowgemm linears, specbuild attention: greedy equality bitwise" in lines
    engine = ReferenceEngine.from_engine_dir(engine_dir)
    assert engine.kernels.greedy_equality == "bitwise" and engine.kernels.to_json() == _record(tmp_path)
    code = ("from specbuild.runtime import ReferenceEngine\n"
            f"ReferenceEngine.from_engine_dir({str(engine_dir)!r})\n")
    env = _env(tmp_path, CC="/nonexistent/cc", SPECBUILD_CACHE=str(tmp_path / "empty-cache"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0
    assert "records the engine's own kernels (rowgemm, greedy equality bitwise), which cannot be built here" in done.stderr
    assert "specbuild build --rebuild" in done.stderr and "$CC='/nonexistent/cc'" in done.stderr


@needs_kernel
def test_a_target_the_attention_kernel_does_not_take_is_near_ties_and_refused_when_bitwise_is_required(tmp_path):
    """rowgemm linears alone do not make greedy equality bitwise: a head size the attention kernel does not take
    (8) leaves PyTorch's SDPA, so ``auto`` reports near-ties with the reason and ``rowgemm`` is refused."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specbuild.engine.guarantee import plan_kernels

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    choice = plan_kernels(model, "auto")
    assert (choice.linear, choice.attention, choice.greedy_equality) == ("rowgemm", "sdpa", "near-ties")
    assert "head_dim 8" in choice.fallback_reason
    with pytest.raises(ValueError, match="rowgemm requires the engine's bitwise kernels, and its attention kernel cannot run"):
        plan_kernels(model, "rowgemm")
    assert plan_kernels(model, "onednn").fallback_reason == "build.kernels: onednn chooses them"
    assert plan_kernels(model, "auto", device="cuda").greedy_equality == "near-ties"
    assert plan_kernels(model.to(torch.bfloat16), "auto").fallback_reason.startswith("rowgemm runs float32 models on the CPU")


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc for the counting compiler wrapper")
def test_concurrent_processes_compile_the_library_once_and_leave_no_partial_file(tmp_path):
    """Triton's model instances (and a build beside a serve) load the kernels at once into an empty cache: the
    file lock lets one compile while the others wait, and every process gets the whole library."""
    calls = tmp_path / "calls.txt"
    wrapper = tmp_path / "cc-counting"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {shutil.which("gcc")} "$@"\n')
    wrapper.chmod(0o755)
    code = "from specbuild.engine import native; print(native.load_library(native.build_library(None))._name)"
    env = _env(tmp_path, CC=str(wrapper))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert len({out.strip() for out, _ in outputs}) == 1
    compiles = [line for line in calls.read_text().splitlines() if "rowgemm.c" in line]
    assert len(compiles) == 1, compiles
    built = sorted(p.name for p in (tmp_path / "cache" / "kernels").iterdir())
    assert [name for name in built if not name.endswith(".lock")] == [Path(outputs[0][0].strip()).name]


def test_the_plan_says_which_kernels_before_any_work(tiny_checkpoint, tmp_path, monkeypatch):
    """``specbuild plan`` / ``recipe --dry-run``: the kernels line from the recipe and the compiler lookup alone."""
    from specbuild.builder.recipe import load_recipe
    from specbuild.pipeline import RunPaths, plan_lines

    loaded = load_recipe(str(write_recipe(tmp_path / "r.yaml", tiny_checkpoint)))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc or gcc there
    line = next(line for line in plan_lines(loaded, RunPaths(tmp_path / "out")) if line.startswith("kernels"))
    assert "oneDNN fallback, greedy equality up to logit near-ties" in line and "no C compiler" in line
    monkeypatch.setenv("CC", sys.executable)  # an executable: the plan only looks the compiler up
    line = next(line for line in plan_lines(loaded, RunPaths(tmp_path / "out")) if line.startswith("kernels"))
    assert f"compiled with {sys.executable}: greedy equality bitwise" in line


@pytest.mark.parametrize(("extra", "names"), [("  device: cuda\n", "float32 on cuda"), ("", "bfloat16 on cpu")])
def test_required_bitwise_kernels_for_a_target_they_cannot_run_are_refused_by_the_recipe(tiny_checkpoint, tmp_path, extra, names):
    from specbuild.builder.recipe import RecipeError, load_recipe

    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint)
    text = recipe.read_text().replace("build:\n", "build:\n  kernels: rowgemm\n" + extra)
    recipe.write_text(text if extra else text.replace(f"checkpoint: {tiny_checkpoint}", f"checkpoint: {tiny_checkpoint}\n  dtype: bfloat16"))
    with pytest.raises(RecipeError, match=rf"build.kernels: rowgemm \(the engine's bitwise kernels\) runs float32 targets on the CPU, not {names}"):
        load_recipe(str(recipe))
