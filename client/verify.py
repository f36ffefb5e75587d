"""Verify a deployment: greedy speculative decoding must give exactly the tokens plain decoding gives.

Each prompt runs twice on the same deployment, with the same max_tokens and end_id:
``num_draft_tokens=0`` (the baseline: plain decoding on the target) and with speculation
(``num_draft_tokens=None`` = the engine's max_draft_len, or a given value). The runs are
interleaved, alternating which goes first, after one untimed warm-up request, so machine noise
and connection set-up hit both alike.
Token ids are compared exactly; there is no tolerance unless asked for. The first mismatch is
reported with the next few tokens of both sides, as ids and, given a tokenizer, as text, and with
the target's logit margin there: the baseline is re-run with ``return_logit_margin`` (specbuild
reference deployments; other deployments say "not available" in the report) to get the target's
largest minus second-largest logit and its second choice at the divergence. A divergence where
speculation picked the target's second choice by a margin of a few ulps of the logits is a
numerical near-tie (fp16/bf16 kernels that batch differently); any other divergence is a bug.
``near_tie_margin`` (explicit, reported) lets such near-ties pass; it never hides anything else.

Example::

    with SpecClient() as client:
        report = verify(client, load_prompts("humaneval:10"), max_tokens=128)
    Console().print(render_report(report))
    report.write("verify.json")
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from rich.table import Table

from specbuild.interface import SpecDecodeMetrics, acceptance_rate
from specbuild.prompts import Prompt
from specbuild.util.atomic import write_json_atomic

from .sdk import GenerateResult, RequestError, SpecClient

CONTINUATION_TOKENS = 20  # tokens shown after the divergence, on each side
CONTEXT_TOKENS = 10  # agreed tokens shown before it


class TokenDecoder(Protocol):
    """Anything with a Hugging Face style ``decode(ids) -> str``."""

    def decode(self, token_ids: list[int]) -> str: ...


@dataclass(frozen=True)
class Divergence:
    """Where baseline and speculative output ids first differ.

    Example: baseline [5, 6, 7, 8], speculative [5, 6, 9] -> position 2, baseline_token 7,
    speculative_token 9, baseline_continuation [7, 8], speculative_continuation [9], context [5, 6].
    A token is ``None`` when that side ended before ``position`` (one output is a prefix of the
    other). The ``*_text`` fields are ``None`` unless a tokenizer was given.
    """

    position: int
    baseline_token: int | None
    speculative_token: int | None
    baseline_continuation: list[int]  # up to CONTINUATION_TOKENS ids from position
    speculative_continuation: list[int]
    context: list[int] = field(default_factory=list)  # up to CONTEXT_TOKENS agreed ids before position
    context_text: str | None = None
    baseline_continuation_text: str | None = None
    speculative_continuation_text: str | None = None
    logit_margin: float | None = None  # target's top-1 minus top-2 logit at position (logit units)
    runner_up_token: int | None = None  # target's second choice at position
    margin_note: str | None = None  # why logit_margin is None, when it is

    @property
    def speculative_took_runner_up(self) -> bool:
        """The speculative side emitted the target's second choice (what a near-tie looks like)."""
        return self.runner_up_token is not None and self.speculative_token == self.runner_up_token

    def is_near_tie(self, near_tie_margin: float) -> bool:
        """Speculation took the runner-up and the top-two logits differ by at most ``near_tie_margin``."""
        return self.speculative_took_runner_up and self.logit_margin is not None and self.logit_margin <= near_tie_margin

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "speculative_took_runner_up": self.speculative_took_runner_up}


@dataclass(frozen=True)
class PromptVerification:
    """One prompt's two runs; ``near_tie``: the divergence is within the report's ``near_tie_margin``."""

    prompt_id: str
    match: bool
    baseline: GenerateResult
    speculative: GenerateResult
    divergence: Divergence | None
    near_tie: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.prompt_id,
            "match": self.match,
            "near_tie": self.near_tie,
            "first_divergence": self.divergence.position if self.divergence else None,
            "divergence": self.divergence.to_json() if self.divergence else None,
            "baseline": result_to_json(self.baseline),
            "speculative": result_to_json(self.speculative),
        }


