"""A small typed client for a specbuild deployment's ``ensemble`` model, over gRPC or HTTP.

The deployment's interface is :mod:`specbuild.interface` (tabled in docs/interface.md): the
``ensemble`` model has ``max_batch_size > 0``, so every tensor carries a leading batch dimension and
this client always sends batch 1 (``text_input`` BYTES [1, 1], ``max_tokens`` INT32 [1, 1], ...).
A request's options are one :class:`~specbuild.interface.GenerateOptions`, whose fields
:meth:`SpecClient.generate` also takes as keywords; each set option is sent as the contract's tensor
of that name and type. Outputs: ``text_output`` [1, 1], ``output_ids`` [1, beam, n],
``sequence_length`` [1, beam]; the perf counters with ``return_perf_metrics``, ``logit_margin`` /
``runner_up_ids`` [1, n] with ``return_logit_margin`` (specbuild reference deployments), TensorRT-LLM's
``generation_logits`` [1, beam, n, vocab] with ``return_generation_logits`` (reduced here to the same
per-token margin; the logits themselves are not kept).

Errors are typed (:class:`ClientError` and its subclasses): server down, model not ready, request
rejected (with the server's message), timeout, malformed response. Calls that found no server are
retried by one :class:`RetryPolicy` (sync and async): exponential back-off with jitter; rejections
and timeouts are not retried.

Example::

    with SpecClient() as client:                      # gRPC on 127.0.0.1:8001
        client.wait_ready()
        result = client.generate("def fib(n):", max_tokens=64)
        print(result.text, result.finish_reason, result.acceptance_length, result.num_iterations)

    async with AsyncSpecClient() as client:           # asyncio, many requests in flight
        options = GenerateOptions(max_tokens=64, temperature=0.8, seed=7)
        results = await asyncio.gather(*(client.generate(p, options) for p in prompts))
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import socket
import threading
import time
from pathlib import Path
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import tenacity
from tritonclient.utils import InferenceServerException

from specbuild.interface import ENSEMBLE, GenerateOptions, SpecDecodeMetrics

Protocol = Literal["grpc", "http"]
DEFAULT_URLS: dict[str, str] = {"grpc": "127.0.0.1:8001", "http": "127.0.0.1:8000"}


class ClientError(Exception):
    """Base class of the errors this client raises.

    Hierarchy (``except ServerUnavailableError`` catches everything worth retrying later)::

        ClientError
          ServerUnavailableError   no answer: connection refused or reset, server died mid-request
            ModelNotReadyError     the server answers but the model is not loaded / not ready
            RequestTimeoutError    no answer within timeout_s (also a TimeoutError)
          RequestError             the server answered with an error (400: bad request, 500: failure)
          ResponseError            the server's answer is malformed (missing or mis-shaped tensors)

    ``attempts``: how many times the call was tried before this error (retries included).
    """

    attempts: int = 1


class ServerUnavailableError(ClientError):
    """No server answered at the url (refused, reset, died mid-request), or the model never became ready."""


class ModelNotReadyError(ServerUnavailableError):
    """The server answers, but the model is not loaded or not ready (Triton: unknown model, UNAVAILABLE)."""


class RequestTimeoutError(ServerUnavailableError, TimeoutError):
    """No answer within the client's ``timeout_s``; the request may still be running on the server."""


