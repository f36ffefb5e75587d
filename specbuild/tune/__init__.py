"""``specbuild tune``: pick a method and draft length from a bench sweep.

From the points of :mod:`specbuild.bench` (one per deployment x prompt set x concurrency x
draft length) this package computes, per prompt set (a workload):

- the throughput-latency Pareto frontier (:func:`pareto_front`): points no other point beats on both
  total output tokens/s (higher is better) and latency (lower is better);
- a recommendation for a stated goal: the lowest latency at concurrency C
  (:func:`recommend_lowest_latency`), or the highest throughput under a latency bound
  (:func:`recommend_highest_throughput`);
- a draft-length schedule by concurrency per deployment (:func:`draft_len_schedule`), in TensorRT-LLM's
  terms: ``draft_len_schedule`` {batch-size threshold: draft length} (a batch of b requests uses the
  entry of the largest threshold <= b), valid by TensorRT-LLM's own rules
  (:mod:`specbuild.util.draft_len_schedule`), and ``max_concurrency`` (speculation off above it);
- the analytic expectation of Leviathan et al. 2023 (:func:`analytic_comparison`) and how close each
  point comes to it;
- PNG plots of the frontier and of speed-up vs concurrency per method (:func:`plot_frontier`,
  :func:`plot_speedup`).

By concern: ``analysis`` (frontier, recommendations, schedule, :func:`tune`), ``analytic`` (the
model and per-position acceptance), ``plots``, ``report`` (tables, :func:`run_tune`). The pure
functions take plain data and are unit-tested on hand-made points.
"""

from .analysis import (
    LATENCY_METRICS,
    Candidate,
    Schedule,
    TuneError,
    TuneReport,
    candidates,
    dominates,
    draft_len_schedule,
    indistinguishable,
    pareto_front,
    point_warnings,
    recommend_highest_throughput,
    recommend_lowest_latency,
    tie_basis,
    tune,
)
from .analytic import (
    AnalyticRow,
    analytic_comparison,
    expected_speedup,
    expected_tokens_per_step,
    fit_acceptance,
    fit_cost_ratio,
    measured_per_position,
    open_loop_speedups,
    per_position_from_sweep,
    per_position_warnings,
)
from .plots import plot_frontier, plot_speedup
from .report import per_position_table, report_tables, run_tune

__all__ = [
    "LATENCY_METRICS", "AnalyticRow", "Candidate", "Schedule", "TuneError", "TuneReport", "analytic_comparison",
    "candidates", "dominates", "draft_len_schedule", "expected_speedup", "expected_tokens_per_step", "fit_acceptance",
    "fit_cost_ratio", "indistinguishable", "measured_per_position", "open_loop_speedups", "pareto_front",
    "per_position_from_sweep", "per_position_table", "per_position_warnings", "plot_frontier", "plot_speedup",
    "point_warnings", "recommend_highest_throughput", "recommend_lowest_latency", "report_tables", "run_tune", "tie_basis", "tune",
]