@dataclass(frozen=True)
class VerifyReport:
    """Per-prompt verifications plus the settings they ran with; aggregates are properties.

    Throughputs are total tokens / total latency (tokens/s); acceptance figures pool the
    speculative runs' counters (every verify step and every draft token weighs the same).
    """

    results: list[PromptVerification]
    max_tokens: int | None = None
    num_draft_tokens: int | None = None  # None = the engine's max_draft_len
    end_id: int | None = None
    near_tie_margin: float | None = None  # None: no tolerance, every divergence fails
    # The deployment's kernels and the greedy equality they give ("greedy_equality": "bitwise", or "near-ties"
    # where a divergence at a logit near-tie is possible; KernelChoice.to_json, from the engine's config.json);
    # None where verify knows only a URL.
    kernels: dict | None = None
    # What was verified and by what (:func:`provenance`): recipe, target, engine fingerprint, server, date.
    provenance: dict | None = None

    @property
    def exercised(self) -> bool:
        """Speculation happened: at least one draft token was proposed (or the server does not say).
        With none, plain and speculative runs are the same computation and the check tested nothing."""
        return self.total_draft_tokens != 0

    @property
    def num_near_ties(self) -> int:
        return sum(r.near_tie for r in self.results)

    @property
    def passed(self) -> bool:
        """All prompts matched, or every mismatch is a near-tie within ``near_tie_margin`` (when given)."""
        return bool(self.results) and all(r.match or r.near_tie for r in self.results)

    @property
    def num_prompts(self) -> int:
        return len(self.results)

    @property
    def num_match(self) -> int:
        return sum(r.match for r in self.results)

    @property
    def all_match(self) -> bool:
        """True when there is at least one prompt and every prompt matched."""
        return bool(self.results) and self.num_match == self.num_prompts

    @property
    def total_draft_tokens(self) -> int | None:
        """Draft tokens proposed over all speculative runs; 0 means speculation never happened."""
        return _sum_known(r.speculative.total_draft_tokens for r in self.results)

    @property
    def total_accepted_draft_tokens(self) -> int | None:
        return _sum_known(r.speculative.total_accepted_draft_tokens for r in self.results)

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per verification step over all speculative runs, bonus token included:
        ``1 + sum(accepted) / sum(steps)`` (:class:`specbuild.interface.SpecDecodeMetrics` pooled);
        ``None`` without perf metrics or without a step."""
        pooled = SpecDecodeMetrics.pooled(m for r in self.results if (m := r.speculative.metrics) is not None)
        return None if pooled is None else pooled.mean_acceptance_length

    @property
    def mean_acceptance_rate(self) -> float | None:
        """Accepted draft tokens / draft tokens over all speculative runs; None without drafts."""
        runs = [r.speculative for r in self.results if None not in _counters(r.speculative)]
        return acceptance_rate(sum(g.total_accepted_draft_tokens for g in runs), sum(g.total_draft_tokens for g in runs))

    @property
    def acceptance_source(self) -> str | None:
        """Where the speculative runs' counts came from (``perf_metrics``, ``derived``, ``none``; several
        joined by ``+``); ``None`` when no run reported a source."""
        sources = sorted({s for r in self.results if (s := getattr(r.speculative, "acceptance_source", None))})
        return "+".join(sources) or None

    @property
    def baseline_tokens_per_s(self) -> float:
        return _throughput([r.baseline for r in self.results])

    @property
    def speculative_tokens_per_s(self) -> float:
        return _throughput([r.speculative for r in self.results])

    @property
    def speedup(self) -> float | None:
        """speculative_tokens_per_s / baseline_tokens_per_s; None when the baseline has no throughput."""
        baseline = self.baseline_tokens_per_s
        return self.speculative_tokens_per_s / baseline if baseline > 0 else None

    @property
    def median_speedup(self) -> float | None:
        """Median over prompts of speculative / baseline tokens/s: one stalled request moves it
        far less than it moves :attr:`speedup`; report both."""
        ratios = [
            r.speculative.tokens_per_s / r.baseline.tokens_per_s for r in self.results if r.baseline.tokens_per_s > 0
        ]
        return statistics.median(ratios) if ratios else None

    def summary(self) -> dict[str, Any]:
        names = (
            "num_prompts", "num_match", "all_match", "num_near_ties", "passed", "exercised",
            "mean_acceptance_length", "mean_acceptance_rate", "acceptance_source",
            "total_draft_tokens", "total_accepted_draft_tokens",
            "baseline_tokens_per_s", "speculative_tokens_per_s", "speedup", "median_speedup",
        )  # fmt: skip
        return {name: getattr(self, name) for name in names}

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": {
                "max_tokens": self.max_tokens,
                "num_draft_tokens": self.num_draft_tokens,
                "end_id": self.end_id,
                "near_tie_margin": self.near_tie_margin,
            },
            "summary": self.summary(),
            "provenance": self.provenance,
            "kernels": self.kernels,
            "prompts": [r.to_json() for r in self.results],
        }

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write ``to_json()`` as indented JSON (parent folders created); returns the path."""
        return write_json_atomic(path, self.to_json())


