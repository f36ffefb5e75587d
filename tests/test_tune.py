"""specbuild tune's pure functions on hand-made points whose right answers are known by construction."""

from __future__ import annotations

import math

import pytest

from specbuild.tune import (
    Candidate,
    TuneError,
    analytic_comparison,
    draft_len_schedule,
    expected_speedup,
    expected_tokens_per_step,
    fit_acceptance,
    fit_cost_ratio,
    indistinguishable,
    pareto_front,
    per_position_from_sweep,
    plot_frontier,
    plot_speedup,
    recommend_highest_throughput,
    recommend_lowest_latency,
    tie_basis,
    tune,
)


def cand(latency, throughput, *, k=0, c=1, deployment="d", prompt_set="s"):
    return Candidate(deployment, "ngram", prompt_set, k, c, latency, throughput)


def point(k, c, *, tokens_per_step=1.0, step_ms=10.0, tpot_ms=10.0, accepted_per_step=0.0, latency=None,
          throughput=None, deployment="d", prompt_set="s"):
    """A bench point dict with only the fields the tuner reads."""
    return {
        "deployment": deployment, "method": "ngram", "prompt_set": prompt_set, "draft_len": k, "concurrency": c,
        "latency_ms_p50": latency if latency is not None else 100 * tpot_ms, "latency_ms_p90": 0.0,
        "latency_ms_p99": 0.0, "tpot_ms": tpot_ms, "total_tok_s": throughput if throughput is not None else c * 1000 / tpot_ms,
        "tokens_per_step": tokens_per_step, "step_ms": step_ms, "accepted_per_step": accepted_per_step,
    }


# --- Pareto frontier and recommendations ----------------------------------------------------------------


def test_pareto_front_keeps_exactly_the_undominated_points():
    a, b, dominated_by_a, dominated_by_b = cand(10, 5), cand(20, 9), cand(15, 4), cand(30, 9)
    assert pareto_front([dominated_by_b, a, dominated_by_a, b]) == [a, b]


def test_pareto_front_of_a_pure_trade_off_keeps_every_point_in_latency_order():
    points = [cand(lat, thr) for lat, thr in [(40, 10), (10, 1), (30, 8), (20, 5)]]
    assert [c.latency_ms for c in pareto_front(points)] == [10, 20, 30, 40]


def test_pareto_front_keeps_ties_and_drops_a_point_beaten_on_one_axis_only():
    twin1, twin2, worse = cand(10, 5, k=1), cand(10, 5, k=2), cand(10, 4)
    assert pareto_front([twin1, twin2, worse]) == [twin1, twin2]


def test_lowest_latency_at_a_concurrency_ignores_faster_points_elsewhere():
    best = cand(50, 10, k=2, c=4)
    cands = [cand(5, 1, c=1), cand(60, 12, k=0, c=4), best, cand(55, 30, k=4, c=4)]
    assert recommend_lowest_latency(cands, 4) == best


def test_lowest_latency_at_an_unmeasured_concurrency_lists_the_measured_ones():
    with pytest.raises(TuneError, match=r"concurrency 8; measured: \[1, 4\]"):
        recommend_lowest_latency([cand(1, 1, c=1), cand(2, 2, c=4)], 8)


def test_highest_throughput_under_a_bound_includes_the_bound_itself():
    at_bound = cand(100, 50)
    cands = [cand(10, 5), at_bound, cand(101, 99), cand(90, 40)]
    assert recommend_highest_throughput(cands, 100) == at_bound


def test_unmeetable_latency_bound_names_the_lowest_latency_measured():
    with pytest.raises(TuneError, match=r"lowest measured is 30 ms \(d k=2 C=1\)"):
        recommend_highest_throughput([cand(30, 1, k=2), cand(40, 2)], 20)


# --- draft-length schedule -----------------------------------------------------------------------------


def schedule_points(best_by_level):
    """Candidates whose lowest latency at each level is at the given draft length."""
    cands = []
    for level, best in best_by_level.items():
        for k in (0, 2, 4):
            cands.append(cand(10.0 if k == best else 20.0 + k, 1.0, k=k, c=level))
    return cands


