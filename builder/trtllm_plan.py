"""The TensorRT-LLM build plan for a recipe: exact commands and config files, nothing run.

``plan_tensorrt`` (engine path, TensorRT-LLM <= 1.2.x) lists, per method, the Hugging Face download,
the checkpoint conversion (the model family's ``convert_checkpoint.py``, Medusa/EAGLE's own, or
ModelOpt ``quantize.py`` for fp8) and ``trtllm-build`` with speculation enabled. ``plan_pytorch``
(LLM API, >= 1.0) writes the ``speculative_config`` as ``extra_llm_api_options.yaml`` (for
``trtllm-serve``) and ``model.yaml`` (the LLM arguments of the repository's ensemble). ``TrtllmPlan.write`` writes a
runnable ``build.sh`` (every step logs to ``logs/<step>.log`` and is skipped when its outputs exist);
:mod:`specbuild.builder.trtllm_run` runs the same steps from ``specbuild recipe``, resumably.

Output layout (``output_dir``, made absolute: the paths end up in Triton configs)::

    hf/target, hf/draft, hf/<head>      downloaded Hugging Face checkpoints (ids only)
    checkpoints/target, checkpoints/draft   TensorRT-LLM checkpoints (engine path)
    engines/target, engines/draft, engines/baseline   engines (rank{N}.engine + config.json)
    logs/<step>.log, build.sh, extra_llm_api_options.yaml, model.yaml

Every flag and key is checked in tests/test_trtllm_plan.py against the argparse / click / LLM-API
definitions of TensorRT-LLM (file and commit named there).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from specbuild.util.draft_len_schedule import DraftLenScheduleError, check_draft_len_schedule, portable_schedule
from specbuild.builder.recipe import LoadedRecipe, Recipe, RecipeError
from specbuild.methods import Conversion
from specbuild.builder.trtllm_version import (
    FIELD_SINCE,
    LLM_API_LINES,
    NEWEST_VERIFIED_LINE,
    BuildPath,
    PlannedVersion,
    capability_error,
    llm_api_config,
    parse_version,
    planned_version,
    unverified_error,
)

StepKind = Literal["download", "convert", "quantize", "build"]
Quantization = Literal["none", "fp8", "int8_wo", "int4_wo"]
DEFAULT_EXAMPLES = Path("/app/examples")  # the tritonserver:<yy.mm>-trtllm-python-py3 image copies TensorRT-LLM examples/ here
EXAMPLES_ENV = "TRTLLM_EXAMPLES_DIR"
MIN_MAX_NUM_TOKENS = 8192  # trtllm-build's BuildConfig.max_num_tokens default
# Skips Meta's original/ consolidated *.pth (pickles, as large again as the HF weights: 16 GB for
# Llama-3.1-8B, 140 GB for 70B) that Llama repositories ship next to the safetensors. Downloads go
# straight to their directory with huggingface_hub's `hf download` (it resumes partial files and
# skips finished ones); DOWNLOAD_DONE, written after it succeeds, is what marks one complete.
DOWNLOAD_DONE = ".specbuild-download-complete"
DOWNLOAD_EXCLUDE = ("original/*", "*.pth")


@dataclass(frozen=True)
class Step:
    """One command: ``argv`` exactly as run; ``outputs`` the files it produces, all in one directory
    (:attr:`output_dir`; a step whose outputs all exist is skipped by build.sh); ``log`` where its
    stdout/stderr go; ``inputs`` the directories it reads (their fingerprints decide whether
    ``specbuild recipe`` re-runs it)."""

    name: str
    kind: StepKind
    argv: tuple[str, ...]
    outputs: tuple[Path, ...]
    log: Path
    inputs: tuple[Path, ...] = ()
    marker: Path | None = None  # one of ``outputs`` the command does not write: touched once it succeeds

    @property
    def output_dir(self) -> Path:
        """The directory the step writes (its ``--output_dir`` / ``local_dir``)."""
        return self.outputs[0].parent

    def command(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class ConfigFile:
    """A file the plan writes verbatim (YAML for the LLM API)."""

    path: Path
    text: str


@dataclass(frozen=True)
class Parallelism:
    """Tensor x pipeline parallel sizes; ``world_size`` GPUs (ranks) per engine."""

    tp_size: int = 1
    pp_size: int = 1
    gpus_per_node: int = 8

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def nodes(self) -> int:
        """Nodes the ranks span: ceil(world_size / gpus_per_node). Example: TP=8 on 4-GPU nodes -> 2."""
        return -(-self.world_size // self.gpus_per_node)

    @property
    def ranks_per_node(self) -> int:
        return min(self.world_size, self.gpus_per_node)


@dataclass(frozen=True)
class EngineDirs:
    """Where the engines land (``None``: this plan builds no such engine)."""

    target: Path | None
    draft: Path | None = None
    baseline: Path | None = None


@dataclass(frozen=True)
class TrtllmPlan:
    """What ``specbuild plan`` prints and a GPU run executes, in order."""

    recipe_name: str
    backend: BuildPath
    output_dir: Path
    parallel: Parallelism
    steps: tuple[Step, ...]
    files: tuple[ConfigFile, ...] = ()
    engines: EngineDirs = EngineDirs(target=None)
    serve_argv: tuple[str, ...] = ()
    tokenizer_dir: Path | None = None  # the target's Hugging Face directory (tokenizer, special ids)
    draft_dir: Path | None = None  # draft-target: the draft's Hugging Face directory
    notes: tuple[str, ...] = field(default=())
    trtllm_version: str = ""  # which TensorRT-LLM the files are written for (PlannedVersion.describe)
    version: str | None = None  # that version's number (None: not pinned; "1.2": the engine path's default line)
    # PyTorch path: the dict written as extra_llm_api_options.yaml (files[0]); None on the engine path
    llm_api_options: dict[str, Any] | None = None

    @property
    def speculative_config(self) -> dict[str, Any] | None:
        """The ``speculative_config`` the plan writes, exactly (the PyTorch path's
        ``extra_llm_api_options.yaml``, for the planned version); ``None`` on the engine path, which
        writes none (speculation is built into the engine by ``trtllm-build --speculative_decoding_mode``)
        and for plain decoding."""
        return None if self.llm_api_options is None else self.llm_api_options.get("speculative_config")

    def lines(self) -> list[str]:
        """Human-readable plan: one block per step (command, outputs, log), then the files."""
        from specbuild.triton_repo.tensorrtllm import container_image

        out = [f"# {self.recipe_name}: TensorRT-LLM {self.backend} path, world size {self.parallel.world_size}"
               + (f" on {self.parallel.nodes} nodes" if self.parallel.nodes > 1 else ""),
               f"# planned for {self.trtllm_version}"]
        out += [f"# note: {n}" for n in self.notes]
        out += [f"# {line}" for line in container_image(self.backend, self.version).lines()]
        for i, step in enumerate(self.steps, 1):
            out += [f"[{i}/{len(self.steps)}] {step.name} ({step.kind})", f"  $ {step.command()}"]
            out += [f"  -> {p}" for p in step.outputs] + [f"  log: {step.log}"]
        for f in self.files:
            out += [f"file {f.path}:"] + [f"  {line}" for line in f.text.splitlines()]
        if self.serve_argv:
            out.append(f"serve with trtllm-serve (OpenAI API; an alternative to the Triton launch, not both): $ {shlex.join(self.serve_argv)}")
        return out

    def build_script(self) -> str:
        """``build.sh``: runs the steps in order, each skipped when its outputs exist."""
        lines = ["#!/usr/bin/env bash", f"# Generated by specbuild for recipe {self.recipe_name}.", "set -euo pipefail", ""]
        for step in self.steps:
            exists = " && ".join(f"[ -e {shlex.quote(str(p))} ]" for p in step.outputs)
            log = shlex.quote(str(step.log))
            lines += [
                f"# {step.name}",
                f"if {exists}; then echo 'skip {step.name} (outputs exist)'; else",
                f"  echo 'run {step.name} (log: {step.log})'",
                f"  mkdir -p {shlex.quote(str(step.log.parent))}",
                f"  {step.command()} > {log} 2>&1 || {{ echo 'FAILED {step.name}; see {step.log}'; tail -n 20 {log}; exit 1; }}",
                *([f"  touch {shlex.quote(str(step.marker))}"] if step.marker is not None else []),
                "fi",
                "",
            ]
        return "\n".join(lines)

    def write(self, output_dir: Path | None = None) -> list[Path]:
        """Write ``build.sh`` (executable) and the config files; returns their paths."""
        root = output_dir or self.output_dir
        root.mkdir(parents=True, exist_ok=True)
        script = root / "build.sh"
        script.write_text(self.build_script())
        script.chmod(0o755)
        written = [script]
        for f in self.files:
            f.path.parent.mkdir(parents=True, exist_ok=True)
            f.path.write_text(f.text)
            written.append(f.path)
        return written


# ----------------------------------------------------------------------------------------------
# Validation shared by both paths


def _planned(loaded: LoadedRecipe, path: BuildPath, version: str | None, source: str) -> PlannedVersion:
    if version is not None:
        return PlannedVersion(version, source)
    return planned_version(path, installed=None, requested=_build_field(loaded.recipe, "trtllm_version", None))


def _build_field(recipe: Recipe, name: str, default: Any) -> Any:
    return getattr(recipe.build, name, default)


def parallelism(recipe: Recipe) -> Parallelism:
    return Parallelism(tp_size=_build_field(recipe, "tp_size", 1), pp_size=_build_field(recipe, "pp_size", 1),
                       gpus_per_node=_build_field(recipe, "gpus_per_node", 8))


def _check_nodes(loaded: LoadedRecipe, path: BuildPath) -> None:
    """A world size beyond one node must fill whole nodes; the engine path's orchestrator mode
    (several engine models: draft-target, a baseline engine) runs on one node only
    (tensorrtllm_backend README, "Orchestrator Mode").

    Raises:
        RecipeError: at ``build.gpus_per_node`` / ``build.backend``.
    """
    p = parallelism(loaded.recipe)
    if p.nodes == 1:
        return
    if p.world_size % p.gpus_per_node:
        raise loaded.error(("build", "gpus_per_node"), f"tp_size * pp_size = {p.world_size} spans {p.nodes} nodes of {p.gpus_per_node} GPUs "
                           "unevenly; make the world size a multiple of gpus_per_node")
    several = loaded.recipe.speculation.definition.trtllm.draft_engine is not None or (
        _build_field(loaded.recipe, "baseline_engine", False) and loaded.recipe.speculation.definition.speculates)
    if path == "tensorrt" and several:
        raise loaded.error(("build", "gpus_per_node"), f"{p.world_size} ranks need {p.nodes} nodes, and the Triton backend's orchestrator "
                           "mode (several engine models: a draft or baseline engine) runs on one node only; use the PyTorch path "
                           "or fit the world size on one node")


def check_recipe(loaded: LoadedRecipe, path: BuildPath, version: str | None, source: str = "installed") -> None:
    """Reject recipes TensorRT-LLM would reject, before any work. ``version``: the one planned for
    (``None``: unknown), ``source``: where it came from (for messages).

    Raises:
        RecipeError: method unavailable on ``path`` or ``version``; a ``speculative_token_map``; a draft_len_schedule off the
            PyTorch path; beam width > 1 with speculation; a quantization the method's converter does
            not take; the method's own refusals (:attr:`~specbuild.methods.TrtllmMapping.check`) and
            weights checks (:attr:`~specbuild.methods.Weights.check_files`, local directories only).
    """
    r = loaded.recipe
    spec = r.speculation
    method = spec.definition
    problem = capability_error(spec.method, path, version, source)
    if problem:
        if capability_error(spec.method, path, None):
            loc = ("speculation", "method")
        else:
            loc = ("build", "trtllm_version") if source == "build.trtllm_version" else ("build", "backend")
        raise loaded.error(loc, problem)
    for name in ("draft_len_schedule", "max_concurrency", "acceptance_window", "acceptance_length_threshold"):
        if _build_field(r, name, None) not in (None, {}) and (path != "pytorch" or not method.speculates):
            why = "there is no speculation to control" if not method.speculates else "the engine path has no such option"
            raise loaded.error(("build", name), f"{name} is a PyTorch-path (LLM API) speculative_config option and {why}; remove it")
    if getattr(spec, "speculative_token_map", None) is not None:
        raise loaded.error(("speculation", "speculative_token_map"),
                           "TensorRT-LLM has no hot-token map for the draft (SGLang's --speculative-token-map; EAGLE-3 "
                           "checkpoints carry their own draft vocabulary instead): remove speculative_token_map, or set "
                           "build.backend: reference")
    if method.speculates and _build_field(r, "max_beam_width", 1) > 1:
        raise loaded.error(("build", "max_beam_width"), "beam search is not supported with speculative decoding; set 1")
    _check_quantization(loaded, method.trtllm.conversion)
    _check_nodes(loaded, path)
    if method.trtllm.check is not None:
        method.trtllm.check(loaded, path)
    weights = method.weights
    if weights is not None and weights.check_files is not None:
        local = loaded.resolve_path(spec.weights_path)
        if local.is_dir():
            weights.check_files(loaded, local)


def _check_quantization(loaded: LoadedRecipe, conversion: Conversion | None) -> None:
    """The method's converter takes the recipe's ``build.quantization`` (every converter takes ``none``)."""
    spec = loaded.recipe.speculation
    quantization = _build_field(loaded.recipe, "quantization", "none")
    if conversion is None or quantization == "none" or quantization in conversion.quantization:
        return
    if not conversion.quantization:
        raise loaded.error(("build", "quantization"), f"{spec.definition.title}'s converter has no quantization options; set quantization: none")
    raise loaded.error(("build", "quantization"),
                       f"{quantization} is not planned for {spec.method} conversion; use {', '.join(conversion.quantization)} or none")


# ----------------------------------------------------------------------------------------------
# Engine path


@dataclass(frozen=True)
class _Paths:
    out: Path
    examples: Path

    def hf(self, role: str) -> Path:
        return self.out / "hf" / role

    def ckpt(self, role: str) -> Path:
        return self.out / "checkpoints" / role

    def engine(self, role: str) -> Path:
        return self.out / "engines" / role

    def log(self, step: str) -> Path:
        return self.out / "logs" / f"{step}.log"


def _is_hf_id(value: str) -> bool:
    return value.count("/") == 1 and not value.startswith((".", "/", "~"))


def _source_dir(loaded: LoadedRecipe, checkpoint: str, role: str, paths: _Paths, steps: list[Step]) -> Path:
    """The local HF directory for ``checkpoint``; adds a download step for a Hugging Face id
    that is not an existing local path."""
    local = loaded.resolve_path(checkpoint)
    if local.exists() or not _is_hf_id(checkpoint):
        return local
    revision = loaded.recipe.target.revision if role == "target" else None
    dest = paths.hf(role)
    argv = ("hf", "download", checkpoint, *(("--revision", revision) if revision else ()), "--local-dir", str(dest),
            *(a for pattern in DOWNLOAD_EXCLUDE for a in ("--exclude", pattern)))
    steps.append(Step(f"download-{role}", "download", argv, (dest / "config.json", dest / DOWNLOAD_DONE), paths.log(f"download-{role}"),
                      marker=dest / DOWNLOAD_DONE))
    return dest


def _quant_flags(quantization: Quantization) -> tuple[str, ...]:
    """convert_checkpoint.py weight-only flags (int8/int4 weights, activations in dtype)."""
    if quantization in ("int8_wo", "int4_wo"):
        return ("--use_weight_only", "--weight_only_precision", quantization.removesuffix("_wo"))
    return ()


def _parallel_flags(p: Parallelism, pp_flag: bool = True) -> tuple[str, ...]:
    return ("--tp_size", str(p.tp_size), "--pp_size", str(p.pp_size)) if pp_flag else ("--tp_size", str(p.tp_size))


def _convert_step(role: str, model_dir: Path, dtype: str, p: Parallelism, quantization: Quantization, paths: _Paths, extra: tuple[str, ...] = (),
                  script: str = "models/core/llama/convert_checkpoint.py", heads: Path | None = None, pp_flag: bool = True) -> Step:
    """A TensorRT-LLM checkpoint from an HF checkpoint (fp8: ModelOpt's quantize.py instead)."""
    out = paths.ckpt(role)
    if quantization == "fp8":
        argv = ("python3", str(paths.examples / "quantization/quantize.py"), "--model_dir", str(model_dir), "--dtype", dtype,
                "--qformat", "fp8", "--kv_cache_dtype", "fp8", "--calib_size", "512", *_parallel_flags(p), "--output_dir", str(out))
        return Step(f"quantize-{role}", "quantize", argv, (out / "config.json",), paths.log(f"quantize-{role}"), (model_dir,))
    argv = ("python3", str(paths.examples / script), "--model_dir", str(model_dir), *extra, "--dtype", dtype,
            *_parallel_flags(p, pp_flag), *_quant_flags(quantization), "--output_dir", str(out), "--workers", str(p.world_size))
    inputs = (model_dir,) if heads is None else (model_dir, heads)
    return Step(f"convert-{role}", "convert", argv, (out / "config.json",), paths.log(f"convert-{role}"), inputs)


@dataclass(frozen=True)
class _EngineOptions:
    """trtllm-build options; lengths in tokens."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    dtype: str
    quantization: Quantization
    speculative_decoding_mode: str | None = None
    max_draft_len: int = 0
    paged_context_fmha: bool = False
    gather_generation_logits: bool = False


def max_num_tokens(max_batch_size: int, max_draft_len: int) -> int:
    """trtllm-build's token budget: >= max_batch_size * (max_draft_len + 1), at least 8192.

    Example: batch 8, 63 draft tokens -> max(8192, 512) = 8192; batch 256, 63 -> 16384.
    """
    return max(MIN_MAX_NUM_TOKENS, max_batch_size * (max_draft_len + 1))


def _build_step(role: str, o: _EngineOptions, p: Parallelism, paths: _Paths, checkpoint_role: str | None = None) -> Step:
    out = paths.engine(role)
    argv = [
        "trtllm-build", "--checkpoint_dir", str(paths.ckpt(checkpoint_role or role)), "--output_dir", str(out),
        "--max_batch_size", str(o.max_batch_size), "--max_input_len", str(o.max_input_len),
        "--max_seq_len", str(o.max_seq_len), "--max_num_tokens", str(max_num_tokens(o.max_batch_size, o.max_draft_len)),
        "--max_beam_width", "1",
    ]
    if o.quantization != "fp8":  # fp8 GEMMs run without the gemm plugin
        argv += ["--gemm_plugin", o.dtype]
    if o.paged_context_fmha:
        argv += ["--use_paged_context_fmha", "enable"]
    if o.gather_generation_logits:
        argv += ["--gather_generation_logits"]
    if o.speculative_decoding_mode == "explicit_draft_tokens":  # ReDrafter: the draft budget comes from the checkpoint
        argv += ["--speculative_decoding_mode", o.speculative_decoding_mode]
    elif o.speculative_decoding_mode is not None:
        argv += ["--speculative_decoding_mode", o.speculative_decoding_mode, "--max_draft_len", str(o.max_draft_len)]
    argv += ["--workers", str(p.world_size)]
    return Step(f"build-{role}", "build", tuple(argv), (out / "config.json", out / "rank0.engine"), paths.log(f"build-{role}"),
                (paths.ckpt(checkpoint_role or role),))


def _base_options(r: Recipe, dtype: str) -> _EngineOptions:
    return _EngineOptions(r.build.max_batch_size, r.build.max_input_len, r.build.max_seq_len, dtype, _build_field(r, "quantization", "none"))


def _target_engine_options(r: Recipe, dtype: str) -> _EngineOptions:
    spec = r.speculation
    base = _base_options(r, dtype)
    if not spec.definition.speculates:
        return base
    return _EngineOptions(**{**base.__dict__, "speculative_decoding_mode": spec.speculative_decoding_mode,
                             "max_draft_len": spec.max_draft_len, "paged_context_fmha": spec.definition.trtllm.paged_context_fmha})


def _target_convert(loaded: LoadedRecipe, model_dir: Path, dtype: str, p: Parallelism, paths: _Paths, steps: list[Step]) -> Step:
    """The target's conversion: with the method's weights through its own converter, else the plain one."""
    spec = loaded.recipe.speculation
    q = _build_field(loaded.recipe, "quantization", "none")
    conversion = spec.definition.trtllm.conversion
    if conversion is None:
        return _convert_step("target", model_dir, dtype, p, q, paths)
    weights = _source_dir(loaded, spec.weights_path, spec.definition.weights.role, paths, steps)
    extra = (conversion.weights_flag, str(weights), *conversion.flags(spec))
    return _convert_step("target", model_dir, dtype, p, q, paths, extra, conversion.script, weights, pp_flag=conversion.pp_flag)


def plan_tensorrt(loaded: LoadedRecipe, output_dir: Path, *, version: str | None = None, source: str = "installed",
                  examples_dir: Path = DEFAULT_EXAMPLES) -> TrtllmPlan:
    """The engine-path plan (TensorRT-LLM <= 1.2.x) for ``loaded``.

    ``version``: the TensorRT-LLM planned for (``source``: ``installed`` or ``build.trtllm_version``),
    or ``None``: the recipe's ``build.trtllm_version``, else the path's default, 1.2.x.
    ``examples_dir``: the TensorRT-LLM source tree's ``examples/`` (convert scripts are not in the wheel).

    Raises:
        RecipeError: see :func:`check_recipe`.
    """
    planned = _planned(loaded, "tensorrt", version, source)
    check_recipe(loaded, "tensorrt", planned.version, planned.source)
    output_dir = Path(os.path.abspath(output_dir))  # the paths end up in configs read from other directories
    r = loaded.recipe
    spec = r.speculation
    p = parallelism(r)
    paths = _Paths(output_dir, examples_dir)
    dtype = r.target.dtype
    steps: list[Step] = []
    target_hf = _source_dir(loaded, r.target.checkpoint, "target", paths, steps)
    steps.append(_target_convert(loaded, target_hf, dtype, p, paths, steps))
    draft_engine = draft_hf = None
    method = spec.definition
    if method.trtllm.draft_engine is not None:
        draft = method.trtllm.draft_engine(spec)
        draft_dtype = draft.dtype or dtype
        draft_hf = _source_dir(loaded, draft.checkpoint, method.weights.role, paths, steps)
        steps.append(_convert_step("draft", draft_hf, draft_dtype, p, _build_field(r, "quantization", "none"), paths))
        draft_options = _EngineOptions(**{**_base_options(r, draft_dtype).__dict__, "paged_context_fmha": True,
                                          "gather_generation_logits": draft.gather_generation_logits})
        steps.append(_build_step("draft", draft_options, p, paths))
        draft_engine = paths.engine("draft")
    steps.append(_build_step("target", _target_engine_options(r, dtype), p, paths))
    baseline_engine = None
    if _build_field(r, "baseline_engine", False) and method.speculates:
        if method.trtllm.conversion is not None:  # the target's checkpoint carries the method's weights; convert plainly
            steps.append(_convert_step("baseline", target_hf, dtype, p, _build_field(r, "quantization", "none"), paths))
            steps.append(_build_step("baseline", _base_options(r, dtype), p, paths))
        else:
            steps.append(_build_step("baseline", _base_options(r, dtype), p, paths, checkpoint_role="target"))
        baseline_engine = paths.engine("baseline")
    return TrtllmPlan(r.name, "tensorrt", output_dir, p, tuple(steps), engines=EngineDirs(paths.engine("target"), draft_engine, baseline_engine),
                      tokenizer_dir=target_hf, draft_dir=draft_hf, trtllm_version=planned.describe("tensorrt"), version=planned.version)


# ----------------------------------------------------------------------------------------------
# PyTorch (LLM API) path


def speculative_config(recipe: Recipe, version: str) -> dict[str, Any] | None:
    """The LLM API ``speculative_config`` for TensorRT-LLM ``version``, model dirs resolved by the caller."""
    config = recipe.speculation.to_llm_api()
    if config is None:
        return None
    return llm_api_config(config, version)


def llm_api_options(loaded: LoadedRecipe, version: str, draft_dir: Path | None) -> dict[str, Any]:
    """``extra_llm_api_options.yaml`` contents: LLM(...) keyword arguments beyond the model;
    ``build.draft_len_schedule`` goes to ``speculative_config.draft_len_schedule`` with
    ``build.max_concurrency`` folded in
    (:func:`~specbuild.util.draft_len_schedule.portable_schedule`: TensorRT-LLM 1.2 and main read it
    alike; main refuses both keys together); ``max_concurrency`` alone, ``acceptance_window`` and
    ``acceptance_length_threshold`` go there as they are when set.

    Raises:
        RecipeError: the schedule breaks a TensorRT-LLM rule
            (:func:`~specbuild.util.draft_len_schedule.check_draft_len_schedule`), or there is no
            speculation to schedule.
    """
    r = loaded.recipe
    options: dict[str, Any] = {
        "max_batch_size": r.build.max_batch_size,
        "max_seq_len": r.build.max_seq_len,
        "kv_cache_config": {"free_gpu_memory_fraction": getattr(r.serve, "kv_cache_free_gpu_mem_fraction", 0.9)},
    }
    spec = speculative_config(r, version)
    if spec is not None:
        for key in ("speculative_model_dir", "speculative_model"):
            if key in spec and draft_dir is not None:
                spec[key] = str(draft_dir)
        for key, first in FIELD_SINCE.items():
            if key in spec and parse_version(version) < parse_version(first):
                raise loaded.error(("speculation", key), f"{key} needs TensorRT-LLM >= {first} (planned for {version}); "
                                   f"set build.trtllm_version to {first} or later, or remove {key}")
        schedule = _build_field(r, "draft_len_schedule", None)
        max_concurrency = _build_field(r, "max_concurrency", None)
        if schedule:
            try:
                check_draft_len_schedule(schedule, r.speculation.max_draft_len)
                # written so that 1.2 (lower-bound keys, max_concurrency beside it) and main (upper-bound
                # keys, max_concurrency refused beside a schedule) run the same draft lengths
                spec["draft_len_schedule"] = portable_schedule(schedule, max_concurrency, r.build.max_batch_size)
            except DraftLenScheduleError as exc:
                raise loaded.error(("build", "draft_len_schedule"), f"{exc} (speculation.max_draft_len: {r.speculation.max_draft_len})") from None
            max_concurrency = None
        if max_concurrency is not None:
            spec["max_concurrency"] = max_concurrency
        for name in ("acceptance_window", "acceptance_length_threshold"):
            if _build_field(r, name, None) is not None:
                spec[name] = _build_field(r, name, None)
        options["speculative_config"] = spec
    return options


def llmapi_model_yaml(loaded: LoadedRecipe, model_dir: Path, options: dict[str, Any], p: Parallelism) -> dict[str, Any]:
    """``model.yaml``: the ``LLM(...)`` arguments the repository's ensemble loads
    (:mod:`specbuild.triton_repo.models.llmapi_front`), laid out as TensorRT-LLM's own ``llmapi``
    model's (triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml): the LLM arguments, then
    ``triton_config`` (``max_batch_size``, ``decoupled``), which that model turns into its Triton
    config and specbuild's ``ensemble`` declares in config.pbtxt with the same values (the model
    drops the key before building the LLM)."""
    return {
        "model": str(model_dir),
        "backend": "pytorch",
        "tensor_parallel_size": p.tp_size,
        "pipeline_parallel_size": p.pp_size,
        **({"gpus_per_node": p.gpus_per_node} if p.nodes > 1 else {}),
        **options,
        "triton_config": {"max_batch_size": loaded.recipe.build.max_batch_size, "decoupled": False},  # the ensemble answers once
    }


def plan_pytorch(loaded: LoadedRecipe, output_dir: Path, *, version: str | None = None, source: str = "installed") -> TrtllmPlan:
    """The LLM-API plan (TensorRT-LLM >= 1.0): downloads, then the two YAML files, then serving.

    ``version``: the TensorRT-LLM planned for (``source``: ``installed`` or ``build.trtllm_version``),
    or ``None``: the recipe's ``build.trtllm_version``, else none, allowed only where the files come
    out the same for every LLM-API line (:data:`LLM_API_LINES`).

    Raises:
        RecipeError: see :func:`check_recipe`; the version is unknown and the files differ by version
            (e.g. EAGLE-3's ``decoding_type``: ``Eagle`` before 1.3, ``Eagle3`` from 1.3 on).
    """
    planned = _planned(loaded, "pytorch", version, source)
    check_recipe(loaded, "pytorch", planned.version, planned.source)
    output_dir = Path(os.path.abspath(output_dir))
    r = loaded.recipe
    spec = r.speculation
    p = parallelism(r)
    paths = _Paths(output_dir, DEFAULT_EXAMPLES)
    steps: list[Step] = []
    target_hf = _source_dir(loaded, r.target.checkpoint, "target", paths, steps)
    draft_dir = _source_dir(loaded, spec.weights_path, "draft", paths, steps) if spec.weights_path else None
    options = _version_independent_options(loaded, draft_dir) if planned.version is None else llm_api_options(loaded, planned.version, draft_dir)
    options_file = output_dir / "extra_llm_api_options.yaml"
    model_yaml = llmapi_model_yaml(loaded, target_hf, options, p)
    files = (
        ConfigFile(options_file, yaml.safe_dump(options, sort_keys=False)),
        ConfigFile(output_dir / "model.yaml", yaml.safe_dump(model_yaml, sort_keys=False)),
    )
    host = r.serve.host if "host" in r.serve.model_fields_set else "0.0.0.0"  # in the container: what `docker run -p` reaches
    serve = ("trtllm-serve", str(target_hf), "--backend", "pytorch", "--tp_size", str(p.tp_size), "--pp_size", str(p.pp_size),
             "--extra_llm_api_options", str(options_file), "--host", host, "--port", str(r.serve.http_port or 8000),
             *(("--gpus_per_node", str(p.gpus_per_node)) if p.nodes > 1 else ()))
    return TrtllmPlan(r.name, "pytorch", output_dir, p, tuple(steps), files, EngineDirs(None), serve, tokenizer_dir=target_hf,
                      draft_dir=draft_dir if spec.definition.weights and spec.definition.weights.draft_model else None, trtllm_version=planned.describe("pytorch"),
                      version=planned.version, llm_api_options=options)


def _version_independent_options(loaded: LoadedRecipe, draft_dir: Path | None) -> dict[str, Any]:
    """The LLM-API options when no version is known: allowed only if every line gives the same.

    Raises:
        RecipeError: at ``build.trtllm_version``, naming what differs and how to choose.
    """
    by_line = {v: llm_api_options(loaded, v, draft_dir) for v in LLM_API_LINES}
    first, *others = by_line.values()
    if any(o != first for o in others):
        differs = ", ".join(f"{v}: decoding_type {o.get('speculative_config', {}).get('decoding_type')}" for v, o in by_line.items())
        raise loaded.error(
            ("build", "trtllm_version"),
            f"the LLM-API configuration for method {loaded.recipe.speculation.method!r} differs by TensorRT-LLM version "
            f"({differs}) and no TensorRT-LLM is installed here: set build.trtllm_version (e.g. '1.2.1') in the recipe "
            "or pass --trtllm-version to the version you will deploy with",
        )
    return first


def examples_dir() -> Path:
    """TensorRT-LLM's ``examples/`` (the conversion scripts are not in the wheel): ``$TRTLLM_EXAMPLES_DIR``,
    default ``/app/examples``: NGC's tritonserver:<yy.mm>-trtllm-python-py3 image copies TensorRT-LLM's
    examples/ there, next to /app/scripts and /app/all_models (tensorrtllm_backend
    dockerfile/Dockerfile.triton.trt_llm_backend: WORKDIR /app, COPY ... examples)."""
    return Path(os.environ.get(EXAMPLES_ENV, str(DEFAULT_EXAMPLES)))


def plan_for(loaded: LoadedRecipe, output_dir: Path, *, version: str | None = None, allow_unverified: bool = False) -> TrtllmPlan:
    """``plan_tensorrt`` or ``plan_pytorch`` by ``build.backend``, for the TensorRT-LLM version
    :func:`~specbuild.builder.trtllm_version.planned_version` picks: ``version`` (the installed one,
    ``installed_version()``), else the recipe's ``build.trtllm_version``, else the path's default.
    A ``build.trtllm_version`` that differs from the installed version is noted and not used.
    A version newer than the newest verified line (:data:`~specbuild.builder.trtllm_version.NEWEST_VERIFIED_LINE`)
    is refused unless ``allow_unverified`` (or ``$SPECBUILD_ALLOW_UNVERIFIED_TRTLLM=1``): then planned
    with that line's names and a warning note.

    Raises:
        RecipeError: ``build.backend`` is ``reference``; an unverified version without the override;
            or see :func:`check_recipe`, :func:`plan_pytorch`.
    """
    backend = loaded.recipe.build.backend
    requested = _build_field(loaded.recipe, "trtllm_version", None)
    if backend not in ("tensorrt", "pytorch"):
        raise loaded.error(("build", "backend"), "not a TensorRT-LLM backend; the reference backend has its own plan")
    unverified = _unverified_note(loaded, version, requested, backend, allow_unverified)
    if backend == "tensorrt":
        plan = plan_tensorrt(loaded, output_dir, version=version, examples_dir=examples_dir())
    else:
        plan = plan_pytorch(loaded, output_dir, version=version)
    if version is not None and requested is not None and requested != version:
        note = f"build.trtllm_version {requested} not used: TensorRT-LLM {version} is installed and is what runs"
        plan = dataclasses.replace(plan, notes=(*plan.notes, note))
    if unverified:
        plan = dataclasses.replace(plan, notes=(*plan.notes, unverified))
    ignored = _controls_ignored_note(loaded, plan)
    if ignored:
        plan = dataclasses.replace(plan, notes=(*plan.notes, ignored))
    return plan


def _controls_ignored_note(loaded: LoadedRecipe, plan: TrtllmPlan) -> str | None:
    """The plan's note when TensorRT-LLM 1.2.x would ignore the recipe's runtime controls: on 1.2 only
    methods with a drafter object run them (``_torch/speculative/utils.py`` ``get_spec_drafter``:
    n-gram, draft-target, two-model EAGLE-3); one-model EAGLE-3 (the default) and MTP do not."""
    r = loaded.recipe
    if plan.backend != "pytorch" or plan.version is None or parse_version(plan.version) >= parse_version("1.3"):
        return None
    set_controls = [n for n in ("draft_len_schedule", "max_concurrency", "acceptance_window", "acceptance_length_threshold")
                    if _build_field(r, n, None) not in (None, {})]
    if not set_controls or not r.speculation.definition.trtllm.one_model(r.speculation):
        return None
    fix = "set speculation.eagle3_one_model: false (two-model) or " if hasattr(r.speculation, "eagle3_one_model") else ""
    return (f"TensorRT-LLM {plan.version} ignores {', '.join(set_controls)} for one-model {r.speculation.method} "
            f"(1.2 runs them only for methods with a drafter object, _torch/speculative/utils.py get_spec_drafter): "
            f"{fix}plan for 1.3 or later, where the one-model path runs them")


ALLOW_UNVERIFIED_ENV = "SPECBUILD_ALLOW_UNVERIFIED_TRTLLM"  # "1": plan for a TensorRT-LLM newer than the newest verified line


def _unverified_note(loaded: LoadedRecipe, version: str | None, requested: str | None, backend: str, allow: bool) -> str | None:
    """The plan's warning for a TensorRT-LLM newer than the newest verified line, when allowed
    (``allow`` or ``$SPECBUILD_ALLOW_UNVERIFIED_TRTLLM=1``); ``None`` for a verified one.

    Raises:
        RecipeError: such a version without the override, naming the newest verified line.
    """
    planned, source = (version, "installed") if version is not None else (requested, "build.trtllm_version")
    if planned is None or backend != "pytorch":
        return None
    problem = unverified_error(planned, source)
    if problem is None:
        return None
    if not (allow or os.environ.get(ALLOW_UNVERIFIED_ENV) == "1"):
        raise loaded.error(("build", "trtllm_version"), problem)
    return f"WARNING: {problem.split(': its')[0]}; planned with the {NEWEST_VERIFIED_LINE} line's names (override given)"


def with_trtllm_version(loaded: LoadedRecipe, version: str | None) -> LoadedRecipe:
    """``loaded`` with ``build.trtllm_version`` set to ``version`` (``--trtllm-version``; ``None``:
    unchanged), validated like the recipe field.

    Raises:
        RecipeError: ``version`` is not ``MAJOR.MINOR[.PATCH][rcN]``.
    """
    if version is None:
        return loaded
    from pydantic import ValidationError

    from specbuild.builder.recipe import BuildConfig

    try:
        build = BuildConfig.model_validate({**loaded.recipe.build.model_dump(), "trtllm_version": version})
    except ValidationError:
        raise RecipeError(f"--trtllm-version {version!r}: expected a TensorRT-LLM version such as 1.2.1 or 1.3.0rc2") from None
    return dataclasses.replace(loaded, recipe=loaded.recipe.model_copy(update={"build": build}),
                               overrides={**loaded.overrides, ("build", "trtllm_version"): f"--trtllm-version {version}"})


def require_installed(loaded: LoadedRecipe, version: str | None) -> None:
    """Stop a non-dry run before any work when TensorRT-LLM is missing.

    Raises:
        RecipeError: ``version`` is ``None``; the message points to --dry-run and the reference backend.
    """
    if version is None:
        raise loaded.error(
            ("build", "backend"),
            f"build.backend {loaded.recipe.build.backend!r} needs TensorRT-LLM, which is not installed here "
            "(it needs an NVIDIA GPU; use the NGC container the plan names, e.g. nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 "
            "for TensorRT-LLM 1.2.1). "
            "Run with --dry-run (or `specbuild plan`) to see the exact commands, or use build.backend: reference on this machine",
        )


__all__ = [
    "ConfigFile", "EngineDirs", "Parallelism", "RecipeError", "Step", "TrtllmPlan", "check_recipe", "llm_api_options",
    "max_num_tokens", "plan_for", "plan_pytorch", "plan_tensorrt", "require_installed", "speculative_config",
    "with_trtllm_version",
]
