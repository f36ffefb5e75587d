"""``specbuild tune`` in the terminal: the report's tables, and :func:`run_tune`, which prints them and
writes ``tune.json`` and the plots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .analysis import TuneReport, tune
from .analytic import AnalyticRow
from .plots import plot_frontier, plot_speedup
from .schedules import engine_schedule_table


def report_tables(report: TuneReport) -> list:
    """Rich renderables: frontier, recommendation, schedule, speed-ups, analytic comparison, per position."""
    from rich.table import Table

    out = []
    for prompt_set, front in sorted(report.frontiers.items()):
        t = Table(title=f"Frontier: {prompt_set} (latency {report.latency_metric}; [95% interval])")
        for name in ("deployment", "k", "load", "latency ms", "tok/s total"):
            t.add_column(name, justify="left" if name == "deployment" else "right")
        for c in front:
            t.add_row(c.deployment, str(c.draft_len), c.load, _with_ci(c.latency_ms, c.latency_ci, "{:.0f}"),
                      _with_ci(c.throughput, c.throughput_ci, "{:.1f}") + (" (few requests)" if c.small_sample else ""))
        out.append(t)
    t = Table(title=f"Recommendation: {report.goal}")
    for name in ("prompts", "deployment", "method", "k", "load", "latency ms", "tok/s total", "cannot be told apart from"):
        t.add_column(name)
    for prompt_set, c in sorted(report.recommendations.items()):
        ties = report.ties.get(prompt_set, [])
        tie_text = ", ".join(f"{o.deployment} k={o.draft_len} {o.load}" for o in ties) or "-"
        t.add_row(prompt_set, c.deployment, c.method, str(c.draft_len), c.load, _with_ci(c.latency_ms, c.latency_ci, "{:.0f}"),
                  _with_ci(c.throughput, c.throughput_ci, "{:.1f}"), tie_text)
    for prompt_set, error in sorted(report.errors.items()):
        t.add_row(prompt_set, f"[red]{error}[/red]", "", "", "", "", "", "")
    out.append(t)
    t = Table(title=f"Draft-length schedule by concurrency (TensorRT-LLM draft_len_schedule / max_concurrency; "
                    f"k > 0 only when >= {100 * report.min_gain:.0f}% faster than k=0 and, with intervals, significantly)")
    for name in ("deployment", "prompts", "best k per C", "draft_len_schedule", "max_concurrency"):
        t.add_column(name)
    for s in report.schedules:
        mc = "always on" if s.max_concurrency is None else ("always off" if s.max_concurrency == 0 else str(s.max_concurrency))
        t.add_row(s.deployment, s.prompt_set, _fmt_map(s.best), _fmt_map(s.draft_len_schedule) or f"- ({s.note})", mc)
    out.append(t)
    if report.engine_schedules:
        out.append(engine_schedule_table(report.engine_schedules))
    t = Table(title="Against Leviathan et al. 2023: E[tokens/step] = (1-a^(k+1))/(1-a), speed-up = E/(kc+1); speed-up [95% interval]")
    for name in ("deployment", "prompts", "k", "C", "a", "c", "tok/step", "expected", "speed-up", "expected", "meas/exp"):
        t.add_column(name, justify="left" if name in ("deployment", "prompts") else "right")
    for r in report.analytic:
        t.add_row(r.deployment, r.prompt_set, str(r.draft_len), str(r.concurrency), f"{r.a:.3f}", f"{r.c:.3f}",
                  f"{r.tokens_per_step:.2f}", f"{r.expected_tokens_per_step:.2f}", _speedup_text(r),
                  f"{r.expected_speedup:.2f}", f"{r.closeness:.2f}")
    out.append(t)
    if report.open_loop:
        t = Table(title="Open loop: speed-up vs k=0 at the same arrival rate (time per output token) [95% interval]")
        for name in ("deployment", "prompts", "k", "rate /s", "cap", "tok/step", "speed-up"):
            t.add_column(name)
        for r in report.open_loop:
            t.add_row(r.deployment, r.prompt_set, str(r.draft_len), f"{r.request_rate:g}", str(r.concurrency or "-"),
                      f"{r.tokens_per_step:.2f}", _speedup_text(r))
        out.append(t)
    out.append(per_position_table(report))
    return out


def _with_ci(value: float, interval: list[float] | None, fmt: str) -> str:
    text = fmt.format(value)
    return text if interval is None else f"{text} [{fmt.format(interval[0])}, {fmt.format(interval[1])}]"


def _speedup_text(r: AnalyticRow) -> str:
    text = _with_ci(r.speedup, r.speedup_ci, "{:.2f}")
    if r.speedup_ci is not None and r.speedup_ci[0] <= 1.0 <= r.speedup_ci[1]:
        text += " (n.s.)"  # the interval contains 1: not significantly different from speculation off
    return text


def per_position_table(report: TuneReport):
    """Per-position acceptance at the lowest concurrency: measured from streamed steps where the bench
    streamed, else derived across draft lengths; next to the model's a^i for the fitted a."""
    from rich.table import Table

    fitted = {(r.deployment, r.prompt_set): r.a for r in report.analytic}
    t = Table(title="Per-position acceptance P(step accepts >= i drafts): measured (streamed) / derived (across k) / model a^i")
    for name in ("deployment", "prompts", "k", "source", "i = 1, 2, ...", "model a^i"):
        t.add_column(name)
    for (deployment, prompt_set, k), values in sorted(report.measured_per_position.items()):
        a = fitted.get((deployment, prompt_set))
        model = "" if a is None else " ".join(f"{a ** i:.2f}" for i in range(1, k + 1))
        t.add_row(deployment, prompt_set, str(k), "measured", " ".join(f"{v:.2f}" for v in values), model)
    for (deployment, prompt_set), spans in sorted(report.per_position.items()):
        text = " ".join(f"{p:.2f}" if lo == hi else f"[{lo}-{hi}] {p:.2f}" for lo, hi, p in spans)
        t.add_row(deployment, prompt_set, "-", "derived", text, "")
    return t


def _fmt_map(m: dict[int, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(m.items()))


def run_tune(points: Sequence, out_dir: str | Path, *, console, **goal) -> TuneReport:
    """``specbuild tune`` on bench points: print the tables, write tune.json, frontier.png, speedup.png.

    ``goal``: the keyword arguments of :func:`tune`. Raises ``TuneError``.
    """
    out = Path(out_dir)
    report = tune(points, **goal)
    report.plots = [str(plot_frontier(points, report, out / "frontier.png")), str(plot_speedup(points, report, out / "speedup.png"))]
    for table in report_tables(report):
        console.print(table)
    if any(r.speedup_ci for r in report.analytic + report.open_loop):
        console.print("(n.s.): the speed-up's 95% interval contains 1.0 -- not significantly different from speculation off")
    for prompt_set, ties in sorted(report.ties.items()):
        best = report.recommendations[prompt_set]
        console.print(f"note: {prompt_set}: the recommendation {best.label} is not significantly different from "
                      + ", ".join(o.label for o in ties) + " (95% intervals overlap); prefer the simpler or cheaper one")
    for line in report.warnings:
        console.print(f"warning: {line}", highlight=False)
    json_path = report.write(out / "tune.json")
    console.print(f"wrote {json_path}, {', '.join(report.plots)}")
    return report
