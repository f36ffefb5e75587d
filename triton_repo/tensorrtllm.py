"""The Triton repository that serves TensorRT-LLM engines (``inflight_batcher_llm`` layout).

::

    repo/
      ensemble/           python: specbuild's front (the reference interface, num_draft_tokens routed)
      preprocessing/      python (specbuild's, as in the reference repository)
      postprocessing/     python (specbuild's)
      tensorrt_llm/       backend "tensorrtllm": the target engine
      tensorrt_llm_draft/ backend "tensorrtllm": the draft engine            (draft_target only)
      tensorrt_llm_baseline/   the target without speculation (opt-in build.baseline_engine)
      launch.sh           scripts/launch_triton_server.py: leader mode with world_size = tp * pp for
                          one engine model, orchestrator mode (--multi-model) for several

Every parameter comes from :class:`TrtllmRepoSpec`; nothing is a template placeholder.

Client interface: ``ensemble`` has the contract's tensors (:mod:`specbuild.interface`, the
``trtllm`` deployment's share), ``num_draft_tokens`` included. The C++ ``tensorrtllm`` backend has no such input, so a static ensemble could not honour
it (Triton refuses an ensemble input no step consumes); ``ensemble`` is therefore a Python BLS
model (:mod:`specbuild.triton_repo.models.trtllm_front`) that routes each request: draft-target
runs the draft -> target loop (``0``: the target alone), lookahead sends (w, n, g) = (1, 1, 0) for
``0``, Medusa / EAGLE send ``0`` to ``tensorrt_llm_baseline`` when the recipe builds one.

``ensemble`` is the one entry point. Upstream's ``tensorrt_llm_bls`` is not shipped: its contract
with the engine models (TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/
tensorrt_llm_bls/1/lib/triton_decoder.py ``_llm_outputs`` requests ``num_input_tokens`` /
``num_output_tokens``; lib/decode.py ``_spec_generate`` sends ``min_tokens`` to the draft; it reads
``STOP_WORDS_IDS`` from preprocessing) is not one these configs and specbuild's preprocessing keep.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from specbuild.interface import ENGINE, ENSEMBLE, LLMAPI, TRTLLM
from specbuild.triton_repo.pbtxt import DynamicBatching, ModelConfig, render
from specbuild.triton_repo.reference_repository import (
    SHELL,
    SHELL_MODULES,
    ReferenceRepoSpec,
    reference_models,
)

if TYPE_CHECKING:
    from specbuild.builder.recipe import LoadedRecipe
    from specbuild.builder.trtllm_plan import TrtllmPlan

Choices = list[list[int]]
DEFAULT_LAUNCH_SCRIPT = Path("/app/scripts/launch_triton_server.py")  # tensorrtllm_backend in the NGC container


@dataclass(frozen=True)
class EngineModel:
    """One ``tensorrtllm`` model: its engine, GPUs and KV-cache share.

    ``gpu_device_ids``: per instance, the GPUs of its ranks, e.g. ``((0, 1),)``; ``None`` lets the
    backend use the visible devices. ``kv_cache_free_gpu_mem_fraction``: of the GPU memory free after
    loading the engine (0-1). ``participant_ids``: MPI ranks, only for orchestrator mode with
    ``--disable-spawn-processes`` (not used here: the backend spawns the ranks), else ``None``.
    """

    name: str
    engine_dir: Path
    decoding_mode: str
    kv_cache_free_gpu_mem_fraction: float = 0.9
    enable_kv_cache_reuse: bool = False
    gpu_device_ids: tuple[tuple[int, ...], ...] | None = None
    participant_ids: tuple[int, ...] | None = None
    medusa_choices: Choices | None = None
    eagle_choices: Choices | None = None
    lookahead: tuple[int, int, int] | None = None  # (W, N, G)
    speculative_decoding_fast_logits: bool = False


@dataclass(frozen=True)
class TrtllmRepoSpec:
    """What the repository needs: engines, limits (tokens, requests) and serving choices."""

    method: str
    target: EngineModel
    tokenizer_dir: Path
    end_id: int
    pad_id: int
    max_batch_size: int
    world_size: int = 1
    draft: EngineModel | None = None
    baseline: EngineModel | None = None
    decoupled: bool = False
    batching_strategy: str = "inflight_fused_batching"
    batch_scheduler_policy: str = "guaranteed_no_evict"
    exclude_input_in_output: bool = True
    max_queue_delay_microseconds: int = 0
    max_draft_len: int = 0  # the target engine's draft budget (tokens per step)
    front_parameters: Mapping[str, str] = field(default_factory=dict)  # the method's, e.g. ngram's prompt lookup
    end_ids: tuple[int, ...] = ()  # every end id the checkpoint declares, end_id first (the front stops on each)


def choices_string(choices: Choices) -> str:
    """TensorRT-LLM backend format for medusa_choices / eagle_choices.

    Example: ``[[0], [0, 0], [1]]`` -> ``"{0}, {0, 0}, {1}"``.
    """
    return ", ".join("{" + ", ".join(str(i) for i in node) + "}" for node in choices)


def _b(flag: bool) -> str:
    return "true" if flag else "false"


# The tensors of the ``tensorrtllm`` models and of the fronts: the ``trtllm`` and ``llmapi``
# deployments' share of the contract (specbuild.interface; upstream's tensorrt_llm/config.pbtxt for
# the engine models, which the tests compare with a copy of it).
ENGINE_INTERFACE = ENGINE.served_by(TRTLLM)
FRONT_INTERFACE = ENSEMBLE.served_by(TRTLLM)
LLMAPI_INTERFACE = ENSEMBLE.served_by(LLMAPI)


def engine_parameters(model: EngineModel, spec: TrtllmRepoSpec) -> dict[str, str]:
    """The ``tensorrtllm`` backend's parameters (keys as in its config.pbtxt template).

    ``tokenizer_dir``, ``xgrammar_tokenizer_info_path`` and ``guided_decoding_backend`` are read
    without a default (``ModelInstanceState::getGuidedDecodingConfigFromParams``; an absent key
    fails the model load with "Cannot find parameter with name: ..."), so they are always emitted;
    the two guided-decoding keys empty, which the backend takes as guided decoding off. The logits
    type is not a parameter: the backend takes it from the ``data_type`` of the
    ``generation_logits`` / ``context_logits`` outputs (``ModelState::LoadParameters``).
    """
    params = {
        "gpt_model_type": spec.batching_strategy,
        "gpt_model_path": str(model.engine_dir),
        "max_beam_width": "1",
        "batch_scheduler_policy": spec.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": f"{model.kv_cache_free_gpu_mem_fraction:g}",
        "enable_kv_cache_reuse": _b(model.enable_kv_cache_reuse),
        "exclude_input_in_output": _b(spec.exclude_input_in_output),
        "enable_chunked_context": "false",
        "decoding_mode": model.decoding_mode,
        "tokenizer_dir": str(spec.tokenizer_dir),
        "guided_decoding_backend": "",
        "xgrammar_tokenizer_info_path": "",
    }
    if model.gpu_device_ids is not None:
        params["gpu_device_ids"] = ";".join(",".join(str(i) for i in ids) for ids in model.gpu_device_ids)
    if model.participant_ids is not None:
        params["participant_ids"] = ",".join(str(i) for i in model.participant_ids)
    if model.medusa_choices is not None:
        params["medusa_choices"] = choices_string(model.medusa_choices)
    if model.eagle_choices is not None:
        params["eagle_choices"] = choices_string(model.eagle_choices)
    if model.lookahead is not None:
        w, n, g = model.lookahead
        params |= {"lookahead_window_size": str(w), "lookahead_ngram_size": str(n), "lookahead_verification_set_size": str(g)}
    if model.speculative_decoding_fast_logits:
        params["speculative_decoding_fast_logits"] = "1"
    return params


def engine_model(model: EngineModel, spec: TrtllmRepoSpec) -> ModelConfig:
    """``tensorrt_llm`` / ``tensorrt_llm_draft``: backend ``tensorrtllm``, one CPU-kind instance
    (the backend places ranks on GPUs itself), dynamic batching up to max_batch_size as upstream."""
    return ModelConfig(
        name=model.name, backend="tensorrtllm", max_batch_size=spec.max_batch_size,
        inputs=ENGINE_INTERFACE.inputs, outputs=ENGINE_INTERFACE.outputs, parameters=engine_parameters(model, spec),
        decoupled=spec.decoupled,
        dynamic_batching=DynamicBatching((spec.max_batch_size,), spec.max_queue_delay_microseconds),
    )


def _step_models(spec: TrtllmRepoSpec) -> list[ModelConfig]:
    """specbuild's preprocessing and postprocessing (as in the reference repository: upstream's dynamic
    batching), with this repository's tokenizer."""
    ref = ReferenceRepoSpec(engine_dir=spec.tokenizer_dir, end_id=spec.end_id, pad_id=spec.pad_id, max_batch_size=spec.max_batch_size)
    return [dataclasses.replace(m, parameters={**m.parameters, "tokenizer_dir": str(spec.tokenizer_dir)})
            for m in reference_models(ref) if m.name in ("preprocessing", "postprocessing")]


