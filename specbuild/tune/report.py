"""``specbuild tune`` in the terminal: the report's tables, and :func:`run_tune`, which prints them and
writes ``tune.json`` and the plots."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from rich.text import Text

from ..bench.stats import DISTURBED
from .analysis import TuneReport, tune
from .analytic import AnalyticRow
from .plots import plot_frontier, plot_speedup
from .schedules import engine_schedule_table


NAME_COLUMNS = ("deployment", "prompts", "method", "load", "source", "draft_len_schedule", "max_concurrency")  # never cut
NARROW = 120  # terminal columns under which the recommendation leaves its ties to the note below it


def _table(title: str, columns: Sequence[str], *, left: Sequence[str] = NAME_COLUMNS):
    """A table that fits a narrow terminal: no outer box, names whole, other cells wrapped at spaces."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for name in columns:
        t.add_column(name, justify="left" if name in left else "right", no_wrap=name in NAME_COLUMNS)
    return t


def report_tables(report: TuneReport, *, width: int | None = None) -> list:
    """Rich renderables: frontier, recommendation, schedule, speed-ups, analytic comparison, per position.
    ``width``: the terminal's columns; narrower than :data:`NARROW`, the recommendation's ties are
    left to the note :func:`run_tune` prints."""
    out = []
    for prompt_set, front in sorted(report.frontiers.items()):
        t = _table(f"Frontier: {prompt_set} (latency {report.latency_metric}; [95% interval])",
                   ("deployment", "k", "load", "latency ms", "tok/s total"))
        for c in front:
            t.add_row(c.deployment, str(c.draft_len), c.load, _with_ci(c.latency_ms, c.latency_ci, "{:.0f}"),
                      _with_ci(c.throughput, c.throughput_ci, "{:.1f}") + (" (few requests)" if c.small_sample else ""))
        out.append(t)
    narrow = width is not None and width < NARROW
    columns = ("prompts", "deployment", "method", "k", "load", "latency ms", "tok/s total") + (() if narrow else ("cannot be told apart from",))
    t = _table(f"Recommendation: {report.goal}", columns, left=NAME_COLUMNS + ("k", "cannot be told apart from"))
    for prompt_set, c in sorted(report.recommendations.items()):
        ties = report.ties.get(prompt_set, [])
        tie_text = ", ".join(f"{o.deployment} k={o.draft_len} {o.load}" for o in ties) or "-"
        t.add_row(prompt_set, c.deployment, c.method, str(c.draft_len), c.load, _with_ci(c.latency_ms, c.latency_ci, "{:.0f}"),
                  _with_ci(c.throughput, c.throughput_ci, "{:.1f}"), *(() if narrow else (tie_text,)))
    if report.recommendations:
        out.append(t)
    ties = [f"note: {prompt_set}: {tie_note(report.recommendations[prompt_set], tied, report.tie_bases.get(prompt_set))}"
            for prompt_set, tied in sorted(report.ties.items())]
    if ties:  # right under the recommendation: why it is what it is (at 80 columns the table drops its ties column)
        out.append(Text("\n".join(ties)))
    if report.errors:  # below the table, whole: a table cell would cut the reason
        out.append(Text("\n".join(f"no recommendation for {prompt_set}: {error}" for prompt_set, error in sorted(report.errors.items())),
                        style="red"))
    out += schedule_tables(report)
    if report.engine_schedules:
        out += engine_schedule_table(report.engine_schedules)
    out.append(_analytic_table(report.analytic, narrow=narrow))
    if report.open_loop:
        t = _table("Open loop: speed-up vs k=0 at the same arrival rate (time per output token) [95% interval]",
                   ("deployment", "prompts", "k", "rate /s", "cap", "tok/step", "speed-up"))
        for r in report.open_loop:
            t.add_row(r.deployment, r.prompt_set, str(r.draft_len), f"{r.request_rate:g}", str(r.concurrency or "-"),
                      f"{r.tokens_per_step:.2f}", _speedup_text(r))
        out.append(t)
    out.append(per_position_table(report))
    return out


