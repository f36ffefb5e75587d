"""Terminal display for the CLI (rich): the plan, stage progress, and the final summary table."""

from __future__ import annotations

import time
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from specbuild.builder.recipe import LoadedRecipe
from specbuild.exit_codes import CommandError, ExitCode
from specbuild.main_job import RunSummary, run_recipe
from specbuild.pipeline import RunPaths, plan_lines


def print_plan(console: Console, loaded: LoadedRecipe, paths: RunPaths, warnings: list[str] = ()) -> None:
    """The dry-run plan: one line per stage, no work done, then the recipe's warnings."""
    console.print("[bold]plan[/bold] (dry run: nothing is built or started)")
    for line in plan_lines(loaded, paths):
        for part in _plan_line(f"  {line}", console.width):
            console.print(part, highlight=False, soft_wrap=True, markup=False)
    for warning in warnings:
        console.print(f"  [yellow]warning[/yellow]   {warning}", highlight=False, soft_wrap=True)


def _plan_line(line: str, width: int) -> list[str]:
    """A plan line for a ``width``-column terminal: a stage line (``  build     ...``) wraps at spaces under
    its detail; commands (``$ ...``, ``specbuild check-draft ...``) and the TensorRT-LLM plan's lines
    (``file``, ``->``, ``log:``, notes) stay whole: a path or a command is copied, never split."""
    import re
    import textwrap

    stage = re.match(r"^( {2}[a-z]+ +)\S", line)
    if stage is None or "$ " in line or "specbuild check-draft" in line or len(line) <= width:
        return [line]
    return textwrap.wrap(line, width=max(width, 40), subsequent_indent=" " * len(stage.group(1)), break_long_words=False,
                         break_on_hyphens=False) or [line]


LOG_PROGRESS_EVERY_S = 30.0  # piped or logged output: how often a progress line is printed
WIDE_COLUMNS = 120  # below this, ``specbuild recipes`` leaves the descriptions to --wide
WIDE_LINE = 200


def print_recipes(console: Console, rows: list[dict], *, wide: bool = False) -> None:
    """``specbuild recipes``: one row per bundled recipe (see :func:`specbuild.pipeline.recipe_summaries`).

    Names, methods and backends never wrap (a user copies them). Narrower than 120 columns the
    descriptions are left out, unless ``wide``: then the table is printed at its full width. Into a
    pipe or file, lines carry no trailing padding.
    """
    described = wide or console.width >= WIDE_COLUMNS
    table = Table(show_header=True, box=None, pad_edge=False)
    for column in ("recipe", "method", "backend", "runs on"):
        table.add_column(column, no_wrap=True)
    table.add_column("training", overflow="fold")
    if described:
        table.add_column("description", overflow="fold")
    for row in rows:
        if "error" in row:
            cells = [row["name"], "", "", "", "", f"[red]invalid:[/red] {row['error']}"]
        else:
            cells = [row["name"], row["method"], row["backend"], row["runs_on"], _training_cell(row["training"]), row["description"]]
        table.add_row(*cells[: 6 if described else 5])
    if wide and console.width < WIDE_LINE:  # lines longer than the terminal, as `ps -ww`
        console = Console(width=WIDE_LINE, file=console.file, color_system=console.color_system, force_terminal=console.is_terminal)
    if console.is_terminal:
        console.print(table)
    else:  # a pipe or a file: no cells padded out to the table's width (`specbuild recipes | cat`, grep, diff)
        with console.capture() as captured:
            console.print(table)
        console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    notes = [] if described else ["descriptions: specbuild recipes --wide"]
    if any(r.get("training") and (not r["training"]["trained"] or r["training"].get("up_to_date") is False) for r in rows):
        notes.append("'est.': estimated training time on 2 CPU cores; 'trained': how long it took here")
    for note in notes:
        console.print(note, highlight=False, soft_wrap=True)