def test_schedule_turns_speculation_off_above_the_last_level_where_it_wins():
    (s,) = draft_len_schedule(schedule_points({1: 4, 4: 2, 8: 0, 16: 0}))
    assert s.best == {1: 4, 4: 2, 8: 0, 16: 0}
    assert s.draft_len_schedule == {1: 4, 2: 2}  # batch 2-4: C=4's k (batch_thresholds)
    assert s.max_concurrency == 4


def test_schedule_is_always_on_when_the_top_level_still_speculates():
    (s,) = draft_len_schedule(schedule_points({1: 4, 4: 0, 8: 2}))
    assert s.max_concurrency is None
    assert s.draft_len_schedule == {1: 4, 2: 0, 5: 2}


def test_schedule_is_always_off_when_plain_decoding_wins_everywhere():
    (s,) = draft_len_schedule(schedule_points({1: 0, 4: 0}))
    assert (s.max_concurrency, s.draft_len_schedule) == (0, {})


def test_schedule_is_per_deployment_and_prompt_set():
    cands = schedule_points({1: 4}) + [
        Candidate("e", "lookahead", "s", k, 1, 10.0 if k == 2 else 30.0, 1.0) for k in (0, 2)
    ]
    assert {(s.deployment, s.best[1]) for s in draft_len_schedule(cands)} == {("d", 4), ("e", 2)}


# --- Leviathan et al. 2023 -----------------------------------------------------------------------------