def front_model(spec: TrtllmRepoSpec) -> ModelConfig:
    """``ensemble``: specbuild's BLS front (:mod:`specbuild.triton_repo.models.trtllm_front`) with the
    contract's ensemble tensors (the ``trtllm`` deployment's), routing ``num_draft_tokens`` per request.
    One instance per batch slot: each instance serves one request at a time."""
    params = {
        "method": spec.method, "max_draft_len": str(spec.max_draft_len), "tokenizer_dir": str(spec.tokenizer_dir),
        "end_id": str(spec.end_id), "pad_id": str(spec.pad_id), "tensorrt_llm_model_name": spec.target.name,
    }
    if spec.draft is not None:
        params["tensorrt_llm_draft_model_name"] = spec.draft.name
    if spec.baseline is not None:
        params["tensorrt_llm_baseline_model_name"] = spec.baseline.name
    if spec.target.lookahead is not None:
        params["lookahead_wng"] = ",".join(str(v) for v in spec.target.lookahead)
    if spec.decoupled:
        params["decoupled"] = "true"
    if len(spec.end_ids) > 1:
        params["end_ids"] = ",".join(str(i) for i in spec.end_ids)
    params.update(spec.front_parameters)
    return ModelConfig(name=FRONT_INTERFACE.name, backend="python", max_batch_size=spec.max_batch_size,
                       inputs=FRONT_INTERFACE.inputs, outputs=FRONT_INTERFACE.outputs, parameters=params,
                       instance_count=spec.max_batch_size)


