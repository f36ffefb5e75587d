"""Run a TensorRT-LLM plan: each step as a subprocess, logged, resumable, never half-finished.

:func:`run_plan` executes :class:`~specbuild.builder.trtllm_plan.TrtllmPlan` steps in order
(downloads, checkpoint conversion, ``trtllm-build``); :func:`run_trtllm` adds the Triton repository
and ``launch.sh``. Each step:

- writes its stdout/stderr to ``step.log`` (``<output_dir>/logs/<step>.log``);
- conversions and builds run with their output directory redirected to a hidden staging sibling
  (``--output_dir`` in ``argv`` replaced), published by rename only when the command exits 0
  (:mod:`specbuild.util.atomic`): a failed or interrupted step leaves no output directory that
  looks finished. Downloads write in place, so an interrupted one resumes where it stopped; they
  count as finished only once their completion marker (written last) exists;
- records a stamp ``<output_dir>/.stamps/<step>.json`` (written atomically, after the outputs)
  with the command and the fingerprints of its input directories.

A step is skipped when its stamp exists, names the same command and input fingerprints, and all
its outputs exist. A directory's fingerprint is the SHA-256 over its files' relative paths, sizes
and modification times (not contents: reading 140 GB of weights to decide to skip would take
minutes), so editing or replacing any input file re-runs the steps that read it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from specbuild.util.atomic import staging_dir

if TYPE_CHECKING:
    from specbuild.builder.recipe import LoadedRecipe
    from specbuild.builder.trtllm_plan import Step, TrtllmPlan

STAMP_DIR = ".stamps"


class StageError(RuntimeError):
    """A step's command failed; the message names the step, its exit status and its log file."""


@dataclass
class RunRecord:
    """What :func:`run_plan` did: seconds per step run, and the steps skipped as up to date."""

    ran: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def fingerprint(paths: tuple[Path, ...]) -> dict[str, str]:
    """``{path: sha256}`` over each input directory's (relative path, size, mtime_ns) per file;
    a missing path fingerprints as ``"missing"``; a file as its own (size, mtime_ns)."""
    result = {}
    for path in paths:
        if not path.exists():
            result[str(path)] = "missing"
            continue
        digest = hashlib.sha256()
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            st = f.stat()
            digest.update(f"{f.relative_to(path) if f != path else f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        result[str(path)] = digest.hexdigest()
    return result


def stamp_path(plan: TrtllmPlan, step: Step) -> Path:
    return plan.output_dir / STAMP_DIR / f"{step.name}.json"


def _stamp(step: Step) -> dict:
    return {"argv": list(step.argv), "inputs": fingerprint(step.inputs)}


def is_done(plan: TrtllmPlan, step: Step) -> bool:
    """The step's outputs all exist and its stamp matches its command and current inputs."""
    path = stamp_path(plan, step)
    if not path.is_file() or not all(p.exists() for p in step.outputs):
        return False
    try:
        return json.loads(path.read_text()) == _stamp(step)
    except ValueError:
        return False


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_step(plan: TrtllmPlan, step: Step, *, env: dict[str, str] | None = None) -> float:
    """Run one step (see the module docstring); returns its wall time in seconds.

    Raises:
        StageError: the command exited non-zero or could not start; nothing of it is published.
    """
    stamp = stamp_path(plan, step)
    stamp.unlink(missing_ok=True)  # from here on the step is unfinished until the new stamp lands
    step.log.parent.mkdir(parents=True, exist_ok=True)
    final = step.output_dir
    start = time.perf_counter()
    if step.kind == "download":  # in place, resumable; its completion marker is written last
        if step.marker is not None:
            step.marker.unlink(missing_ok=True)
        _run_logged(step, list(step.argv), final, env)
        if step.marker is not None:
            step.marker.touch()
    else:
        shutil.rmtree(final, ignore_errors=True)  # stale outputs must not look finished if this run fails
        with staging_dir(final) as tmp:
            _run_logged(step, [str(tmp) if a == str(final) else a for a in step.argv], tmp, env)
    _write_atomic(stamp, json.dumps(_stamp(step), indent=1) + "\n")
    return time.perf_counter() - start


def _run_logged(step: Step, argv: list[str], out_dir: Path, env: dict[str, str] | None) -> None:
    """Run ``argv`` (``step.argv`` writing to ``out_dir``) with its output in ``step.log``.

    Raises:
        StageError: it could not start, exited non-zero, or left one of the step's outputs unwritten.
    """
    with step.log.open("w") as log:
        log.write(f"$ {step.command()}\n# writing to {out_dir}\n")
        log.flush()
        try:
            code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env).returncode
        except OSError as exc:  # command not found / not executable
            raise StageError(f"step {step.name} could not start: {exc}; see {step.log}") from None
    if code != 0:
        raise StageError(f"step {step.name} failed (exit status {code}); see {step.log}")
    missing = [p.name for p in step.outputs if p != step.marker and not (out_dir / p.relative_to(step.output_dir)).exists()]
    if missing:
        raise StageError(f"step {step.name} exited 0 but did not write {', '.join(missing)}; see {step.log}")