@pytest.mark.parametrize("a", [0.05, 0.3, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_expected_tokens_per_step_is_the_closed_form(a, k):
    assert expected_tokens_per_step(a, k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))


def test_expected_tokens_per_step_limits():
    assert expected_tokens_per_step(0.0, 5) == 1.0  # every draft rejected: the bonus token only
    assert expected_tokens_per_step(1.0, 5) == 6.0  # every draft accepted: k + 1
    assert expected_tokens_per_step(0.5, 2) == 1.75
    assert expected_tokens_per_step(0.7, 0) == 1.0  # no drafts: plain decoding


def test_expected_speedup_is_tokens_per_step_over_step_cost():
    a, k, c = 0.8, 4, 0.05
    assert expected_speedup(a, k, c) == pytest.approx((1 - a**5) / ((1 - a) * (k * c + 1)))
    assert expected_speedup(a, k, 0.0) == pytest.approx(expected_tokens_per_step(a, k))  # free drafts
    assert expected_speedup(0.0, k, c) < 1.0  # nothing accepted, drafting costs: a slow-down


@pytest.mark.parametrize("bad", [(-0.1, 2, 0.0), (1.1, 2, 0.0), (0.5, -1, 0.0), (0.5, 2, -0.1)])
def test_model_rejects_out_of_range_arguments(bad):
    with pytest.raises(ValueError):
        expected_speedup(*bad)


@pytest.mark.parametrize("a", [0.0, 0.35, 0.7, 0.99])
def test_fit_acceptance_recovers_the_a_that_generated_the_data(a):
    data = [(k, expected_tokens_per_step(a, k)) for k in (1, 2, 3, 4)]
    assert fit_acceptance(data) == pytest.approx(a, abs=1e-5)


def test_fit_acceptance_inverts_one_point_exactly_and_needs_one():
    assert fit_acceptance([(0, 1.0), (2, 1.75)]) == pytest.approx(0.5, abs=1e-6)
    with pytest.raises(ValueError):
        fit_acceptance([(0, 1.0)])


def test_fit_cost_ratio_recovers_c():
    assert fit_cost_ratio([(1, 1.1), (2, 1.2), (4, 1.4)]) == pytest.approx(0.1)
    assert fit_cost_ratio([(2, 1.2), (4, 1.4)]) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        fit_cost_ratio([(0, 1.0)])


def synthetic_sweep(a, c, *, t0=10.0, batching_loss=1.0):
    """Points that obey the model at C=1; at C=4 the speculative gain is scaled by ``batching_loss``."""
    points = []
    for level, loss in ((1, 1.0), (4, batching_loss)):
        for k in (0, 1, 2, 4):
            tau = expected_tokens_per_step(a, k)
            step = t0 * (1 + c * k)
            speedup = 1 + (tau / (1 + c * k) - 1) * loss
            points.append(point(k, level, tokens_per_step=tau, step_ms=step, tpot_ms=t0 / speedup,
                                accepted_per_step=tau - 1))
    return points


def test_analytic_comparison_recovers_a_and_c_and_scores_a_model_exact_point_at_one():
    rows = analytic_comparison(synthetic_sweep(0.6, 0.1, batching_loss=0.5))
    assert {(r.draft_len, r.concurrency) for r in rows} == {(k, c) for k in (1, 2, 4) for c in (1, 4)}
    for r in rows:
        assert r.a == pytest.approx(0.6, abs=1e-5)
        assert r.c == pytest.approx(0.1)
        assert r.expected_speedup == pytest.approx(expected_speedup(0.6, r.draft_len, 0.1), rel=1e-4)
        if r.concurrency == 1:
            assert r.closeness == pytest.approx(1.0, rel=1e-4)
        else:  # half the gain was lost at C=4 by construction
            assert r.speedup - 1 == pytest.approx((r.expected_speedup - 1) * 0.5, rel=1e-3)
            assert r.closeness < 1.0


def test_analytic_comparison_clamps_a_negative_cost_ratio_to_zero():
    # Speculative steps measured faster than plain ones (noise): c would fit negative.
    points = [point(0, 1, step_ms=10.0), point(2, 1, tokens_per_step=1.5, step_ms=9.0, tpot_ms=6.0)]
    (row,) = analytic_comparison(points)
    assert row.c == 0.0
    assert row.expected_speedup == pytest.approx(row.expected_tokens_per_step)


def test_analytic_comparison_skips_groups_without_a_baseline():
    assert analytic_comparison([point(2, 1, tokens_per_step=1.5)]) == []


def test_per_position_acceptance_from_consecutive_draft_lengths():
    points = [point(0, 1), point(1, 1, accepted_per_step=0.6), point(2, 1, accepted_per_step=0.9)]
    (positions,) = per_position_from_sweep(points).values()
    assert positions == [(1, 1, pytest.approx(0.6)), (2, 2, pytest.approx(0.3))]


def test_per_position_acceptance_over_a_gap_is_the_mean_per_position():
    # Geometric acceptance 0.5: P(>= i) = 0.5^i, so accepted/step at k=1 is 0.5 and at k=3 is 0.875.
    points = [point(0, 1), point(1, 1, accepted_per_step=0.5), point(3, 1, accepted_per_step=0.875)]
    (positions,) = per_position_from_sweep(points).values()
    assert positions[1] == (2, 3, pytest.approx((0.25 + 0.125) / 2))


# --- tune() and the plots --------------------------------------------------------------------------------


def test_tune_recommends_per_prompt_set_and_records_unmeetable_goals():
    points = [
        point(0, 1, latency=100, throughput=10, prompt_set="chat"),
        point(2, 1, latency=60, throughput=16, prompt_set="chat"),
        point(0, 1, latency=900, throughput=2, prompt_set="summarize"),
    ]
    report = tune(points, goal="throughput", max_latency_ms=500)
    assert report.recommendations["chat"].draft_len == 2
    assert "summarize" in report.errors and "900 ms" in report.errors["summarize"]
    latency_report = tune(points, goal="latency")  # default concurrency: the lowest measured
    assert latency_report.recommendations["chat"].latency_ms == 60


def test_tune_needs_a_bound_for_the_throughput_goal():
    with pytest.raises(TuneError, match="--max-latency-ms"):
        tune([point(0, 1)], goal="throughput")
    with pytest.raises(TuneError, match="goal"):
        tune([point(0, 1)], goal="cheapest")


def test_plots_are_png_files(tmp_path):
    points = synthetic_sweep(0.6, 0.1, batching_loss=0.5)
    report = tune(points)
    for plot, name in ((plot_frontier, "frontier.png"), (plot_speedup, "speedup.png")):
        path = plot(points, report, tmp_path / name)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 10_000  # axes, points and labels, not an empty canvas
    assert not math.isnan(report.analytic[0].closeness)


def test_measured_per_position_is_taken_at_the_lowest_concurrency():
    from specbuild.tune import measured_per_position

    points = [
        point(2, 1) | {"per_position_acceptance": [0.5, 0.2]},
        point(2, 4) | {"per_position_acceptance": [0.9, 0.9]},
        point(0, 1) | {"per_position_acceptance": None},
    ]
    assert measured_per_position(points) == {("d", "s", 2): [0.5, 0.2]}


def test_schedule_ignores_gains_smaller_than_min_gain():
    cands = [cand(1000.0, 1.0, k=0, c=1), cand(980.0, 1.0, k=2, c=1), cand(1000.0, 1.0, k=0, c=4), cand(800.0, 1.0, k=2, c=4)]
    (noisy,) = draft_len_schedule(cands)
    assert noisy.best == {1: 2, 4: 2}
    (guarded,) = draft_len_schedule(cands, min_gain=0.05)  # 2 % at C=1 is within the margin, 20 % at C=4 is not
    assert guarded.best == {1: 0, 4: 2}
    assert guarded.max_concurrency is None


def test_tie_note_names_k0_as_the_simpler_choice_when_it_is_one():
    from specbuild.tune.report import tie_note

    best = cand(10.0, 100.0, k=4)
    assert tie_note(best, [cand(11.0, 95.0, k=2), cand(12.0, 90.0, k=0)]).endswith(
        "; the simpler choice is d k=0 C=1: speculation off")
    assert tie_note(best, [cand(11.0, 95.0, k=2)]).endswith("; the simpler choice is d k=2 C=1")
    assert tie_note(cand(10.0, 100.0, k=0), [cand(11.0, 95.0, k=2)]).endswith("prefer the simpler or cheaper one")


def test_repeated_small_sample_warnings_become_one_line():
    from specbuild.tune.report import summarize_warnings

    small = [f"ngram humaneval:8 k={k} C={c}: 16 requests (< 20): percentiles and intervals are rough" for k in (0, 2, 4) for c in (1, 2)]
    unstable = "ngram humaneval:8 k=0 C=2: unstable: a repeat's tokens/s is 20% from the mean (> 10%)"
    assert summarize_warnings(small + [unstable]) == [
        unstable, "6 points have 16 requests (< 20): percentiles and intervals are rough; raise --request-count or --repeats "
        "(tune.json lists them)"]
    assert summarize_warnings([unstable]) == [unstable]


def test_frontier_legend_matches_hollow_points_and_the_recommendation_rings_its_own_point(tmp_path, monkeypatch):
    import specbuild.tune.plots as plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, plt, path: figures.append(fig) or path)
    points = [p | {"small_sample": True} for p in synthetic_sweep(0.6, 0.1, batching_loss=0.5)]
    report = tune(points)
    plot_frontier(points, report, tmp_path / "frontier.png")
    ax = figures[0].axes[0]
    legend = {text.get_text(): handle for text, handle in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)}
    k_entries = [handle for label, handle in legend.items() if label.startswith("k=")]
    assert k_entries and all(h.get_markerfacecolor() == "white" for h in k_entries)  # every point is hollow: so are they
    labels = {a.get_text() for a in ax.texts}
    best = report.recommendations["s"]
    assert f"k={best.draft_len}, C={best.concurrency}" in labels
    ring = next(c for c in ax.collections if c.get_label().startswith("recommended"))
    at = ax.transData.transform((best.latency_ms, best.throughput))
    drawn = ring.get_offset_transform().transform(ring.get_offsets()[0])
    assert math.dist(at, drawn) < 1  # pixels: on the measured point (nc5: a star beside it read as a point of its own)
    assert (ring.get_facecolors()[:, 3] == 0).all()  # a hollow ring: the point stays visible inside it
    callout = next(a for a in ax.texts if a.get_text() == "recommended")  # a boxed word: not read as a data point (nc3 item 9)
    assert callout.get_bbox_patch() is not None and callout.xy == (best.latency_ms, best.throughput)


