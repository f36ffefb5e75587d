"""``specbuild bench --ramp 1,2,4,8,16,8,4,2,1 --ramp-step-s 30``: load steps up and down across a
draft-length schedule's thresholds, and what happens to throughput, draft length and acceptance.

Closed loop, after one untimed warm-up request: ``max(levels)`` worker threads; during step i the first ``levels[i]`` of them send
streamed requests back to back (prompts cycled); a worker that is switched off finishes the request
it has in flight, so load falls as requests end, as it does on a real server. Requests carry no
draft length: the deployment runs its own (its ``max_draft_len``, or its schedule).

Per interval (one per step), from the streamed responses (one per decoding step) whose arrival
falls in it:

- ``tokens_per_s``: output tokens that arrived / the interval's length (all requests together);
- ``draft_len_mean`` / ``draft_len_max`` / ``draft_lens``: **derived**, not reported by the engine:
  the engine returns cumulative ``total_draft_tokens`` per request, so the draft tokens it proposed
  for a request in a step are the change of that counter between two responses. A method with
  nothing to propose (an n-gram with no match) proposes fewer than the length in force, so
  ``draft_len_max`` is the better reading of the length the engine chose; 0 means speculation off;
- ``acceptance_rate``: accepted / proposed draft tokens of the interval's steps, with a 95 % bootstrap
  interval over its steps.

Flags (definitions):

- **throughput cliff**: load rises from one interval to the next and total tokens/s falls by more
  than ``cliff_drop`` (default 20 %) of the previous interval's. Batching should hold or raise total
  throughput as load rises (vLLM #49548: 232 -> 24-157 tok/s at a schedule threshold);
- **acceptance after re-enabling**: speculation was on, went off (mean derived draft length below
  0.1 token per step) and came
  back; the acceptance of the first interval with it back is below the 95 % interval of the last
  interval before it went off (TensorRT-LLM PR #16888: stale drafter state after K=0).

Example::

    report = run_ramp(deployment, prompts, levels=(1, 4, 8, 4, 1), step_s=20)
    report.write("out")     # ramp.json + ramp.png
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specbuild.prompts import Prompt
from specbuild.util.atomic import write_json_atomic

from .plan import BenchError, Deployment
from .points import ratio_of_sums_ci

CLIFF_DROP = 0.2  # a >20 % fall of total tokens/s while load rises is a cliff
OFF_BELOW = 0.1  # an interval drafting fewer tokens per step than this has speculation off
DRAFT_LEN_NOTE = ("draft length derived from the per-step change of the engine's cumulative total_draft_tokens "
                  "(the engine does not report the length it chose); a step with nothing to propose lowers the mean")


@dataclass(frozen=True)
class StepEvent:
    """One streamed response: ``t_s`` after the ramp's start; ``tokens`` it added; ``drafted`` /
    ``accepted``: draft tokens proposed / accepted for this request since its previous response;
    ``first``: the request's first response (the prefill: no draft)."""

    t_s: float
    worker: int
    tokens: int
    drafted: int
    accepted: int
    first: bool = False


@dataclass
class RampInterval:
    """One step of the ramp and what was measured in it (module docstring for each figure)."""

    index: int
    concurrency: int
    start_s: float
    end_s: float
    tokens: int
    tokens_per_s: float
    steps: int
    draft_len_mean: float | None
    draft_len_max: int | None
    draft_lens: dict[int, int]
    acceptance_rate: float | None
    acceptance_ci: list[float] | None
    requests_finished: int = 0
    flags: list[str] = field(default_factory=list)

    @property
    def speculating(self) -> bool:
        """At least one draft token per ten steps (:data:`OFF_BELOW`): a few drafted steps while the
        load falls through a threshold do not make an interval "on"."""
        return self.draft_len_mean is not None and self.draft_len_mean >= OFF_BELOW


