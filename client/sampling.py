"""Sampling verification: is speculative sampling distributed exactly as plain sampling?

Speculative sampling (Leviathan et al. 2023, §2.3 and Appendix A.1; Chen et al. 2023, Theorem 1)
emits tokens distributed exactly as the target's own sampling distribution, so on a correct
deployment the tokens a request samples with speculation and without it come from the same
distribution. This module tests that with seeded requests through the client:

    baseline arm     seeds s0 .. s0+n-1       num_draft_tokens = 0      (plain sampling)
    speculative arm  seeds s0+n .. s0+2n-1    num_draft_tokens = k      (speculative sampling)

Disjoint seeds make the two arms independent samples (the same seed would make the first token
identical on both sides and the rest correlated). Each arm's first ``positions`` tokens are compared
with Pearson's two-sample chi-square test of homogeneity (``scipy.stats.chi2_contingency``), one
test per position (the token's marginal distribution) plus one on the whole ``positions``-token
prefix (the joint distribution: catches a rule that keeps marginals but breaks dependence).
Categories whose expected count is below ``MIN_EXPECTED`` in either arm are pooled into one
``other`` category (the chi-square approximation needs about 5 per cell). The family of tests is
corrected with Bonferroni (each test at ``alpha / m``), which holds however the tests depend on each
other; the deployment passes when the adjusted p-value ``min(1, m * min p)`` is at least ``alpha``.

What the test can see: the minimum detectable effect is the Cohen's w (Cohen 1988, ch. 7) at which
the test has ``power`` (default 0.8) at level ``alpha / m`` for this sample size, from the
noncentral chi-square (noncentrality ``N * w**2``, N = both arms' samples). For two arms with
shares pi_1, pi_2 of the samples, w**2 = pi_1 pi_2 sum_k (p1_k - p2_k)**2 / pbar_k, and by
Cauchy-Schwarz the total variation distance TV = 1/2 sum |p1 - p2| <= w / (2 sqrt(pi_1 pi_2)):
so any difference of at least ``min_detectable_tv`` in total variation (on the pooled categories)
is caught with at least that power. Equal arms: min_detectable_tv = w.

Example (500 samples per arm, 4 positions -> 5 tests at alpha/5 = 0.002, 3 pooled categories, df 2):
w_mde ~ 0.13, i.e. a shift of 13 percentage points of probability mass is found 80% of the time.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.prompts import Prompt
from specbuild.util.atomic import write_json_atomic
from .sdk import SpecClient

MIN_EXPECTED = 5.0  # expected count per cell below which categories are pooled
OTHER = "<other>"
END = "<end>"  # a position after the sequence ended (only when the end token is enabled)


@dataclass(frozen=True)
class HomogeneityTest:
    """One two-sample chi-square test of homogeneity (what one category variable looks like in two arms).

    Attributes:
        name: what was compared, e.g. ``"position 2"`` or ``"prefix[:4]"``.
        statistic: Pearson's chi-square (no continuity correction).
        df: degrees of freedom, ``num_categories - 1``; 0 when everything fell in one category.
        p_value: P(chi2_df >= statistic); 1.0 when df is 0.
        num_categories: categories after pooling (``other`` included).
        n_baseline, n_speculative: samples per arm.
        alpha: the level this test ran at (after the Bonferroni correction).
        min_detectable_w: Cohen's w detected with probability ``power`` at ``alpha``; inf when df is 0.
        min_detectable_tv: the total-variation distance that guarantees that power (see module doc).
        observed_tv: total variation distance between the two empirical distributions (pooled).
    """

    name: str
    statistic: float
    df: int
    p_value: float
    num_categories: int
    n_baseline: int
    n_speculative: int
    alpha: float
    power: float
    min_detectable_w: float
    min_detectable_tv: float
    observed_tv: float

    @property
    def rejected(self) -> bool:
        return self.p_value < self.alpha

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "rejected": self.rejected}


def homogeneity_test(
    baseline: Sequence[Hashable],
    speculative: Sequence[Hashable],
    *,
    name: str = "",
    alpha: float = 0.01,
    power: float = 0.8,
    min_expected: float = MIN_EXPECTED,
) -> HomogeneityTest:
    """Two-sample chi-square test that ``baseline`` and ``speculative`` come from one distribution.

    Example: baseline [1]*50 + [2]*50 vs speculative [1]*80 + [2]*20 -> df 1, statistic 19.8,
    p ~ 9e-6 (rejected at 0.01); observed TV 0.3.

    Raises:
        ValueError: an empty arm, ``alpha`` outside (0, 1), or ``power`` outside (alpha, 1).
    """
    import numpy as np
    from scipy import stats

    if not baseline or not speculative:
        raise ValueError(f"{name or 'test'}: both arms need samples, got {len(baseline)} and {len(speculative)}")
    _check_levels(alpha, power)
    n1, n2 = len(baseline), len(speculative)
    table = _pooled_table(Counter(baseline), Counter(speculative), n1, n2, min_expected)  # [2, categories]
    shares = np.array([n1, n2]) / (n1 + n2)
    tv = 0.5 * float(np.abs(table[0] / n1 - table[1] / n2).sum())
    df = table.shape[1] - 1
    if df == 0:
        statistic, p_value = 0.0, 1.0
    else:
        statistic, p_value, df, _ = stats.chi2_contingency(table, correction=False)
    w = min_detectable_w(n1 + n2, df, alpha=alpha, power=power)
    return HomogeneityTest(
        name=name, statistic=float(statistic), df=int(df), p_value=float(p_value), num_categories=table.shape[1],
        n_baseline=n1, n_speculative=n2, alpha=alpha, power=power, min_detectable_w=w,
        min_detectable_tv=w / (2 * math.sqrt(shares[0] * shares[1])), observed_tv=tv,
    )  # fmt: skip


def min_detectable_w(total: int, df: int, *, alpha: float, power: float) -> float:
    """Smallest Cohen's w a chi-square test with ``df`` degrees of freedom on ``total`` samples
    detects with probability ``power`` at level ``alpha``: solves
    ``P(ncx2(df, total * w**2) > chi2.ppf(1 - alpha, df)) = power``. inf when df is 0."""
    from scipy import optimize, stats

    if df <= 0 or total <= 0:
        return math.inf
    critical = stats.chi2.ppf(1 - alpha, df)
    reach = lambda lam: stats.ncx2.sf(critical, df, lam) - power  # noqa: E731
    upper = 1.0
    while reach(upper) < 0:
        upper *= 2
    return math.sqrt(optimize.brentq(reach, 1e-9, upper) / total)


def _pooled_table(a: Counter, b: Counter, n1: int, n2: int, min_expected: float):
    """``[2, K]`` counts; categories whose expected count under homogeneity is below ``min_expected``
    in either arm pooled into one (merged into the smallest kept category if still too small)."""
    import numpy as np

    total = n1 + n2
    small = min(n1, n2) / total  # expected count in the smaller arm = small * (a[c] + b[c])
    categories = sorted(set(a) | set(b), key=lambda c: (-(a[c] + b[c]), repr(c)))
    kept = [c for c in categories if small * (a[c] + b[c]) >= min_expected]
    pooled = [c for c in categories if c not in kept]
    rows = [[a[c] for c in kept], [b[c] for c in kept]]
    if pooled:
        other = [sum(a[c] for c in pooled), sum(b[c] for c in pooled)]
        if small * sum(other) >= min_expected or not kept:
            rows[0].append(other[0])
            rows[1].append(other[1])
        else:  # still too small: fold into the least frequent kept category
            rows[0][-1] += other[0]
            rows[1][-1] += other[1]
    return np.array(rows, dtype=float)


def _check_levels(alpha: float, power: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not alpha < power < 1:
        raise ValueError(f"power must be in (alpha, 1), got {power}")


@dataclass(frozen=True)
class SamplingSettings:
    """What the sampling verification sends; every request uses these except its seed and draft length.

    ``positions``: tokens compared per request (= max_tokens). ``num_draft_tokens``: the
    speculative arm's draft length (None = the engine's max_draft_len). ``end_id`` -1 (default)
    never stops early, so every sample has ``positions`` tokens; with an end token, positions after
    it count as the category ``<end>``.
    """

    num_samples: int = 500  # per arm and prompt
    positions: int = 4
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    num_draft_tokens: int | None = None
    end_id: int | None = -1
    seed: int = 0  # first seed; the arms use [seed, seed + n) and [seed + n, seed + 2n)
    alpha: float = 0.01
    power: float = 0.8

    def __post_init__(self) -> None:
        if self.num_samples < 2:
            raise ValueError(f"num_samples must be >= 2 per arm, got {self.num_samples}")
        if self.positions < 1:
            raise ValueError(f"positions must be >= 1, got {self.positions}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for a sampling test, got {self.temperature} (0 is greedy: use plain verify)")
        if self.num_draft_tokens == 0:
            raise ValueError("num_draft_tokens=0 would compare plain sampling with itself; give k > 0 or None")
        _check_levels(self.alpha, self.power)


@dataclass(frozen=True)
class PromptSampling:
    """One prompt's samples and tests."""

    prompt_id: str
    tests: list[HomogeneityTest]
    baseline_samples: list[list[int]] = field(repr=False)
    speculative_samples: list[list[int]] = field(repr=False)
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.prompt_id,
            "tests": [t.to_json() for t in self.tests],
            "total_draft_tokens": self.total_draft_tokens,
            "total_accepted_draft_tokens": self.total_accepted_draft_tokens,
        }


