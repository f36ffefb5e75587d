"""The main job: recipe -> engine -> Triton repository -> server -> verification -> shutdown.

The recipe checks every command shares live here (:func:`check_recipe`, :func:`check_runnable`);
building and serving are :func:`specbuild.deploy.deploy` (which imports this module, never the other
way), and :func:`specbuild.main_job.run_recipe` times the stages, verifies the running deployment and
returns a typed :class:`specbuild.main_job.RunSummary`. Everything a run leaves
behind lives under one output directory::

    <output_dir>/engine/           engine directory (config.json + target/ + tokenizer/)
    <output_dir>/triton_repo/      Triton model repository
    <output_dir>/logs/tritonserver.log
    <output_dir>/report.json       verification report, with the engine's kernels and the greedy equality
                                   they give ("kernels": bitwise or near-ties, from engine/config.json)
                                   and its provenance (recipe, target, engine fingerprint, server, date)
    <output_dir>/report.stale.json the previous report, moved aside when the engine is rebuilt
                                   (``specbuild build``) or verified again (``specbuild recipe``)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specbuild.builder.recipe import LoadedRecipe, RecipeError

if TYPE_CHECKING:
    from specbuild.builder.reference import ReferenceInputs


@dataclass(frozen=True)
class RunPaths:
    """Where a run writes; see the module docstring."""

    output_dir: Path

    @property
    def engine_dir(self) -> Path:
        return self.output_dir / "engine"

    @property
    def repo_dir(self) -> Path:
        return self.output_dir / "triton_repo"

    @property
    def log_file(self) -> Path:
        return self.output_dir / "logs" / "tritonserver.log"

    @property
    def report(self) -> Path:
        return self.output_dir / "report.json"


def default_output_dir(loaded: LoadedRecipe) -> Path:
    """``./specbuild-out/<recipe name>``."""
    return Path("specbuild-out") / loaded.recipe.name


@dataclass(frozen=True)
class CheckedInputs:
    """What :func:`check_inputs` found: the verification prompts and, for the reference backend, the
    build's inputs located and checked (:func:`~specbuild.builder.reference.build_reference_engine` takes them)."""

    prompts: list
    reference: ReferenceInputs | None = None


def check_inputs(loaded: LoadedRecipe) -> CheckedInputs:
    """A reference-backend recipe's inputs, in milliseconds: a method and settings the reference engine
    runs (not ``posterior_threshold``, ReDrafter or MTP), for ``device: cuda`` a GPU on this machine, for
    ``build.kernels: rowgemm`` a C compiler,
    the checkpoint and the method's weights (a draft sharing the target's vocabulary, Medusa and EAGLE
    heads its hidden and vocabulary sizes, an EAGLE-3 head finding the layers it fuses; a packaged GGUF's
    sizes are checked after its conversion; weights the train stage writes, after it), and the prompts.

    Raises:
        RecipeError: naming the recipe line of the field at fault.
    """
    from specbuild.builder.reference import check_kernels, check_reference_inputs, check_reference_speculation
    from specbuild.builder.train_stage import reuses_draft
    from specbuild.prompts import PromptSourceError, load_prompts

    check_reference_speculation(loaded)
    _check_device(loaded)
    check_kernels(loaded)
    untrained = draft_from_train_stage(loaded) and not reuses_draft(loaded)  # written by the train stage, checked after it
    reference = check_reference_inputs(loaded, trained_later=untrained)
    try:
        prompts = load_prompts(loaded.recipe.verify.prompts, base_dir=loaded.path.parent)
    except PromptSourceError as exc:
        raise loaded.error(("verify", "prompts"), str(exc)) from None
    _check_request_log(loaded)
    return CheckedInputs(prompts, reference)


