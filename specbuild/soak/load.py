"""The soak's requests: the prompt pool, the mix of request kinds, one request's execution, the
plain-decoding calibration that also computes the references, and the open-loop arrivals.

Kinds: ``triton-stream`` (gRPC ``start_stream``, one response per step), ``triton-unary`` (one response;
a decoupled deployment takes non-streamed requests over the same stream call), ``openai-stream``
(server-sent events) and ``openai-unary`` on the OpenAI front. All requests are greedy with
``end_id = -1`` (OpenAI ``ignore_eos``), so a completed output of ``max_tokens`` tokens must equal the
first ``max_tokens`` tokens of its prompt's plain reference (``num_draft_tokens = 0``).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from specbuild.soak.ledger import Ledger, RequestRecord

KINDS = ("triton-stream", "triton-unary", "openai-stream", "openai-unary")
BAD_NUM_DRAFT_TOKENS = 99  # above any max_draft_len: the engine rejects it (InvalidRequestError)


@dataclass(frozen=True)
class SoakPrompt:
    """A prompt of the pool: ``name``, ``text`` and its token count under the served tokenizer."""

    name: str
    text: str
    tokens: int


@dataclass(frozen=True)
class Mix:
    """Fractions of requests that cancel mid-stream, are bad, or open a new connection; the output
    lengths drawn from; the fraction of completed outputs compared with the reference."""

    cancel: float = 0.10
    bad: float = 0.05
    reconnect: float = 0.10
    max_tokens: tuple[int, ...] = (16, 32, 64)
    sample: float = 0.5
    kinds: tuple[str, ...] = KINDS


@dataclass
class Endpoints:
    """Where requests go: Triton gRPC ``host:port``, the OpenAI base URL (``http://host:port/v1``; None:
    Triton only), the served model name, the client timeout in seconds."""

    grpc_url: str
    openai_url: str | None
    model: str | None = None
    timeout_s: float = 30.0


def prompt_pool(texts: Sequence[tuple[str, str]], tokenizer, *, max_input_len: int, near_max_margin: int = 16) -> list[SoakPrompt]:
    """The given ``(name, text)`` prompts plus two built ones: ``long`` (about half ``max_input_len``
    tokens) and ``near-max`` (``max_input_len - near_max_margin`` tokens or just under), both cut from
    the given texts repeated. Raises ``ValueError`` when no text is given."""
    if not texts:
        raise ValueError("the soak needs at least one prompt text")

    def count(text: str) -> int:
        return len(tokenizer(text)["input_ids"])

    pool = [SoakPrompt(name, text, count(text)) for name, text in texts]
    pool = [p for p in pool if p.tokens <= max_input_len - near_max_margin]
    source = "\n".join(text for _, text in texts)
    for name, target in (("long", max_input_len // 2), ("near-max", max_input_len - near_max_margin)):
        pool.append(_cut(name, source, target, tokenizer))
    return pool


def _cut(name: str, source: str, target: int, tokenizer) -> SoakPrompt:
    """A prompt of at most ``target`` tokens (as the tokenizer counts the decoded text) from ``source`` repeated."""
    ids = tokenizer(source, add_special_tokens=False)["input_ids"]
    ids = (ids * (target // max(1, len(ids)) + 2))[:target]
    while True:
        text = tokenizer.decode(ids, skip_special_tokens=True)
        n = len(tokenizer(text)["input_ids"])
        if n <= target or not ids:
            return SoakPrompt(name, text, n)
        ids = ids[: len(ids) - (n - target) - 1]


@dataclass
class RequestPlan:
    """One request as drawn: its kind, prompt, length and what it does on purpose."""

    kind: str
    prompt: SoakPrompt
    max_tokens: int
    bad: bool = False
    cancel: bool = False
    reconnect: bool = False
    sample: bool = False


def draw(rng: random.Random, pool: Sequence[SoakPrompt], mix: Mix) -> RequestPlan:
    """The next request: kind uniform over ``mix.kinds``; bad, cancelling (streams only), reconnecting
    and sampled with their fractions."""
    kind = rng.choice(mix.kinds)
    bad = rng.random() < mix.bad
    cancel = not bad and kind.endswith("stream") and rng.random() < mix.cancel * len(mix.kinds) / max(1, sum(k.endswith("stream") for k in mix.kinds))
    return RequestPlan(kind, rng.choice(pool), rng.choice(mix.max_tokens), bad=bad, cancel=cancel,
                       reconnect=rng.random() < mix.reconnect, sample=rng.random() < mix.sample)


class Clients:
    """Pools of Triton and OpenAI clients shared by the request threads: a request takes one (or makes
    one when none is free) and gives it back; a reconnecting request makes a new one and closes it."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        self._free: dict[str, list] = {"triton": [], "openai": []}
        self._all: list = []
        self._lock = threading.Lock()

    def make_triton(self):
        from specbuild.client.sdk import SpecClient

        # a stream is bounded in all (see _stream), and the server is told so: it drops an abandoned one
        return SpecClient(self.endpoints.grpc_url, timeout_s=self.endpoints.timeout_s, retries=0, decoupled=True,
                          stream_timeout_s=self.endpoints.timeout_s)

    def make_openai(self):
        from specbuild.client.openai_client import OpenAIClient

        return OpenAIClient(self.endpoints.openai_url, model=self.endpoints.model, draft_field=True, timeout_s=self.endpoints.timeout_s)

    def take(self, which: str, reconnect: bool):
        """A client of ``which`` (``triton``/``openai``): a pooled one, or a new one when ``reconnect``."""
        make = self.make_triton if which == "triton" else self.make_openai
        if not reconnect:
            with self._lock:
                if self._free[which]:
                    return self._free[which].pop()
        client = make()
        if not reconnect:
            with self._lock:
                self._all.append(client)
        return client

    def give_back(self, which: str, client, reconnect: bool) -> None:
        if reconnect:
            _close(client)
            return
        with self._lock:
            self._free[which].append(client)

    def close(self) -> None:
        with self._lock:
            clients, self._all, self._free = self._all, [], {"triton": [], "openai": []}
        for client in clients:
            _close(client)