def run_plan(
    plan: TrtllmPlan,
    *,
    force: bool = False,
    status: Callable[[str], None] = print,
    log: Callable[[str], None] = print,
    before: Callable[[Step], None] | None = None,
    env: dict[str, str] | None = None,
) -> RunRecord:
    """Run ``plan``'s steps in order, skipping finished ones (``force``: run all).

    Args:
        status: called with ``"[i/n] step-name"`` as each step starts.
        log: one line per step: skipped (up to date) or done in N s, with its log file.
        before: called with each step before it runs or is skipped (e.g. a vocabulary check
            once the downloads exist); may raise to stop the run.

    Raises:
        StageError: a step failed; later steps are not run.
    """
    record = RunRecord()
    plan.write()  # build.sh and config files: the same plan, runnable by hand
    n = len(plan.steps)
    for i, step in enumerate(plan.steps, 1):
        if before is not None:
            before(step)
        if not force and is_done(plan, step):
            record.skipped.append(step.name)
            log(f"[{i}/{n}] {step.name}: up to date, skipped")
            continue
        status(f"[{i}/{n}] {step.name}")
        seconds = run_step(plan, step, env=env)
        record.ran[step.name] = seconds
        log(f"[{i}/{n}] {step.name}: done in {seconds:.1f} s (log: {step.log})")
    return record


def special_ids(hf_dir: Path) -> tuple[int, int]:
    """(end_id, pad_id) of a Hugging Face checkpoint: ``eos_token_id`` (first if a list) from
    generation_config.json, else config.json; pad = ``pad_token_id`` or end_id.

    Raises:
        ValueError: neither file names an eos_token_id.
    """
    config: dict = {}
    for name in ("config.json", "generation_config.json"):  # generation_config wins
        path = hf_dir / name
        if path.is_file():
            config |= {k: v for k, v in json.loads(path.read_text()).items() if v is not None}
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is None:
        raise ValueError(f"{hf_dir}: no eos_token_id in config.json or generation_config.json")
    pad = config.get("pad_token_id")
    return int(eos), int(pad[0] if isinstance(pad, list) else pad if pad is not None else eos)


def check_vocabulary(loaded: LoadedRecipe, plan: TrtllmPlan) -> None:
    """A draft model shares the target's vocabulary (the method's :attr:`~specbuild.methods.Weights.check_fit`:
    config.json ``vocab_size`` and the token tables, milliseconds).

    Raises:
        RecipeError: they differ (located at the draft's field, e.g. ``speculation.draft_checkpoint``).
    """
    check_fit = loaded.recipe.speculation.definition.weights.check_fit if plan.draft_dir is not None else None
    if check_fit is not None:
        check_fit(loaded, plan.tokenizer_dir, plan.draft_dir)


@dataclass(frozen=True)
class TrtllmRunResult:
    """A finished TensorRT-LLM build: where the repository and launch script are."""

    plan: TrtllmPlan
    record: RunRecord
    repo_dir: Path
    launch_script: Path


def run_trtllm(
    loaded: LoadedRecipe,
    plan: TrtllmPlan,
    repo_dir: Path,
    *,
    force: bool = False,
    status: Callable[[str], None] = print,
    log: Callable[[str], None] = print,
    env: dict[str, str] | None = None,
) -> TrtllmRunResult:
    """Run the plan's steps, then write the Triton repository (atomically) with its ``launch.sh``.

    Raises:
        StageError: a step failed.
        RecipeError: draft and target vocabularies differ (checked once both are downloaded,
            before any conversion).
    """
    from specbuild.triton_repo.tensorrtllm import (
        CONTAINER_HOST,
        checkpoint_end_ids,
        container_ports,
        launch_command,
        launch_header,
        repo_spec_for,
        write_llmapi_repository,
        write_trtllm_repository,
    )

    repo_dir = Path(os.path.abspath(repo_dir))
    checked: list[bool] = []

    weights = loaded.recipe.speculation.definition.weights
    check_files = weights.check_files if weights is not None else None

    def before(step: Step | None) -> None:  # as soon as both checkpoints are on disk
        if check_files is not None and step is not None and step.name == "convert-target" and len(step.inputs) > 1:
            check_files(loaded, step.inputs[1])  # downloaded weights too (ReDrafter: never unpickle model.pt)
        if checked or plan.draft_dir is None:
            return
        if step is None or all((d / "config.json").is_file() for d in (plan.tokenizer_dir, plan.draft_dir)):
            check_vocabulary(loaded, plan)
            checked.append(True)

    record = run_plan(plan, force=force, status=status, log=log, before=before, env=env)
    before(None)  # no step read both (the PyTorch path converts nothing)
    status("repository")
    s = loaded.recipe.serve
    with staging_dir(repo_dir) as tmp:
        if plan.backend == "pytorch":
            write_llmapi_repository(loaded, plan, tmp, final_dir=repo_dir, end_ids=checkpoint_end_ids(plan.tokenizer_dir))
        else:
            try:
                end_id, pad_id = special_ids(plan.tokenizer_dir)
            except ValueError as exc:
                raise StageError(f"repository: {exc}; add eos_token_id to the target's generation_config.json") from None
            spec = repo_spec_for(loaded, plan, end_id=end_id, pad_id=pad_id, end_ids=checkpoint_end_ids(plan.tokenizer_dir))
            argv = launch_command(spec, repo_dir, **container_ports(s))
            write_trtllm_repository(spec, tmp, launch_argv=argv, header=launch_header("tensorrt", plan.version, CONTAINER_HOST))
    log(f"repository: {repo_dir} (launch: {repo_dir / 'launch.sh'})")
    return TrtllmRunResult(plan, record, repo_dir, repo_dir / "launch.sh")