def _check_request_log(loaded: LoadedRecipe) -> None:
    """``serve.request_log`` names a ``.jsonl`` file the deployment may append to: not a directory, and
    not an existing file of something else (a checkpoint's config.json would get prompts appended).

    Raises:
        RecipeError: at ``serve.request_log``.
    """
    value = loaded.recipe.serve.request_log
    if value is None:
        return
    path = loaded.resolve_path(value)
    fix = "name a new .jsonl file (or an earlier request log)"
    if path.suffix != ".jsonl":
        raise loaded.error(("serve", "request_log"), f"{path} is not a .jsonl file: train-draft --from-log reads the log as "
                           f"JSON lines; {fix}")
    if path.is_dir():
        raise loaded.error(("serve", "request_log"), f"{path} is a directory; {fix}")
    if path.is_file() and path.stat().st_size:
        try:
            with path.open(encoding="utf-8") as f:
                first = json.loads(f.readline())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            first = None
        if not (isinstance(first, dict) and isinstance(first.get("prompt"), str)):
            raise loaded.error(("serve", "request_log"), f'{path} holds something other than a request log (line 1 is not '
                               f'{{"prompt": ...}}), and the deployment would append prompts to it; {fix}')


def check_recipe(loaded: LoadedRecipe) -> None:
    """Everything ``plan``, ``build``, ``recipe`` and ``train-draft`` check before any work, the same
    for all four, in well under a second and without importing torch: the reference backend's inputs
    (:func:`check_inputs`), or the TensorRT-LLM plan for the installed version.

    Raises:
        RecipeError: naming the recipe line of the field at fault and the fix.
    """
    if loaded.recipe.build.backend == "reference":
        check_inputs(loaded)
        return
    from specbuild.builder.trtllm_plan import plan_for
    from specbuild.builder.trtllm_version import installed_version

    plan_for(loaded, default_output_dir(loaded), version=installed_version())


def cuda_device_present() -> bool:
    """Whether this machine may have an NVIDIA GPU, from the file system only (importing torch to ask
    takes seconds): a ``/dev/nvidia0``... device, ``/dev/dxg`` (WSL), a GPU under
    ``/proc/driver/nvidia/gpus``, or ``nvidia-smi`` on PATH. ``CUDA_VISIBLE_DEVICES`` set to empty or
    ``-1`` hides them. Errs towards True: a false "no GPU" would refuse a recipe that runs."""
    import os
    import shutil

    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return (
        any(Path("/dev").glob("nvidia[0-9]*"))
        or Path("/dev/dxg").exists()
        or (gpus.is_dir() and any(gpus.iterdir()))
        or shutil.which("nvidia-smi") is not None
    )


def _check_device(loaded: LoadedRecipe) -> None:
    if loaded.recipe.build.device == "cuda" and not cuda_device_present():
        raise loaded.error(
            ("build", "device"),
            "cuda, but this machine shows no NVIDIA GPU (no /dev/nvidia* device, or CUDA_VISIBLE_DEVICES hides them); "
            "set build.device: cpu, or run where a GPU is",
        )


def draft_from_train_stage(loaded: LoadedRecipe) -> bool:
    """True when the recipe's ``train:`` section makes its draft (EAGLE/Medusa heads, draft model)."""
    return loaded.recipe.train is not None


