"""Terminal display for the CLI (rich): the plan, stage progress, and the final summary table."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from specbuild.builder.recipe import LoadedRecipe
from specbuild.exit_codes import CommandError, ExitCode
from specbuild.pipeline import RunPaths, RunSummary, plan_lines, run_recipe


def print_plan(console: Console, loaded: LoadedRecipe, paths: RunPaths, warnings: list[str] = ()) -> None:
    """The dry-run plan: one line per stage, no work done, then the recipe's warnings."""
    console.print("[bold]plan[/bold] (dry run: nothing is built or started)")
    for line in plan_lines(loaded, paths):
        console.print(f"  {line}", highlight=False, soft_wrap=True)  # commands stay one line: copy-pasteable
    for warning in warnings:
        console.print(f"  [yellow]warning[/yellow]   {warning}", highlight=False, soft_wrap=True)


def print_recipes(console: Console, rows: list[dict]) -> None:
    """``specbuild recipes``: one row per bundled recipe (see :func:`specbuild.pipeline.recipe_summaries`)."""
    table = Table(show_header=True, box=None, pad_edge=False)
    for column in ("recipe", "method", "backend", "runs on", "training", "description"):
        table.add_column(column, overflow="fold")
    for row in rows:
        if "error" in row:
            table.add_row(row["name"], "", "", "", "", f"[red]invalid:[/red] {row['error']}")
            continue
        table.add_row(row["name"], row["method"], row["backend"], row["runs_on"], _training_cell(row["training"]), row["description"])
    console.print(table)


def _training_cell(info: dict | None) -> str:
    """``no``; ``yes, not trained (3000 steps)``; ``trained: 3000 steps, 1501 s (+ 912 s data)``."""
    if info is None:
        return "no"
    if not info["trained"]:
        return f"yes, not trained yet ({info['steps']} steps)"
    data = f" + {info['data_seconds']:.0f} s data" if isinstance(info.get("data_seconds"), (int, float)) else ""
    return f"trained: {info['steps']} steps, {info['seconds']} s{data}"


@contextmanager
def verification_progress(console: Console, total: int):
    """A progress bar; yields the ``callable(done, total)`` hook that verify() calls."""
    with Progress(
        TextColumn("verify"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=False
    ) as bar:
        task = bar.add_task("verify", total=total)
        yield lambda done, _total: bar.update(task, completed=done)


def run_with_progress(console: Console, loaded: LoadedRecipe, paths: RunPaths, *, rebuild: bool) -> RunSummary:
    """Run the main job with a spinner per stage and a progress bar for verification, then the summary.

    Raises:
        CommandError: any stage failed; the message says which and why, the exit code what kind
            (bad input 2, server unavailable 3, else 1).
    """
    from specbuild.builder.checkpoints import CheckpointError
    from specbuild.builder.recipe import RecipeError
    from specbuild.builder.trtllm_run import StageError
    from specbuild.prompts import PromptSourceError
    from specbuild.client.sdk import RequestError, ServerUnavailableError
    from specbuild.triton_repo.tritonserver import ServerNotFoundError, ServerStartError

    failures = (StageError, RecipeError, CheckpointError, PromptSourceError, RequestError, ServerUnavailableError, ServerNotFoundError, ServerStartError)
    # transient: the live bar disappears when the run ends; the summary tables follow.
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True) as bar:
        stage = bar.add_task("start", total=None)

        def status(name: str) -> None:
            bar.update(stage, description=f"[bold]{name}[/bold]", total=None, completed=0)
            if not console.is_terminal:
                bar.console.print(f"{name} ...", highlight=False)

        def progress(done: int, total: int) -> None:
            bar.update(stage, description="[bold]verify[/bold]", total=total, completed=done)
            if not console.is_terminal:  # no live bar in a log: one line per prompt instead
                bar.console.print(f"  verified {done}/{total} prompts", highlight=False)

        try:
            summary = run_recipe(loaded, paths, rebuild=rebuild, status=status, progress=progress, log=lambda m: bar.console.print(f"  {m}", highlight=False))
        except failures as exc:
            bad_input = (RecipeError, CheckpointError, PromptSourceError)
            unavailable = (ServerUnavailableError, ServerStartError)
            code = ExitCode.BAD_INPUT if isinstance(exc, bad_input) else ExitCode.SERVER_UNAVAILABLE if isinstance(exc, unavailable) else ExitCode.FAILED
            raise CommandError(str(exc), code) from None
        except KeyboardInterrupt:
            # run_recipe has already stopped the server and removed any half-written directory.
            bar.console.print("[yellow]interrupted[/yellow]")
            raise SystemExit(ExitCode.INTERRUPTED) from None
    print_summary(console, summary)
    return summary