class RequestError(ClientError):
    """The server answered but rejected the request; the message carries the server's own text.

    ``status``: the transport's status (``"400"``, ``"500"`` over HTTP; ``"StatusCode.INVALID_ARGUMENT"``,
    ``"StatusCode.INTERNAL"`` over gRPC); ``server_message``: the server's text alone. Never retried.
    """

    def __init__(self, message: str, *, status: str | None = None, server_message: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.server_message = server_message

    @property
    def invalid_argument(self) -> bool:
        """True for a bad request (HTTP 400 / gRPC INVALID_ARGUMENT): fix the request, do not retry."""
        return self.status in ("400", "StatusCode.INVALID_ARGUMENT")


class ResponseError(ClientError):
    """The server's response is malformed: a tensor is missing, or has the wrong type or shape."""


@dataclass(frozen=True)
class GenerateResult:
    """One generation: the token ids and text the server returned, and how long it took.

    ``output_ids`` are the generated tokens only when the request had
    ``exclude_input_in_output=True`` (the default); otherwise they include the prompt.
    The three perf fields are ``None`` when the request did not ask for perf metrics.

    ``finish_reason``: ``"stop"`` (the end token ended it, or fewer than ``max_tokens`` came back),
    ``"length"`` (``max_tokens`` tokens, the last not the known end token); ``None`` when unknown.
    TensorRT-LLM's ensemble has no finish-reason tensor, so the client derives it from the token
    count and the request's ``end_id``: with ``end_id=None`` (engine default, unknown here) a
    generation whose end token lands exactly on the last allowed slot reads as ``"length"``.

    ``logit_margin`` / ``runner_up_ids`` (only with ``return_logit_margin=True`` on a deployment
    that has it, else ``None``): per generated token, the target's largest minus second-largest
    logit (logit units) and the second choice's id.
    """

    output_ids: list[int]
    text: str
    latency_s: float  # wall-clock seconds, request sent -> response received
    acceptance_rate: float | None = None  # accepted draft tokens / draft tokens, as the server reports
    total_accepted_draft_tokens: int | None = None
    total_draft_tokens: int | None = None
    finish_reason: str | None = None
    acceptance_source: str | None = None  # perf_metrics / derived (PyTorch path on 1.2.1) / none; None: no counts
    logit_margin: list[float] | None = None  # [num_tokens] logit units
    runner_up_ids: list[int] | None = None  # [num_tokens]

    @property
    def token_ids(self) -> list[int]:
        """Alias of ``output_ids``."""
        return self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def metrics(self) -> SpecDecodeMetrics | None:
        """The speculation figures of this result (:class:`specbuild.interface.SpecDecodeMetrics`):
        steps derived as ``num_tokens - 1 - accepted``. ``None`` without perf metrics.

        With ``exclude_input_in_output=False`` ``output_ids`` hold the prompt too, so the derived
        steps are not the generation's."""
        if self.total_accepted_draft_tokens is None:
            return None
        return SpecDecodeMetrics(self.num_tokens, self.total_draft_tokens, self.total_accepted_draft_tokens)

    @property
    def num_iterations(self) -> int | None:
        """Target forward passes, prefill included: ``num_spec_steps + 1``.

        Every verification step emits its accepted drafts plus one target token and the prefill the
        first token, so 10 tokens with 6 accepted drafts took 1 + 3 passes. ``None`` without perf
        metrics, 0 without tokens.
        """
        metrics = self.metrics
        if metrics is None:
            return None
        return metrics.num_spec_steps + 1 if self.num_tokens else 0

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second of wall-clock latency (0.0 when the latency is not positive)."""
        return self.num_tokens / self.latency_s if self.latency_s > 0 else 0.0

    @property
    def num_spec_steps(self) -> int | None:
        """Target verification passes after the prefill: ``num_tokens - 1 - accepted`` (the metrics
        vocabulary's name, docs/interface.md). ``None`` without perf metrics."""
        metrics = self.metrics
        return None if metrics is None else metrics.num_spec_steps

    @property
    def mean_acceptance_length(self) -> float | None:
        """Mean tokens per verification step after the prefill, bonus token included:
        ``1 + accepted / num_spec_steps`` (:func:`specbuild.interface.mean_acceptance_length`; the
        engine's and the OpenAI front's value for the same request).

        Example: 10 tokens with 6 drafts accepted -> 3 steps -> 1 + 6 / 3 = 3.0. Plain decoding
        (nothing accepted) gives 1.0. ``None`` without perf metrics or without a step.
        """
        metrics = self.metrics
        return None if metrics is None else metrics.mean_acceptance_length

    @property
    def acceptance_length(self) -> float | None:
        """Alias of :attr:`mean_acceptance_length` (specbuild 0.1's name)."""
        return self.mean_acceptance_length


class _Client:
    """What :class:`SpecClient` and :class:`AsyncSpecClient` share: where the ``ensemble`` model is, the
    request timeout and the retry policy (see :class:`SpecClient` for the arguments)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        protocol: Protocol = "grpc",
        model_name: str = "ensemble",
        timeout_s: float = 300.0,
        retries: int = 2,
        retry_backoff_s: float = 0.25,
        decoupled: bool = False,
        stream_timeout_s: float | None = None,
    ) -> None:
        self.url, self.protocol = _check_url(url, protocol)
        self.retry = RetryPolicy(retries, retry_backoff_s)
        _check_timeout(timeout_s)
        if stream_timeout_s is not None:
            _check_timeout(stream_timeout_s)
        self.stream_timeout_s = stream_timeout_s
        if decoupled and self.protocol != "grpc":
            raise ValueError("decoupled=True needs protocol='grpc': Triton streams responses over gRPC only")
        self.model_name = model_name
        self.timeout_s = timeout_s
        self.decoupled = decoupled
        self._tc = _triton_module(protocol)
        self._connect()

    def _connect(self) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, protocol={self.protocol!r}, model_name={self.model_name!r})"

    @property
    def _where(self) -> str:
        return f"model {self.model_name!r} on the {self.protocol} server at {self.url}"

    def _translate(self, what: str) -> Callable[[Exception], ClientError]:
        """``exception -> ClientError`` for a failed call ``what`` (see :func:`translate_error`)."""
        return lambda exc: translate_error(exc, what=what, where=self._where, timeout_s=self.timeout_s)

    @property
    def _server_timeout_us(self) -> int:
        """``timeout_s`` as Triton's request ``timeout`` (microseconds), sent with every non-streamed
        request: the server may drop the request once its client has given up (the reference engine
        does, wherever the request is; Triton's ensemble passes it on to its steps)."""
        return max(1, int(self.timeout_s * 1e6))


class SpecClient(_Client):
    """Typed wrapper over ``tritonclient.grpc`` / ``tritonclient.http`` for the ``ensemble`` model.

    ``url`` is ``host:port`` (``http://`` / ``grpc://`` and a path are dropped); it defaults to 127.0.0.1:8001 for gRPC and
    127.0.0.1:8000 for HTTP. ``timeout_s`` (seconds) bounds each request (gRPC ``client_timeout``;
    HTTP ``connection_timeout`` / ``network_timeout``); a non-streamed request also carries it to
    the server as Triton's request ``timeout``, so the reference engine drops the request when its
    client gives up instead of finishing it for nobody (a streamed request's ``timeout_s`` bounds the
    wait for each response, not the whole stream, so it is not sent). ``stream_timeout_s`` (None: no
    bound) bounds a whole stream: past it the stream is closed with ``RequestTimeoutError``, and it
    is sent as the stream's request ``timeout``, so the engine drops the stream then as well. A call that finds no server (refused, reset,
    model not ready) is tried ``1 + retries`` times, ``retry_backoff_s * 2**i`` seconds apart plus
    jitter (:class:`RetryPolicy`, the attribute ``retry``); a rejected request (``RequestError``), a
    malformed response and a timeout are never retried.
    ``decoupled=True`` is for a decoupled deployment (recipe ``serve.decoupled: true``), which
    refuses plain ``infer``: :meth:`generate` then sends each request over a gRPC stream with
    ``stream=False`` and returns its one response (same result; gRPC only).

    Thread-safe: one client may serve many threads at once (gRPC shares one channel, which
    tritonclient documents as thread-safe for ``infer``; HTTP, whose tritonclient object is
    single-threaded, gets one connection per thread). For asyncio use :class:`AsyncSpecClient`.
    Raises ``ValueError`` for an unknown protocol, an ``https://`` or other scheme, or negative retry settings.
    :meth:`wait_ready` on a port that speaks the other protocol (gRPC to Triton's HTTP port) fails at
    once with a ``ServerUnavailableError`` saying which protocol or port to use.
    """

    def _connect(self) -> None:
        self._client = _make_client(self._tc, self.protocol, self.url, self.timeout_s)
        self._lock = threading.Lock()
        self._thread_clients: list[Any] = [self._client]
        self._local = threading.local()
        self._local.client = self._client

    def __enter__(self) -> SpecClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            clients, self._thread_clients = self._thread_clients, []
        for client in clients:
            client.close()

    def _local_client(self) -> Any:
        """The tritonclient object for this thread (gRPC: the shared one)."""
        if self.protocol == "grpc":
            return self._client
        client = getattr(self._local, "client", None)
        if client is None:
            client = _make_client(self._tc, self.protocol, self.url, self.timeout_s)
            self._local.client = client
            with self._lock:
                self._thread_clients.append(client)
        return client

    def _output_names(self, options: GenerateOptions) -> tuple[str, ...]:
        """``options.output_names()`` plus the :data:`~specbuild.interface.PROBED_OUTPUTS` the model
        declares (its metadata, read once)."""
        names = options.output_names()
        if not options.return_perf_metrics:
            return names
        declared = getattr(self, "_probed", None)
        if declared is None:
            try:
                kwargs = {"as_json": True, "client_timeout": self.timeout_s} if self.protocol == "grpc" else {}
                metadata = self._local_client().get_model_metadata(self.model_name, **kwargs)
                declared = _declared_probes(metadata)
            except Exception:  # noqa: BLE001 - no metadata (yet): the contract's outputs only, asked again next time
                return names
            self._probed = declared
        return names + declared

    def deployment_facts(self) -> dict:
        """What the repository's own model configs say, for a client to adapt to (empty where a model
        or parameter is missing, e.g. on a foreign repository): ``tokenizer_dir`` (the ``preprocessing``
        model's parameter; a path on the server's machine, kept only if it exists here) and
        ``decoupled`` (whether ``tensorrt_llm`` streams one response per step)."""
        facts: dict = {}
        kwargs = {"as_json": True, "client_timeout": self.timeout_s} if self.protocol == "grpc" else {}

        def config(name: str) -> dict:
            raw = self._local_client().get_model_config(name, **kwargs)
            return raw.get("config", raw) if isinstance(raw, dict) else {}

        try:
            tokenizer = config("preprocessing").get("parameters", {}).get("tokenizer_dir", {}).get("string_value")
            if tokenizer and Path(tokenizer).is_dir():
                facts["tokenizer_dir"] = tokenizer
        except Exception:  # noqa: BLE001 - no preprocessing model: nothing to say
            pass
        try:
            facts["decoupled"] = bool(config("tensorrt_llm").get("model_transaction_policy", {}).get("decoupled", False))
        except Exception:  # noqa: BLE001 - no tensorrt_llm model
            pass
        return facts

    def wait_ready(self, timeout_s: float = 60.0, *, poll_s: float = 0.5) -> None:
        """Poll until the server is live and ``model_name`` is ready; give up after ``timeout_s`` seconds.

        Raises ``ServerUnavailableError`` naming the url (server down), or ``ModelNotReadyError``
        naming the model (with the repository's model states when the server can list them).
        """
        if timeout_s != timeout_s:  # nan: every deadline test is False, so the loop never ends
            raise ValueError("timeout_s must be a number of seconds, got nan")
        start = time.monotonic()
        deadline = start + timeout_s
        while True:
            problem = self._readiness_problem(poll_timeout_s=max(poll_s, 1.0))
            if problem is None:
                return
            if ": use --protocol " in problem[1]:  # the port speaks the other protocol: no point waiting
                raise problem[0](f"{problem[1]} (found after {time.monotonic() - start:.1f} s; not waiting for the rest of "
                                 f"the {timeout_s:g} s: a server is there, speaking the other protocol)")
            if time.monotonic() >= deadline:
                raise problem[0](f"{problem[1]} (waited {timeout_s:g} s)")
            time.sleep(poll_s)

    def generate(self, prompt: str, options: GenerateOptions | None = None, **fields: Any) -> GenerateResult:
        """Generate for ``prompt`` as ``options`` say, changed by the keyword ``fields`` (the fields of
        :class:`~specbuild.interface.GenerateOptions`: ``max_tokens``, ``num_draft_tokens``,
        ``end_id``, ``temperature``, ``top_k``, ``top_p``, ``seed``, ``lookahead_config``,
        ``return_logit_margin``, ...). Greedy unless ``temperature > 0``. Examples::

            client.generate("def fib(n):", max_tokens=64, num_draft_tokens=0)
            client.generate("def fib(n):", GenerateOptions(max_tokens=64, temperature=0.8, seed=7))

        Raises ``TypeError`` for an unknown field; ``ValueError`` for out-of-range values;
        ``RequestError`` (with the server's message, not retried) when the server rejects the request;
        ``ModelNotReadyError`` when the model is not loaded; ``RequestTimeoutError`` when no answer
        comes within ``timeout_s``; ``ServerUnavailableError`` when no server answers (after the
        retries); ``ResponseError`` when the response lacks ``output_ids`` or is mis-shaped.
        """
        options = GenerateOptions.of(options, **fields)
        if self.decoupled:
            (result,) = self._stream(prompt, options, stream=False)
            return dataclasses.replace(result, finish_reason=_finish_reason(result.token_ids, options.max_tokens, options.end_id))
        inputs = input_tensors(self._tc, options.tensor_values(prompt))
        outputs = [self._tc.InferRequestedOutput(name) for name in self._output_names(options)]
        start = time.perf_counter()
        response = self._call("inference", self._infer_fn(inputs, outputs))
        latency_s = time.perf_counter() - start
        return parse_response(response, latency_s, max_tokens=options.max_tokens, end_id=options.end_id, source=self._where)

    def _infer_fn(self, inputs: list[Any], outputs: list[Any]):
        timeout = self._server_timeout_us
        if self.protocol == "grpc":
            return lambda: self._client.infer(
                self.model_name, inputs, outputs=outputs, timeout=timeout, client_timeout=self.timeout_s
            )
        return lambda: self._local_client().infer(self.model_name, inputs, outputs=outputs, timeout=timeout)

    def _call(self, what: str, fn, *, retry: bool = True):
        """Run one tritonclient call under :attr:`retry` (or once); failures become this module's errors."""
        try:
            return (self.retry if retry else NO_RETRY).call(fn, self._translate(what))
        except ModelNotReadyError as error:
            if retry:
                error.args = (error.args[0] + self._repository_states(),)
            raise

    def _readiness_problem(self, *, poll_timeout_s: float) -> tuple[type[ClientError], str] | None:
        """``None`` when the server is live and the model ready, else (error class, sentence saying what is not)."""
        timeout = {"client_timeout": poll_timeout_s} if self.protocol == "grpc" else {}
        client = self._local_client()
        try:
            live = self._call("liveness", lambda: client.is_server_live(**timeout), retry=False)
            ready = live and self._call(
                "readiness", lambda: client.is_model_ready(self.model_name, **timeout), retry=False
            )
        except ClientError as e:
            from .connect import protocol_hint

            return ServerUnavailableError, f"server at {self.url} ({self.protocol}) is not reachable: {e}{protocol_hint(self.url, self.protocol)}"
        if not live:
            return ServerUnavailableError, f"server at {self.url} ({self.protocol}) answers but is not live"
        if not ready:
            return ModelNotReadyError, f"model {self.model_name!r} is not ready on {self.url}{self._repository_states()}"
        return None

    def _repository_states(self) -> str:
        """``'; repository: name (STATE: reason), ...'``, or '' when the server cannot list it."""
        try:
            index = self._call("repository index", self._repository_index, retry=False)
        except ClientError:
            return ""
        return describe_repository(index)

    def _repository_index(self) -> list[dict[str, Any]]:
        if self.protocol == "grpc":
            return self._client.get_model_repository_index(as_json=True).get("models", [])
        return list(self._local_client().get_model_repository_index())

    def generate_stream(self, prompt: str, options: GenerateOptions | None = None, *, stream: bool = True,
                        **fields: Any) -> Iterator[GenerateResult]:
        """Stream a generation from a decoupled deployment (recipe ``serve.decoupled: true``) over gRPC
        ``start_stream`` / ``async_stream_infer`` with TensorRT-LLM's ``stream`` input.

        Yields one :class:`GenerateResult` per decoding step: ``output_ids`` and ``text`` are what that
        step added (several tokens when drafts were accepted), the perf counters are totals so far and
        ``latency_s`` counts from sending the request. Concatenating the chunks' ``output_ids`` and
        ``text`` gives what :meth:`generate` returns. ``stream=False`` gets one response: the way to send
        a non-streamed request to a decoupled deployment (which refuses plain ``infer``).
        ``options`` / ``fields``: as for :meth:`generate`. Each call opens its own gRPC stream,
        so several may run at once (from threads). Example::

            text = "".join(chunk.text for chunk in client.generate_stream("def fib(n):", max_tokens=64))

        Raises ``ValueError`` for out-of-range arguments or ``protocol="http"``; ``RequestError`` (the
        server's message) when the server answers with an error; ``RequestTimeoutError`` when no
        response arrives within ``timeout_s``; ``ServerUnavailableError`` when no server answers.
        """
        return self._stream(prompt, GenerateOptions.of(options, **fields), stream=stream)

    def _stream(self, prompt: str, options: GenerateOptions, *, stream: bool) -> Iterator[GenerateResult]:
        """:meth:`generate_stream` for checked ``options`` (the arguments are checked before the first
        chunk is asked for)."""
        if self.protocol != "grpc":
            raise ValueError("generate_stream needs protocol='grpc' (Triton streams over gRPC)")
        inputs = input_tensors(self._tc, {**options.tensor_values(prompt), "stream": stream})
        outputs = [self._tc.InferRequestedOutput(name) for name in self._output_names(options)]
        if not stream:
            return self._stream_responses(inputs, outputs, timeout_us=self._server_timeout_us)
        whole = self.stream_timeout_s
        return self._stream_responses(inputs, outputs, timeout_us=None if whole is None else max(1, int(whole * 1e6)),
                                      whole_s=whole)

    def _stream_responses(self, inputs: list[Any], outputs: list[Any], *, timeout_us: int | None = None,
                          whole_s: float | None = None) -> Iterator[GenerateResult]:
        """Send one request over a gRPC stream (with Triton's request ``timeout_us`` when given); yield a
        result per response until the final one, each within ``timeout_s`` and all within ``whole_s``
        (None: no bound).

        The stream runs on this thread's stream connection (:meth:`_stream_connection`), kept for the
        thread's next request when this one finished cleanly, so a worker sending request after
        request opens one gRPC channel, not one per request."""
        import queue

        arrivals: queue.Queue = queue.Queue()
        client = self._stream_connection()
        start, finished, clean = time.perf_counter(), False, False
        deadline = None if whole_s is None else start + whole_s
        try:
            self._call("streaming", lambda: client.start_stream(callback=lambda result, error: arrivals.put((result, error))))
            try:
                client.async_stream_infer(self.model_name, inputs, outputs=outputs, enable_empty_final_response=True,
                                          timeout=timeout_us)
            except InferenceServerException as exc:  # the stream broke before the request went out (server gone)
                raise self._broken_stream(exc, arrivals) from None
            while not finished:
                wait_s = self.timeout_s if deadline is None else min(self.timeout_s, deadline - time.perf_counter())
                try:
                    result, error = arrivals.get(timeout=max(0.0, wait_s))
                except queue.Empty:
                    if wait_s < self.timeout_s:
                        raise RequestTimeoutError(f"streaming inference on {self._where}: not finished within "
                                                  f"stream_timeout_s={whole_s:g} s in all; closed") from None
                    raise _timeout("streaming inference", self._where, self.timeout_s) from None
                if error is not None:
                    finished = True
                    if isinstance(error, InferenceServerException) and error.status() is None:  # an error response
                        message = error.message() or str(error)
                        raise RequestError(f"streaming inference on {self._where} rejected: {message}", server_message=message)
                    raise translate_error(error, what="streaming inference", where=self._where, timeout_s=self.timeout_s)
                response = result.get_response()
                finished = response.parameters["triton_final_response"].bool_param
                if any(o.name == "output_ids" for o in response.outputs):  # the empty final response carries none
                    yield parse_response(result, time.perf_counter() - start, source=self._where)
            clean = True
        finally:
            client.stop_stream(cancel_requests=not finished)
            self._release_stream_connection(client, reuse=clean)

    def _stream_connection(self) -> Any:
        """This thread's idle gRPC client for a stream (tritonclient runs one stream per client at a
        time), or a new one while the thread's is busy (a generator of this thread not yet done)."""
        client = getattr(self._local, "stream_client", None)
        if client is not None and not self._local.stream_busy:
            self._local.stream_busy = True
            return client
        return _make_client(self._tc, "grpc", self.url, self.timeout_s)

    def _release_stream_connection(self, client: Any, *, reuse: bool) -> None:
        """Keep ``client`` as the thread's stream connection after a clean request; close it otherwise
        (a broken or abandoned stream starts the next request on a fresh channel)."""
        mine = client is getattr(self._local, "stream_client", None)
        if reuse and (mine or getattr(self._local, "stream_client", None) is None):
            if not mine:
                with self._lock:
                    self._thread_clients.append(client)
            self._local.stream_client, self._local.stream_busy = client, False
            return
        if mine:
            self._local.stream_client, self._local.stream_busy = None, False
            with self._lock:
                if client in self._thread_clients:
                    self._thread_clients.remove(client)
        client.close()

    def _broken_stream(self, exc: InferenceServerException, arrivals) -> ClientError:
        """The error for a stream tritonclient found broken when sending: the reason its callback got
        (a connection failure: :class:`ServerUnavailableError`), else ``exc`` as no answer."""
        import queue

        try:
            _, reason = arrivals.get(timeout=1.0)
        except queue.Empty:
            reason = None
        if isinstance(reason, InferenceServerException) and reason.status() is not None:
            return translate_error(reason, what="streaming inference", where=self._where, timeout_s=self.timeout_s)
        return ServerUnavailableError(f"streaming inference: no answer from {self._where}: {exc.message() or exc}")


class AsyncSpecClient(_Client):
    """The asyncio twin of :class:`SpecClient` over ``tritonclient.grpc.aio`` / ``tritonclient.http.aio``.

    Same arguments (``decoupled`` excepted), results, errors, retries and timeouts; ``generate`` and
    ``wait_ready`` are coroutines. Many ``generate`` calls may run at once on one client
    (``asyncio.gather``); use it from one event loop. HTTP needs ``aiohttp`` (``pip install 'tritonclient[http]'``).

    Example::

        async with AsyncSpecClient() as client:
            results = await asyncio.gather(*(client.generate(p, max_tokens=32) for p in prompts))
    """

    def _connect(self) -> None:
        if self.decoupled:
            raise ValueError("AsyncSpecClient does not stream: for a decoupled deployment use SpecClient(decoupled=True)")
        self._client = None  # made on first use, inside the event loop

    async def __aenter__(self) -> AsyncSpecClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def _aio(self) -> Any:
        if self._client is None:
            if self.protocol == "grpc":
                import tritonclient.grpc.aio as aio

                self._client = aio.InferenceServerClient(self.url)
            else:
                import tritonclient.http.aio as aio

                self._client = aio.InferenceServerClient(self.url, conn_timeout=self.timeout_s)
        return self._client

    async def wait_ready(self, timeout_s: float = 60.0, *, poll_s: float = 0.5) -> None:
        """Poll until the server is live and ``model_name`` is ready (see :meth:`SpecClient.wait_ready`)."""
        if timeout_s != timeout_s:  # nan: every deadline test is False, so the loop never ends
            raise ValueError("timeout_s must be a number of seconds, got nan")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ready = await self._call("readiness", lambda: self._aio().is_model_ready(self.model_name), retry=False)
                problem = None if ready else (ModelNotReadyError, f"model {self.model_name!r} is not ready on {self.url}")
            except ClientError as e:
                problem = (type(e), f"server at {self.url} ({self.protocol}) is not reachable: {e}")
            if problem is None:
                return
            if time.monotonic() >= deadline:
                raise problem[0](f"{problem[1]} (waited {timeout_s:g} s)")
            await asyncio.sleep(poll_s)

    async def generate(self, prompt: str, options: GenerateOptions | None = None, **fields: Any) -> GenerateResult:
        """Generate for ``prompt``; the options, keyword fields and errors are :meth:`SpecClient.generate`'s."""
        options = GenerateOptions.of(options, **fields)
        inputs = input_tensors(self._tc, options.tensor_values(prompt))
        names = options.output_names()
        if options.return_perf_metrics:
            if getattr(self, "_probed", None) is None:
                try:
                    kwargs = {"as_json": True} if self.protocol == "grpc" else {}
                    self._probed = _declared_probes(await self._aio().get_model_metadata(self.model_name, **kwargs))
                except Exception:  # noqa: BLE001 - no metadata (yet): the contract's outputs only
                    pass
            names += getattr(self, "_probed", None) or ()
        outputs = [self._tc.InferRequestedOutput(name) for name in names]
        start = time.perf_counter()
        response = await self._call("inference", lambda: self._infer(inputs, outputs))
        latency_s = time.perf_counter() - start
        return parse_response(response, latency_s, max_tokens=options.max_tokens, end_id=options.end_id, source=self._where)

    async def _infer(self, inputs: list[Any], outputs: list[Any]):
        client = self._aio()
        timeout = self._server_timeout_us
        if self.protocol == "grpc":
            return await client.infer(self.model_name, inputs, outputs=outputs, timeout=timeout, client_timeout=self.timeout_s)
        return await asyncio.wait_for(client.infer(self.model_name, inputs, outputs=outputs, timeout=timeout), self.timeout_s)

    async def _call(self, what: str, make_coroutine: Callable[[], Awaitable[Any]], *, retry: bool = True):
        """``await make_coroutine()`` under :attr:`retry` (or once); failures become this module's errors."""
        return await (self.retry if retry else NO_RETRY).call_async(make_coroutine, self._translate(what))


def input_tensors(tc, values: dict[str, Any]) -> list[Any]:
    """``tc.InferInput`` tensors (``tc``: a tritonclient module) of batch 1: each ``ensemble`` input
    in ``values`` (by name, e.g. :meth:`GenerateOptions.tensor_values`) as a ``[1, 1]`` array of the
    contract's type. Raises ``KeyError`` for a name the contract does not have."""
    result = []
    for name, value in values.items():
        spec = ENSEMBLE.input(name)
        array = np.array([[value]], dtype=spec.numpy_dtype)  # [batch 1, 1]
        tensor = tc.InferInput(name, list(array.shape), spec.wire_type)
        tensor.set_data_from_numpy(array)
        result.append(tensor)
    return result


def translate_error(exc: Exception, *, what: str, where: str, timeout_s: float) -> ClientError:
    """The :class:`ClientError` for a failed tritonclient call; re-raises ``exc`` when it is not one.

    tritonclient reports server answers and gRPC transport failures as ``InferenceServerException``
    (status ``StatusCode.*`` or an HTTP code) and HTTP transport failures as ``OSError`` (refused,
    reset, socket timeout) or the HTTP library's own errors.
    """
    if isinstance(exc, ClientError):
        return exc
    if isinstance(exc, InferenceServerException):
        status = None if exc.status() is None else str(exc.status())
        message = exc.message() or str(exc)
        lowered = message.lower()
        if status in ("StatusCode.DEADLINE_EXCEEDED", "504") or "deadline exceeded" in lowered:
            return _timeout(what, where, timeout_s)
        if any(marker in lowered for marker in MODEL_NOT_READY_MARKERS) or status in ("StatusCode.NOT_FOUND", "404"):
            return ModelNotReadyError(f"{what}: {where} is not loaded or not ready: {message}")
        if status in TRANSPORT_STATUSES:
            return ServerUnavailableError(f"{what}: no answer from {where}: {message}")
        if status is None:
            return ResponseError(f"{what}: unreadable response from {where}: {message}")
        if "decoupled transaction policy" in lowered:  # Triton: ModelInfer on a streaming model
            message += ("; this deployment streams (decoupled): use SpecClient(url, decoupled=True) or "
                        "`specbuild verify --streaming`")
        return RequestError(f"{what} on {where} rejected ({status}): {message}", status=status, server_message=message)
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return _timeout(what, where, timeout_s)
    if isinstance(exc, _transport_errors()):
        return ServerUnavailableError(f"{what}: no answer from {where}: {type(exc).__name__}: {exc}")
    if isinstance(exc, (ValueError, KeyError, TypeError, UnicodeDecodeError)):
        # tritonclient parsing a body that is not Triton's JSON / protobuf.
        return ResponseError(f"{what}: malformed response from {where}: {type(exc).__name__}: {exc}")
    raise exc


MODEL_NOT_READY_MARKERS = ("unknown model", "is not ready", "no available versions", "is not loaded")
# Statuses of a call that never reached a server able to answer (gRPC transport, HTTP 502/503).
TRANSPORT_STATUSES = ("StatusCode.UNAVAILABLE", "StatusCode.UNKNOWN", "StatusCode.CANCELLED", "502", "503")


def _timeout(what: str, where: str, timeout_s: float) -> RequestTimeoutError:
    return RequestTimeoutError(
        f"{what}: no answer from {where} within timeout_s={timeout_s:g} s (the request may still be "
        "running on the server); raise timeout_s or lower max_tokens"
    )


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Exceptions the HTTP stacks raise when the connection fails (besides OSError)."""
    errors: list[type[BaseException]] = [OSError, http.client.HTTPException, EOFError]
    try:
        from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError

        errors += [HTTPConnectionClosed, HTTPParseError]
    except ImportError:
        pass
    try:
        import aiohttp

        errors.append(aiohttp.ClientError)
    except ImportError:
        pass
    return tuple(errors)


def _retryable(error: BaseException) -> bool:
    """Retry only when no server answered or the model was not ready; never a rejection or a timeout."""
    return isinstance(error, ServerUnavailableError) and not isinstance(error, RequestTimeoutError)


def _with_attempts(error: ClientError) -> ClientError:
    if error.attempts > 1 and error.args:
        error.args = (f"{error.args[0]} (after {error.attempts} attempts)",)
    return error


@dataclass(frozen=True)
class RetryPolicy:
    """How :class:`SpecClient` and :class:`AsyncSpecClient` retry a call that found no server (tenacity).

    A call is tried at most ``1 + retries`` times. Before try ``i + 1`` the client waits
    ``backoff_s * 2**(i - 1)`` seconds plus a random jitter of up to ``backoff_s`` (tenacity's
    ``wait_exponential + wait_random``), so clients that lost the same server do not all come back at once.
    Only "no server answered" and "model not ready" (:class:`ServerUnavailableError`, not a
    :class:`RequestTimeoutError`) are retried; a rejected request, a malformed response and a timeout
    never are. The error raised says how many times the call was tried (``attempts``).
    ``sleep``: what waits (``None``: ``time.sleep``, ``asyncio.sleep`` for async calls; tests record).

    Example: ``RetryPolicy(retries=2, backoff_s=0.25)`` tries three times, waiting 0.25-0.5 s and then
    0.5-0.75 s. Raises ``ValueError`` for a negative ``retries`` or ``backoff_s``.
    """

    retries: int = 2
    backoff_s: float = 0.25
    sleep: Callable[[float], Any] | None = None

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0:
            raise ValueError(f"retries and retry_backoff_s must be >= 0, got {self.retries} and {self.backoff_s}")

    def _arguments(self) -> dict[str, Any]:
        return dict(
            stop=tenacity.stop_after_attempt(self.retries + 1),
            wait=tenacity.wait_exponential(multiplier=self.backoff_s) + tenacity.wait_random(0, self.backoff_s),
            retry=tenacity.retry_if_exception(_retryable),
            reraise=True,
            **({} if self.sleep is None else {"sleep": self.sleep}),
        )

    def call(self, fn: Callable[[], Any], translate: Callable[[Exception], ClientError]) -> Any:
        """``fn()``, retried; a failure is raised as ``translate(exception)`` (which re-raises what is
        not a call failure, e.g. a programming error)."""
        try:
            for attempt in tenacity.Retrying(**self._arguments()):
                with attempt:
                    return _attempt(fn, translate, attempt.retry_state.attempt_number)
        except ClientError as error:
            raise _with_attempts(error)
        raise AssertionError("unreachable")

    async def call_async(self, make_coroutine: Callable[[], Awaitable[Any]], translate: Callable[[Exception], ClientError]) -> Any:
        """``await make_coroutine()``, retried as :meth:`call` does."""
        try:
            async for attempt in tenacity.AsyncRetrying(**self._arguments()):
                with attempt:
                    try:
                        return await make_coroutine()
                    except Exception as exc:  # noqa: BLE001 - translate re-raises what is not a call failure
                        raise _translated(exc, translate, attempt.retry_state.attempt_number) from exc
        except ClientError as error:
            raise _with_attempts(error)
        raise AssertionError("unreachable")


NO_RETRY = RetryPolicy(retries=0, backoff_s=0.0)


def _attempt(fn: Callable[[], Any], translate: Callable[[Exception], ClientError], attempt_number: int) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - translate re-raises what is not a call failure
        raise _translated(exc, translate, attempt_number) from exc


def _translated(exc: Exception, translate: Callable[[Exception], ClientError], attempt_number: int) -> ClientError:
    error = translate(exc)
    error.attempts = attempt_number
    return error


def describe_repository(index: list[dict[str, Any]]) -> str:
    """``'; repository: name (STATE: reason), ...'`` from a repository index."""
    entries = [
        f"{m.get('name')} ({m.get('state', 'UNAVAILABLE')}{': ' + m['reason'] if m.get('reason') else ''})"
        for m in index
    ]
    return "; repository: " + (", ".join(entries) or "empty")


def _check_url(url: str | None, protocol: str) -> tuple[str, Protocol]:
    if protocol not in DEFAULT_URLS:
        raise ValueError(f"protocol must be one of {sorted(DEFAULT_URLS)}, got {protocol!r}")
    from .connect import host_port

    return host_port(url or DEFAULT_URLS[protocol]), protocol  # type: ignore[return-value]


def _check_timeout(timeout_s: float) -> None:
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")


def _triton_module(protocol: Protocol):
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    return module


def _make_client(module, protocol: Protocol, url: str, timeout_s: float):
    if protocol == "grpc":
        return module.InferenceServerClient(url)
    return module.InferenceServerClient(url, connection_timeout=timeout_s, network_timeout=timeout_s)


def parse_response(
    response, latency_s: float, *, max_tokens: int | None = None, end_id: int | None = None, source: str = "the server"
) -> GenerateResult:
    """A :class:`GenerateResult` from a tritonclient ``InferResult``.

    ``output_ids`` [1, beam, n] (first beam kept), cut to ``sequence_length`` [1, beam] when present.
    Raises ``ResponseError`` (naming ``source``) when ``output_ids`` is missing, not integer, or
    ``sequence_length`` is outside ``[0, n]``.
    """
    read = _output_reader(response)
    try:
        output_ids = read("output_ids")  # [1, beam, n]
        sequence_length = read("sequence_length")  # [1, beam]
        text = read("text_output")  # [1, 1]
    except Exception as e:  # noqa: BLE001 - tritonclient decoding a malformed body
        raise ResponseError(f"malformed response from {source}: {type(e).__name__}: {e}") from e
    if output_ids is None:
        raise ResponseError(f"response from {source} has no output_ids tensor")
    if output_ids.ndim == 0 or not np.issubdtype(output_ids.dtype, np.integer):
        raise ResponseError(
            f"response from {source}: output_ids must be an integer [1, beam, n] tensor, got "
            f"{output_ids.dtype} {list(output_ids.shape)}"
        )
    ids = output_ids.reshape(-1, output_ids.shape[-1])[0] if output_ids.size else output_ids.reshape(0)  # [n], first beam
    if sequence_length is not None and sequence_length.size:
        n = int(sequence_length.reshape(-1)[0])
        if not 0 <= n <= len(ids):
            raise ResponseError(f"response from {source}: sequence_length {n} is outside [0, {len(ids)}] output ids")
        ids = ids[:n]
    output = [int(t) for t in ids]
    margin = _per_token(read("logit_margin"), len(output), float)
    runner_up = _per_token(read("runner_up_ids"), len(output), int) if margin is not None else None
    if margin is None:
        margin, runner_up = margins_from_logits(read("generation_logits"), len(output))
    accepted, drafted = _first_scalar(read("total_accepted_draft_tokens"), int), _first_scalar(read("total_draft_tokens"), int)
    rate = _first_scalar(read("acceptance_rate"), float)
    if rate is not None and accepted is not None and drafted and abs(rate - accepted / drafted) < 1e-6:
        rate = accepted / drafted  # the server's FP32 tensor holds this ratio: give it in float64, without FP32 noise
    if drafted == 0:
        rate = None  # nothing drafted: undefined, as docs/interface.md and the OpenAI front say (not 0.0)
    return GenerateResult(
        output_ids=output,
        text=_first_text(text),
        latency_s=latency_s,
        acceptance_rate=rate,
        total_accepted_draft_tokens=accepted,
        total_draft_tokens=drafted,
        finish_reason=_finish_reason(output, max_tokens, end_id),
        acceptance_source=_acceptance_source(read),
        logit_margin=margin,
        runner_up_ids=runner_up,
    )


def _output_reader(response) -> Callable[[str], np.ndarray | None]:
    """``name -> response.as_numpy(name)``, answering None at once for an output the response does not
    carry (a gRPC response lists its outputs; tritonclient's ``as_numpy`` scans them on every call)."""
    try:
        present = {o.name for o in response.get_response().outputs}
    except Exception:  # noqa: BLE001 - an HTTP result (a dict) or a stand-in: ask as_numpy for each name
        return response.as_numpy
    return lambda name: response.as_numpy(name) if name in present else None


def margins_from_logits(logits: np.ndarray | None, n: int) -> tuple[list[float] | None, list[int] | None]:
    """Per-token top-1 minus top-2 logit and the runner-up id from TensorRT-LLM's ``generation_logits``.

    ``logits``: ``[1, beam, steps, vocab]`` (or ``[beam, steps, vocab]``), first beam used, cut to
    ``n`` steps. Example: rows [[2, 5, 1]] -> margin [3.0], runner-up [0]. ``(None, None)`` when absent.
    """
    if logits is None or logits.size == 0 or logits.ndim < 2:
        return None, None
    rows = logits.reshape(-1, *logits.shape[-2:])[0][:n].astype(np.float32)  # [steps, vocab]
    if rows.shape[-1] < 2:
        return None, None
    order = np.argsort(-rows, axis=-1, kind="stable")[:, :2]  # [steps, 2]
    top = np.take_along_axis(rows, order, axis=-1)
    return [float(v) for v in top[:, 0] - top[:, 1]], [int(i) for i in order[:, 1]]


_parse_response = parse_response  # the name earlier versions used


def _finish_reason(ids: list[int], max_tokens: int | None, end_id: int | None) -> str | None:
    """``"stop"``/``"length"`` (see :class:`GenerateResult`); None when ``max_tokens`` is unknown."""
    if max_tokens is None:
        return None
    if ids and end_id is not None and end_id >= 0 and ids[-1] == end_id:
        return "stop"
    return "length" if len(ids) >= max_tokens else "stop"


def _per_token(array: np.ndarray | None, n: int, cast) -> list | None:
    """The first row of a [1, >= n] per-token output cut to ``n``; None when absent or all NaN."""
    if array is None or array.size == 0:
        return None
    row = array.reshape(array.shape[0], -1)[0][:n] if array.ndim > 1 else array[:n]
    if row.dtype.kind == "f" and np.isnan(row).all():
        return None
    return [cast(v) for v in row]


def _declared_probes(metadata: Any) -> tuple[str, ...]:
    """The :data:`~specbuild.interface.PROBED_OUTPUTS` among a model's metadata ``outputs``."""
    from specbuild.interface import PROBED_OUTPUTS

    names = {o.get("name") for o in (metadata or {}).get("outputs", [])}
    return tuple(n for n in PROBED_OUTPUTS if n in names)


def _acceptance_source(read: Callable[[str], np.ndarray | None]) -> str | None:
    """The deployment's ``acceptance_source`` (PyTorch path); else ``perf_metrics`` when the counts
    came back (the engine's own counters), else ``None``. ``read``: :func:`_output_reader`."""
    source = read("acceptance_source")
    if source is not None and source.size:
        return _first_text(source)
    counts = read("total_draft_tokens")
    return "perf_metrics" if counts is not None and counts.size else None


def _first_text(array: np.ndarray | None) -> str:
    if array is None or array.size == 0:
        return ""
    value = array.reshape(-1)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _first_scalar(array: np.ndarray | None, cast):
    if array is None or array.size == 0:
        return None
    return cast(array.reshape(-1)[0])