def check_runnable(loaded: LoadedRecipe) -> CheckedInputs:
    """Everything that can fail before long work: backend and extras installed, checkpoint and
    prompts present, and for ``build.kernels: rowgemm`` the engine's kernels compiled. Returns what :func:`check_inputs` found (no prompts for TensorRT-LLM recipes).

    Raises:
        RecipeError: naming the recipe line and what to install or change.
    """
    if loaded.recipe.build.backend != "reference":
        from specbuild.builder.trtllm_plan import plan_for, require_installed
        from specbuild.builder.trtllm_version import installed_version

        version = installed_version()
        plan_for(loaded, default_output_dir(loaded), version=version)  # validates method vs path and version
        require_installed(loaded, version)
        return CheckedInputs([])  # the TensorRT-LLM path builds and writes the repository; verification runs after launch.sh
    checked = check_inputs(loaded)  # the plan's checks first: a bad recipe is reported before a missing extra
    missing = [
        extra
        for extra, module in (("engine", "torch"), ("engine", "transformers"), ("client", "tritonclient"), ("server", "pytriton"))
        if importlib.util.find_spec(module) is None
    ]
    if missing:
        extras = ",".join(sorted(set(missing)))
        message = f"missing dependencies for this recipe; install them with: pip install 'specbuild[{extras}]'"
        if "server" in missing:
            from specbuild.triton_repo.triton_install import platform_problem

            problem = platform_problem() if shutil.which("tritonserver") is None else None
            message += f" (but {problem})" if problem else ""
        raise RecipeError(message)
    from specbuild.builder.reference import check_kernels

    check_kernels(loaded, compile=True)  # build.kernels: rowgemm: compiled now, not found missing at the serve
    return checked


SERVE_PORTS = ("http_port", "grpc_port", "metrics_port")


def with_serve_ports(loaded: LoadedRecipe, **ports: int | None) -> LoadedRecipe:
    """``loaded`` with ``serve.http_port`` / ``grpc_port`` / ``metrics_port`` replaced where ``ports``
    gives one (``specbuild recipe --http-port ...``; None: the recipe's; 0: a free port at start).

    Raises:
        RecipeError: two of the resulting ports are the same (0 excepted).
    """
    update = {name: port for name, port in ports.items() if port is not None}
    if not update:
        return loaded
    serve = loaded.recipe.serve.model_dump()
    serve.update(update)
    taken: dict[int, str] = {}
    for name in SERVE_PORTS:
        if serve[name] and serve[name] in taken:
            raise RecipeError(
                f"--{name.replace('_', '-')} {serve[name]} is also the {taken[serve[name]].replace('_', ' ')}; "
                "http, grpc and metrics each need their own port (0 picks a free one)"
            )
        taken[serve[name]] = name
    new = type(loaded.recipe.serve).model_validate(serve)
    overrides = {**loaded.overrides, **{("serve", name): f"--{name.replace('_', '-')} {port}" for name, port in update.items()}}
    return dataclasses.replace(loaded, recipe=loaded.recipe.model_copy(update={"serve": new}), overrides=overrides)


def check_ports(loaded: LoadedRecipe) -> None:
    """The recipe's fixed serve ports (not 0) are free on ``serve.host`` now, checked in
    milliseconds before any build (tritonserver itself would find out after loading the models).

    Raises:
        RecipeError: at the ``serve.<name>_port`` line; names ``specbuild recipe --<name>-port`` and 0.
    """
    from specbuild.triton_repo.tritonserver import port_in_use

    serve = loaded.recipe.serve
    for name in SERVE_PORTS:
        port = getattr(serve, name)
        if port and port_in_use(serve.host, port):
            flag = "--" + name.replace("_", "-")
            raise loaded.error(
                ("serve", name),
                f"port {port} on {serve.host} is already in use (another server running?); give `specbuild recipe` "
                f"{flag} N for another port or {flag} 0 for a free one, or change serve.{name}",
            )


def _ports_text(serve) -> str:
    """``http 8000, grpc 8001, metrics 8002``; a port of 0 reads "a free port" (chosen when the server starts)."""
    return ", ".join(f"{name} {getattr(serve, name + '_port') or 'a free port'}" for name in ("http", "grpc", "metrics"))


