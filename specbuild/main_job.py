"""The main job, ``specbuild recipe``: recipe -> engine -> Triton repository -> server -> verification
-> shutdown, each stage timed, returning a typed :class:`RunSummary`.

The checks every command shares are :mod:`specbuild.pipeline`'s; building and serving are
:func:`specbuild.deploy.deploy`. This module sits above both (docs/architecture.md, the layer map).
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from specbuild.builder.recipe import LoadedRecipe
from specbuild.builder.reference import read_kernel_guarantee
from specbuild.deploy import build_recipe, deploy
from specbuild.pipeline import RunPaths, retire_report, trtllm_next_steps
from specbuild.prompts import apply_chat_template
from specbuild.tokenizer import load_tokenizer


@dataclass
class RunSummary:
    """Stage wall times (seconds) and the verification report of one run."""

    paths: RunPaths
    stage_seconds: dict[str, float] = field(default_factory=dict)
    engine_rebuilt: bool | None = None
    report: object | None = None  # specbuild.client.verify.VerifyReport
    next_steps: list[str] = field(default_factory=list)  # TensorRT-LLM path: what to run on the GPU box next



@contextmanager
def _timed(summary: RunSummary, stage: str, status):
    status(stage)
    start = time.perf_counter()
    yield
    summary.stage_seconds[stage] = time.perf_counter() - start


def run_recipe(loaded: LoadedRecipe, paths: RunPaths, *, rebuild: bool = False, status=print, progress=None, log=print) -> RunSummary:
    """Run every stage for ``loaded`` (:func:`specbuild.deploy.deploy`, then verification); the
    server is stopped whatever happens.

    Args:
        status: called with each stage name as it starts.
        progress: optional ``callable(done, total)`` for the verification progress bar.
        log: called with one-line messages from the build stages.

    Raises:
        RecipeError: the recipe cannot run here (raised before any long work).
        specbuild.triton_repo.tritonserver.ServerStartError, specbuild.client.sdk.ServerUnavailableError:
            the server failed; its log file is named in the message.
    """
    summary = RunSummary(paths=paths)
    timed = lambda stage: _timed(summary, stage, status)  # noqa: E731
    retire_report(paths)  # a report always belongs to the run that wrote it
    if loaded.recipe.build.backend != "reference":
        build = build_recipe(loaded, paths, rebuild=rebuild, stage=timed, log=log, status=status)
        summary.engine_rebuilt = build.engine_rebuilt
        summary.next_steps = trtllm_next_steps(loaded, build.trtllm)
        return summary
    with deploy(loaded, output_dir=paths.output_dir, rebuild=rebuild, stage=timed, log=log) as served:
        summary.engine_rebuilt = served.engine_rebuilt
        s = served.server
        log(f"tritonserver on {served.loaded.recipe.serve.host}: http {s.http_port}, grpc {s.grpc_port}, metrics {s.metrics_port}")
        served_url, served_decoupled = served.url(loaded.recipe.verify.protocol), served.decoupled
        with timed("verify"):
            summary.report = _verify(served, progress=progress)
    from specbuild.client.verify import provenance

    v, target = loaded.recipe.verify, loaded.recipe.target
    summary.report = dataclasses.replace(summary.report, kernels=read_kernel_guarantee(paths.engine_dir), provenance=provenance(
        url=served_url, protocol=v.protocol, streaming=served_decoupled, prompts=v.prompts, recipe=loaded.recipe.name,
        target=target.checkpoint, dtype=target.dtype, repo_dir=paths.repo_dir))
    summary.report.write(paths.report)
    return summary


def _verify(served, *, progress):
    # tritonclient is the client extra's: `specbuild plan` and the refusals load without it.
    from specbuild.client.sdk import SpecClient
    from specbuild.client.verify import verify

    v = served.loaded.recipe.verify
    tokenizer = load_tokenizer(served.tokenizer_dir)
    prompts = apply_chat_template(served.prompts, v.prompts, v.chat_template, tokenizer)
    with SpecClient(served.url(v.protocol), protocol=v.protocol, decoupled=served.decoupled) as client:
        client.wait_ready()
        return verify(
            client,
            prompts,
            max_tokens=v.max_tokens,
            num_draft_tokens=v.num_draft_tokens,
            end_id=v.end_id,
            tokenizer=tokenizer,
            progress=progress,
        )