def print_summary(console: Console, summary: RunSummary) -> None:
    """Stage times, the verification result and where everything is."""
    times = Table(title="stages", show_header=True)
    times.add_column("stage")
    times.add_column("wall time (s)", justify="right")
    for name, seconds in summary.stage_seconds.items():
        note = " (cached)" if name == "build" and summary.engine_rebuilt is False else ""
        times.add_row(name + note, f"{seconds:.1f}")
    console.print(times)
    if summary.report is not None:
        print_report(console, summary.report)
    p = summary.paths
    if summary.next_steps:  # TensorRT-LLM path: engines under engines/, logs under logs/
        console.print(f"repository: {p.repo_dir}\nlogs: {p.output_dir / 'logs'}\nnext, inside the TensorRT-LLM Triton container:", highlight=False)
        for line in summary.next_steps:
            console.print(f"  {line}", highlight=False)
        return
    console.print(f"engine: {p.engine_dir}\nrepository: {p.repo_dir}\nserver log: {p.log_file}\nreport: {p.report}", highlight=False)


def print_report(console: Console, report) -> None:
    """The verification summary: matches, first divergences, acceptance and speed-up."""
    from specbuild.client.verify import describe_divergence, render_report

    console.print(render_report(report))
    for result in report.results:
        if result.divergence is not None:
            console.print(f"[red]{result.prompt_id}[/red]: {describe_divergence(result.divergence)}", highlight=False)
    verdict = "[green]LOSSLESS[/green]" if report.all_match else "[red]MISMATCH[/red]"
    if not report.all_match and getattr(report, "passed", False):
        verdict = f"[yellow]NEAR-TIES ONLY[/yellow] ({report.num_near_ties} within --near-tie-margin {report.near_tie_margin:g})"
    fmt = lambda value, spec: "n/a" if value is None else format(value, spec)  # noqa: E731
    console.print(
        f"{verdict}: {report.num_match}/{report.num_prompts} prompts token-identical; "
        f"mean acceptance length {fmt(report.mean_acceptance_length, '.2f')} "
        f"(acceptance rate {fmt(report.mean_acceptance_rate, '.2f')}, {fmt(report.total_draft_tokens, 'd')} draft tokens, "
        f"from {getattr(report, 'acceptance_source', None) or 'none'}); "
        f"speculative {report.speculative_tokens_per_s:.1f} vs non-speculative {report.baseline_tokens_per_s:.1f} "
        f"tokens/s: speed-up {fmt(report.speedup, '.2f')}x (median over prompts {fmt(report.median_speedup, '.2f')}x)"
    )


def print_draft_check(console: Console, result) -> None:
    """``specbuild check-draft``: one row per check (a :class:`~specbuild.builder.check_draft.DraftCheck`),
    the fix under the detail of a failed or doubtful one; 80 columns wide at most."""
    from rich.markup import escape

    from specbuild.builder.check_draft import ENGINE_TITLES

    styles = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
    console.print(f"[bold]check-draft[/bold] {result.method} {escape(str(result.draft))}\n  against {escape(str(result.target))}, "
                  f"for {ENGINE_TITLES[result.engine]}", highlight=False)
    table = Table(show_header=True, box=None, pad_edge=False, width=min(console.width, 80))
    table.add_column("check", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("detail", overflow="fold", ratio=1)
    for f in result.findings:
        detail = escape(f.detail) + (f"\n[italic]fix:[/italic] {escape(f.fix)}" if f.fix and f.status in ("fail", "warn") else "")
        table.add_row(f.check, f"[{styles[f.status]}]{f.status}[/{styles[f.status]}]", detail)
    console.print(table, highlight=False)
    verdict = "[green]ok[/green]" if result.ok else "[bold red]failed[/bold red]"
    console.print(f"{verdict}: {escape(result.summary())}", highlight=False)