def plan_lines(loaded: LoadedRecipe, paths: RunPaths) -> list[str]:
    """The stages a run performs, one human-readable line each (``--dry-run``)."""
    r = loaded.recipe
    spec = r.speculation
    s = r.serve
    if r.build.backend != "reference":
        from specbuild.builder.trtllm_plan import plan_for
        from specbuild.builder.trtllm_version import installed_version

        from specbuild.triton_repo.tensorrtllm import repository_lines

        plan = plan_for(loaded, paths.output_dir, version=installed_version())
        return plan.lines() + repository_lines(loaded, plan, paths.repo_dir) + _draft_check_lines(loaded)
    from specbuild.builder.reference import kernels_plan_line

    train = []
    if r.train is not None:
        from specbuild.builder.train_stage import training_status

        train = [f"train     {spec.method} draft, {training_status(loaded)}"]
    return [
        f"recipe    {loaded.path} ({r.name})",
        f"target    {r.target.checkpoint} ({r.target.dtype})",
        f"method    {spec.method}" + (f", max_draft_len={spec.max_draft_len}" if spec.max_draft_len else "")
        + (f", {spec.definition.weights.field} {spec.weights_path}" if spec.weights_path else ""),
        *_token_map_lines(loaded),
        *train,
        *_draft_check_lines(loaded),
        f"build     {r.build.backend} engine -> {paths.engine_dir} "
        f"(max_batch_size={r.build.max_batch_size}, max_input_len={r.build.max_input_len}, max_seq_len={r.build.max_seq_len})",
        kernels_plan_line(loaded),
        f"repo      ensemble/preprocessing/tensorrt_llm/postprocessing -> {paths.repo_dir}",
        f"serve     tritonserver on {s.host} ({_ports_text(s)}), log {paths.log_file}",
        f"verify    {r.verify.prompts}, max_tokens={r.verify.max_tokens}, {r.verify.protocol}: "
        "speculative vs num_draft_tokens=0, token ids",
        f"report    {paths.report}",
    ]


def _token_map_lines(loaded: LoadedRecipe) -> list[str]:
    """The plan's line on the draft's hot-token map, if the recipe names one."""
    from specbuild.methods.token_map import recipe_token_map

    path = recipe_token_map(loaded)
    if path is None:
        return []
    train = loaded.recipe.train
    if path.is_file():
        how = "the draft scores only its tokens"
    else:
        how = f"written by the train stage: the target's {train.token_map_size} most frequent predictions"
    return [f"drafts    over a token map {path} ({how})"]


def _draft_check_lines(loaded: LoadedRecipe) -> list[str]:
    """The plan's line on ``check-draft`` of the recipe's draft (:func:`~specbuild.builder.check_draft.recipe_check_line`)."""
    from specbuild.builder.check_draft import recipe_check_line

    line = recipe_check_line(loaded)
    return [] if line is None else [line]


def runs_on(loaded: LoadedRecipe) -> str:
    """Where the recipe's engine runs: ``CPU``, or ``GPU`` (CUDA reference engine or TensorRT-LLM)."""
    b = loaded.recipe.build
    return "CPU" if b.backend == "reference" and b.device == "cpu" else "GPU"


def planned_speculative_config(loaded: LoadedRecipe, paths: RunPaths) -> tuple[dict | None, str | None]:
    """``(speculative_config, file)``: exactly the ``speculative_config`` the run writes, and where.

    - reference backend: ``engine_dir/config.json``'s (:func:`specbuild.builder.reference.engine_speculative_config`);
    - TensorRT-LLM PyTorch path: ``extra_llm_api_options.yaml``'s, spelt for the planned TensorRT-LLM
      version (e.g. EAGLE-3: ``decoding_type: Eagle`` and ``speculative_model_dir`` on 1.2.x,
      ``Eagle3`` and ``speculative_model`` from 1.3), taken from the dict the plan writes;
    - TensorRT-LLM engine path: ``(None, None)``: speculation is built into the engine
      (``trtllm-build --speculative_decoding_mode``) and no file holds a ``speculative_config``.

    ``None`` config for plain decoding. Raises ``RecipeError`` as :func:`plan_lines` does.
    """
    r = loaded.recipe
    if r.build.backend == "reference":
        from specbuild.builder.reference import engine_speculative_config

        config = engine_speculative_config(r)
        return config, None if config is None else str(paths.engine_dir / "config.json")
    from specbuild.builder.trtllm_plan import plan_for
    from specbuild.builder.trtllm_version import installed_version

    plan = plan_for(loaded, paths.output_dir, version=installed_version())
    if plan.llm_api_options is None or plan.speculative_config is None:
        return None, None
    return plan.speculative_config, str(plan.files[0].path)