def trtllm_models(spec: TrtllmRepoSpec) -> list[ModelConfig]:
    """Every model config of the repository, ensemble first."""
    models = [front_model(spec), *_step_models(spec), engine_model(spec.target, spec)]
    if spec.draft is not None:
        models.append(engine_model(spec.draft, spec))
    if spec.baseline is not None:
        models.append(engine_model(spec.baseline, spec))
    return models


def engine_model_names(spec: TrtllmRepoSpec) -> list[str]:
    return [m.name for m in (spec.target, spec.draft, spec.baseline) if m is not None]


def orchestrator_mode(spec: TrtllmRepoSpec) -> bool:
    """More than one ``tensorrtllm`` model (draft-target, baseline engine): orchestrator mode."""
    return spec.draft is not None or spec.baseline is not None


def launch_command(spec: TrtllmRepoSpec, repo_dir: Path, *, http_port: int, grpc_port: int, metrics_port: int,
                   launch_script: Path = DEFAULT_LAUNCH_SCRIPT) -> list[str]:
    """scripts/launch_triton_server.py for this repository (NVIDIA/TensorRT-LLM triton_backend/scripts, 0a2e2c1f).

    One engine model: leader mode, ``--world_size`` = tp * pp (mpirun starts one tritonserver per
    rank). Several (draft-target, baseline engine): orchestrator mode, ``--multi-model`` with
    ``--world_size 1``; the script asserts world size 1 there, because the backend spawns each
    model's tp * pp ranks itself (on its ``gpu_device_ids``).
    """
    multi = orchestrator_mode(spec)
    argv = ["python3", str(launch_script), "--world_size", "1" if multi else str(spec.world_size), "--model_repo", str(repo_dir),
            "--tensorrt_llm_model_name", ",".join(engine_model_names(spec)),
            "--http_port", str(http_port), "--grpc_port", str(grpc_port), "--metrics_port", str(metrics_port)]
    if multi:
        argv.append("--multi-model")
    return argv