def test_speedup_plot_marks_not_significant_points(tmp_path, monkeypatch):
    import specbuild.tune.plots as plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, plt, path: figures.append(fig) or path)
    points = synthetic_sweep(0.6, 0.1, batching_loss=0.5)
    report = tune(points)
    import dataclasses

    row = report.analytic[0]
    report.analytic[0] = dataclasses.replace(row, speedup_ci=[row.speedup - 0.5, max(row.speedup, 1.0) + 0.5])  # contains 1.0
    plot_speedup(points, report, tmp_path / "speedup.png")
    texts = [t.get_text() for ax in figures[0].axes for t in ax.texts]
    assert texts.count("n.s.") == 1


def test_tune_tables_fit_80_columns_and_never_cut_a_name():
    from rich.console import Console

    from specbuild.tune import report_tables

    points = synthetic_sweep(0.6, 0.1, batching_loss=0.5)
    points = [p | {"deployment": "smollm2-lookahead-long", "prompt_set": "humaneval:8"} for p in points]
    report = tune(points)
    console = Console(width=80, record=True)
    for table in report_tables(report, width=console.width):
        console.print(table)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text and "smollm2-lookahead-long" in text and "draft_len_schedule" in text


# --- a disturbed baseline (issue 36) -----------------------------------------------------------------------