def plan_stages(loaded: LoadedRecipe, paths: RunPaths) -> tuple[list[dict], list[dict]]:
    """``(stages, files)`` of ``plan --json``, as objects a script reads without parsing text.

    TensorRT-LLM recipes: one stage per command of ``build.sh`` (``name``, ``kind``, ``argv`` exactly as
    run, ``command`` (its shell form), ``outputs``, ``log``, ``inputs``), then ``serve`` stages with the
    launch ``argv`` (Triton's ``launch.sh`` and, on the PyTorch path, ``trtllm-serve``: alternatives,
    ``alternative_to`` says which); ``files`` every file the run writes (``path``, ``text``, and a
    ``note`` where the run fills something in): ``build.sh``, the config files, the Triton
    repository's config.pbtxt files and ``launch.sh``.
    Reference backend: the plan's lines as objects (``name``, ``kind``: ``info`` for what the recipe
    names, else the stage the in-process run performs: train, check, build, repo, serve, verify,
    report; ``detail``; ``outputs``) and no files. Raises ``RecipeError`` as :func:`plan_lines` does.
    """
    r = loaded.recipe
    if r.build.backend != "reference":
        from specbuild.builder.trtllm_plan import plan_for
        from specbuild.builder.trtllm_version import installed_version
        from specbuild.triton_repo.tensorrtllm import repository_files, triton_launch_argv

        plan = plan_for(loaded, paths.output_dir, version=installed_version())
        stages = [{"name": s.name, "kind": str(s.kind), "argv": list(s.argv), "command": s.command(),
                   "outputs": [str(p) for p in s.outputs], "log": str(s.log), "inputs": [str(p) for p in s.inputs]}
                  for s in plan.steps]
        triton = {"name": "serve-triton", "kind": "serve", "argv": triton_launch_argv(loaded, plan, paths.repo_dir)}
        triton["command"] = shlex.join(triton["argv"])
        stages.append(triton)
        if plan.serve_argv:
            stages.append({"name": "serve-trtllm-serve", "kind": "serve", "argv": list(plan.serve_argv),
                           "command": shlex.join(plan.serve_argv), "alternative_to": "serve-triton"})
            triton["alternative_to"] = "serve-trtllm-serve"
        files = [{"path": str(plan.output_dir / "build.sh"), "text": plan.build_script()}]
        files += [{"path": str(f.path), "text": f.text} for f in plan.files]
        files += [{"path": str(path), "text": text, **({"note": note} if note else {})}
                  for path, text, note in repository_files(loaded, plan, paths.repo_dir)]
        return stages, files
    outputs = {"build": [paths.engine_dir], "repo": [paths.repo_dir], "serve": [paths.log_file], "report": [paths.report]}
    stages = []
    for line in plan_lines(loaded, paths):
        name, _, detail = line.partition(" ")
        kind = "info" if name in ("recipe", "target", "method", "drafts", "kernels") else name
        stages.append({"name": name, "kind": kind, "detail": detail.strip(), "outputs": [str(p) for p in outputs.get(name, [])]})
    return stages, []