def checkpoint_end_ids(hf_dir: Path) -> tuple[int, ...]:
    """Every end id a Hugging Face checkpoint declares: ``eos_token_id`` (an int or a list) from
    generation_config.json, else config.json; () when neither names one.

    Example: Llama-3.1-8B-Instruct -> ``(128001, 128008, 128009)``.
    """
    import json

    for name in ("generation_config.json", "config.json"):
        path = hf_dir / name
        eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
        if eos is not None:
            return tuple(int(i) for i in (eos if isinstance(eos, list) else [eos]))
    return ()


# --- the container -------------------------------------------------------------------------------
# Which NGC image carries which TensorRT-LLM: triton-inference-server/tensorrtllm_backend's release
# branches pin it in dockerfile/Dockerfile.triton.trt_llm_backend (TENSORRTLLM_VER): r26.01-r26.02
# 1.1.0, r26.03 1.2.0rc8, r26.04-r26.07 1.2.1, and main (0b9d7d5, 2026-07-14) still 1.2.1. That
# Dockerfile installs tensorrt_llm into the venv /opt/venv-tritonserver it puts on PATH and copies
# TensorRT-LLM's examples/ and triton_backend/scripts to /app. TensorRT-LLM's own release image
# (nvcr.io/nvidia/tensorrt-llm/release:<version>) has trtllm-serve and no tritonserver.
VERSION_COMMAND = "python3 -c \"import importlib.metadata as m; print(m.version('tensorrt_llm'))\""
TRITON_IMAGES = {"1.2.1": ("26.04", "26.07"), "1.1.0": ("26.01", "26.02")}  # TensorRT-LLM -> first, last tritonserver tag
CONTAINER_HOST = "0.0.0.0"  # inside the container: the only address `docker run -p` forwards to
TRITON_DEFAULT_PORTS = {"http_port": 8000, "grpc_port": 8001, "metrics_port": 8002}


@dataclass(frozen=True)
class ContainerImage:
    """The image to run a plan in: ``image`` (``None``: no NGC image carries that TensorRT-LLM with
    tritonserver), ``serve_image`` for the trtllm-serve route, and why."""

    image: str | None
    serve_image: str | None
    why: str

    def lines(self) -> list[str]:
        """For the plan and ``launch.sh``'s header."""
        out = [f"container: {self.image}" if self.image else "container: no NGC Triton image carries this TensorRT-LLM"]
        if self.serve_image:
            out.append(f"trtllm-serve route: {self.serve_image} (trtllm-serve, no tritonserver)")
        return out + [f"({self.why}; check inside: {VERSION_COMMAND})"]


def container_image(path: str, version: str | None) -> ContainerImage:
    """The NGC image for a plan on ``path`` (``tensorrt`` / ``pytorch``) with TensorRT-LLM ``version``
    (``None``: not pinned; ``"1.2"``: the engine path's default line).

    Example: ``("pytorch", "1.3.0rc2")`` -> no Triton image; trtllm-serve in
    ``nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc2``.
    """
    release = f"nvcr.io/nvidia/tensorrt-llm/release:{version}" if version and version.count(".") == 2 else None
    key = "1.2.1" if version in (None, "1.2", "1.2.1") else version
    tags = TRITON_IMAGES.get(key)
    if tags is not None:
        first, last = tags
        image = f"nvcr.io/nvidia/tritonserver:{first}-trtllm-python-py3"
        why = f"tensorrtllm_backend r{first}-r{last} pin TensorRT-LLM {key} (tritonserver:{first} to {last}-trtllm-python-py3)"
        return ContainerImage(image, release if path == "pytorch" else None, why)
    why = (f"no tensorrtllm_backend branch pins TensorRT-LLM {version} (r26.04-r26.07 and main pin 1.2.1), so the "
           "trtllm-serve route is the simpler one for this version")
    return ContainerImage(None, release, why)