def _close(client) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001 - closing after a fault may fail; nothing to keep
        pass


def execute(plan: RequestPlan, record: RequestRecord, clients: Clients, references: dict[str, list[int]],
            clock: Callable[[], float]) -> None:
    """Send ``plan`` and fill ``record`` (end, status, error, latencies, tokens, match). Never raises
    for a request's own failure: every error ends up in the record."""
    from specbuild.client.sdk import ClientError, RequestError

    which = plan.kind.split("-")[0]
    client = clients.take(which, plan.reconnect)
    try:
        if plan.bad:
            _send_bad(plan, client, clients.endpoints)
        elif plan.kind.endswith("stream"):
            _stream(plan, record, client, clock, clients.endpoints.timeout_s)
        else:
            _unary(plan, record, client)
        record.status = record.status or "ok"
    except ClientError as exc:
        record.status, record.error = "error", f"{type(exc).__name__}: {str(exc)[:300]}"
        record.expected_error = isinstance(exc, RequestError) and (exc.invalid_argument or exc.status is None)
    except Exception as exc:  # noqa: BLE001 - anything else is an unexpected failure, recorded
        record.status, record.error = "error", f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        record.end = clock()
        clients.give_back(which, client, plan.reconnect)
    if record.status == "ok" and plan.sample and record.output_ids is not None:
        reference = references.get(plan.prompt.name)
        if reference is not None:
            record.match = record.output_ids == reference[: plan.max_tokens]
    if record.status != "ok" or not plan.sample:
        record.output_ids = None


def _options(plan: RequestPlan) -> dict:
    return {"max_tokens": plan.max_tokens, "end_id": -1}


def _unary(plan: RequestPlan, record: RequestRecord, client) -> None:
    result = client.generate(plan.prompt.text, **_options(plan))
    _finish(record, result.output_ids, result.total_accepted_draft_tokens)