def provenance(
    *, url: str | None, protocol: str, streaming: bool, prompts: str | Sequence[str], recipe: str | None = None,
    target: str | None = None, dtype: str | None = None, engine_fingerprint: str | None = None,
    repo_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """The provenance block of a verify report: what was verified, through what, by which specbuild, when.

    ``repo_dir``: the deployment's Triton repository, when known: its ``specbuild-repo.json`` gives the
    recipe name and the engine fingerprint where they are not given. Fields not known (a bare URL) are
    ``None``. ``specbuild`` is the version and ``git`` the commit of specbuild's checkout
    (``{commit, dirty}``, None outside a checkout), as bench.json's environment block records them;
    ``date_utc``: ISO 8601, seconds.
    """
    import time

    from specbuild import __version__

    from .environment import git_commit

    if repo_dir is not None:
        try:
            meta = json.loads((Path(repo_dir) / "specbuild-repo.json").read_text())
        except (OSError, ValueError):
            meta = {}
        recipe = recipe or meta.get("recipe")
        engine_fingerprint = engine_fingerprint or meta.get("engine_fingerprint") or None
    return {
        "recipe": recipe,
        "target_checkpoint": target,
        "dtype": dtype,
        "engine_fingerprint": engine_fingerprint,
        "server_url": url,
        "protocol": protocol,
        "streaming": streaming,
        "prompt_sets": [prompts] if isinstance(prompts, str) else list(prompts),
        "specbuild": __version__,
        "git": git_commit(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def verify(
    client: SpecClient,
    prompts: Sequence[Prompt],
    *,
    max_tokens: int,
    num_draft_tokens: int | None = None,
    end_id: int | None = None,
    tokenizer: str | os.PathLike[str] | TokenDecoder | None = None,
    progress: Callable[[int, int], None] | None = None,
    margins: bool = True,
    near_tie_margin: float | None = None,
) -> VerifyReport:
    """Run every prompt as baseline then speculative, interleaved, and compare token ids.

    ``tokenizer``: a tokenizer folder (loaded with transformers) or an object with ``decode``,
    used only to show divergences as text. ``progress(done, total)`` is called after each prompt.
    ``margins``: on a divergence, fetch the target's logit margin there (one more baseline run).
    ``near_tie_margin`` (logit units, >= 0): a divergence where speculation took the target's
    runner-up by at most this margin counts as a near-tie and passes (``report.passed``); None =
    exact equality only.
    Raises what ``SpecClient.generate`` raises (``RequestError``, ``ServerUnavailableError``), and
    ``ValueError`` for a negative ``near_tie_margin``.
    """
    if near_tie_margin is not None and not near_tie_margin >= 0:
        raise ValueError(f"near_tie_margin must be >= 0 logit units or None, got {near_tie_margin}")
    decoder = as_decoder(tokenizer)
    margin_source = MarginSource(client) if margins else None
    if prompts:
        # Untimed warm-up: connection set-up would otherwise land on the first baseline run.
        client.generate(prompts[0].text, max_tokens=1, num_draft_tokens=0, end_id=end_id)
    results = []
    for done, prompt in enumerate(prompts, start=1):
        settings = {"max_tokens": max_tokens, "num_draft_tokens": num_draft_tokens, "end_id": end_id}
        result = verify_prompt(client, prompt, **settings, decoder=decoder, baseline_first=done % 2 == 1)
        if result.divergence is not None and margin_source is not None:
            divergence = margin_source.annotate(result.divergence, prompt.text, result.baseline, max_tokens=max_tokens, end_id=end_id)
            near_tie = near_tie_margin is not None and divergence.is_near_tie(near_tie_margin)
            result = replace(result, divergence=divergence, near_tie=near_tie)
        results.append(result)
        if progress is not None:
            progress(done, len(prompts))
    return VerifyReport(
        results=results, max_tokens=max_tokens, num_draft_tokens=num_draft_tokens, end_id=end_id,
        near_tie_margin=near_tie_margin,
    )


class MarginSource:
    """Fetches the target's logit margin at a divergence by re-running the baseline with
    ``return_logit_margin``; remembers when the deployment cannot (then says why, once per report)."""

    def __init__(self, client: SpecClient) -> None:
        self.client = client
        self.unavailable: str | None = None

    def annotate(
        self, divergence: Divergence, prompt: str, baseline: GenerateResult, *, max_tokens: int, end_id: int | None
    ) -> Divergence:
        """``divergence`` with ``logit_margin`` / ``runner_up_token`` at its position, or a ``margin_note``."""
        if self.unavailable is not None:
            return replace(divergence, margin_note=self.unavailable)
        if divergence.baseline_token is None:
            return replace(divergence, margin_note="the baseline ended before this position: no target logits there")
        scored, reasons = None, []
        # specbuild's reference deployments; then TensorRT-LLM's generation_logits (engines built with
        # --gather_generation_logits).
        for ask in ("return_logit_margin", "return_generation_logits"):
            try:
                scored = self.client.generate(prompt, max_tokens=max_tokens, num_draft_tokens=0, end_id=end_id, **{ask: True})
                break
            except RequestError as e:
                reasons.append(f"{ask}: {e.server_message or e}")
        if scored is None:
            self.unavailable = f"not available: the deployment returns no logits ({'; '.join(reasons)})"
            return replace(divergence, margin_note=self.unavailable)
        if scored.logit_margin is None or scored.runner_up_ids is None:
            self.unavailable = "not available: the deployment sent no logit_margin output"
            return replace(divergence, margin_note=self.unavailable)
        if scored.output_ids != baseline.output_ids:
            return replace(divergence, margin_note="the baseline re-run for margins gave other tokens (non-deterministic baseline)")
        position = divergence.position
        return replace(
            divergence, logit_margin=scored.logit_margin[position], runner_up_token=scored.runner_up_ids[position]
        )


def verify_prompt(
    client: SpecClient,
    prompt: Prompt,
    *,
    max_tokens: int,
    num_draft_tokens: int | None = None,
    end_id: int | None = None,
    decoder: TokenDecoder | None = None,
    baseline_first: bool = True,
) -> PromptVerification:
    """One prompt: the baseline run (num_draft_tokens=0) and the speculative run, in the order
    ``baseline_first`` says (verify() alternates it so neither side always runs first)."""
    run = lambda k: client.generate(prompt.text, max_tokens=max_tokens, num_draft_tokens=k, end_id=end_id)  # noqa: E731
    if baseline_first:
        baseline, speculative = run(0), run(num_draft_tokens)
    else:
        speculative, baseline = run(num_draft_tokens), run(0)
    divergence = find_divergence(baseline.output_ids, speculative.output_ids, decoder=decoder)
    return PromptVerification(
        prompt_id=prompt.id, match=divergence is None, baseline=baseline, speculative=speculative, divergence=divergence
    )


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ, or None when they are equal.

    A length mismatch is a divergence: [1, 2] vs [1, 2, 3] -> 2. [1, 2, 3] vs [1, 5, 3] -> 1.
    """
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def find_divergence(
    baseline: Sequence[int], speculative: Sequence[int], *, decoder: TokenDecoder | None = None
) -> Divergence | None:
    """The first divergence with context and both continuations, or None when the ids are equal."""
    position = first_divergence(baseline, speculative)
    if position is None:
        return None
    context = list(baseline[max(0, position - CONTEXT_TOKENS) : position])
    base_next = list(baseline[position : position + CONTINUATION_TOKENS])
    spec_next = list(speculative[position : position + CONTINUATION_TOKENS])
    decode = (lambda ids: decoder.decode(ids)) if decoder is not None else (lambda ids: None)
    return Divergence(
        position=position,
        baseline_token=_at(baseline, position),
        speculative_token=_at(speculative, position),
        context=context,
        baseline_continuation=base_next,
        speculative_continuation=spec_next,
        context_text=decode(context),
        baseline_continuation_text=decode(base_next),
        speculative_continuation_text=decode(spec_next),
    )


def as_decoder(tokenizer: str | os.PathLike[str] | TokenDecoder | None) -> TokenDecoder | None:
    """Pass through an object with ``decode``; load a tokenizer folder with transformers.

    Raises ``ImportError`` (with the install hint) when a folder is given and transformers is missing.
    """
    if tokenizer is None or hasattr(tokenizer, "decode"):
        return tokenizer
    from specbuild.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer)


def result_to_json(result: GenerateResult) -> dict[str, Any]:
    return {
        **vars(result),
        "num_tokens": result.num_tokens,
        "tokens_per_s": result.tokens_per_s,
        "acceptance_length": result.acceptance_length,
    }


def render_report(report: VerifyReport) -> Table:
    """A rich table: one row per prompt (the CLI prints the aggregates under it)."""
    from rich import box

    # 80 columns: light borders, two-line headers, numbers never cut; only the divergence (last) folds
    table = Table(title="specbuild verify: speculative vs num_draft_tokens=0, greedy", box=box.SIMPLE_HEAD, pad_edge=False)
    columns = ("prompt", "match", "tokens\nbase/spec", "acc.\nlength", "acc.\nrate", "base\ntok/s", "spec\ntok/s", "first divergence")
    for name in columns:
        last = name == "first divergence"
        table.add_column(name, justify="left" if last or name == "prompt" else "right", no_wrap=not last, overflow="fold")
    for r in report.results:
        table.add_row(
            r.prompt_id,
            "[green]yes[/]" if r.match else "[red]NO[/]",
            f"{r.baseline.num_tokens}/{r.speculative.num_tokens}",
            _fmt(r.speculative.acceptance_length),
            _fmt(r.speculative.acceptance_rate),
            _fmt(r.baseline.tokens_per_s, ".1f"),
            _fmt(r.speculative.tokens_per_s, ".1f"),
            describe_divergence(r.divergence, short=True),
        )
    return table


def describe_divergence(divergence: Divergence | None, *, short: bool = False) -> str:
    """``-`` for none; short: ``@17: 123 vs 456``; long: both continuations (ids and text if decoded)."""
    if divergence is None:
        return "-"
    head = f"@{divergence.position}: {divergence.baseline_token} vs {divergence.speculative_token}"
    if divergence.logit_margin is not None:
        choice = "runner-up" if divergence.speculative_took_runner_up else f"not the runner-up {divergence.runner_up_token}"
        head += f", margin {divergence.logit_margin:.3g} ({choice})"
    if short:
        return head
    lines = [head, f"  context      {divergence.context}"]
    lines += [f"  baseline     {divergence.baseline_continuation}"]
    lines += [f"  speculative  {divergence.speculative_continuation}"]
    if divergence.baseline_continuation_text is not None:
        lines += [f"  context      {divergence.context_text!r}"]
        lines += [f"  baseline     {divergence.baseline_continuation_text!r}"]
        lines += [f"  speculative  {divergence.speculative_continuation_text!r}"]
    if divergence.logit_margin is not None:
        lines += [
            f"  target logits at @{divergence.position}: top-1 {divergence.baseline_token} beats the runner-up "
            f"{divergence.runner_up_token} by {divergence.logit_margin:.6g}"
        ]
    elif divergence.margin_note:
        lines += [f"  logit margin: {divergence.margin_note}"]
    return "\n".join(lines)


def _at(ids: Sequence[int], position: int) -> int | None:
    return ids[position] if position < len(ids) else None


def _counters(result: GenerateResult) -> tuple[int | None, int | None]:
    return result.total_accepted_draft_tokens, result.total_draft_tokens


def _sum_known(values) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _throughput(results: list[GenerateResult]) -> float:
    latency_s = sum(g.latency_s for g in results)
    return sum(g.num_tokens for g in results) / latency_s if latency_s > 0 else 0.0


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)