def container_address(serve) -> str:
    """The address the container's server binds: ``serve.host`` when the recipe sets it, else
    0.0.0.0, the only one `docker run -p` reaches inside the container (the host side stays what
    ``-p`` publishes, e.g. ``-p 127.0.0.1:8000:8000``)."""
    return serve.host if "host" in serve.model_fields_set else CONTAINER_HOST


def container_ports(serve) -> dict[str, int]:
    """``serve``'s ports for the container: a free-port 0 becomes Triton's default (8000, 8001,
    8002), the ports `docker run -p` publishes."""
    return {name: getattr(serve, name) or default for name, default in TRITON_DEFAULT_PORTS.items()}


def launch_script_text(argv: list[str], header: list[str] = ()) -> str:
    """``launch.sh``: ``header`` as comments (the image, the bind address), then the launch command."""
    lines = ["#!/usr/bin/env bash", "# Generated by specbuild: run inside the TensorRT-LLM Triton container.",
             *(f"# {line}" for line in header), "set -euo pipefail"]
    lines.append(shlex.join(argv))
    return "\n".join(lines) + "\n"


def launch_header(path: str, version: str | None, host: str) -> list[str]:
    """``launch.sh``'s comments: the image and how the address is reached from outside."""
    reach = (f"binds {host} inside the container: reachable through the ports `docker run -p` publishes"
             if host == CONTAINER_HOST else f"binds {host} (serve.host)")
    return [*container_image(path, version).lines(), reach]


def multi_node_lines(plan: TrtllmPlan, repo_dir: Path) -> list[str]:
    """The launches for a plan whose ranks span several nodes ([] for one node), as upstream documents them:

    - trtllm-serve: Slurm ``srun --mpi=pmix`` with ``trtllm-llmapi-launch`` (NVIDIA/TensorRT-LLM
      examples/llm-api/llm_mgmn_trtllm_serve.sh: one MPI rank per GPU, world size = tp * pp), or
      ``mpirun`` with a host list;
    - engine-path Triton (leader mode): one tritonserver per rank under ``srun --mpi=pmix`` with a
      per-rank Python-backend shared-memory prefix (tensorrtllm_backend README, "Launch Triton server
      within Slurm based clusters");
    - PyTorch-path Triton: tritonserver under ``srun --mpi=pmix ... trtllm-llmapi-launch`` (rank 0
      serves, the other ranks run the LLM's workers), as tensorrtllm_backend docs/llmapi.md ("Start the
      server on a multi-node configuration") launches its LLM-API repository.
    """
    p = plan.parallel
    if p.nodes == 1:
        return []
    srun = f"srun --nodes {p.nodes} --ntasks-per-node {p.ranks_per_node} --mpi=pmix"
    hosts = ",".join(f"NODE{i}:{p.ranks_per_node}" for i in range(1, p.nodes + 1))
    out = [f"multi-node: {p.world_size} ranks (tp {p.tp_size} x pp {p.pp_size}) on {p.nodes} nodes of {p.gpus_per_node} GPUs; "
           "the same image and output directory on every node (a shared file system)"]
    repo = shlex.quote(str(repo_dir))
    if plan.backend == "pytorch":
        serve = shlex.join(plan.serve_argv)
        out += [f"  trtllm-serve, Slurm: $ {srun} trtllm-llmapi-launch {serve}",
                f"  trtllm-serve, mpirun: $ mpirun -np {p.world_size} -H {hosts} trtllm-llmapi-launch {serve}",
                f"  Triton (alternative): $ {srun} trtllm-llmapi-launch /opt/tritonserver/bin/tritonserver --model-repository {repo} "
                "(rank 0 serves; the other ranks run the LLM's workers)"]
    else:
        out += [f"  Triton leader mode, Slurm: $ {srun} tritonserver --model-repository={repo} --disable-auto-complete-config "
                "'--backend-config=python,shm-region-prefix-name=prefix${SLURM_PROCID}_'",
                f"  or, where srun sets up MPI: $ {srun} python3 /app/scripts/launch_triton_server.py --world_size {p.world_size} "
                f"--model_repo {repo} --oversubscribe"]
    return out