def disturbed_sweep():
    """k=0 measured on a slow machine at C=1: k=4's speed-up 3.12 at 1.41 tokens per step, k=2 plausible."""
    return [point(0, 1, tpot_ms=31.2), point(2, 1, tokens_per_step=1.3, tpot_ms=25.0, accepted_per_step=0.3),
            point(4, 1, tokens_per_step=1.41, tpot_ms=10.0, accepted_per_step=0.41),
            point(0, 2, tpot_ms=20.0), point(2, 2, tokens_per_step=1.3, tpot_ms=18.0, accepted_per_step=0.3),
            point(4, 2, tokens_per_step=1.41, tpot_ms=17.0, accepted_per_step=0.41)]


def test_a_speedup_above_its_tokens_per_step_flags_the_point_and_is_not_recommended():
    from specbuild.bench.stats import exceeds_speedup_bound

    assert exceeds_speedup_bound(3.12, 1.41) and not exceeds_speedup_bound(1.45, 1.41) and not exceeds_speedup_bound(None, 1.0)
    report = tune(disturbed_sweep())
    assert [(c.draft_len, c.concurrency) for c in report.disturbed] == [(4, 1)]
    assert report.recommendations["s"].draft_len != 4  # the fastest-looking point is the disturbed one
    assert any("baseline disturbed" in w for w in report.warnings)
    assert report.to_json()["baseline_disturbed"][0]["draft_len"] == 4
    # a level left unjudged gives no schedule (k=2 would be "best" at C=1 only because k=4 was set aside)
    assert report.schedules == [] and any("no draft_len_schedule" in w for w in report.warnings)
    row = next(r for r in report.analytic if (r.draft_len, r.concurrency) == (4, 1))
    from specbuild.tune.report import _speedup_text

    assert row.baseline_disturbed and "(disturbed)" in _speedup_text(row)


def test_no_recommendation_when_every_speculative_point_is_disturbed():
    """Without a judged speculative point, k=0 "wins" by default: tune says it cannot judge instead of
    advising to deploy without speculation (newcomer trial 7)."""
    from rich.console import Console

    from specbuild.tune.report import report_tables

    sweep = [point(0, 1, tpot_ms=31.2), point(2, 1, tokens_per_step=1.3, tpot_ms=10.0, accepted_per_step=0.3),
             point(4, 1, tokens_per_step=1.41, tpot_ms=9.0, accepted_per_step=0.41)]
    report = tune(sweep)
    assert "s" not in report.recommendations and "rerun with --repeats 3" in report.errors["s"]
    console = Console(width=80, record=True)
    for table in report_tables(report, width=80):
        console.print(table)
    text = " ".join(console.export_text().split())
    assert "no recommendation for s: every speculative point" in text and "…" not in text
    assert report.schedules == []
    # one judged speculative point is enough to recommend
    assert tune(sweep[:2] + [point(4, 1, tokens_per_step=1.41, tpot_ms=25.0, accepted_per_step=0.41)]).recommendations["s"]


