"""Statistics, workloads and the trust features of bench/tune, on data whose answers are known."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from specbuild.bench import RequestRecord, summarize_point
from specbuild.bench.stats import bootstrap_ci, clamp_probability, meets_slo, overlaps, parse_slo, ratio_ci
from specbuild.prompts import PromptSourceError, expand_prompt_sets, load_prompts, load_specbench, synthetic_prompts
from specbuild.tune import Candidate, indistinguishable, per_position_from_sweep, per_position_warnings, tune


def test_bootstrap_interval_covers_the_mean_and_narrows_with_more_data():
    rng = np.random.default_rng(3)
    small = rng.normal(10.0, 2.0, 10)
    large = rng.normal(10.0, 2.0, 1000)
    lo_s, hi_s = bootstrap_ci(small)
    lo_l, hi_l = bootstrap_ci(large)
    assert lo_s <= small.mean() <= hi_s and lo_l <= 10.0 <= hi_l
    assert hi_l - lo_l < (hi_s - lo_s) / 3
    assert bootstrap_ci([5.0]) is None and bootstrap_ci([2.0, 2.0, 2.0]) == [2.0, 2.0]


def test_ratio_interval_excludes_one_only_for_a_real_speedup():
    rng = np.random.default_rng(4)
    base = rng.normal(10.0, 1.0, 50)  # time per token, k = 0
    faster = rng.normal(5.0, 0.5, 50)  # 2x
    same = rng.normal(10.0, 1.0, 50)
    lo, hi = ratio_ci(base, faster)
    assert 1.7 < lo < 2.0 < hi < 2.3
    lo, hi = ratio_ci(base, same)
    assert lo < 1.0 < hi


def test_slo_parsing_and_goodput_rule():
    assert parse_slo("ttft=500, tpot=50") == {"ttft": 500.0, "tpot": 50.0}
    assert parse_slo("") == {}
    for bad in ("latency=5", "ttft", "ttft=x", "tpot=-1"):
        with pytest.raises(ValueError, match="slo"):
            parse_slo(bad)
    slo = {"ttft": 100.0, "e2el": 1000.0}
    assert meets_slo(ttft_ms=90, tpot_ms=999, e2el_ms=900, slo=slo)
    assert not meets_slo(ttft_ms=110, tpot_ms=1, e2el_ms=900, slo=slo)


def test_probabilities_outside_zero_one_are_clamped_with_a_reason():
    assert clamp_probability(0.4, "x") == (0.4, None)
    value, reason = clamp_probability(-0.08, "ngram chat positions 3-4")
    assert value == 0.0 and "-0.080" in reason and "unreliable" in reason
    # accepted per step fell from k=2 to k=4: the derived P for positions 3-4 is -0.05 -> 0, flagged
    points = [{"deployment": "d", "prompt_set": "s", "draft_len": k, "concurrency": 1, "accepted_per_step": a}
              for k, a in ((0, 0.0), (2, 0.9), (4, 0.8))]
    assert per_position_from_sweep(points)[("d", "s")] == [(1, 2, 0.45), (3, 4, 0.0)]
    (warning,) = per_position_warnings(points)
    assert "positions 3-4" in warning and "-0.050" in warning


def test_overlapping_intervals_make_configurations_indistinguishable():
    best = Candidate("d", "ngram", "s", 2, 1, 100.0, 10.0, latency_ci=[90.0, 110.0])
    close = Candidate("d", "ngram", "s", 4, 1, 105.0, 10.0, latency_ci=[95.0, 120.0])
    far = Candidate("d", "ngram", "s", 0, 1, 130.0, 8.0, latency_ci=[120.0, 140.0])
    other_level = Candidate("d", "ngram", "s", 0, 4, 101.0, 30.0, latency_ci=[95.0, 105.0])
    assert indistinguishable(best, [best, close, far, other_level], "latency") == [close]
    assert overlaps([1, 2], [2, 3]) and not overlaps([1, 2], None)


def rec(latency, tokens, *, repeat=0, ttft=None, steps=None, accepted=0, drafts=0):
    chunk_times = None
    if steps is not None:
        gaps = np.linspace(ttft, latency, len(steps))
        chunk_times = tuple(float(t) for t in gaps)
    return RequestRecord("p", latency, tokens, accepted, drafts, accepted / drafts if drafts else None, ttft_s=ttft,
                         step_tokens=tuple(steps) if steps else None, chunk_times_s=chunk_times, repeat=repeat)


def test_repeats_pool_requests_and_average_run_figures_with_intervals():
    records = [rec(1.0, 10, repeat=0), rec(1.0, 10, repeat=0), rec(2.0, 10, repeat=1), rec(2.0, 10, repeat=1)]
    s = summarize_point(records, wall_s=[1.0, 2.0], draft_len=0, max_tokens=10, slo="e2el=1500")
    assert s["repeats"] == 2 and s["repeat_total_tok_s"] == [20.0, 10.0] and s["total_tok_s"] == 15.0
    assert s["request_throughput"] == pytest.approx((2 / 1 + 2 / 2) / 2)
    assert s["goodput"] == pytest.approx((2 / 1 + 0 / 2) / 2)  # the second repeat's requests miss 1.5 s
    assert s["ci"]["total_tok_s"] == [10.0, 20.0]  # two values: the bootstrap means lie between them
    assert s["small_sample"] and s["unstable"] and any("unstable" in n for n in s["notes"])


def test_streamed_figures_ttft_itl_and_the_acceptance_histogram():
    # k = 2: prefill chunk of 1 token, then steps of 3, 1, 2 tokens (accepted 2, 0, 1)
    r = rec(0.4, 7, ttft=0.1, steps=[1, 3, 1, 2], accepted=3, drafts=6)
    s = summarize_point([r, r], wall_s=1.0, draft_len=2, max_tokens=7)
    assert s["ttft_ms_p50"] == pytest.approx(100.0) and s["itl_ms_p50"] == pytest.approx(100.0)
    assert s["tpot_ms"] == pytest.approx(50.0)  # (0.4 - 0.1) / 6
    assert s["acceptance_length_histogram"] == [2, 2, 2]  # steps emitting 1, 2, 3 tokens
    assert s["tokens_per_step"] == pytest.approx(2.0) and not s["problems"]


def test_synthetic_prompts_have_the_asked_lengths():
    prompts = synthetic_prompts("synthetic:200:in=50,out=20,in_std=10,out_std=5,seed=1")
    ins = np.array([len(p.text.split()) for p in prompts])
    outs = np.array([p.max_tokens for p in prompts])
    assert abs(ins.mean() - 50) < 2.5 and abs(ins.std() - 10) < 2 and abs(outs.mean() - 20) < 1.5 and outs.min() >= 1
    assert [p.text for p in prompts] == [p.text for p in load_prompts("synthetic:200:in=50,out=20,in_std=10,out_std=5,seed=1")]
    fixed = synthetic_prompts("synthetic:3")
    assert all(len(p.text.split()) == 128 and p.max_tokens == 64 for p in fixed)
    with pytest.raises(PromptSourceError, match="unknown setting"):
        synthetic_prompts("synthetic:3:length=5")


@pytest.mark.parametrize("spec, says", [
    ("synthetic:2:seed=-1", "seed=-1 is out of range"), ("synthetic:2:seed=nan", "seed='nan' is not an integer"),
    ("synthetic:2:seed=inf", "not an integer"), ("synthetic:2:in=nan", "in=nan is out of range"),
    ("synthetic:2:in=inf", "in=inf is out of range"), ("synthetic:2:in_std=-1", "in_std=-1 is out of range"),
    ("synthetic:3:in=-1,out=0", "in=-1 is out of range"), ("synthetic:2:seed=1.5", "seed='1.5' is not an integer"), ("synthetic:2:in=1e9", "in=1e9 is out of range"),
    ("synthetic:1000:in=1000000", "more than 100,000,000 tokens"), ("synthetic:0", "N in 1..1,000,000"),
])
def test_synthetic_settings_out_of_range_are_named_before_any_work(spec, says):
    """A seed of -1 or NaN, an infinite or negative length, or a set of a billion tokens: a PromptSourceError
    naming the setting and its range (plan, verify and bench report it as bad input), not a numpy traceback
    or minutes of allocation."""
    with pytest.raises(PromptSourceError, match=re.escape(says)):
        load_prompts(spec)


def test_synthetic_settings_written_as_before_still_read():
    assert [p.max_tokens for p in synthetic_prompts("synthetic:2:seed=1.0,out=0.5,in=4")] == [1, 1]
    assert synthetic_prompts("synthetic:2:seed=1.0,in=4")[0].text == synthetic_prompts("synthetic:2:seed=1,in=4")[0].text


def test_synthetic_prompts_are_exact_in_tokens_with_a_tokenizer(tiny_checkpoint):
    from specbuild.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_checkpoint))
    lengths = [len(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in synthetic_prompts("synthetic:5:in=40", tokenizer)]
    assert all(abs(n - 40) <= 2 for n in lengths), lengths  # re-tokenizing the cut text may merge a token or two


def test_specbench_loader_reads_tasks_from_a_local_question_file(tmp_path, monkeypatch):
    lines = [{"question_id": i, "category": c, "turns": [f"{c} question {i}", "follow-up"]}
             for i, c in enumerate(["writing", "coding", "translation", "translation", "qa", "rag", "math_reasoning", "summarization"])]
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    monkeypatch.setenv("SPECBUILD_SPECBENCH", str(path))
    mt = load_prompts("specbench:mt_bench")
    assert [p.id for p in mt] == ["specbench/writing/0", "specbench/coding/1"] and mt[0].text == "writing question 0"
    assert len(load_prompts("specbench:translation:1")) == 1
    assert expand_prompt_sets(["specbench:2", "chat:3"]) == tuple(f"specbench:{t}:2" for t in
                                                                ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")) + ("chat:3",)
    with pytest.raises(PromptSourceError, match="TASK one of"):
        load_prompts("specbench:poetry")
    with pytest.raises(PromptSourceError, match="no Spec-Bench question file"):
        load_specbench("specbench:qa", tmp_path / "missing.jsonl")


def test_bundled_specbench_has_every_task_with_80_first_turns(monkeypatch):
    monkeypatch.delenv("SPECBUILD_SPECBENCH", raising=False)
    for task in ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"):
        prompts = load_prompts(f"specbench:{task}")
        assert len(prompts) == 80 and all(p.text.strip() for p in prompts), task
        assert len({p.id for p in prompts}) == 80
    assert load_prompts("specbench:translation:2")[0].text.startswith("Translate German to English:")


def test_tune_reports_ties_and_flags():
    points = [
        {"deployment": "d", "method": "ngram", "prompt_set": "s", "draft_len": k, "concurrency": 1, "latency_ms_p50": lat,
         "latency_ms_p90": lat, "latency_ms_p99": lat, "tpot_ms": lat / 10, "total_tok_s": 1000 / lat, "tokens_per_step": 1 + k / 10,
         "step_ms": 10.0, "accepted_per_step": k / 10, "ci": {"latency_ms_p50": [lat - 8, lat + 8]}, "small_sample": True,
         "notes": ["6 requests (< 20): percentiles and intervals are rough"]}
        for k, lat in ((0, 120.0), (2, 100.0), (4, 104.0))
    ]
    report = tune(points)
    assert report.recommendations["s"].draft_len == 2
    assert [c.draft_len for c in report.ties["s"]] == [4]
    assert len([w for w in report.warnings if "rough" in w]) == 3
    assert report.to_json()["not_significantly_different"]["s"][0]["draft_len"] == 4


def test_paired_ratio_is_the_geometric_mean_of_the_pairs_and_refuses_unpaired_input():
    from specbuild.bench.stats import paired_ratio

    ratio, ci = paired_ratio([90.0, 45.0], [100.0, 50.0])  # the same 0.9 in both pairs: no spread
    assert ratio == pytest.approx(0.9) and ci == pytest.approx([0.9, 0.9])
    assert paired_ratio([2.0], [1.0]) == (pytest.approx(2.0), None)
    with pytest.raises(ValueError, match="pairs"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        paired_ratio([0.0, 1.0], [1.0, 1.0])