def plan_json(loaded: LoadedRecipe, paths: RunPaths, stages: list[str], warnings: list[str]) -> dict:
    """``specbuild plan --json``: the recipe, where it runs, ``speculative_config`` and
    ``speculative_config_file`` (:func:`planned_speculative_config`: exactly what the run writes
    there for the planned TensorRT-LLM version; both None where nothing is written), training,
    ``stages`` and ``files`` as objects (:func:`plan_stages`), ``lines`` (the text plan, ``stages``
    here) and warnings."""
    from specbuild.builder.train_stage import training_info

    r = loaded.recipe
    speculative_config, speculative_config_file = planned_speculative_config(loaded, paths)
    structured, files = plan_stages(loaded, paths)
    return {
        "recipe": str(loaded.path),
        "name": r.name,
        "description": r.description,
        "method": r.speculation.method,
        "max_draft_len": r.speculation.max_draft_len,
        "backend": r.build.backend,
        "runs_on": runs_on(loaded),
        "output_dir": str(paths.output_dir),
        "speculative_config": speculative_config,
        "speculative_config_file": speculative_config_file,
        "training": training_info(loaded),
        "stages": structured,
        "files": files,
        "lines": stages,
        "warnings": warnings,
    }


def recipe_summaries() -> list[dict]:
    """One row per bundled recipe for ``specbuild recipes``: name, method, backend, where it runs,
    training (None: none needed; else :func:`specbuild.builder.train_stage.training_info`), description; a
    recipe that does not load has ``error`` instead."""
    from specbuild.builder.recipe import bundled_recipes, load_recipe
    from specbuild.builder.train_stage import training_info

    rows = []
    for name, path in sorted(bundled_recipes().items()):
        try:
            loaded = load_recipe(str(path))
        except RecipeError as exc:
            rows.append({"name": name, "error": str(exc)})
            continue
        r = loaded.recipe
        rows.append({
            "name": name, "method": r.speculation.method, "backend": r.build.backend, "runs_on": runs_on(loaded),
            "training": training_info(loaded), "description": r.description,
        })
    return rows


def run_trtllm_build(loaded: LoadedRecipe, paths: RunPaths, *, rebuild: bool = False, status=print, log=print):
    """TensorRT-LLM path: run the plan's steps (resumable, logged under ``logs/``) and write the
    Triton repository with its ``launch.sh``; returns a
    :class:`specbuild.builder.trtllm_run.TrtllmRunResult`.

    Raises:
        RecipeError: TensorRT-LLM is missing or cannot run the recipe (before any work).
        specbuild.builder.trtllm_run.StageError: a step failed; its log file is named.
    """
    from specbuild.builder.trtllm_plan import plan_for, require_installed
    from specbuild.builder.trtllm_run import run_trtllm
    from specbuild.builder.trtllm_version import installed_version

    version = installed_version()
    plan = plan_for(loaded, paths.output_dir, version=version)
    require_installed(loaded, version)
    return run_trtllm(loaded, plan, paths.repo_dir, force=rebuild, status=status, log=log)


def trtllm_next_steps(loaded: LoadedRecipe, result) -> list[str]:
    """How to serve and verify a TensorRT-LLM repository (inside the TensorRT-LLM Triton container)."""
    from specbuild.triton_repo.tensorrtllm import container_address, container_ports

    v = loaded.recipe.verify
    s = loaded.recipe.serve
    ports = container_ports(s)
    host = container_address(s)
    host = "127.0.0.1" if host == "0.0.0.0" else host  # reached through `docker run -p` on this host
    return [
        f"serve:  bash {result.launch_script}   (or: specbuild serve {result.repo_dir})",
        f"verify: specbuild verify --url {host}:{ports['grpc_port'] if v.protocol == 'grpc' else ports['http_port']} --protocol {v.protocol} "
        f"--prompts {v.prompts} --max-tokens {v.max_tokens} --tokenizer {result.plan.tokenizer_dir}",
    ]


STALE_REPORT = "report.stale.json"


def retire_report(paths: RunPaths) -> Path | None:
    """Move ``report.json`` aside to ``report.stale.json`` (replacing an older one) before its engine is
    rebuilt or verified again, so no report describes an engine other than the one beside it; the old
    one stays readable under a name that says so. Returns the new path, or None when there was none."""
    if not paths.report.is_file():
        return None
    stale = paths.report.with_name(STALE_REPORT)
    paths.report.replace(stale)
    return stale
