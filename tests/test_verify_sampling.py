"""Sampling verification: the two-sample chi-square tests, their power, and the whole check through a
real tritonserver, which must pass on a correct deployment and FAIL on one serving a wrong rule.

The end-to-end part serves a draft-target deployment whose draft is the tiny target with noise on
its weights (q close to p but not equal: drafts are accepted and rejected, so both the acceptance
test and the residual distribution matter), once correct and once per wrong rule, served by the
test-only model of tests/fault_injection.py.
"""

from __future__ import annotations

import json

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from fake_client import ReadyClient
from fault_injection import WARNING
from specbuild.client.prompts import Prompt
from specbuild.client.sampling import (
    SamplingSettings,
    describe_sampling_report,
    homogeneity_test,
    min_detectable_w,
    verify_sampling,
)

pytest.importorskip("scipy.stats", reason="the sampling verification needs scipy (pip install scipy)")


def draws(probs, n, seed):
    return np.random.default_rng(seed).choice(len(probs), size=n, p=probs).tolist()


# --- the statistics ------------------------------------------------------------------------------


def test_same_distribution_passes_and_a_shift_is_rejected():
    p = [0.4, 0.3, 0.2, 0.1]
    shifted = [0.3, 0.3, 0.2, 0.2]  # total variation 0.1
    same = [homogeneity_test(draws(p, 2000, s), draws(p, 2000, 100 + s), alpha=0.01) for s in range(20)]
    assert sum(t.rejected for t in same) <= 2  # ~1% false alarms expected
    different = homogeneity_test(draws(p, 2000, 1), draws(shifted, 2000, 2), alpha=0.01)
    assert different.rejected and different.df == 3
    assert different.observed_tv == pytest.approx(0.1, abs=0.03)


def test_docstring_example_numbers():
    t = homogeneity_test([1] * 50 + [2] * 50, [1] * 80 + [2] * 20, alpha=0.01)
    assert (t.df, round(t.statistic, 1), t.rejected, round(t.observed_tv, 2)) == (1, 19.8, True, 0.3)
    assert min_detectable_w(1000, 2, alpha=0.01 / 5, power=0.8) == pytest.approx(0.134, abs=0.001)


def test_a_shift_of_the_minimum_detectable_effect_is_caught_with_the_stated_power():
    """The reported detectable TV is a promise: differences that large are found >= 80% of the time."""
    n, alpha = 400, 0.01
    w = min_detectable_w(2 * n, 1, alpha=alpha, power=0.8)
    p, q = [0.5, 0.5], [0.5 + w, 0.5 - w]  # two categories: TV = w (equal arms)
    caught = [homogeneity_test(draws(p, n, s), draws(q, n, 1000 + s), alpha=alpha).rejected for s in range(200)]
    assert np.mean(caught) >= 0.72  # 0.8 up to Monte-Carlo error (sd ~0.03)
    assert min_detectable_w(8 * n, 1, alpha=alpha, power=0.8) == pytest.approx(w / 2, rel=0.01)  # ~ 1/sqrt(N)


