"""What a sweep measures: the deployments (targets) and the grid of prompt sets, load levels and
draft lengths (:class:`SweepPlan`), checked before any request is sent."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from specbuild.prompts import CHAT_TEMPLATE_MODES

from .stats import parse_slo


URL = re.compile(r"^(?:(?:http|grpc)://)?[\w.-]+:\d+/?$")  # host:port, http://host:port/, grpc://host:port


class BenchError(ValueError):
    """A sweep that cannot run as asked; the message names the option at fault and the valid values."""


@dataclass(frozen=True)
class Deployment:
    """One deployment to benchmark: where it answers and how a draft length maps onto its requests.

    Attributes:
        name: label in tables and files (the recipe name, or ``--label`` for a url).
        method: speculation method (``ngram``, ``lookahead``, ...; ``"unknown"`` for a bare url).
        url: gRPC or HTTP ``host:port``.
        max_draft_len: the most draft tokens a request may ask for; ``None`` = unknown (not checked).
        lookahead: the built ``(W, N, G)`` of a Lookahead deployment, else ``None``. Its draft length k
            is the candidate length ``n - 1``: a request at k sends ``lookahead_config = (W, k + 1, G)``.
        metrics_url: Triton's metrics ``host:port`` for the counter cross-check; ``None`` = skip it.
        tokenizer_dir: the deployment's tokenizer, for chat templates; ``None`` = none applied.
        stream: stream every request (gRPC; required by a decoupled deployment).
        protocol: ``grpc`` / ``http`` (Triton) or ``openai`` (``url`` is then an OpenAI base URL).
        per_request_draft: the deployment takes a draft length per request (Triton deployments and
            specbuild's OpenAI front); ``False`` for other OpenAI servers, whose draft length is their
            own configuration: the sweep then runs one draft length, the label ``openai_draft_len``.
        openai_chat: OpenAI targets: send prompts to ``/chat/completions`` as one user message.
        openai_draft_len: the draft length a foreign OpenAI server was started with (a label; 0 = its
            speculation is off).
        stream_interval: decoding iterations per streamed response (the deployment's
            ``serve.stream_interval``); above 1 a response may carry several steps' tokens.
        max_input_len: the longest prompt (tokens) the deployment takes; None = unknown (not checked).
            Known, every prompt set is checked against it before the sweep starts.
        recipe: the recipe file a recipe target was deployed from (absolute path), where
            ``tune --write-recipe`` starts; None for a URL target.
    """

    name: str
    url: str
    method: str = "unknown"
    protocol: str = "grpc"
    max_draft_len: int | None = None
    lookahead: tuple[int, int, int] | None = None
    metrics_url: str | None = None
    tokenizer_dir: str | None = None
    stream: bool = False  # send requests with SpecClient.generate_stream (TTFT, per-step tokens)
    per_request_draft: bool = True
    openai_chat: bool = False
    openai_draft_len: int | None = None
    stream_interval: int = 1
    max_input_len: int | None = None
    recipe: str | None = None

    def request_fields(self, draft_len: int) -> dict:
        """``SpecClient.generate`` keyword arguments for draft length ``draft_len`` (0 = plain decoding).

        Raises ``BenchError`` when ``draft_len`` is past what the deployment was built for.
        """
        if draft_len < 0:
            raise BenchError(f"draft length must be >= 0, got {draft_len}")
        if not self.per_request_draft:
            if draft_len != (self.openai_draft_len or 0):
                raise BenchError(
                    f"{self.name}: this OpenAI server takes no per-request draft length; it runs its own "
                    f"(--openai-max-draft-len {self.openai_draft_len or 0}); start one server per max_draft_len"
                )
            return {}
        if draft_len == 0:
            return {"num_draft_tokens": 0}
        if self.lookahead is not None:
            w, n, g = self.lookahead
            if draft_len + 1 > n:
                raise BenchError(
                    f"{self.name}: lookahead draft length {draft_len} needs ngram size {draft_len + 1} > the built "
                    f"N = {n}; use --num-draft-tokens up to {n - 1}"
                )
            return {"lookahead_config": (w, draft_len + 1, g)}
        if self.max_draft_len is not None and draft_len > self.max_draft_len:
            raise BenchError(
                f"{self.name}: draft length {draft_len} > the deployment's max_draft_len {self.max_draft_len}; "
                f"use --num-draft-tokens up to {self.max_draft_len}"
            )
        return {"num_draft_tokens": draft_len}


@dataclass(frozen=True)
class SweepPlan:
    """The grid and the request shape.

    Attributes:
        draft_lengths: draft tokens per step to sweep, 0 = speculation off (run first: the baseline).
        concurrencies: requests in flight (closed loop: C workers, each sends its next request when
            the previous one returns).
        prompt_sets: ``load_prompts`` sources (``humaneval:N``, ``chat:N``, ``summarize:N``, files).
        max_tokens: new tokens per request.
        requests: requests per point; ``None`` = ``max(len(prompts), C)`` (every prompt at least once,
            every worker busy at least once).
        end_id: ``None`` = the deployment's end token; -1 = always generate ``max_tokens``.
        warmup: untimed requests per deployment and prompt set before its points.
        chat_template: ``auto`` = wrap the bundled chat/summarize prompts in the deployment's chat
            template when its tokenizer has one; ``always`` = every set; ``never``.
        request_rates: open loop instead of closed: requests arrive at these mean rates (requests/s),
            each level a point; inter-arrival times are gamma-distributed with shape ``burstiness``
            (1 = Poisson arrivals; < 1 burstier, > 1 more regular; vLLM's ``--burstiness``) and mean
            1 / rate. Empty = closed loop at ``concurrencies``.
        max_concurrency: open loop: at most this many requests in flight (later arrivals wait for a
            slot, as vLLM's ``--max-concurrency``); ``None`` = no cap.
        repeats: measure every point this many times, draft lengths interleaved within each repeat
            (k=0, 2, 4, k=0, 2, 4, ...) so slow drift of the machine lands on every k alike; the
            figures pool the repeats and carry bootstrap confidence intervals
            (:mod:`specbuild.bench.stats`).
        slo: goodput's service-level objectives, ``"ttft=500,tpot=50,e2el=5000"`` (ms; vLLM's
            ``--goodput`` keys); empty = goodput not computed.
        stability_percentage: repeats whose total tokens/s differ from their mean by more than this
            (percent) mark the point ``unstable`` (perf_analyzer's ``--stability-percentage``).
        seed: arrival-time seed of the open loop.
    """

    draft_lengths: tuple[int, ...] = (0, 2, 4)
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16)
    prompt_sets: tuple[str, ...] = ("humaneval:8",)
    max_tokens: int = 64
    requests: int | None = None
    end_id: int | None = None
    warmup: int = 1
    chat_template: str = "auto"
    request_rates: tuple[float, ...] = ()
    burstiness: float = 1.0
    max_concurrency: int | None = None
    repeats: int = 1
    slo: str = ""
    stability_percentage: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.draft_lengths or any(k < 0 for k in self.draft_lengths):
            raise BenchError(f"--num-draft-tokens must be integers >= 0 (0 = off), got {self.draft_lengths}")
        if not self.concurrencies or any(c < 1 for c in self.concurrencies):
            raise BenchError(f"--concurrency levels must be integers >= 1, got {self.concurrencies}")
        if not self.prompt_sets:
            raise BenchError("give at least one --prompts set")
        if self.max_tokens < 1:
            raise BenchError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.requests is not None and self.requests < 1:
            raise BenchError(f"--requests must be >= 1, got {self.requests}")
        if self.chat_template not in CHAT_TEMPLATE_MODES:
            raise BenchError(f"--chat-template must be one of {CHAT_TEMPLATE_MODES}, got {self.chat_template!r}")
        if any(not r > 0 for r in self.request_rates):
            raise BenchError(f"--request-rate values must be > 0 requests/s, got {self.request_rates}")
        if not self.burstiness > 0:
            raise BenchError(f"--burstiness must be > 0 (1 = Poisson), got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise BenchError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        if self.repeats < 1:
            raise BenchError(f"--repeats must be >= 1, got {self.repeats}")
        try:
            parse_slo(self.slo)
        except ValueError as exc:
            raise BenchError(str(exc)) from None

    @property
    def open_loop(self) -> bool:
        return bool(self.request_rates)

    def loads(self) -> list[Load]:
        """The load levels of the sweep, in order: request rates (open loop) or concurrencies."""
        if self.open_loop:
            return [Load(concurrency=self.max_concurrency or 0, request_rate=r) for r in sorted(set(self.request_rates))]
        return [Load(concurrency=c) for c in sorted(set(self.concurrencies))]

    def draft_lengths_for(self, deployment: Deployment) -> list[int]:
        """The draft lengths swept on ``deployment``: only 0 on a deployment without speculation, only
        the server's own on an OpenAI server without a per-request draft length."""
        if not deployment.per_request_draft:
            return [deployment.openai_draft_len or 0]
        return [0] if deployment.method == "none" else self.ordered_draft_lengths()

    def num_requests(self, num_prompts: int, concurrency: int) -> int:
        """Requests per point and repeat: ``requests``, else every prompt once and every worker busy
        (open loop: ``concurrency`` is the cap, 0 = none)."""
        return self.requests if self.requests is not None else max(num_prompts, concurrency)

    def ordered_draft_lengths(self) -> list[int]:
        """Sorted, without repeats: k = 0 first, so every later point can compare its ids to it."""
        return sorted(set(self.draft_lengths))


@dataclass(frozen=True)
class Load:
    """One load level: closed loop at ``concurrency`` requests in flight, or (``request_rate`` set)
    open loop at that mean rate with at most ``concurrency`` in flight (0 = no cap)."""

    concurrency: int
    request_rate: float | None = None

    @property
    def label(self) -> str:
        """``C=4`` (closed loop) or ``2/s`` / ``2/s<=4`` (open loop, capped at 4 in flight)."""
        if self.request_rate is None:
            return f"C={self.concurrency}"
        return f"{self.request_rate:g}/s" + (f"<={self.concurrency}" if self.concurrency else "")


def sweep_size(plan: SweepPlan, deployments: Sequence[Deployment], set_sizes: dict[str, int]) -> int:
    """Timed requests the whole sweep sends (for the progress bar); ``set_sizes``: prompts per set."""
    per_k = sum(plan.num_requests(n, load.concurrency) for n in set_sizes.values() for load in plan.loads())
    return sum(per_k * len(plan.draft_lengths_for(d)) * plan.repeats for d in deployments)


def is_url(target: str) -> bool:
    """``host:port`` (a running server) rather than a recipe name or path."""
    return bool(URL.match(target)) and not Path(target).exists()


def url_deployments(urls: Sequence[str], *, labels: Sequence[str] = (), metrics_urls: Sequence[str] = (),
                    protocol: str = "grpc", tokenizer_dir: str | None = None, stream: bool = False) -> list[Deployment]:
    """Deployments for servers already running at ``urls``; ``labels`` / ``metrics_urls`` pair up with
    them in order. Raises ``BenchError`` when more labels or metrics urls than urls are given."""
    from specbuild.client.connect import host_port

    if len(labels) > len(urls) or len(metrics_urls) > len(urls):
        raise BenchError(f"{len(urls)} url targets but {len(labels)} --label and {len(metrics_urls)} --metrics-url")
    urls, metrics_urls = [host_port(u) for u in urls], [host_port(u) for u in metrics_urls]
    return [
        Deployment(
            name=labels[i] if i < len(labels) else url,
            url=url,
            protocol=protocol,
            metrics_url=metrics_urls[i] if i < len(metrics_urls) else None,
            tokenizer_dir=tokenizer_dir,
            stream=stream,
        )
        for i, url in enumerate(urls)
    ]


def openai_deployments(urls: Sequence[str], *, labels: Sequence[str] = (), chat: bool = False, stream: bool = True,
                       draft_len: int | None = None, tokenizer_dir: str | None = None, timeout_s: float = 30.0) -> list[Deployment]:
    """Deployments for OpenAI-compatible base URLs; each is asked (``/v1/models``) whether it is
    specbuild's front (then the sweep sets the draft length per request) or another server (then it
    runs at its own draft length ``draft_len``, a label). Raises ``BenchError`` when one does not answer."""
    from specbuild.client.openai_client import OpenAIClient
    from specbuild.client.sdk import ClientError

    out = []
    for i, url in enumerate(urls):
        with OpenAIClient(url, timeout_s=timeout_s) as probe:
            try:
                ours = probe.is_specbuild()
            except ClientError as exc:
                raise BenchError(f"--openai {url}: {exc}") from None
            base = probe.base_url
        out.append(Deployment(
            # named by host:port (the table's deployment column stays short); --label names it otherwise
            name=labels[i] if i < len(labels) else urlparse(base).netloc or base, url=base, protocol="openai",
            method="specbuild" if ours else "unknown",
            tokenizer_dir=tokenizer_dir, stream=stream, per_request_draft=ours, openai_chat=chat,
            openai_draft_len=None if ours else (draft_len or 0),
            # specbuild's front publishes the specbuild_* counters on its own /metrics: cross-check them too
            metrics_url=urlparse(base).netloc if ours else None,
        ))
    return out
