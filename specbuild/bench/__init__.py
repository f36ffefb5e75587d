"""``specbuild bench``: sweep deployments x draft lengths x concurrency levels x prompt sets.

One deployment per speculation method (a recipe started here, or a server already running at a url);
on each, every point of the grid::

    prompt set P  x  concurrency C (C requests in flight, closed loop)  x  draft length k (0 = off)

sends ``requests`` greedy requests (the prompts of P, cycled) from C worker threads, each with its own
client, measures each point's figures and cross-checks the server's acceptance outputs against the
client's own counts. The package, by concern:

    plan     targets and the grid (:class:`SweepPlan`, :class:`Deployment`), checked up front
    run      requests, points, the sweep, recipes served for it, the ``specbuild bench`` driver
    points   the figures of a point from its requests (each figure's definition)
    checks   the cross-checks (``problems``)
    stats    bootstrap intervals, goodput, small-sample flags (shared with ``specbuild tune``)
    report   ``bench.json`` / ``bench.csv`` / ``requests.jsonl``, the table and notes

Example::

    targets = [Deployment("ngram", "127.0.0.1:8001", method="ngram")]
    result = run_sweep(targets, SweepPlan(draft_lengths=(0, 2, 4), concurrencies=(1, 4)))
    result.write("bench-out")      # bench.json + bench.csv
"""

from .checks import COUNTERS, RATE_TOLERANCE, check_request, counter_problems, read_counters
from .plan import BenchError, Deployment, Load, SweepPlan, is_url, openai_deployments, sweep_size, url_deployments
from .points import (
    PointResult,
    acceptance_length_histogram,
    per_position_from_steps,
    percentile_ms,
    ratio_of_sums_ci,
    summarize_point,
)
from .report import CSV_COLUMNS, CSV_INTERVALS, SCHEMA_VERSION, SweepResult, load_label, load_result, notes, points_table, request_row
from .records import RequestRecord
from .run import (
    arrival_times,
    deployment_for_recipe,
    make_client,
    prepare_prompts,
    run_bench,
    run_point,
    run_sweep,
    serve_recipes,
    timed_request,
)

__all__ = [
    "COUNTERS", "CSV_COLUMNS", "CSV_INTERVALS", "RATE_TOLERANCE", "SCHEMA_VERSION", "BenchError", "Deployment", "Load",
    "PointResult", "RequestRecord", "SweepPlan", "SweepResult", "acceptance_length_histogram", "arrival_times",
    "check_request", "counter_problems", "deployment_for_recipe", "is_url", "load_label", "load_result", "make_client",
    "notes", "openai_deployments", "per_position_from_steps", "percentile_ms", "points_table", "prepare_prompts",
    "ratio_of_sums_ci", "read_counters", "request_row", "run_bench", "run_point", "run_sweep", "serve_recipes",
    "summarize_point", "sweep_size", "timed_request", "url_deployments",
]