@dataclass
class RampReport:
    """The ramp of one deployment: its intervals, the flags raised, and how draft length was read."""

    deployment: str
    method: str
    levels: list[int]
    step_s: float
    intervals: list[RampInterval]
    cliff_drop: float = CLIFF_DROP
    draft_len_source: str = DRAFT_LEN_NOTE
    plot: str | None = None

    @property
    def flags(self) -> list[str]:
        return [f"interval {iv.index} (C={iv.concurrency}): {flag}" for iv in self.intervals for flag in iv.flags]

    def to_json(self) -> dict:
        return {
            "deployment": self.deployment, "method": self.method, "levels": self.levels, "step_s": self.step_s,
            "cliff_definition": f"total tokens/s falls by more than {100 * self.cliff_drop:.0f}% while load rises",
            "reenable_definition": "acceptance of the first interval after speculation returns is below the 95% interval "
                                   "of the last interval before it went off",
            "draft_len_source": self.draft_len_source, "flags": self.flags, "plot": self.plot,
            "intervals": [asdict(iv) | {"speculating": iv.speculating} for iv in self.intervals],
        }

    def write(self, out_dir: str | Path, stem: str = "ramp") -> Path:
        """``<stem>.json`` and ``<stem>.png`` (matplotlib) under ``out_dir``; returns the JSON path."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.plot = str(plot_ramp(self, out / f"{stem}.png"))
        return write_json_atomic(out / f"{stem}.json", self.to_json(), indent=1)


def run_ramp(
    deployment: Deployment, prompts: Sequence[tuple[Prompt, str]], *, levels: Sequence[int], step_s: float,
    max_tokens: int, end_id: int | None = None, timeout_s: float = 600.0, cliff_drop: float = CLIFF_DROP,
    make_client=None, log=lambda message: None,
) -> RampReport:
    """Run the ramp (module docstring) on ``deployment``, which must already answer.

    Raises:
        BenchError: a level below 1, a step not above 0 s, or no prompts.
        specbuild.client.sdk.ClientError: a request failed.
    """
    if not levels or min(levels) < 1 or step_s <= 0:
        raise BenchError(f"--ramp levels must be >= 1 and --ramp-step-s > 0, got {list(levels)} and {step_s}")
    if not prompts:
        raise BenchError("--ramp needs at least one prompt")
    from .run import make_client as default_make_client

    make = make_client or (lambda: default_make_client(deployment, timeout_s))
    warm = make()
    try:  # untimed: the first request's set-up would otherwise land in the first interval
        _one_request(warm, 0, _RampState(levels), deployment, prompts[0][1], max_tokens=4, end_id=end_id)
    finally:
        warm.close()
    state = _RampState(levels)
    workers = [threading.Thread(target=_worker, args=(w, state, make, deployment, prompts, max_tokens, end_id), daemon=True)
               for w in range(max(levels))]
    for w in workers:
        w.start()
    try:
        for i, level in enumerate(levels):
            log(f"ramp: C={level} for {step_s:g} s")
            state.set_level(i, level)
            time.sleep(max(0.0, state.t0 + (i + 1) * step_s - time.perf_counter()))
            if state.error is not None:
                raise state.error
    finally:
        state.stop()
        for w in workers:
            w.join(timeout=timeout_s)
    if state.error is not None:
        raise state.error
    intervals = intervals_of(state.events, state.finished, levels, step_s)
    flag_intervals(intervals, cliff_drop)
    return RampReport(deployment.name, deployment.method, list(levels), step_s, intervals, cliff_drop)


class _RampState:
    """The level in force, the events recorded and the first error, shared by the workers."""

    def __init__(self, levels: Sequence[int]) -> None:
        self.lock = threading.Condition()
        self.level, self.running, self.error = 0, True, None
        self.events: list[StepEvent] = []
        self.finished: list[float] = []
        self.sent = 0  # requests sent so far: the next prompt (prompts are cycled)
        self.t0 = time.perf_counter()

    def set_level(self, index: int, level: int) -> None:
        with self.lock:
            if index == 0:
                self.t0 = time.perf_counter()
            self.level = level
            self.lock.notify_all()

    def stop(self) -> None:
        with self.lock:
            self.running = False
            self.lock.notify_all()

    def wait_turn(self, worker: int) -> bool:
        """Block while ``worker`` is switched off; False once the ramp is over."""
        with self.lock:
            while self.running and worker >= self.level:
                self.lock.wait(0.5)
            return self.running


def _worker(worker: int, state: _RampState, make, deployment: Deployment, prompts, max_tokens, end_id) -> None:
    client = make()
    try:
        while state.wait_turn(worker):
            with state.lock:
                prompt, text = prompts[state.sent % len(prompts)]
                state.sent += 1
            _one_request(client, worker, state, deployment, text, max_tokens=prompt.max_tokens or max_tokens, end_id=end_id)
    except Exception as exc:  # noqa: BLE001 -- handed to the main thread, which raises it
        with state.lock:
            state.error = state.error or exc
    finally:
        client.close()


def _one_request(client, worker: int, state: _RampState, deployment: Deployment, text: str, *, max_tokens, end_id) -> None:
    drafted = accepted = 0
    if deployment.stream:
        chunks = client.generate_stream(text, max_tokens=max_tokens, end_id=end_id)
    else:
        chunks = [client.generate(text, max_tokens=max_tokens, end_id=end_id)]
    for i, chunk in enumerate(chunks):
        now = time.perf_counter() - state.t0
        d, a = chunk.total_draft_tokens or 0, chunk.total_accepted_draft_tokens or 0
        event = StepEvent(now, worker, len(chunk.output_ids), d - drafted, a - accepted, first=i == 0)
        drafted, accepted = d, a
        with state.lock:
            state.events.append(event)
    with state.lock:
        state.finished.append(time.perf_counter() - state.t0)


def intervals_of(events: Sequence[StepEvent], finished: Sequence[float], levels: Sequence[int], step_s: float) -> list[RampInterval]:
    """One :class:`RampInterval` per step from the events that arrived in it (module docstring)."""
    out = []
    for i, level in enumerate(levels):
        lo, hi = i * step_s, (i + 1) * step_s
        inside = [e for e in events if lo <= e.t_s < hi]
        steps = [e for e in inside if not e.first]
        lens = Counter(e.drafted for e in steps)
        drafted = [e.drafted for e in steps]
        total_drafted = sum(drafted)
        acc = sum(e.accepted for e in steps) / total_drafted if total_drafted else None
        ci = ratio_of_sums_ci([e.accepted for e in steps if e.drafted], [e.drafted for e in steps if e.drafted]) if total_drafted else None
        tokens = sum(e.tokens for e in inside)
        out.append(RampInterval(
            index=i, concurrency=level, start_s=lo, end_s=hi, tokens=tokens, tokens_per_s=tokens / step_s, steps=len(steps),
            draft_len_mean=total_drafted / len(steps) if steps else None, draft_len_max=max(drafted) if steps else None,
            draft_lens=dict(sorted(lens.items())), acceptance_rate=acc, acceptance_ci=ci,
            requests_finished=sum(lo <= t < hi for t in finished),
        ))
    return out


def flag_intervals(intervals: Sequence[RampInterval], cliff_drop: float = CLIFF_DROP) -> None:
    """Add the cliff and re-enable flags (module docstring) to ``intervals``, in place.

    Example: tokens/s 100 at C=4 then 70 at C=8 -> "throughput cliff" on the C=8 interval (-30 %).
    """
    for prev, cur in zip(intervals, intervals[1:]):
        if cur.concurrency > prev.concurrency and prev.tokens_per_s > 0 and cur.tokens_per_s < (1 - cliff_drop) * prev.tokens_per_s:
            drop = 1 - cur.tokens_per_s / prev.tokens_per_s
            cur.flags.append(f"throughput cliff: {prev.tokens_per_s:.1f} -> {cur.tokens_per_s:.1f} tok/s (-{100 * drop:.0f}%) "
                             f"as load rose from C={prev.concurrency}")
    last_on: RampInterval | None = None
    off = False
    for iv in intervals:
        if iv.steps == 0:
            continue
        if not iv.speculating:
            off = off or last_on is not None
            continue
        if off and last_on is not None and last_on.acceptance_ci is not None and iv.acceptance_rate is not None:
            if iv.acceptance_rate < last_on.acceptance_ci[0]:
                iv.flags.append(f"acceptance after re-enabling {iv.acceptance_rate:.3f} is below the interval before it went "
                                f"off [{last_on.acceptance_ci[0]:.3f}, {last_on.acceptance_ci[1]:.3f}] (interval {last_on.index})")
        off, last_on = False, iv


def plot_ramp(report: RampReport, path: str | Path) -> Path:
    """A time series: total tokens/s with the load (top), derived draft length (middle), acceptance
    with its interval (bottom); flagged intervals marked in red."""
    try:
        import matplotlib
    except ImportError:
        raise BenchError("the ramp plot needs matplotlib: pip install 'specbuild[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ivs = report.intervals
    mid = [(iv.start_s + iv.end_s) / 2 for iv in ivs]
    edges = [iv.start_s for iv in ivs] + [ivs[-1].end_s] if ivs else []
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, sharex=True, figsize=(9, 7.5))
    ax1.stairs([iv.tokens_per_s for iv in ivs], edges, color="tab:blue", label="total tokens/s")
    ax1.set_ylabel("tokens/s (all requests)")
    load = ax1.twinx()
    load.stairs([iv.concurrency for iv in ivs], edges, color="gray", linestyle="--", label="concurrency")
    load.set_ylabel("requests in flight (target)")
    # headroom above the curves: the legends sit there, never over the first interval
    ax1.set_ylim(0, 1.4 * max([iv.tokens_per_s for iv in ivs] + [1e-9]))
    load.set_ylim(0, 1.4 * max([iv.concurrency for iv in ivs] + [1]))
    handles = ax1.get_legend_handles_labels()[0] + load.get_legend_handles_labels()[0]
    ax1.legend(handles, ["total tokens/s (left axis)", "requests in flight (right axis, dashed)"], loc="upper left", fontsize=8)
    ax2.stairs([iv.draft_len_mean or 0 for iv in ivs], edges, color="tab:green", label="mean (derived)")
    ax2.plot(mid, [iv.draft_len_max or 0 for iv in ivs], "^", color="tab:green", label="max (derived)")
    ax2.set_ylabel("draft tokens / step")
    ax2.set_ylim(0, 1.4 * max([iv.draft_len_max or 0 for iv in ivs] + [1]))
    ax2.legend(loc="upper right", fontsize=8)
    acc = [(m, iv) for m, iv in zip(mid, ivs) if iv.acceptance_rate is not None]
    ax3.plot([m for m, _ in acc], [iv.acceptance_rate for _, iv in acc], "o-", color="tab:orange")
    for m, iv in acc:
        if iv.acceptance_ci:
            ax3.vlines(m, *iv.acceptance_ci, color="tab:orange", alpha=0.5)
    ax3.set_ylabel("acceptance rate")
    ax3.set_xlabel("seconds")
    for m, iv in zip(mid, ivs):
        if iv.flags:
            for ax in (ax1, ax3):
                ax.axvspan(iv.start_s, iv.end_s, color="red", alpha=0.12)
    fig.suptitle(f"{report.deployment}: ramp {','.join(map(str, report.levels))} x {report.step_s:g} s")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ramp_table(report: RampReport):
    """A rich table: one row per interval."""
    from rich.table import Table

    t = Table(title=f"Ramp {report.deployment} (draft length derived from the engine's counters; flags: cliff = "
                    f">{100 * report.cliff_drop:.0f}% tok/s drop as load rises, re-enable = acceptance below the interval before)")
    # two-line headers and a compact interval: one line per interval at 80 columns
    for name in ("#", "C", "tok/s", "steps", "draft len\nmean", "\nmax", "acceptance\n[95% CI]", "done", "flags"):
        t.add_column(name, justify="left" if name == "flags" else "right")
    for iv in report.intervals:
        ci = f" [{iv.acceptance_ci[0]:.2f},{iv.acceptance_ci[1]:.2f}]" if iv.acceptance_ci else ""
        t.add_row(str(iv.index), str(iv.concurrency), f"{iv.tokens_per_s:.1f}", str(iv.steps),
                  "-" if iv.draft_len_mean is None else f"{iv.draft_len_mean:.2f}", "-" if iv.draft_len_max is None else str(iv.draft_len_max),
                  "-" if iv.acceptance_rate is None else f"{iv.acceptance_rate:.2f}{ci}", str(iv.requests_finished),
                  "[red]" + "; ".join(iv.flags) + "[/red]" if iv.flags else "")
    return t




def run_ramp_bench(targets: Sequence[str], *, levels: Sequence[int], step_s: float, prompt_sets: Sequence[str], max_tokens: int,
                   end_id: int | None, chat_template: str, console, results_dir: Path, output_root: Path | None = None,
                   timeout_s: float = 600.0, stream: bool | None = None, openai_urls: Sequence[str] = (),
                   openai_chat: bool = False, labels: Sequence[str] = (), **url_options) -> list[RampReport]:
    """``specbuild bench --ramp``: serve the recipe targets (decoupled, streamed), run the ramp on each
    target in turn with the prompts of ``prompt_sets`` (together), print a table per target and write
    ``ramp[-NAME].json`` / ``.png`` to ``results_dir``.

    Raises ``BenchError``, ``specbuild.builder.recipe.RecipeError``, ``specbuild.client.sdk.ClientError``.
    """
    from .plan import is_url, openai_deployments, url_deployments
    from .run import _tokenizer, prepare_prompts, serve_recipes

    if not targets and not openai_urls:
        raise BenchError("give at least one target: a recipe name or path, a running server's host:port, or --openai URL")
    urls = [t for t in targets if is_url(t)]
    recipes = [t for t in targets if not is_url(t)]
    openai = openai_deployments(openai_urls, labels=list(labels)[len(urls):], chat=openai_chat, stream=stream is not False,
                                tokenizer_dir=url_options.get("tokenizer_dir"))
    log = lambda message: console.print(f"[dim]{message}[/dim]")  # noqa: E731
    reports = []
    with serve_recipes(recipes, output_root=output_root, stream=stream is not False, log=log) as served:
        deployments = served + url_deployments(urls, stream=bool(stream), labels=list(labels)[: len(urls)], **url_options) + openai
        for deployment in deployments:
            tokenizer = _tokenizer(deployment) if chat_template != "never" else None
            prompts = [p for source in prompt_sets for p in prepare_prompts(source, deployment, chat_template, tokenizer)]
            report = run_ramp(deployment, prompts, levels=levels, step_s=step_s, max_tokens=max_tokens, end_id=end_id,
                              timeout_s=timeout_s, log=log)
            stem = "ramp" if len(deployments) == 1 else f"ramp-{_safe(deployment.name)}"
            path = report.write(results_dir, stem)
            console.print(ramp_table(report))
            for flag in report.flags:
                console.print(f"[red]flag:[/red] {deployment.name}: {flag}", highlight=False)
            console.print(f"note: {DRAFT_LEN_NOTE}")
            console.print(f"wrote {path} and {report.plot}")
            reports.append(report)
    return reports


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


__all__ = ["CLIFF_DROP", "RampInterval", "RampReport", "StepEvent", "flag_intervals", "intervals_of", "plot_ramp", "ramp_table",
           "run_ramp", "run_ramp_bench"]