def schedule_tables(report: TuneReport) -> list:
    """The draft-length schedule by concurrency, then why a deployment has none, below the table: the
    deployment, best k and schedule columns never wrap or shrink (a user copies them into a recipe),
    and a long note cannot take their width."""
    if not report.schedules:  # the warnings say why
        return []
    sets = sorted({s.prompt_set for s in report.schedules})
    one_set = len(sets) == 1  # in the title; several: under each deployment's name, so no name is ever cut
    columns = ("deployment" if len(sets) < 2 else "deployment\nprompts", "best k\nby C", "draft_len_schedule", "max_concurrency")
    t = _table(f"Draft-length schedule by concurrency (TensorRT-LLM draft_len_schedule / max_concurrency; "
               f"k > 0 only when >= {100 * report.min_gain:.0f}% faster than k=0 and, with intervals, significantly)"
               + (f"; {sets[0]}" if one_set else ""), (), left=columns)
    for name in columns:  # best k may wrap between levels (it is read, not copied)
        t.add_column(name, justify="left", no_wrap=not name.startswith("best k"), min_width=max(len(line) for line in name.split("\n")))
    notes = []
    for s in report.schedules:
        mc = "always on" if s.max_concurrency is None else ("always off" if s.max_concurrency == 0 else str(s.max_concurrency))
        schedule = _fmt_map(s.draft_len_schedule)
        if not schedule:
            notes.append(f"{s.deployment} {s.prompt_set}: no draft_len_schedule: {s.note or 'speculation off'}")
            schedule = f"- (note {len(notes)})"
        t.add_row(s.deployment if len(sets) < 2 else f"{s.deployment}\n{s.prompt_set}", _fmt_map(s.best).replace(": ", ":"), schedule, mc)
    out = [t]
    if notes:
        out.append(Text("\n".join(f"note {i}: {n}" for i, n in enumerate(notes, start=1))))
    return out


def _analytic_table(rows: Sequence[AnalyticRow], *, narrow: bool):
    """Measured against Leviathan et al.; narrow: without the tokens-per-step columns (tune.json has
    them) and, for one prompt set, with the set in the title."""
    sets = sorted({r.prompt_set for r in rows})
    one_set = narrow and len(sets) == 1
    title = "Against Leviathan et al. 2023: E[tokens/step] = (1-a^(k+1))/(1-a), speed-up = E/(kc+1); speed-up [95% interval]"
    columns = ("deployment",) + (() if one_set else ("prompts",)) + ("k", "C", "a", "c")
    columns += (() if narrow else ("tok/step", "expected")) + ("speed-up", "expected", "meas/exp")
    t = _table(title + (f"; {sets[0]}" if one_set else ""), columns)
    for r in rows:
        cells = [r.deployment] + ([] if one_set else [r.prompt_set]) + [str(r.draft_len), str(r.concurrency), f"{r.a:.3f}", f"{r.c:.3f}"]
        cells += [] if narrow else [f"{r.tokens_per_step:.2f}", f"{r.expected_tokens_per_step:.2f}"]
        t.add_row(*cells, _speedup_text(r), f"{r.expected_speedup:.2f}", f"{r.closeness:.2f}")
    return t


def _with_ci(value: float, interval: list[float] | None, fmt: str) -> str:
    text = fmt.format(value)
    return text if interval is None else f"{text} [{fmt.format(interval[0])}, {fmt.format(interval[1])}]"


def _not_significant(r: AnalyticRow) -> bool:
    """The speed-up's interval contains 1: not significantly different from speculation off."""
    return r.speedup_ci is not None and r.speedup_ci[0] <= 1.0 <= r.speedup_ci[1]


def _speedup_text(r: AnalyticRow) -> str:
    text = _with_ci(r.speedup, r.speedup_ci, "{:.2f}")
    if r.baseline_disturbed:
        return text + " (disturbed)"
    return text + " (n.s.)" if _not_significant(r) else text


def per_position_table(report: TuneReport):
    """Per-position acceptance at the lowest concurrency: measured from streamed steps where the bench
    streamed, else derived across draft lengths; next to the model's a^i for the fitted a."""
    fitted = {(r.deployment, r.prompt_set): r.a for r in report.analytic}
    t = _table("Per-position acceptance P(step accepts >= i drafts): measured (streamed) / derived (across k) / model a^i",
               ("deployment", "prompts", "k", "source", "i = 1, 2, ...", "model a^i"),
               left=NAME_COLUMNS + ("i = 1, 2, ...", "model a^i"))
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