def triton_launch_argv(loaded: LoadedRecipe, plan: TrtllmPlan, repo_dir: Path) -> list[str]:
    """The command ``launch.sh`` runs to serve the plan's repository with Triton (in the container)."""
    s = loaded.recipe.serve
    ports = container_ports(s)
    repo_dir = Path(os.path.abspath(repo_dir))
    if plan.backend == "pytorch":
        return llmapi_launch_command(repo_dir, host=container_address(s), **ports)
    return launch_command(repo_spec_for(loaded, plan, end_id=0, pad_id=0), repo_dir, **ports)


def repository_lines(loaded: LoadedRecipe, plan: TrtllmPlan, repo_dir: Path) -> list[str]:
    """What the plan's Triton repository will hold and the command that serves it (dry run).

    Engine path: every model with its backend and, for ``tensorrtllm`` models, every parameter
    (end/pad ids are read from the target checkpoint at run time, so they are not shown).
    """
    repo_dir = Path(os.path.abspath(repo_dir))
    argv = triton_launch_argv(loaded, plan, repo_dir)
    if plan.backend == "pytorch":
        model = llmapi_model(loaded, plan)
        return [f"repository {repo_dir} (specbuild's ensemble over tensorrt_llm.LLM: output_ids and acceptance counts)",
                f"  file {repo_dir / 'ensemble/config.pbtxt'} (backend python: {LLMAPI_MODULE})",
                *(f"      {key} = {value}" for key, value in model.parameters.items()),
                f"  file {repo_dir / 'ensemble/1/model.yaml'} (= model.yaml above)",
                f"  file {repo_dir / 'launch.sh'}", f"launch with Triton (the alternative to trtllm-serve above): $ {shlex.join(argv)}",
                *multi_node_lines(plan, repo_dir)]
    spec = repo_spec_for(loaded, plan, end_id=0, pad_id=0)
    out = [f"repository {repo_dir} (TensorRT-LLM inflight_batcher_llm; end/pad ids from {plan.tokenizer_dir} at run time)"]
    for model in trtllm_models(spec):
        what = model.platform or f"backend {model.backend}"
        if model.name == "ensemble" and not model.platform:
            what += ": a BLS router that keeps num_draft_tokens, not upstream's platform: ensemble"
        if model.steps:
            what += ": " + " -> ".join(step.model_name for step in model.steps)
        out.append(f"  file {repo_dir / model.name / 'config.pbtxt'} ({what})")
        if model.backend == "tensorrtllm" or model.name == "ensemble":
            out += [f"      {key} = {value}" for key, value in model.parameters.items() if key not in ("end_id", "pad_id")]
    out += [f"  file {repo_dir / 'launch.sh'}", f"launch: $ {shlex.join(argv)}", *multi_node_lines(plan, repo_dir)]
    return out


def repository_files(loaded: LoadedRecipe, plan: TrtllmPlan, repo_dir: Path) -> list[tuple[Path, str, str]]:
    """``(path, text, note)`` of every file the run writes into the plan's Triton repository (dry
    run): each model's config.pbtxt and ``launch.sh``. Engine path: ``end_id`` / ``pad_id`` are read
    from the target's tokenizer at run time, so the texts here carry 0 there (the note says so)."""
    repo_dir = Path(os.path.abspath(repo_dir))
    s = loaded.recipe.serve
    argv = triton_launch_argv(loaded, plan, repo_dir)
    if plan.backend == "pytorch":
        model = llmapi_model(loaded, plan)
        launch = launch_script_text(argv, launch_header("pytorch", plan.version, container_address(s)))
        return [(repo_dir / model.name / "config.pbtxt", render(model), ""), (repo_dir / "launch.sh", launch, "")]
    ids = f"end_id and pad_id are read from {plan.tokenizer_dir} at run time (0 here)"
    files = [(repo_dir / m.name / "config.pbtxt", render(m), ids if "end_id" in m.parameters else "")
             for m in trtllm_models(repo_spec_for(loaded, plan, end_id=0, pad_id=0))]
    return files + [(repo_dir / "launch.sh", launch_script_text(argv, launch_header("tensorrt", plan.version, CONTAINER_HOST)), "")]