def test_rare_categories_are_pooled_and_one_category_has_no_power():
    rare = homogeneity_test(["a"] * 90 + list("bcdefghijk"), ["a"] * 95 + list("bcdef"))
    assert rare.num_categories <= 2  # the ten rare tokens pooled, not ten cells with expected count ~0.5
    constant = homogeneity_test(["a"] * 30, ["a"] * 30)
    assert (constant.df, constant.p_value, constant.rejected) == (0, 1.0, False)
    assert math.isinf(constant.min_detectable_tv)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_samples": 1}, "num_samples"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"num_draft_tokens": 0}, "num_draft_tokens=0"),
        ({"alpha": 1.5}, "alpha"),
        ({"positions": 0}, "positions"),
    ],
)
def test_settings_are_checked(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingSettings(**fields)


def test_empty_arm_is_an_error():
    with pytest.raises(ValueError, match="both arms need samples"):
        homogeneity_test([], [1, 2])


# --- through a real server, with and without a wrong acceptance rule -----------------------------


def test_wrong_rules_live_in_a_test_only_model(tmp_path):
    """The faulty repository differs from the shipped one only in its tensorrt_llm model.py, which
    wraps the shipped model; the installed package has no fault switch."""
    import importlib.util

    from fault_injection import faulty_repository

    shipped = tmp_path / "repo"
    (shipped / "tensorrt_llm" / "1").mkdir(parents=True)
    (shipped / "tensorrt_llm" / "1" / "model.py").write_text("from specbuild.triton_repo.models.reference_engine import TritonPythonModel\n")
    model = (faulty_repository(shipped, "no_residual", tmp_path / "faulty") / "tensorrt_llm" / "1" / "model.py").read_text()
    compile(model, "model.py", "exec")
    assert "reference_engine import TritonPythonModel as CorrectModel" in model and "install('no_residual')" in model
    with pytest.raises(ValueError, match="choose one of"):
        faulty_repository(shipped, "accept_sometimes", tmp_path / "other")
    assert importlib.util.find_spec("specbuild.triton_repo.models.fault_injection") is None

SETTINGS = SamplingSettings(num_samples=300, positions=4, temperature=1.0, top_k=3, seed=0, alpha=0.01)
PROMPTS = [Prompt("code", "def fib(n):\n    if n < 2:\n        return n\n")]


@pytest.fixture(scope="module")
def draft_target_repo(tiny_checkpoint, tmp_path_factory):
    """Repository of a draft-target deployment; the draft = the target with noise (std 0.3 x each weight's)."""
    import torch
    from safetensors.torch import load_file, save_file

    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine
    from specbuild.triton_repo.reference_repository import spec_from_engine_dir, write_reference_repository

    out = tmp_path_factory.mktemp("sampling")
    draft = out / "draft"
    shutil.copytree(tiny_checkpoint, draft)
    weights = load_file(str(tiny_checkpoint / "model.safetensors"))
    noise = torch.Generator().manual_seed(1)
    weights = {k: v + 0.3 * v.std() * torch.randn(v.shape, generator=noise) if v.ndim > 1 else v for k, v in weights.items()}
    save_file(weights, str(draft / "model.safetensors"), metadata={"format": "pt"})
    recipe = out / "r.yaml"
    recipe.write_text(
        f"name: tiny-draft-target\ntarget:\n  checkpoint: {tiny_checkpoint}\n"
        f"speculation:\n  method: draft_target\n  draft_checkpoint: {draft}\n  max_draft_len: 3\n"
        "build:\n  max_batch_size: 4\n  max_input_len: 400\n  max_seq_len: 500\n"
    )
    engine_dir = build_reference_engine(load_recipe(str(recipe)), out / "engine", log=lambda m: None).engine_dir
    return write_reference_repository(spec_from_engine_dir(engine_dir), out / "repo")


def sampling_report(repo: Path, log: Path, fault: str | None):
    from fault_injection import faulty_repository
    from specbuild.client.sdk import SpecClient
    from specbuild.triton_repo.tritonserver import TritonServer

    if fault is not None:
        repo = faulty_repository(repo, fault, log.parent / f"repo-{fault}")
    server = TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=log).start()
    try:
        with SpecClient(server.grpc_url) as client:
            return verify_sampling(client, PROMPTS, SETTINGS, concurrency=8), server.log_tail(400)
    finally:
        server.stop()


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("fault", [None, "accept_always", "no_residual"], ids=["correct", "accept-always", "no-residual"])
def test_sampling_check_passes_a_correct_deployment_and_fails_a_wrong_rule(draft_target_repo, tmp_path, fault):
    report, log = sampling_report(draft_target_repo, tmp_path / "server.log", fault)
    print(describe_sampling_report(report))
    assert report.total_accepted_draft_tokens > 0  # speculation really happened
    if fault is None:
        assert report.total_accepted_draft_tokens < report.total_draft_tokens  # and rejections, so residuals
        assert report.passed, describe_sampling_report(report)
        assert WARNING not in log
        # What the sample size could see is reported: a shift of this much TV would not pass unnoticed.
        assert 0 < report.min_detectable_tv < 0.5
    else:
        assert WARNING in log  # the fault really was active on the server
        assert not report.passed, f"{fault} passed: {describe_sampling_report(report)}"
        assert report.p_value < SETTINGS.alpha


def test_a_sampling_check_without_drafts_is_not_exercised_and_exits_nonzero(monkeypatch, tmp_path):
    """Both arms plain (no draft proposed): whatever the p-value, nothing was tested (issue 36)."""
    from click.testing import CliRunner

    import specbuild.client.sampling as sampling_module
    import specbuild.client.sdk as sdk
    from specbuild.cli import main
    from specbuild.client.sampling import PromptSampling, SamplingReport, SamplingSettings, homogeneity_test

    samples = [[1, 2]] * 20 + [[1, 3]] * 20
    test = homogeneity_test([tuple(s) for s in samples], [tuple(s) for s in samples], name="prefix[:2]")
    settings = SamplingSettings(num_samples=40, positions=2, temperature=0.8)
    report = SamplingReport(settings, [PromptSampling("p", [test], samples, samples, total_draft_tokens=0)])
    assert report.passed and not report.exercised  # the test "passes": it compared plain sampling with itself
    said = describe_sampling_report(report)
    assert said.startswith("NOT EXERCISED: no draft tokens were proposed") and "--positions" in said

    monkeypatch.setattr(sdk, "SpecClient", ReadyClient)  # the deployment answers; verify_sampling's result is the report above
    monkeypatch.setattr(sampling_module, "verify_sampling", lambda *a, **k: report)
    result = CliRunner().invoke(main, ["verify", "--sampling", "--samples", "40", "--sampling-prompts", "1", "--positions", "2",
                                       "--temperature", "0.8", "--report", str(tmp_path / "report.json")])
    assert result.exit_code == 1, result.output  # exit_codes.FAILED: not a pass
    assert "NOT EXERCISED" in result.output and "EQUIVALENT" not in result.output
    assert json.loads((tmp_path / "report.json").read_text())["summary"]["exercised"] is False


def test_a_pass_without_power_is_not_called_equivalent():
    from specbuild.client.sampling import LOW_POWER_TV, PromptSampling, SamplingReport, SamplingSettings, homogeneity_test

    def report_of(n):
        samples = [[1, 2]] * (n // 2) + [[1, 3]] * (n - n // 2)
        test = homogeneity_test([tuple(s) for s in samples], [tuple(s) for s in samples], name="prefix[:2]")
        settings = SamplingSettings(num_samples=n, positions=2, temperature=0.8)
        return SamplingReport(settings, [PromptSampling("p", [test], samples, samples, total_draft_tokens=10)])

    small, large = report_of(30), report_of(2000)
    assert small.passed and small.min_detectable_tv > LOW_POWER_TV >= large.min_detectable_tv
    assert describe_sampling_report(small).startswith("NOT REJECTED (low power: only shifts >= ")
    assert describe_sampling_report(large).startswith("EQUIVALENT: ")