def _stream(plan: RequestPlan, record: RequestRecord, client, clock, timeout_s: float) -> None:
    """Read the stream; the clients' timeout bounds each chunk, so the whole stream is bounded here:
    past ``timeout_s`` seconds in all it is closed (cancelled on the server) with a timeout error."""
    from specbuild.client.sdk import RequestTimeoutError

    chunks = client.generate_stream(plan.prompt.text, **_options(plan))
    ids: list[int] = []
    accepted = None
    first_at = last_at = None
    try:
        for chunk in chunks:
            now = clock()
            if first_at is None:
                first_at = now
                record.ttft_s = now - record.start
            last_at = now
            ids.extend(chunk.output_ids)
            accepted = chunk.total_accepted_draft_tokens
            if plan.cancel:
                record.status = "cancelled"
                break
            if now - record.start > timeout_s:
                raise RequestTimeoutError(f"stream still running after {timeout_s:g} s ({len(ids)} tokens); closed")
    finally:
        chunks.close()
    if len(ids) > 1 and first_at is not None:
        record.itl_s = (last_at - first_at) / (len(ids) - 1)
    _finish(record, ids, accepted)


def _finish(record: RequestRecord, ids: list[int], accepted: int | None) -> None:
    record.output_ids, record.tokens, record.accepted = list(ids), len(ids), accepted


def _send_bad(plan: RequestPlan, client, endpoints: Endpoints) -> None:
    """A request the server must refuse: Triton: num_draft_tokens above max_draft_len; OpenAI: ``n = 2``."""
    if plan.kind.startswith("triton"):
        if plan.kind.endswith("stream"):
            list(client.generate_stream(plan.prompt.text, max_tokens=4, num_draft_tokens=BAD_NUM_DRAFT_TOKENS))
        else:
            client.generate(plan.prompt.text, max_tokens=4, num_draft_tokens=BAD_NUM_DRAFT_TOKENS)
        return
    client._post_json("/completions", {"model": client.model, "prompt": plan.prompt.text, "max_tokens": 4, "n": 2})


# --- calibration and references ---------------------------------------------------------------------


@dataclass
class Calibration:
    """The plain-decoding closed loop: requests and tokens per second at ``concurrency``."""

    concurrency: int
    elapsed_s: float
    requests: int
    tokens: int
    inconsistent: list[str] = field(default_factory=list)  # prompts whose plain output changed between runs

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s > 0 else 0.0


def calibrate(endpoints: Endpoints, pool: Sequence[SoakPrompt], *, max_tokens: int, concurrency: int, min_s: float,
              log: Callable[[str], None] = print) -> tuple[Calibration, dict[str, list[int]]]:
    """Plain decoding (``num_draft_tokens = 0``, greedy, ``end_id = -1``) over Triton gRPC in a closed
    loop of ``concurrency`` requests: every prompt at least once, then on until ``min_s`` seconds.

    Returns the throughput and each prompt's reference (its first plain output of ``max_tokens``
    tokens); a later plain output that differs is listed in ``inconsistent``. Raises the SDK's
    ``ClientError`` when a plain request fails (the deployment is not serving).
    """
    from specbuild.client.sdk import SpecClient

    references: dict[str, list[int]] = {}
    inconsistent: list[str] = []
    lock = threading.Lock()
    counts = {"requests": 0, "tokens": 0}
    start = time.monotonic()
    cursor = iter(range(10**9))

    def worker() -> None:
        with SpecClient(endpoints.grpc_url, timeout_s=max(endpoints.timeout_s, 120.0), decoupled=True) as client:
            while True:
                with lock:
                    i = next(cursor)
                if i >= len(pool) and time.monotonic() - start >= min_s:
                    return
                prompt = pool[i % len(pool)]
                result = client.generate(prompt.text, max_tokens=max_tokens, end_id=-1, num_draft_tokens=0)
                with lock:
                    counts["requests"] += 1
                    counts["tokens"] += result.num_tokens
                    known = references.setdefault(prompt.name, list(result.output_ids))
                    if known != list(result.output_ids) and prompt.name not in inconsistent:
                        inconsistent.append(prompt.name)

    with ThreadPoolExecutor(concurrency) as pool_exec:
        for future in [pool_exec.submit(worker) for _ in range(concurrency)]:
            future.result()
    calibration = Calibration(concurrency, time.monotonic() - start, counts["requests"], counts["tokens"], inconsistent)
    log(f"calibration: plain decoding at concurrency {concurrency}: {calibration.requests} requests, "
        f"{calibration.tokens_per_s:.1f} tokens/s, {calibration.requests_per_s:.2f} requests/s in {calibration.elapsed_s:.0f} s")
    return calibration, references