def launch_lines(repo_dir: Path) -> list[str] | None:
    """The commands of a TensorRT-LLM repository's ``launch.sh`` (``None``: not such a repository)."""
    launch = repo_dir / "launch.sh"
    if not launch.is_file():
        return None
    return [line for line in launch.read_text().splitlines() if line and not line.startswith(("#", "set "))]


FRONT_AND_SHELL_MODULES = {"ensemble": "specbuild.triton_repo.models.trtllm_front", "preprocessing": SHELL_MODULES["preprocessing"],
                           "postprocessing": SHELL_MODULES["postprocessing"]}


def write_trtllm_repository(spec: TrtllmRepoSpec, repo_dir: Path, *, launch_argv: list[str], header: list[str] = ()) -> Path:
    """Write every model's config.pbtxt (+ specbuild shells) and ``launch.sh`` (running
    ``launch_argv``, which names the repository's final directory) under ``repo_dir``."""
    for model in trtllm_models(spec):
        version_dir = repo_dir / model.name / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        (repo_dir / model.name / "config.pbtxt").write_text(render(model))
        if model.name in FRONT_AND_SHELL_MODULES:
            (version_dir / "model.py").write_text(SHELL.format(version="trtllm", module=FRONT_AND_SHELL_MODULES[model.name]))
    launch = repo_dir / "launch.sh"
    launch.write_text(launch_script_text(launch_argv, header))
    launch.chmod(0o755)
    return repo_dir


def repo_spec_for(loaded: LoadedRecipe, plan: TrtllmPlan, *, end_id: int, pad_id: int, end_ids: tuple[int, ...] = ()) -> TrtllmRepoSpec:
    """The repository spec for an engine-path plan.

    ``serve.gpu_device_ids`` and ``serve.kv_cache_free_gpu_mem_fraction`` are read with defaults
    until the schema has them. Models sharing GPUs (draft, baseline) get a fifth of the target's
    KV-cache fraction; draft-target turns KV-cache reuse on for both engines (required).
    Several engine models run in orchestrator mode, where the backend spawns each model's ranks on
    its ``gpu_device_ids`` (default: the first tp * pp visible GPUs), so no ``participant_ids``.
    """
    r = loaded.recipe
    spec = r.speculation
    fraction = getattr(r.serve, "kv_cache_free_gpu_mem_fraction", 0.9)
    gpus = getattr(r.serve, "gpu_device_ids", None)
    gpu_ids = tuple(tuple(g) for g in gpus) if gpus else None
    world = plan.parallel.world_size
    trtllm = spec.definition.trtllm
    target = EngineModel(
        name="tensorrt_llm", engine_dir=plan.engines.target, decoding_mode=trtllm.decoding_mode,
        # the front's draft loop resends the whole sequence each step: KV reuse keeps that cheap
        kv_cache_free_gpu_mem_fraction=fraction, enable_kv_cache_reuse=trtllm.external_drafts,
        gpu_device_ids=gpu_ids, **trtllm.engine_model(spec),  # medusa_choices, eagle_choices, lookahead (W, N, G)
    )
    extra = {}
    if plan.engines.draft is not None:
        extra["draft"] = EngineModel(
            name="tensorrt_llm_draft", engine_dir=plan.engines.draft, decoding_mode="top_k_top_p",
            kv_cache_free_gpu_mem_fraction=round(fraction / 5, 4), enable_kv_cache_reuse=True, gpu_device_ids=gpu_ids,
        )
    if plan.engines.baseline is not None:
        extra["baseline"] = EngineModel(
            name="tensorrt_llm_baseline", engine_dir=plan.engines.baseline, decoding_mode="top_k_top_p",
            kv_cache_free_gpu_mem_fraction=round(fraction / 5, 4), gpu_device_ids=gpu_ids,
        )
    return TrtllmRepoSpec(
        method=spec.method, target=target, tokenizer_dir=plan.tokenizer_dir, end_id=end_id, pad_id=pad_id,
        max_batch_size=r.build.max_batch_size, world_size=world, decoupled=getattr(r.serve, "decoupled", False),
        max_draft_len=spec.max_draft_len, front_parameters=trtllm.front_parameters(spec), end_ids=end_ids, **extra,
    )


