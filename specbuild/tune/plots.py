"""PNG plots of a tune report: the throughput-latency frontier and the speed-up against concurrency
(matplotlib, ``pip install 'specbuild[bench]'``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .analysis import TuneError, TuneReport, candidates


def _separate_labels(ax, labels: list, group: Sequence) -> None:
    """Move the point labels apart where they overlap each other or the points (adjustText), each
    tied to its point by a thin line when moved."""
    from adjustText import adjust_text

    if labels:
        adjust_text(labels, x=[c.latency_ms for c in group], y=[c.throughput for c in group], ax=ax,
                    arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.4})


def plot_frontier(points: Sequence, report: TuneReport, path: str | Path) -> Path:
    """PNG: total output tokens/s vs latency, one panel per prompt set.

    Every measured point is drawn (colour: deployment and its method, marker: draft length k; hollow:
    fewer requests than its percentiles need) with its 95 % intervals as error bars and labelled
    ``k=4, C=1`` (or ``k=4, 2/s``); the legend draws the markers as the points are drawn. The
    frontier is the staircase through the points no other point beats on both axes (only points that
    exist; a step, not a straight line, between them); the recommendation is a gold ring around its
    own point with the boxed word "recommended" under it (nothing drawn where no point was measured).
    Both axes start at zero.
    """
    plt = _pyplot()

    cands = candidates(points, report.latency_metric)
    sets = sorted({c.prompt_set for c in cands})
    deployments = sorted({c.deployment for c in cands})
    colors = {d: f"C{i}" for i, d in enumerate(deployments)}
    markers = dict(zip(sorted({c.draft_len for c in cands}), "os^Dv<>ph*"))
    fig, axes = plt.subplots(1, len(sets), figsize=(7 * len(sets), 5.5), squeeze=False)
    for ax, prompt_set in zip(axes[0], sets):
        group = [c for c in cands if c.prompt_set == prompt_set]
        labels = []
        for c in group:
            xerr = _err(c.latency_ms, c.latency_ci)
            yerr = _err(c.throughput, c.throughput_ci)
            ax.errorbar(c.latency_ms, c.throughput, xerr=xerr, yerr=yerr, color=colors[c.deployment],
                        marker=markers[c.draft_len], ms=8, capsize=2, lw=0.8, elinewidth=0.8, mew=1.6,
                        mfc="white" if c.small_sample else colors[c.deployment], zorder=3)
            labels.append(ax.text(c.latency_ms, c.throughput, f"k={c.draft_len}, {c.load}", fontsize=6.5,
                                  color=colors[c.deployment], ha="left", va="bottom"))
        front = report.frontiers.get(prompt_set, [])
        if front:
            xs = [c.latency_ms for c in front]
            ys = [c.throughput for c in front]
            ax.step(xs, ys, where="post", color="k", lw=1.2, ls="--", label="frontier (measured points only)")
            ax.scatter(xs, ys, s=160, facecolors="none", edgecolors="k", lw=1.2, zorder=3)
        recommended = report.recommendations.get(prompt_set)
        if recommended is not None:  # a gold ring around the point itself (no marker of its own elsewhere)
            ax.scatter([recommended.latency_ms], [recommended.throughput], s=520, facecolors="none", edgecolors="gold",
                       lw=3.0, zorder=4, label=f"recommended: {recommended.label}")
            ax.annotate("recommended", (recommended.latency_ms, recommended.throughput), xytext=(0, -20), textcoords="offset points",
                        ha="center", va="top", fontsize=7, zorder=5,
                        bbox={"boxstyle": "round,pad=0.25", "fc": "lightyellow", "ec": "0.4", "lw": 0.6})
        ax.set_xlim(left=0)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        _separate_labels(ax, labels, group)
        ax.set_title(f"{prompt_set}")
        ax.set_xlabel(f"request latency {report.latency_metric} (ms)  (lower is better)")
        ax.set_ylabel("total output tokens/s  (higher is better)")
        ax.grid(alpha=0.3)
        methods = {c.deployment: c.method for c in cands}
        for d in deployments:  # colour swatches: the marker shape is the draft length's alone
            ax.plot([], [], color=colors[d], lw=6, label=d if methods[d] in (d, "unknown") or methods[d] in d else f"{d} ({methods[d]})")
        hollow = all(c.small_sample for c in group)
        for k, m in markers.items():
            ax.plot([], [], color="grey", marker=m, ls="", mew=1.6, mfc="white" if hollow else "grey",
                    label=f"k={k}" + (" (speculation off)" if k == 0 else ""))
        if hollow:
            ax.plot([], [], ls="", label="(all hollow: < 20 requests per point)")
        elif any(c.small_sample for c in group):
            ax.plot([], [], color="grey", marker="o", mfc="white", mew=1.6, ls="", label="hollow: < 20 requests")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Throughput vs latency per load level\n(error bars: 95% bootstrap intervals; dashed: the frontier)")
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_speedup(points: Sequence, report: TuneReport, path: str | Path) -> Path:
    """PNG: speed-up vs k = 0 (time per output token) against concurrency, one panel per deployment
    (rows: prompt sets). Measured speed-ups are lines with their 95 % intervals, a point whose
    interval contains 1.0 (not significantly different from k = 0) drawn hollow and marked ``n.s.``;
    Leviathan et al.'s expectation for the fitted (a, c) is drawn as hollow diamonds of the same
    colour; 1.0 (no gain) is the black line and the y axis starts at zero."""
    plt = _pyplot()
    rows_all = report.analytic + report.open_loop  # open-loop rows: x is the arrival rate, no model markers
    sets = sorted({r.prompt_set for r in rows_all}) or ["(no speculative points)"]
    deployments = sorted({(r.deployment, r.request_rate is not None) for r in rows_all}) or [("-", False)]
    fig, axes = plt.subplots(len(sets), len(deployments), figsize=(max(8.0, 6.5 * len(deployments)), 4.8 * len(sets)),
                             squeeze=False)
    for i, prompt_set in enumerate(sets):
        for j, (deployment, open_loop) in enumerate(deployments):
            ax = axes[i][j]
            rows = [r for r in rows_all if r.prompt_set == prompt_set and r.deployment == deployment
                    and (r.request_rate is not None) == open_loop]
            level = (lambda r: r.request_rate) if open_loop else (lambda r: r.concurrency)
            ks = sorted({r.draft_len for r in rows})
            for n, k in enumerate(ks):
                line = sorted((r for r in rows if r.draft_len == k), key=level)
                dodge = 1.0 + 0.05 * (n - (len(ks) - 1) / 2)  # side by side at each level (log axis)
                xs = [level(r) * dodge for r in line]
                ys = [r.speedup for r in line]
                errors = [_err(r.speedup, r.speedup_ci) for r in line]
                yerr = None if any(e is None for e in errors) else [[e[0][0] for e in errors], [e[1][0] for e in errors]]
                ax.errorbar(xs, ys, yerr=yerr, marker="o", color=f"C{n}", capsize=3, label=f"k={k} measured")
                for x, r in zip(xs, line):
                    if _not_significant(r):
                        ax.plot([x], [r.speedup], ls="", marker="o", mfc="white", mec=f"C{n}", mew=1.5, zorder=4)
                        ax.annotate("n.s.", (x, r.speedup), textcoords="offset points", xytext=(5, -10), fontsize=7, color=f"C{n}")
                if not open_loop:
                    ax.plot(xs, [r.expected_speedup for r in line], ls="", marker="D", mfc="none", mec=f"C{n}", ms=8,
                            label=f"k={k} expected (Leviathan et al.)")
            ax.axhline(1.0, color="k", lw=0.8)
            levels = sorted({level(r) for r in rows})
            if levels:
                ax.set_xscale("log", base=2)
                ax.set_xticks(levels, [f"{x:g}" for x in levels])
                ax.minorticks_off()
            top = max([1.2] + [r.speedup for r in rows] + [r.expected_speedup for r in rows]
                      + [r.speedup_ci[1] for r in rows if r.speedup_ci])
            ax.set_ylim(0, top * 1.1)
            ax.set_title(f"{deployment} -- {prompt_set}" + (" (open loop)" if open_loop else ""), fontsize=10)
            ax.set_xlabel("arrival rate (requests/s)" if open_loop else "concurrency (requests in flight)")
            ax.set_ylabel("speed-up vs k=0 (time per output token)")
            ax.grid(alpha=0.3)
            if any(_not_significant(r) for r in rows):
                ax.plot([], [], ls="", marker="o", mfc="white", mec="grey", mew=1.5, label="hollow, n.s.: interval contains 1.0")
            if rows:
                ax.legend(fontsize=7)
    model = any(r.request_rate is None for r in rows_all)
    fig.suptitle("Speed-up over speculation off\nmeasured (95% intervals)"
                 + (" vs the analytic expectation (hollow diamonds)" if model else ""))
    fig.tight_layout()
    return _save(fig, plt, path)


def _not_significant(row) -> bool:
    """The speed-up's 95 % interval contains 1.0: not significantly different from speculation off."""
    return row.speedup_ci is not None and row.speedup_ci[0] <= 1.0 <= row.speedup_ci[1]


def _err(value: float, interval: list[float] | None):
    """matplotlib's asymmetric error ``[[below], [above]]`` from an interval; None without one."""
    if interval is None:
        return None
    return [[max(0.0, value - interval[0])], [max(0.0, interval[1] - value)]]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise TuneError("plots need matplotlib: pip install 'specbuild[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, plt, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