def tie_note(best, ties: Sequence, bases: Sequence[str] | None = None) -> str:
    """The recommendation and what it cannot be told apart from, each with the test that ties it
    (``bases``: :func:`specbuild.tune.analysis.tie_basis`'s reasons, in the order of ``ties``; by
    default "95% intervals overlap"), naming the simpler choice: k=0 (speculation off) when it is
    among them, else the smallest draft length.

    Example: ``"the recommendation ngram k=2 C=4 is not significantly different from ngram k=4 C=4
    (speed-up intervals overlap); prefer the simpler or cheaper one"``. A k > 0 that cannot be told from
    k=0 at its concurrency is never the recommendation (:func:`specbuild.tune.analysis.tune` takes k=0):
    ``"the recommendation is ngram k=0 C=1: speculation off; ngram k=4 C=1 (speed-up interval contains 1)
    measured faster but not significantly (more --repeats may separate them)"``.
    """
    bases = list(bases) if bases else ["95% intervals overlap"] * len(ties)
    if len(set(bases)) == 1:
        named = f"{', '.join(o.label for o in ties)} ({bases[0]})"
    else:
        named = ", ".join(f"{o.label} ({b})" for o, b in zip(ties, bases))
    faster = [o for o in ties if o.draft_len > 0 and o.concurrency == best.concurrency and o.latency_ms < best.latency_ms]
    if best.draft_len == 0 and faster:  # tune() put k=0 first: the faster-looking k is not significantly faster
        return (f"the recommendation is {best.label}: speculation off; {named} measured faster but not "
                "significantly (more --repeats may separate them)")
    text = f"the recommendation {best.label} is not significantly different from {named}"
    simpler = min((o for o in ties if o.draft_len < best.draft_len), key=lambda o: o.draft_len, default=None)
    if simpler is None:
        return text + "; prefer the simpler or cheaper one"
    return text + f"; the simpler choice is {simpler.label}" + (": speculation off" if simpler.draft_len == 0 else "")


SMALL_SAMPLE = re.compile(r"^(?P<where>.+): (?P<n>\d+) requests \(< (?P<floor>\d+)\): (?P<what>.+)$")


def summarize_warnings(lines: Sequence[str]) -> list[str]:
    """The point warnings for the terminal: the "fewer than 20 requests" ones as one line (how many
    points, their request counts), every other line as it is. tune.json keeps them all.

    Example: six ``"ngram humaneval:8 k=0 C=1: 16 requests (< 20): percentiles and intervals are rough"``
    -> ``"6 points have 16 requests (< 20): percentiles and intervals are rough; raise --request-count or --repeats"``.
    """
    small = [m for m in map(SMALL_SAMPLE.match, lines) if m]
    others = [line for line in lines if not SMALL_SAMPLE.match(line)]
    if not small:
        return list(others)
    counts = sorted({int(m["n"]) for m in small})
    n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    points = "1 point has" if len(small) == 1 else f"{len(small)} points have"
    return others + [f"{points} {n} requests (< {small[0]['floor']}): {small[0]['what']}; raise --request-count or --repeats (tune.json lists them)"]


def run_tune(points: Sequence, out_dir: str | Path, *, console, **goal) -> TuneReport:
    """``specbuild tune`` on bench points: print the tables, write tune.json, frontier.png, speedup.png.

    ``goal``: the keyword arguments of :func:`tune`. Raises ``TuneError``.
    """
    out = Path(out_dir)
    report = tune(points, **goal)
    report.plots = [str(plot_frontier(points, report, out / "frontier.png")), str(plot_speedup(points, report, out / "speedup.png"))]
    for table in report_tables(report, width=console.width):
        console.print(table, soft_wrap=getattr(table, "no_wrap", None) is True)  # a config line stays whole (engine_schedule_table)
    if report.disturbed:
        console.print(f"(disturbed): {DISTURBED} -- the k=0 baseline ran on a slower machine; such points are neither "
                      "recommended nor scheduled, and --write-recipe refuses them: rerun with --repeats 3", highlight=False)
    if any(_not_significant(r) for r in report.analytic + report.open_loop):  # the legend of a mark shown
        console.print("(n.s.): the speed-up's 95% interval contains 1.0 -- not significantly different from speculation off")
    for line in summarize_warnings(report.warnings):
        console.print(f"warning: {line}", highlight=False)
    json_path = report.write(out / "tune.json")
    console.print(f"wrote {json_path}, {', '.join(report.plots)}")
    return report