LLMAPI_MODULE = "specbuild.triton_repo.models.llmapi_front"
TRITONSERVER = "tritonserver"  # on PATH in the tritonserver:<yy.mm>-trtllm-python-py3 image (/opt/tritonserver/bin)


def llmapi_model(loaded: LoadedRecipe, plan: TrtllmPlan, end_ids: tuple[int, ...] = ()) -> ModelConfig:
    """``ensemble`` for the PyTorch path: a Python model over ``tensorrt_llm.LLM`` with the contract's
    ensemble tensors (the ``llmapi`` deployment's: no lookahead inputs, no such LLM-API path), one
    instance; Triton's dynamic batching hands it the queued requests together and it passes them to
    ``LLM.generate`` as one list."""
    r = loaded.recipe
    max_draft_len = r.speculation.max_draft_len
    return ModelConfig(
        name=LLMAPI_INTERFACE.name, backend="python", max_batch_size=r.build.max_batch_size,
        inputs=LLMAPI_INTERFACE.inputs, outputs=LLMAPI_INTERFACE.outputs,
        parameters={"max_draft_len": str(max_draft_len),
                    "baseline": _b(bool(getattr(r.build, "baseline_engine", False)) and r.speculation.definition.speculates),
                    **({"end_ids": ",".join(str(i) for i in end_ids)} if end_ids else {})},
        dynamic_batching=DynamicBatching(),
    )


def llmapi_launch_command(repo_dir: Path, *, host: str, http_port: int, grpc_port: int, metrics_port: int) -> list[str]:
    """``tritonserver`` on the PyTorch-path repository: one process; the LLM API spawns its own
    tp * pp workers from model.yaml."""
    return [TRITONSERVER, "--model-repository", str(repo_dir), "--http-address", host, "--grpc-address", host,
            "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]


def write_llmapi_repository(loaded: LoadedRecipe, plan: TrtllmPlan, repo_dir: Path, *, final_dir: Path | None = None,
                            end_ids: tuple[int, ...] = ()) -> Path:
    """The PyTorch-path repository: ``ensemble`` (config.pbtxt, a shell model.py importing
    :mod:`specbuild.triton_repo.models.llmapi_front`, and the plan's ``model.yaml``) and ``launch.sh``.

    ``final_dir``: where the repository will live when ``repo_dir`` is a staging directory.
    ``end_ids``: every end id the target declares (:func:`checkpoint_end_ids`), sent as ``end_id``
    plus ``stop_token_ids`` when a request names none.
    """
    s = loaded.recipe.serve
    model = llmapi_model(loaded, plan, end_ids)
    version_dir = repo_dir / model.name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    (repo_dir / model.name / "config.pbtxt").write_text(render(model))
    (version_dir / "model.py").write_text(SHELL.format(version="trtllm", module=LLMAPI_MODULE))
    (version_dir / "model.yaml").write_text(next(f for f in plan.files if f.path.name == "model.yaml").text)
    host = container_address(s)
    argv = llmapi_launch_command(final_dir or repo_dir, host=host, **container_ports(s))
    (repo_dir / "launch.sh").write_text(launch_script_text(argv, launch_header("pytorch", plan.version, host)))
    (repo_dir / "launch.sh").chmod(0o755)
    return repo_dir