def test_write_recipe_refuses_a_schedule_with_a_disturbed_baseline_unless_forced(tmp_path):
    from click.testing import CliRunner

    from specbuild.cli import main
    from specbuild.bench import PointResult, SweepPlan, SweepResult, summarize_point
    from specbuild.bench.run import RequestRecord, flag_disturbed_baseline

    def bench_point(k, c, latency_s, accepted):
        # 4 requests of 20 tokens; accepted drafts per request fix tokens per step
        records = [RequestRecord(f"p{i}", latency_s, 20, accepted, 4 * k, None) for i in range(4)]
        s = summarize_point(records, wall_s=4 * latency_s, draft_len=k, max_tokens=20)
        return PointResult(deployment="smollm2-ngram", method="ngram", prompt_set="humaneval:4", draft_len=k, concurrency=c, **s)

    points = []
    for c in (1, 2):
        level = [bench_point(0, c, 3.0 if c == 1 else 1.0, 0), bench_point(2, c, 0.9, 4), bench_point(4, c, 0.8, 6)]
        flag_disturbed_baseline(level)
        points += level
    assert [p.draft_len for p in points if p.baseline_disturbed] == [2, 4]  # at C=1 only: 3.0 s vs 0.9 s at ~1.3 tok/step
    assert all("rerun with --repeats 3" in n for p in points if p.baseline_disturbed for n in p.notes if "disturbed" in n)
    plan = SweepPlan(draft_lengths=(0, 2, 4), concurrencies=(1, 2), prompt_sets=("humaneval:4",))
    json_path, csv_path = SweepResult(plan, [], points).write(tmp_path / "bench")
    assert "baseline_disturbed" in csv_path.read_text().splitlines()[0]
    runner = CliRunner()
    out = tmp_path / "tuned.yaml"
    args = ["tune", "--from", str(json_path), "--results-dir", str(tmp_path / "tune"), "--write-recipe", str(out)]
    refused = runner.invoke(main, args)
    assert refused.exit_code == 2 and "--repeats 3" in refused.output and "--force" in refused.output, refused.output
    assert not out.exists()
    forced = runner.invoke(main, args + ["--force"])
    said = " ".join(forced.output.split())  # rich wraps at 80 columns
    assert "going on: --force" in said and "disturbed" in said  # then the usual answer: here no schedule to write


def test_write_recipe_starts_from_the_recipe_file_the_sweep_deployed(tmp_path):
    """A user's recipe file whose name: is not a file (nor a bundled recipe): bench.json records the path
    each recipe target was deployed from, and --write-recipe copies that file."""
    import yaml
    from click.testing import CliRunner

    from specbuild.bench import Deployment, PointResult, SweepPlan, SweepResult, summarize_point
    from specbuild.bench.run import RequestRecord
    from specbuild.builder.recipe import find_recipe
    from specbuild.cli import main

    mine = tmp_path / "recipes" / "mine.yaml"
    mine.parent.mkdir()
    mine.write_text(find_recipe("smollm2-ngram").read_text().replace("name: smollm2-ngram", "name: my-ngram"))

    def bench_point(k, c, latency_s, accepted):
        records = [RequestRecord(f"p{i}", latency_s, 20, accepted, 4 * k, None) for i in range(4)]
        s = summarize_point(records, wall_s=4 * latency_s, draft_len=k, max_tokens=20)
        return PointResult(deployment="my-ngram", method="ngram", prompt_set="humaneval:4", draft_len=k, concurrency=c, **s)

    points = [bench_point(0, 1, 1.0, 0), bench_point(2, 1, 0.7, 8), bench_point(4, 1, 0.75, 8),
              bench_point(0, 2, 1.0, 0), bench_point(2, 2, 1.3, 8), bench_point(4, 2, 1.5, 8)]
    plan = SweepPlan(draft_lengths=(0, 2, 4), concurrencies=(1, 2), prompt_sets=("humaneval:4",))
    deployment = Deployment("my-ngram", "127.0.0.1:8001", method="ngram", max_draft_len=4, recipe=str(mine))
    json_path, _ = SweepResult(plan, [deployment], points).write(tmp_path / "bench")
    out = tmp_path / "tuned.yaml"
    result = CliRunner().invoke(main, ["tune", "--from", str(json_path), "--results-dir", str(tmp_path / "tune"), "--write-recipe", str(out)])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(out.read_text())
    assert data["name"] == "my-ngram-scheduled" and data["build"]["draft_len_schedule"] == {1: 2}
    assert out.read_text().startswith("# my-ngram-scheduled: mine.yaml with the draft-length schedule")


