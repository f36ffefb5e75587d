"""Build and serve a recipe: the one place a recipe becomes a running deployment.

``specbuild recipe`` (:mod:`specbuild.main_job`), ``specbuild bench`` and ``specbuild tune`` all
serve recipes through :func:`deploy`::

    with deploy("smollm2-ngram") as served:
        client = SpecClient(served.grpc_url)
        ...
    # the server is stopped here, also after an error or Ctrl-C

Its stages, each passed to the ``stage`` hook by name (the pipeline times them)::

    validate    check_runnable: backend and extras installed, checkpoints, heads, prompts present
    train       the recipe's ``train:`` section, when it has one (skipped while data and settings
                are unchanged)
    build       the reference engine directory (skipped while its inputs are unchanged)
    repository  the Triton model repository, rendered from the engine directory: ``triton_repo/`` in
                the recipe's ``serve.decoupled`` mode, or, when a caller needs the other mode
                (``bench`` streams, the soak harness), a sibling ``triton_repo_decoupled/`` (or
                ``triton_repo_not_decoupled/``) over the same engine, so ``triton_repo/`` never
                changes mode behind ``specbuild serve``
    serve       tritonserver on the recipe's ports (or free ones), waited on until every model is ready
    shutdown    on leaving the ``with`` block, whatever happened

Everything lands under one output directory (:class:`specbuild.pipeline.RunPaths`). A TensorRT-LLM
recipe is built by :func:`build_recipe` but served inside the TensorRT-LLM Triton container (its
``launch.sh``), so :func:`deploy` refuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specbuild.builder.recipe import LoadedRecipe, RecipeError, load_recipe
from specbuild.pipeline import RunPaths, check_ports, check_runnable, default_output_dir, draft_from_train_stage, run_trtllm_build

if TYPE_CHECKING:
    from specbuild.prompts import Prompt
    from specbuild.triton_repo.tritonserver import TritonServer

Stage = Callable[[str], AbstractContextManager]


class StageFailure(RuntimeError):
    """An unexpected exception in a stage of :func:`build_recipe` (transformers failing to load a
    checkpoint, a full disk), as one line: the stage, the recipe fields whose inputs it was reading
    (file:line and value), the exception's type and first line. The original exception is
    ``__cause__``; ``specbuild --debug`` prints its traceback. Errors the stages already word
    (RecipeError, CheckpointError, TensorRT-LLM's StageError) pass through unchanged.

    Attributes:
        stage: the stage's name (``train``, ``build``, ``repository``).
    """

    def __init__(self, loaded: LoadedRecipe, stage: str, fields: tuple[tuple[str, ...], ...], exc: BaseException) -> None:
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")[:300]
        message = f"the {stage} stage failed: {type(exc).__name__}: {first}"
        if fields:
            reading = "; ".join(_field_text(loaded, loc) for loc in fields)
            message += f" (while reading {reading}). Check the files there (a whole Hugging Face checkpoint folder that transformers loads)"
        super().__init__(message + "; `specbuild --debug COMMAND ...` prints the traceback")
        self.stage = stage


def _field_text(loaded: LoadedRecipe, loc: tuple[str, ...]) -> str:
    """``r.yaml:3: target.checkpoint = ./ckpt``."""
    value: object = loaded.recipe
    for part in loc:
        value = getattr(value, part, None)
    shown = f" = {value}" if isinstance(value, (str, int, float, Path)) else ""
    return f"{loaded.path}:{loaded.line_of(*loc)}: {'.'.join(loc)}{shown}"


def _stage_fields(loaded: LoadedRecipe, stage: str) -> tuple[tuple[str, ...], ...]:
    """The recipe fields whose inputs ``stage`` reads: the target checkpoint and the method's weights."""
    if stage == "train":
        return (("train",), ("target", "checkpoint"))
    if stage != "build":
        return ()
    weights = loaded.recipe.speculation.definition.weights
    extra = ((("speculation", weights.field),) if weights is not None and getattr(loaded.recipe.speculation, weights.field, None)
             else ())
    return (("target", "checkpoint"), *extra)


@contextmanager
def _reported(loaded: LoadedRecipe, stage: str) -> Iterator[None]:
    """Run a stage; an exception nobody worded becomes a :class:`StageFailure`."""
    from specbuild.util.checkpoints import CheckpointError
    from specbuild.prompts import PromptSourceError

    worded: tuple[type[BaseException], ...] = (RecipeError, CheckpointError, PromptSourceError)
    if loaded.recipe.build.backend != "reference":
        from specbuild.builder.trtllm_run import StageError

        worded += (StageError,)
    try:
        yield
    except worded:
        raise
    except Exception as exc:  # noqa: BLE001 - reworded with its stage and field; the traceback stays as __cause__
        raise StageFailure(loaded, stage, _stage_fields(loaded, stage), exc) from exc


def untimed(name: str) -> AbstractContextManager:
    """The default ``stage`` hook: runs the stage, records nothing."""
    return nullcontext()


@dataclass(frozen=True)
class Build:
    """What :func:`build_recipe` made.

    Attributes:
        loaded: the recipe. paths: where everything went.
        prompts: the recipe's ``verify.prompts``, read while validating ([] on TensorRT-LLM).
        engine_rebuilt: False when the cached engine was reused.
        decoupled: the repository streams (one response per decoding step).
        repo_dir: the repository written (:func:`repository_dir`).
        trtllm: TensorRT-LLM recipes: the :class:`specbuild.builder.trtllm_run.TrtllmRunResult`
            (engines, repository, ``launch.sh``); None on the reference backend.
    """

    loaded: LoadedRecipe
    paths: RunPaths
    prompts: list[Prompt]
    engine_rebuilt: bool
    decoupled: bool
    repo_dir: Path
    trtllm: object | None = None


@dataclass(frozen=True)
class ServedRecipe:
    """A recipe's deployment while :func:`deploy` holds it up: its build and the running server."""

    build: Build
    server: TritonServer

    @property
    def loaded(self) -> LoadedRecipe:
        return self.build.loaded

    @property
    def name(self) -> str:
        return self.build.loaded.recipe.name

    @property
    def paths(self) -> RunPaths:
        return self.build.paths

    @property
    def prompts(self) -> list[Prompt]:
        return self.build.prompts

    @property
    def engine_rebuilt(self) -> bool:
        return self.build.engine_rebuilt

    @property
    def decoupled(self) -> bool:
        return self.build.decoupled

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint."""
        return self.server.grpc_url

    @property
    def http_url(self) -> str:
        return self.server.http_url

    @property
    def metrics_url(self) -> str:
        """``host:port`` of Triton's Prometheus ``/metrics``."""
        return self.server.metrics_url

    def url(self, protocol: str) -> str:
        """The endpoint for ``protocol`` (``grpc`` or ``http``)."""
        return self.grpc_url if protocol == "grpc" else self.http_url

    @property
    def tokenizer_dir(self) -> Path:
        """The tokenizer the deployment serves (the engine directory's ``tokenizer/``)."""
        return self.build.paths.engine_dir / "tokenizer"


REPO_DIR_NAMES = ("triton_repo", "triton_repo_decoupled", "triton_repo_not_decoupled")


def repository_dir(paths: RunPaths, *, decoupled: bool, recipe_decoupled: bool) -> Path:
    """Where a repository in mode ``decoupled`` goes: ``paths.repo_dir`` (``triton_repo/``) when that
    is the recipe's mode, else a sibling named for the mode. ``triton_repo/`` is what the docs tell a
    user to ``specbuild serve`` and ``verify`` (plain ``ModelInfer`` refuses a decoupled model), so
    it keeps the recipe's mode whatever ran last; both repositories point at one engine directory."""
    if decoupled == recipe_decoupled:
        return paths.repo_dir
    return paths.output_dir / ("triton_repo_decoupled" if decoupled else "triton_repo_not_decoupled")


def build_recipe(
    loaded: LoadedRecipe, paths: RunPaths, *, rebuild: bool = False, decoupled: bool | None = None, train: bool = True,
    stage: Stage = untimed, log: Callable[[str], None] = print, status: Callable[[str], None] = lambda name: None,
) -> Build:
    """The validate, train, build and repository stages (module docstring); nothing is started.

    Args:
        rebuild: rebuild the engine even if its inputs are unchanged.
        decoupled: write a streaming repository; None = the recipe's ``serve.decoupled``. The other
            mode than the recipe's is written beside ``triton_repo/`` (:func:`repository_dir`).
        train: run the recipe's ``train:`` section first (``specbuild build`` does not).
        stage: ``stage(name)`` returns the context each stage runs in; log: build messages;
            status: TensorRT-LLM's step names as they start.

    Raises:
        RecipeError: the recipe cannot run here (before any long work).
        specbuild.builder.trtllm_run.StageError: a TensorRT-LLM step failed; its log file is named.
        StageFailure: any other exception in the train, build or repository stage, reworded as one
            line naming the stage and the recipe fields it was reading (the original is ``__cause__``).
    """
    serve = loaded.recipe.serve
    decoupled = serve.decoupled if decoupled is None else decoupled
    with stage("validate"):
        checked = check_runnable(loaded)  # the build reuses what it located and checked
    if train and draft_from_train_stage(loaded):
        from specbuild.builder.train_stage import train_draft

        with stage("train"), _reported(loaded, "train"):
            train_draft(loaded, log=log, show_progress=False)
    if loaded.recipe.build.backend != "reference":
        with stage("build"), _reported(loaded, "build"):
            result = run_trtllm_build(loaded, paths, rebuild=rebuild, status=status, log=log)
        return Build(loaded, paths, checked.prompts, bool(result.record.ran), decoupled, result.repo_dir, trtllm=result)
    from specbuild.builder.reference import build_reference_engine
    from specbuild.triton_repo.reference_repository import spec_from_engine_dir, write_reference_repository

    with stage("build"), _reported(loaded, "build"):
        engine = build_reference_engine(loaded, paths.engine_dir, force=rebuild, log=log, inputs=checked.reference)
    repo_dir = repository_dir(paths, decoupled=decoupled, recipe_decoupled=serve.decoupled)
    with stage("repository"), _reported(loaded, "repository"):
        request_log = str(loaded.resolve_path(serve.request_log).resolve()) if serve.request_log else ""
        spec = spec_from_engine_dir(paths.engine_dir, instance_count=serve.instance_count, decoupled=decoupled,
                                    stream_interval=serve.stream_interval, request_log=request_log)
        write_reference_repository(spec, repo_dir)
    if repo_dir != paths.repo_dir:
        mode = "decoupled" if decoupled else "not decoupled"
        log(f"repository: {repo_dir} ({mode}, same engine; {paths.repo_dir} keeps the recipe's "
            f"serve.decoupled: {str(serve.decoupled).lower()})")
    return Build(loaded, paths, checked.prompts, engine.rebuilt, decoupled, repo_dir)


@contextmanager
def serve_build(
    build: Build, *, free_ports: bool = False, log_name: str = "tritonserver.log", stage: Stage = untimed
) -> Iterator[ServedRecipe]:
    """Start tritonserver on ``build``'s repository, wait until it is ready, yield the
    :class:`ServedRecipe`, and stop the server on exit (error and Ctrl-C included).

    Args:
        free_ports: pick free ports instead of the recipe's ``serve`` ports (several at once).
        log_name: the server's log, a file in the output directory's ``logs/``.

    Raises:
        specbuild.triton_repo.tritonserver.ServerNotFoundError: no tritonserver is installed.
        specbuild.triton_repo.tritonserver.ServerStartError: the server exited or was not ready in
            ``serve.startup_timeout_s``; its log's errors are in the message.
    """
    from specbuild.triton_repo.tritonserver import TritonServer

    s = build.loaded.recipe.serve
    ports = (0, 0, 0) if free_ports else (s.http_port, s.grpc_port, s.metrics_port)
    server = TritonServer(
        build.repo_dir,
        host=s.host,
        http_port=ports[0],
        grpc_port=ports[1],
        metrics_port=ports[2],
        log_file=build.paths.output_dir / "logs" / log_name,
        startup_timeout_s=s.startup_timeout_s,
    )
    try:
        with stage("serve"):
            server.start()
        yield ServedRecipe(build, server)
    finally:
        with stage("shutdown"):
            server.stop()


def recipe_output_dir(output_root: Path, name: str) -> Path:
    """Recipe ``name``'s deployment folder under ``output_root``: ``output_root/name``, or
    ``output_root`` itself when it is already that recipe's deployment folder (the
    ``specbuild-repo.json`` of one of its repositories, :data:`REPO_DIR_NAMES`, names the recipe), so
    that ``bench --deploy-dir OUT`` reuses what ``specbuild recipe -o OUT`` built instead of building
    again in ``OUT/name``."""
    import json

    from specbuild.triton_repo.reference_repository import REPO_METADATA

    for repo in REPO_DIR_NAMES:
        try:
            built_for = json.loads((output_root / repo / REPO_METADATA).read_text()).get("recipe")
        except (OSError, ValueError, AttributeError):
            continue
        if built_for == name:
            return output_root
    return output_root / name


@contextmanager
def deploy(
    recipe: str | Path | LoadedRecipe, *, output_dir: Path | None = None, output_root: Path | None = None,
    rebuild: bool = False, decoupled: bool | None = None, free_ports: bool = False, log_name: str = "tritonserver.log",
    stage: Stage = untimed, log: Callable[[str], None] = print,
) -> Iterator[ServedRecipe]:
    """Build ``recipe`` if needed, serve it, and yield the running deployment; the server is stopped
    when the block ends, however it ends (an exception, ``KeyboardInterrupt``).

    Args:
        recipe: a bundled recipe's name, a recipe file, or a loaded recipe.
        output_dir: engine, repository, logs [``<output_root>/<recipe name>``].
        output_root: where recipes' output directories go [``./specbuild-out``]; a recipe's own
            deployment folder is used as it is (:func:`recipe_output_dir`).
        rebuild: rebuild the engine even if its inputs are unchanged.
        decoupled: serve streaming (one response per decoding step); None = the recipe's
            ``serve.decoupled``. The other mode is served from its own repository beside
            ``triton_repo/`` (:func:`repository_dir`), sharing the engine.
        free_ports: free ports instead of the recipe's (several deployments at once).
        log_name: the server's log, a file in ``<output_dir>/logs/``.
        stage: ``stage(name)`` returns the context manager each stage runs in (module docstring);
            log: one-line messages from the build.

    Yields:
        :class:`ServedRecipe`: the recipe, its paths, its verify prompts, the server and its
        ``grpc_url`` / ``http_url`` / ``metrics_url``, the tokenizer directory.

    Raises:
        RecipeError: the recipe does not load or cannot run here, or it is a TensorRT-LLM recipe
            (served in the TensorRT-LLM container; see :func:`build_recipe`); raised before long work.
        specbuild.util.checkpoints.CheckpointError: a checkpoint cannot be fetched or converted.
        specbuild.triton_repo.tritonserver.ServerNotFoundError, specbuild.triton_repo.tritonserver.ServerStartError:
            as :func:`serve_build`.
    """
    loaded = recipe if isinstance(recipe, LoadedRecipe) else load_recipe(str(recipe))
    if loaded.recipe.build.backend != "reference":
        raise RecipeError(
            f"{loaded.path}: build.backend {loaded.recipe.build.backend!r} is served inside the TensorRT-LLM Triton "
            "container; build it with `specbuild build` and run its launch.sh there"
        )
    if not free_ports:
        check_ports(loaded)  # a taken port fails now, not after the build
    if output_dir is None:
        output_dir = recipe_output_dir(Path(output_root), loaded.recipe.name) if output_root is not None else default_output_dir(loaded)
    build = build_recipe(loaded, RunPaths(Path(output_dir)), rebuild=rebuild, decoupled=decoupled, stage=stage, log=log)
    with serve_build(build, free_ports=free_ports, log_name=log_name, stage=stage) as served:
        yield served