def _training_cell(info: dict | None) -> str:
    """``no``; ``yes, ~30 min est.``; ``yes, 3000 steps``; ``trained, 40 min`` (training and data; the
    split is in ``--json``); ``retrains, ~41 min est.`` (trained with other data or settings than the recipe's)."""
    from specbuild.builder.train_stage import duration_text

    if info is None:
        return "no"
    if not info["trained"] or info.get("up_to_date") is False:
        estimate = info.get("estimated_seconds")
        todo = "yes" if not info["trained"] else "retrains"
        return f"{todo}, ~{duration_text(estimate)} est." if estimate else f"{todo}, {info['steps']} steps"
    seconds = info.get("seconds")
    if not isinstance(seconds, (int, float)):
        return f"trained, {info['steps']} steps"
    data = info.get("data_seconds")
    return f"trained, {duration_text(seconds + (data if isinstance(data, (int, float)) else 0))}"


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
    from specbuild.util.checkpoints import CheckpointError
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

        logged = [time.monotonic()]

        def progress(done: int, total: int) -> None:
            bar.update(stage, description="[bold]verify[/bold]", total=total, completed=done)
            if not console.is_terminal and (done == total or time.monotonic() - logged[0] >= LOG_PROGRESS_EVERY_S):
                logged[0] = time.monotonic()  # no live bar in a log: a line every 30 s and one at the end
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
    from specbuild.triton_repo.tritonserver import expected_error_lines

    console.print(f"engine: {p.engine_dir}\nrepository: {p.repo_dir}\nserver log: {p.log_file}\nreport: {p.report}", highlight=False)
    expected = expected_error_lines(p.log_file)
    if expected:
        console.print(f"  tritonserver.log: its {expected} CUDA 'E' lines are expected on a machine without a GPU", highlight=False)


SLOWER_MIN_PROMPTS = 5  # verify says SLOWER only when this many prompts were timed and their median agrees


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
    lines = [  # short lines, one phrase each: nothing wraps mid-phrase in an 80-column terminal
        f"{verdict}: {report.num_match}/{report.num_prompts} prompts token-identical",
        f"  mean acceptance length {fmt(report.mean_acceptance_length, '.2f')} "
        f"(acceptance rate {fmt(report.mean_acceptance_rate, '.2f')})",
        f"  {fmt(report.total_draft_tokens, 'd')} draft tokens"
        + (f"; acceptance from {source}" if (source := getattr(report, "acceptance_source", None)) not in (None, "none") else ""),
        f"  speed-up {fmt(report.speedup, '.2f')}x (median over prompts {fmt(report.median_speedup, '.2f')}x)",
        f"  tokens/s: speculative {report.speculative_tokens_per_s:.1f}, non-speculative {report.baseline_tokens_per_s:.1f}",
    ]
    if report.speedup is not None and report.speedup < 1.0 and report.total_draft_tokens:  # lossless, but not worth it?
        median = report.median_speedup
        if report.num_prompts >= SLOWER_MIN_PROMPTS and median is not None and median < 1.0:
            lines.append(f"[yellow]  SLOWER than plain decoding ({report.speedup:.2f}x): speculation costs more here than it saves[/yellow]")
        else:  # one prompt's timing, or the prompts disagree: no verdict on speed
            lines.append(f"  speed-up below 1 on {report.num_prompts} prompt(s), median {fmt(median, '.2f')}x: too few or too "
                         "mixed to call; measure with specbuild bench --repeats 3")
    if report.total_draft_tokens == 0:  # greedy equality holds trivially: nothing was speculated
        lines += ["[yellow]  warning: speculation not exercised: no draft tokens were proposed,[/yellow]",
                  "[yellow]  so plain and speculative runs were the same computation; for drafts:[/yellow]",
                  "[yellow]  more --max-tokens, prompts that repeat (humaneval), or a deployment[/yellow]",
                  "[yellow]  with max_draft_len > 0[/yellow]"]
    kernels = getattr(report, "kernels", None)
    if kernels:
        lines.append(f"  greedy equality {kernels['greedy_equality']}: {kernels['linear']} linears, {kernels['attention']} attention"
                     + ("" if kernels.get("fallback_reason") is None else f" ({kernels['fallback_reason']})"))
    if implausible_speedup(report.speedup, report.mean_acceptance_length):
        lines += ["[yellow]  note: the speed-up exceeds the tokens per step (acceptance length),[/yellow]",
                  "[yellow]  which bounds it (a step is at least one target pass): the timing[/yellow]",
                  "[yellow]  is noisy (a busy machine?); measure again on a quiet one[/yellow]"]
    console.print("\n".join(lines), highlight=False)


def implausible_speedup(speedup: float | None, acceptance_length: float | None, *, slack: float = 1.1) -> bool:
    """Whether a measured ``speedup`` exceeds ``acceptance_length`` (tokens per step) by more than ``slack``:
    each speculative step costs at least one target pass, so tokens per step bounds the speed-up over
    plain decoding on the same deployment; beyond it, the timing was disturbed (a busy machine)."""
    return speedup is not None and acceptance_length is not None and speedup > slack * acceptance_length


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
