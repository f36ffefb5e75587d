"""One timed request as the sweep records it (:class:`RequestRecord`): what checks, points and reports read."""

from __future__ import annotations

from dataclasses import dataclass

from specbuild.interface import ACCEPTANCE_SOURCES, SpecDecodeMetrics


@dataclass(frozen=True)
class RequestRecord:
    """One timed request and what the server said about it."""

    prompt_id: str
    latency_s: float
    num_tokens: int
    accepted: int  # total_accepted_draft_tokens
    drafts: int  # total_draft_tokens
    acceptance_rate: float | None
    ttft_s: float | None = None  # only when streamed
    step_tokens: tuple[int, ...] | None = None  # tokens per streamed step (prefill first), when streamed
    output_ids: tuple[int, ...] = ()
    finish_reason: str | None = None  # "stop" / "length" as the client reads it; None = unknown
    perf_reported: bool = True  # the server reported draft/accepted counts (OpenAI servers other than specbuild's: no)
    chunk_times_s: tuple[float, ...] | None = None  # streamed: arrival of each chunk, seconds after sending
    start_s: float = 0.0  # sent, seconds after the point (repeat) started
    repeat: int = 0
    max_tokens: int | None = None  # what the request asked for (None: the plan's)
    acceptance_source: str | None = None  # perf_metrics / derived / none (GenerateResult.acceptance_source)

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive streamed chunks (vLLM's inter-token latency: one gap per chunk,
        a chunk of a speculative step carries several tokens); [] when not streamed."""
        times = self.chunk_times_s or ()
        return [b - a for a, b in zip(times, times[1:])]

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (streamed; genai-perf's inter-token latency), else
        latency / tokens (prefill included)."""
        if self.ttft_s is not None and self.num_tokens > 1:
            return (self.latency_s - self.ttft_s) / (self.num_tokens - 1)
        return self.latency_s / max(1, self.num_tokens)

    @property
    def metrics(self) -> SpecDecodeMetrics:
        """This request's speculation figures (:class:`specbuild.interface.SpecDecodeMetrics`; a server
        that reported no counts reads as nothing drafted or accepted)."""
        source = self.acceptance_source if self.acceptance_source in ACCEPTANCE_SOURCES else None
        return SpecDecodeMetrics(self.num_tokens, self.drafts, self.accepted, acceptance_source=source)

    @property
    def decode_steps(self) -> int:
        """Verification steps after the prefill (``num_spec_steps``): each emits its accepted drafts + 1 token."""
        return self.metrics.num_spec_steps