def fill_slots(endpoints: Endpoints, prompt: SoakPrompt, *, slots: int, max_tokens: int,
               log: Callable[[str], None] = print) -> float:
    """``slots`` requests of ``prompt`` at once (speculative, as the load runs): every KV slot of the
    engine gets written as far as the soak's longest request reaches, so the pages the OS commits on
    first write are in RSS before the RSS baseline is taken. Returns the seconds it took; raises the
    SDK's ``ClientError`` when one fails."""
    from specbuild.client.sdk import SpecClient

    def one(_: int) -> None:
        with SpecClient(endpoints.grpc_url, timeout_s=max(endpoints.timeout_s, 600.0), decoupled=True) as client:
            client.generate(prompt.text, max_tokens=max_tokens, end_id=-1)

    start = time.monotonic()
    with ThreadPoolExecutor(slots) as pool:
        list(pool.map(one, range(slots)))
    elapsed = time.monotonic() - start
    log(f"KV slots: {slots} requests of {prompt.tokens} + {max_tokens} tokens at once in {elapsed:.0f} s")
    return elapsed


# --- open loop ----------------------------------------------------------------------------------------


@dataclass
class OpenLoop:
    """Poisson arrivals at ``rate_per_s`` until ``stop`` is set, ``duration_s`` passes or ``max_requests``
    were sent; each request runs in its own thread. An arrival that finds ``max_in_flight`` requests
    running is not sent and counted in ``shed`` (the load generator never queues requests itself)."""

    rate_per_s: float
    duration_s: float
    max_requests: int
    max_in_flight: int
    seed: int = 0
    shed: int = 0
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, send: Callable[[int], None], clock: Callable[[], float],
            end_at: Callable[[], float] | None = None) -> list[threading.Thread]:
        """Send until the end (``end_at()``, seconds on ``clock``, asked at every arrival; default
        ``duration_s``); returns the request threads (the caller joins them with its own deadline)."""
        end_at = end_at or (lambda: self.duration_s)
        rng = random.Random(self.seed)
        slots = threading.BoundedSemaphore(self.max_in_flight)
        threads: list[threading.Thread] = []
        next_at = clock()
        while not self.stop.is_set() and self.sent < self.max_requests:
            next_at += rng.expovariate(self.rate_per_s)
            if next_at >= end_at():
                break
            if self.stop.wait(max(0.0, next_at - clock())):
                break
            if not slots.acquire(blocking=False):
                self.shed += 1
                continue
            request_id = self.sent
            self.sent += 1

            def one(request_id: int = request_id) -> None:
                try:
                    send(request_id)
                finally:
                    slots.release()

            thread = threading.Thread(target=one, name=f"soak-{request_id}", daemon=True)
            thread.start()
            threads.append(thread)
            threads = [t for t in threads if t.is_alive()] if len(threads) > 4 * self.max_in_flight else threads
        return threads


def new_record(ledger: Ledger, request_id: int, plan: RequestPlan, start: float) -> RequestRecord:
    return ledger.add(RequestRecord(request_id, plan.kind, plan.prompt.name, plan.max_tokens, start,
                                    bad=plan.bad, cancel=plan.cancel, reconnect=plan.reconnect))