def test_schedule_table_at_80_columns_keeps_names_and_schedules_whole_and_notes_below(tmp_path):
    from click.testing import CliRunner

    from specbuild.cli import main
    from specbuild.bench import PointResult, SweepPlan, SweepResult, summarize_point
    from specbuild.bench.run import RequestRecord

    def bench_point(deployment, prompt_set, k, c, latency_s, accepted):
        records = [RequestRecord(f"p{i}", latency_s + 0.01 * i, 20, accepted, 4 * k, None) for i in range(4)]
        s = summarize_point(records, wall_s=4 * latency_s, draft_len=k, max_tokens=20)
        return PointResult(deployment=deployment, method="ngram", prompt_set=prompt_set, draft_len=k, concurrency=c, **s)

    points = []
    for prompt_set in ("humaneval:4", "summarize:4"):
        for c in (1, 2):  # the lookahead deployment speculates at every level; plain ngram never pays
            points += [bench_point("smollm2-lookahead-long", prompt_set, k, c, t, a) for k, t, a in ((0, 1.0, 0), (2, 0.7, 6), (4, 0.8, 8))]
            points += [bench_point("smollm2-ngram-plain", prompt_set, k, c, t, a) for k, t, a in ((0, 1.0, 0), (2, 1.2, 1), (4, 1.3, 1))]
    plan = SweepPlan(draft_lengths=(0, 2, 4), concurrencies=(1, 2), prompt_sets=("humaneval:4", "summarize:4"))
    json_path, _ = SweepResult(plan, [], points).write(tmp_path / "bench")
    result = CliRunner().invoke(main, ["tune", "--from", str(json_path), "--results-dir", str(tmp_path / "tune")],
                                env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    table = result.output[result.output.index("Draft-length schedule"):result.output.index("The schedule in each engine")]
    assert max(len(line) for line in table.splitlines()) <= 80 and "…" not in table
    for word in ("smollm2-lookahead-long", "smollm2-ngram-plain", "humaneval:4", "summarize:4", "draft_len_schedule",
                 "max_concurrency", "1: 2, 2: 2", "always on", "always off"):
        assert word in table, word
    assert "note 1: smollm2-ngram-plain" in table  # why there is no schedule: below the table, not in a column


def test_tune_from_a_sweep_writes_beside_it_unless_told(tmp_path):
    """Two sweeps tuned one after the other keep both results (issue 36's second trial)."""
    import shutil
    from pathlib import Path

    from click.testing import CliRunner

    from specbuild.cli import main

    source = Path(__file__).parents[1] / "docs/results/2026-12-05-sa/bench.json"
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy(source, tmp_path / name / "bench.json")
        result = CliRunner().invoke(main, ["tune", "--from", str(tmp_path / name / "bench.json")])
        assert result.exit_code == 0, result.output
    assert (tmp_path / "a" / "tune" / "tune.json").is_file() and (tmp_path / "b" / "tune" / "tune.json").is_file()


def _nc3_points():
    """The third newcomer trial's shape (issue 36): p50 latency intervals of k=2 and k=4 overlap k=0's,
    while their speed-ups by time per output token lie well above 1."""
    def p(k, lat, ci, tpot, tokens_per_step):
        samples = [tpot * f for f in (0.8, 0.9, 1.0, 1.1, 1.2, 0.85, 0.95, 1.05)]
        return point(k, 1, tokens_per_step=tokens_per_step, tpot_ms=tpot, latency=lat) | {
            "ci": {"latency_ms_p50": ci}, "tpot_samples_ms": samples}
    return [p(0, 4900.0, [4600.0, 5150.0], 150.0, 1.0), p(2, 3800.0, [2500.0, 4900.0], 100.0, 1.5),
            p(4, 3665.0, [2195.0, 4766.0], 95.0, 1.7)]


def test_note_schedule_and_recommendation_apply_one_significance_test(tmp_path):
    from rich.console import Console

    from specbuild.tune.report import run_tune

    report = tune(_nc3_points())
    speedups = {r.draft_len: r.speedup_ci for r in report.analytic}
    assert speedups[4][0] > 1.0 and speedups[2][0] > 1.0  # both significantly faster by the speed-up test
    assert report.recommendations["s"].draft_len == 4
    # k=0 is not "not significantly different" although its p50 interval overlaps k=4's
    assert [c.draft_len for c in report.ties["s"]] == [2]
    assert report.tie_bases["s"] == ["speed-up intervals overlap"]
    assert report.schedules[0].best == {1: 4} and report.schedules[0].draft_len_schedule == {1: 4}
    assert report.to_json()["not_significantly_different"]["s"][0]["basis"] == "speed-up intervals overlap"
    console = Console(width=200, record=True)
    run_tune(_nc3_points(), tmp_path, console=console)
    note = next(line for line in console.export_text().splitlines() if line.startswith("note:"))
    assert "k=0" not in note and "speculation off" not in note
    assert note.endswith("not significantly different from d k=2 C=1 (speed-up intervals overlap); the simpler choice is d k=2 C=1")


def test_k0_is_tied_with_the_recommendation_exactly_when_the_schedule_leaves_speculation_off():
    base = Candidate("d", "ngram", "s", 0, 1, 4900.0, 1.0, latency_ci=[4600.0, 5150.0])
    k4 = Candidate("d", "ngram", "s", 4, 1, 3665.0, 1.0, latency_ci=[2195.0, 4766.0])
    for interval, tied in (([1.15, 2.59], False), ([0.95, 2.59], True)):
        ci = {("d", "s", 4, 1): interval}
        assert (indistinguishable(k4, [base, k4], "latency", ci) == [base]) is tied
        assert tie_basis(k4, base, ci) == ("speed-up interval contains 1" if tied else None)
        (s,) = draft_len_schedule([base, k4], speedup_ci=ci)
        assert s.best == {1: 0 if tied else 4}
    # without a speed-up interval the latency intervals decide, for the tie and the schedule alike
    assert tie_basis(k4, base) == "latency intervals overlap"
    (s,) = draft_len_schedule([base, k4])
    assert s.best == {1: 0}


def test_a_lookahead_schedule_runs_one_built_shape_or_plain():
    """A lookahead k is a shape (W, k + 1, G), not a draft length an iteration can switch to: the
    schedule builds the shape best at concurrency 1 and chooses between it and plain at each level;
    its entry is that shape's token budget (N - 2) + (W - 1 + G) * (N - 1)."""
    # k: 1 = (4, 2, 4), 2 = (4, 3, 4). Level 1: k=1 best; level 4: k=2 best, then k=1 beats plain;
    # level 8: k=2 best but plain beats k=1; level 16: plain
    lat = {1: {0: 30.0, 1: 10.0, 2: 20.0}, 4: {0: 30.0, 1: 20.0, 2: 10.0}, 8: {0: 20.0, 1: 30.0, 2: 10.0},
           16: {0: 10.0, 1: 20.0, 2: 30.0}}
    cands = [cand(v, 1.0, k=k, c=level, deployment="la") for level, row in lat.items() for k, v in row.items()]
    (plain,) = draft_len_schedule(cands)  # read as draft lengths, it would switch between shapes
    assert plain.best == {1: 1, 4: 2, 8: 2, 16: 0}
    (s,) = draft_len_schedule(cands, lookahead={"la": (4, 3, 4)})
    assert s.best == {1: 1, 4: 1, 8: 0, 16: 0} and s.lookahead_ngram == 2
    assert s.draft_len_schedule == {1: 7, 2: 7} and s.max_draft_len == 7 and s.max_concurrency == 4  # 0 + (4 - 1 + 4) * 1
    assert "(W, N, G) = (4, 2, 4)" in s.note
    (full,) = draft_len_schedule([replace_k(c) for c in cands], lookahead={"la": (4, 3, 4)})
    assert full.lookahead_ngram == 3 and full.draft_len_schedule == {1: 15, 2: 15}  # 1 + (4 - 1 + 4) * 2


def replace_k(c):
    """Swap the roles of k=1 and k=2."""
    import dataclasses

    return dataclasses.replace(c, draft_len={1: 2, 2: 1}.get(c.draft_len, c.draft_len))


def test_a_speculative_point_that_cannot_be_told_from_k0_is_not_recommended():
    """nc5: the recommendation said k=4, the schedule k=0 and the note "the simpler choice is k=0":
    one answer now. k=4 measured 5 % faster with overlapping intervals -> the recommendation is k=0,
    k=4 listed as not significantly faster."""
    from specbuild.tune.report import tie_note

    points = [point(0, 1, tpot_ms=10.0, latency=1000.0), point(4, 1, tpot_ms=9.5, latency=950.0, tokens_per_step=1.5)]
    for p in points:
        p["ci"] = {"latency_ms_p50": [900.0, 1100.0] if p["draft_len"] == 0 else [850.0, 1050.0]}
    report = tune(points, goal="latency", concurrency=1)
    (best,) = report.recommendations.values()
    assert best.draft_len == 0
    (ties,) = report.ties.values()
    assert [o.draft_len for o in ties] == [4]
    (schedule,) = report.schedules
    assert schedule.best == {1: 0}
    note = tie_note(best, ties)
    assert note.startswith("the recommendation is d k=0 C=1: speculation off; d k=4 C=1") and "not significantly" in note