@dataclass(frozen=True)
class SamplingReport:
    """All prompts' tests, Bonferroni-corrected as one family.

    ``p_value`` = min(1, m * smallest p) over the m tests; ``passed`` when it is >= ``alpha``.
    ``min_detectable_tv``: the largest per-test detectable TV over the tests that could test
    anything (the weakest one's reach); ``num_degenerate``: tests whose samples all fell in one
    (pooled) category, so they had no power at all (more samples, or a lower temperature / top_k).
    """

    settings: SamplingSettings
    prompts: list[PromptSampling]
    provenance: dict | None = None  # client.verify.provenance: what was tested, through what, when

    @property
    def exercised(self) -> bool:
        """At least one draft token was proposed. With none, both arms ran plain sampling and the test
        compared plain sampling with itself: it exercised nothing, whatever its p-value."""
        return self.total_draft_tokens > 0

    @property
    def tests(self) -> list[HomogeneityTest]:
        return [t for p in self.prompts for t in p.tests]

    @property
    def p_value(self) -> float:
        tests = self.tests
        return min(1.0, len(tests) * min(t.p_value for t in tests)) if tests else 1.0

    @property
    def passed(self) -> bool:
        return self.p_value >= self.settings.alpha

    @property
    def total_draft_tokens(self) -> int:
        return sum(p.total_draft_tokens for p in self.prompts)

    @property
    def total_accepted_draft_tokens(self) -> int:
        return sum(p.total_accepted_draft_tokens for p in self.prompts)

    @property
    def min_detectable_tv(self) -> float:
        return max((t.min_detectable_tv for t in self.tests if t.df > 0), default=math.inf)

    @property
    def num_degenerate(self) -> int:
        return sum(t.df == 0 for t in self.tests)

    @property
    def worst(self) -> HomogeneityTest | None:
        return min(self.tests, key=lambda t: t.p_value, default=None)

    def summary(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "passed": self.passed,
            "exercised": self.exercised,
            "p_value": self.p_value,
            "alpha": self.settings.alpha,
            "num_tests": len(self.tests),
            "worst_test": None if worst is None else f"{self.prompts_of(worst)} {worst.name}",
            "worst_statistic": None if worst is None else worst.statistic,
            "worst_df": None if worst is None else worst.df,
            "min_detectable_tv": self.min_detectable_tv,
            "num_degenerate_tests": self.num_degenerate,
            "power": self.settings.power,
            "total_draft_tokens": self.total_draft_tokens,
            "total_accepted_draft_tokens": self.total_accepted_draft_tokens,
        }

    def prompts_of(self, test: HomogeneityTest) -> str:
        return next(p.prompt_id for p in self.prompts if any(t is test for t in p.tests))

    def to_json(self) -> dict[str, Any]:
        return {"settings": vars(self.settings), "summary": self.summary(), "provenance": self.provenance,
                "prompts": [p.to_json() for p in self.prompts]}

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write ``to_json()`` as indented JSON, atomically (parent folders created); returns the path."""
        return write_json_atomic(path, self.to_json(), default=_json_default)


def verify_sampling(
    client: SpecClient,
    prompts: Sequence[Prompt],
    settings: SamplingSettings = SamplingSettings(),
    *,
    concurrency: int = 8,
    progress: Callable[[int, int], None] | None = None,
) -> SamplingReport:
    """Sample every prompt ``settings.num_samples`` times per arm and test the arms for equality.

    Requests run ``concurrency`` at a time on the (thread-safe) client. ``progress(done, total)``
    counts requests. Raises what ``SpecClient.generate`` raises, and ``ValueError`` for no prompts.
    """
    if not prompts:
        raise ValueError("the sampling verification needs at least one prompt")
    n = settings.num_samples
    total = 2 * n * len(prompts)
    done = 0

    def tick(_: Any) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    results = []
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for prompt in prompts:
            arms = {}
            for arm, (k, first_seed) in {"baseline": (0, settings.seed), "speculative": (settings.num_draft_tokens, settings.seed + n)}.items():
                run = lambda seed, k=k, text=prompt.text: client.generate(  # noqa: E731
                    text, max_tokens=settings.positions, num_draft_tokens=k, end_id=settings.end_id,
                    temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p, seed=seed,
                )
                futures = [pool.submit(run, first_seed + i) for i in range(n)]
                for f in futures:
                    f.add_done_callback(tick)
                arms[arm] = [f.result() for f in futures]
            results.append(_test_prompt(prompt.id, arms["baseline"], arms["speculative"], settings, len(prompts)))
    return SamplingReport(settings=settings, prompts=results)


def _test_prompt(prompt_id: str, baseline, speculative, settings: SamplingSettings, num_prompts: int) -> PromptSampling:
    k = settings.positions
    base = [_padded(r.output_ids, k) for r in baseline]
    spec = [_padded(r.output_ids, k) for r in speculative]
    names = [f"position {i}" for i in range(k)] + ([f"prefix[:{k}]"] if k > 1 else [])
    alpha = settings.alpha / (len(names) * num_prompts)  # Bonferroni over the whole family
    variables = [([s[i] for s in base], [s[i] for s in spec]) for i in range(k)]
    if k > 1:
        variables.append(([tuple(s) for s in base], [tuple(s) for s in spec]))
    tests = [
        homogeneity_test(a, b, name=name, alpha=alpha, power=settings.power) for name, (a, b) in zip(names, variables)
    ]
    return PromptSampling(
        prompt_id=prompt_id,
        tests=tests,
        baseline_samples=base,
        speculative_samples=spec,
        total_draft_tokens=sum(r.total_draft_tokens or 0 for r in speculative),
        total_accepted_draft_tokens=sum(r.total_accepted_draft_tokens or 0 for r in speculative),
    )


def _padded(ids: list[int], k: int) -> list:
    return list(ids[:k]) + [END] * (k - len(ids))


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return str(value)


def render_sampling_report(report: SamplingReport):
    """A rich table: one row per test (statistic, df, p-value, detectable TV, observed TV)."""
    from rich import box
    from rich.table import Table

    s = report.settings
    table = Table(
        title=(
            f"specbuild verify --sampling: {s.num_samples} samples per arm, temperature {s.temperature:g}"
            f"{'' if s.top_k is None else f', top_k {s.top_k}'}{'' if s.top_p is None else f', top_p {s.top_p:g}'}"
        ),
        box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,  # 80 columns, two-line headers: nothing cut
    )
    for name in ("prompt", "test", "cate-\ngories", "chi2", "df", "p-value", "level", "detect-\nable TV", "observed\nTV"):
        table.add_column(name, justify="left" if name in ("prompt", "test") else "right", no_wrap=True,
                         min_width=max(map(len, name.split("\n"))))
    for prompt in report.prompts:
        for t in prompt.tests:
            p = f"[red]{t.p_value:.2g}[/]" if t.rejected else f"{t.p_value:.2g}"
            table.add_row(
                prompt.prompt_id, t.name, str(t.num_categories), f"{t.statistic:.2f}", str(t.df), p,
                f"{t.alpha:.2g}", f"{t.min_detectable_tv:.3f}", f"{t.observed_tv:.3f}",
            )  # fmt: skip
    return table


LOW_POWER_TV = 0.25  # above this detectable total variation a passing test is reported as not rejected, not equivalent


def describe_sampling_report(report: SamplingReport) -> str:
    """One summary line: verdict, adjusted p-value, what the sample size could detect."""
    worst = report.worst
    if not report.exercised:
        return (f"NOT EXERCISED: no draft tokens were proposed in {len(report.prompts)} prompt(s) x "
                f"{report.settings.num_samples} samples of {report.settings.positions} tokens, so both arms ran plain "
                "sampling and the test compared it with itself. To get drafts: more --positions (an n-gram drafter "
                "needs tokens to repeat), prompts that repeat themselves (code: humaneval), more --sampling-prompts, "
                "or check that the deployment speculates (specbuild verify without --sampling shows its draft tokens)")
    verdict = "EQUIVALENT" if report.passed else "DIFFERENT"
    if report.passed and report.min_detectable_tv > LOW_POWER_TV:  # not rejecting a null is not equivalence
        verdict = (f"NOT REJECTED (low power: only shifts >= {report.min_detectable_tv:.2f} in total variation were "
                   f"detectable, above {LOW_POWER_TV:g}; raise --samples for a verdict)")
    return (
        f"{verdict}: speculative vs plain sampling, Bonferroni-adjusted p = {report.p_value:.3g} over "
        f"{len(report.tests)} tests (alpha {report.settings.alpha:g}); worst: {report.prompts_of(worst)} "
        f"{worst.name} chi2 = {worst.statistic:.2f}, df {worst.df}; with {report.settings.num_samples} samples "
        f"per arm a total-variation shift >= {report.min_detectable_tv:.3f} is detected with power "
        f">= {report.settings.power:g}; {report.total_accepted_draft_tokens}/{report.total_draft_tokens} "
        "draft tokens accepted"
        + (
            f"; {report.num_degenerate} test(s) had every sample in one pooled category and no power "
            "(more --samples, or fewer --positions)"
            if report.num_degenerate
            else ""
        )
    )
