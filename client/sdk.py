"""A small typed client for a specbuild deployment's ``ensemble`` model, over gRPC or HTTP.

The deployment's interface (see ``/work/shared/facts/triton.md``): the ``ensemble`` model has
``max_batch_size > 0``, so every tensor carries a leading batch dimension and this client always
sends batch 1.

    inputs   text_input BYTES [1, 1]   max_tokens INT32 [1, 1]        (required)
             end_id, num_draft_tokens INT32 [1, 1]
             lookahead_window_size, lookahead_ngram_size, lookahead_verification_set_size INT32 [1, 1]
             return_perf_metrics, exclude_input_in_output BOOL [1, 1] (optional)
    outputs  text_output BYTES [1, 1]  output_ids INT32 [1, beam, n]  sequence_length INT32 [1, beam]
             acceptance_rate FP32 [1, 1], total_accepted_draft_tokens / total_draft_tokens INT32 [1, 1]
             (the last three only when return_perf_metrics is true)

Example::

    with SpecClient() as client:                      # gRPC on 127.0.0.1:8001
        client.wait_ready()
        result = client.generate("def fib(n):", max_tokens=64)
        print(result.text, result.tokens_per_s, result.acceptance_length)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from tritonclient.utils import InferenceServerException

Protocol = Literal["grpc", "http"]
DEFAULT_URLS: dict[str, str] = {"grpc": "127.0.0.1:8001", "http": "127.0.0.1:8000"}
PERF_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
LOOKAHEAD_INPUTS = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")  # (w, n, g)
# gRPC status codes that mean "no server answered", as opposed to "the server rejected the request".
UNAVAILABLE_GRPC_STATUSES = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")


class ClientError(Exception):
    """Base class of the errors this client raises."""


class ServerUnavailableError(ClientError):
    """No server answered at the url (refused, timed out), or the model never became ready."""


class RequestError(ClientError):
    """The server answered but rejected the request; the message carries the server's own text."""


@dataclass(frozen=True)
class GenerateResult:
    """One generation: the token ids and text the server returned, and how long it took.

    ``output_ids`` are the generated tokens only when the request had
    ``exclude_input_in_output=True`` (the default); otherwise they include the prompt.
    The three perf fields are ``None`` when the request did not ask for perf metrics.
    """

    output_ids: list[int]
    text: str
    latency_s: float  # wall-clock seconds, request sent -> response received
    acceptance_rate: float | None = None  # accepted draft tokens / draft tokens, as the server reports
    total_accepted_draft_tokens: int | None = None
    total_draft_tokens: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second of wall-clock latency (0.0 when the latency is not positive)."""
        return self.num_tokens / self.latency_s if self.latency_s > 0 else 0.0

    @property
    def acceptance_length(self) -> float | None:
        """Mean tokens emitted per target forward (verify step), bonus token included.

        Each verify step emits its accepted draft tokens plus exactly one bonus/correction token
        sampled from the target, so over a whole generation of n tokens::

            target steps = n - total_accepted_draft_tokens
            acceptance length = n / max(1, n - total_accepted_draft_tokens)

        Example: n = 10 tokens in 4 steps with 6 drafts accepted -> 10 / (10 - 6) = 2.5.
        Plain decoding (nothing accepted) gives 1.0. ``None`` without perf metrics.
        """
        if self.total_accepted_draft_tokens is None:
            return None
        n = self.num_tokens
        return n / max(1, n - self.total_accepted_draft_tokens)


class SpecClient:
    """Typed wrapper over ``tritonclient.grpc`` / ``tritonclient.http`` for the ``ensemble`` model.

    ``url`` is ``host:port`` without a scheme; it defaults to 127.0.0.1:8001 for gRPC and
    127.0.0.1:8000 for HTTP. ``timeout_s`` (seconds) bounds each request.
    Raises ``ValueError`` for an unknown protocol or a url with a scheme.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        protocol: Protocol = "grpc",
        model_name: str = "ensemble",
        timeout_s: float = 300.0,
    ) -> None:
        if protocol not in DEFAULT_URLS:
            raise ValueError(f"protocol must be one of {sorted(DEFAULT_URLS)}, got {protocol!r}")
        url = url or DEFAULT_URLS[protocol]
        if "://" in url:
            raise ValueError(f"url must be host:port without a scheme, got {url!r}")
        self.url = url
        self.protocol: Protocol = protocol
        self.model_name = model_name
        self.timeout_s = timeout_s
        self._tc = _triton_module(protocol)
        self._client = _make_client(self._tc, protocol, url, timeout_s)

    def __repr__(self) -> str:
        return f"SpecClient(url={self.url!r}, protocol={self.protocol!r}, model_name={self.model_name!r})"

    def __enter__(self) -> SpecClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def wait_ready(self, timeout_s: float = 60.0, *, poll_s: float = 0.5) -> None:
        """Poll until the server is live and ``model_name`` is ready; give up after ``timeout_s`` seconds.

        Raises ``ServerUnavailableError`` naming the url (server down) or the model (not ready,
        with the repository's model states when the server can list them).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            problem = self._readiness_problem(poll_timeout_s=max(poll_s, 1.0))
            if problem is None:
                return
            if time.monotonic() >= deadline:
                raise ServerUnavailableError(f"{problem} (waited {timeout_s:g} s)")
            time.sleep(poll_s)

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int,
        num_draft_tokens: int | None = None,
        end_id: int | None = None,
        return_perf_metrics: bool = True,
        exclude_input_in_output: bool = True,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        lookahead_config: tuple[int, int, int] | None = None,
    ) -> GenerateResult:
        """Generate up to ``max_tokens`` tokens for ``prompt``: greedy unless ``temperature > 0``.

        ``num_draft_tokens``: 0 = plain decoding on the same deployment, ``None`` = the engine's
        built max_draft_len. ``end_id``: ``None`` = engine default, -1 = never stop on a token.
        Sampling (TensorRT-LLM semantics): ``temperature``, ``top_k`` (0 = off), ``top_p`` in
        (0, 1], ``seed`` (uint64; the same seed on the same deployment gives the same tokens).
        ``lookahead_config``: a Lookahead deployment's per-request ``(w, n, g)`` within its built
        ``(W, N, G)`` (``(1, 1, 0)`` = plain decoding), sent as ``lookahead_window_size``,
        ``lookahead_ngram_size``, ``lookahead_verification_set_size``; ``None`` = the built values.
        Raises ``ValueError`` for out-of-range arguments, ``RequestError`` (with the server's
        message) when the server rejects the request, ``ServerUnavailableError`` when no server
        answers within ``timeout_s``.
        """
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if num_draft_tokens is not None and num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be >= 0 or None, got {num_draft_tokens}")
        window = (None, None, None) if lookahead_config is None else tuple(lookahead_config)
        if len(window) != 3:
            raise ValueError(f"lookahead_config must be (w, n, g) or None, got {lookahead_config!r}")
        inputs = self._inputs(
            prompt,
            max_tokens=max_tokens,
            num_draft_tokens=num_draft_tokens,
            end_id=end_id,
            return_perf_metrics=return_perf_metrics,
            exclude_input_in_output=exclude_input_in_output,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            **dict(zip(LOOKAHEAD_INPUTS, window)),
        )
        names = ("text_output", "output_ids", "sequence_length")
        names += PERF_OUTPUTS if return_perf_metrics else ()
        outputs = [self._tc.InferRequestedOutput(name) for name in names]
        start = time.perf_counter()
        response = self._call("inference", self._infer_fn(inputs, outputs))
        latency_s = time.perf_counter() - start
        return _parse_response(response, latency_s)

    def _inputs(self, prompt: str, **values: Any) -> list[Any]:
        tensors = {
            "text_input": (np.array([[prompt.encode("utf-8")]], dtype=np.object_), "BYTES"),
            "max_tokens": (np.array([[values["max_tokens"]]], dtype=np.int32), "INT32"),
            "return_perf_metrics": (np.array([[values["return_perf_metrics"]]], dtype=np.bool_), "BOOL"),
            "exclude_input_in_output": (np.array([[values["exclude_input_in_output"]]], dtype=np.bool_), "BOOL"),
        }
        optional = {
            "num_draft_tokens": (np.int32, "INT32"),
            "end_id": (np.int32, "INT32"),
            "temperature": (np.float32, "FP32"),
            "top_k": (np.int32, "INT32"),
            "top_p": (np.float32, "FP32"),
            "seed": (np.uint64, "UINT64"),
            **{name: (np.int32, "INT32") for name in LOOKAHEAD_INPUTS},
        }
        for name, (np_dtype, triton_dtype) in optional.items():
            if values[name] is not None:
                tensors[name] = (np.array([[values[name]]], dtype=np_dtype), triton_dtype)
        return [self._tensor(name, array, dtype) for name, (array, dtype) in tensors.items()]

    def _tensor(self, name: str, array: np.ndarray, dtype: str) -> Any:
        tensor = self._tc.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        return tensor

    def _infer_fn(self, inputs: list[Any], outputs: list[Any]):
        if self.protocol == "grpc":
            return lambda: self._client.infer(
                self.model_name, inputs, outputs=outputs, client_timeout=self.timeout_s
            )
        return lambda: self._client.infer(self.model_name, inputs, outputs=outputs)

    def _call(self, what: str, fn):
        """Run one tritonclient call, translating its failures into this module's errors."""
        try:
            return fn()
        except InferenceServerException as e:
            message = e.message() or str(e)
            if str(e.status()) in UNAVAILABLE_GRPC_STATUSES:
                raise ServerUnavailableError(
                    f"{what}: no answer from {self.protocol} server at {self.url}: {message}"
                ) from e
            raise RequestError(f"{what} on model {self.model_name!r} at {self.url} rejected: {message}") from e
        except OSError as e:  # HTTP: connection refused, reset, socket timeout
            raise ServerUnavailableError(
                f"{what}: no answer from {self.protocol} server at {self.url}: {e!r}"
            ) from e

    def _readiness_problem(self, *, poll_timeout_s: float) -> str | None:
        """``None`` when the server is live and the model ready, else a sentence saying what is not."""
        timeout = {"client_timeout": poll_timeout_s} if self.protocol == "grpc" else {}
        try:
            live = self._call("liveness", lambda: self._client.is_server_live(**timeout))
            ready = live and self._call(
                "readiness", lambda: self._client.is_model_ready(self.model_name, **timeout)
            )
        except ClientError as e:
            return f"server at {self.url} ({self.protocol}) is not reachable: {e}"
        if not live:
            return f"server at {self.url} ({self.protocol}) answers but is not live"
        if not ready:
            return f"model {self.model_name!r} is not ready on {self.url}{self._repository_states()}"
        return None

    def _repository_states(self) -> str:
        """``'; repository: name (STATE: reason), ...'``, or '' when the server cannot list it."""
        try:
            index = self._call("repository index", self._repository_index)
        except ClientError:
            return ""
        entries = [
            f"{m.get('name')} ({m.get('state', 'UNAVAILABLE')}{': ' + m['reason'] if m.get('reason') else ''})"
            for m in index
        ]
        return "; repository: " + (", ".join(entries) or "empty")

    def _repository_index(self) -> list[dict[str, Any]]:
        if self.protocol == "grpc":
            return self._client.get_model_repository_index(as_json=True).get("models", [])
        return list(self._client.get_model_repository_index())


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


def _parse_response(response, latency_s: float) -> GenerateResult:
    output_ids = response.as_numpy("output_ids")  # [1, beam, n]
    if output_ids is None:
        raise RequestError("response has no output_ids tensor")
    ids = output_ids.reshape(-1, output_ids.shape[-1])[0]  # [n], first beam
    sequence_length = response.as_numpy("sequence_length")  # [1, beam]
    if sequence_length is not None:
        ids = ids[: int(sequence_length.reshape(-1)[0])]
    text = response.as_numpy("text_output")  # [1, 1]
    return GenerateResult(
        output_ids=[int(t) for t in ids],
        text=_first_text(text),
        latency_s=latency_s,
        acceptance_rate=_first_scalar(response.as_numpy("acceptance_rate"), float),
        total_accepted_draft_tokens=_first_scalar(response.as_numpy("total_accepted_draft_tokens"), int),
        total_draft_tokens=_first_scalar(response.as_numpy("total_draft_tokens"), int),
    )


def _first_text(array: np.ndarray | None) -> str:
    if array is None or array.size == 0:
        return ""
    value = array.reshape(-1)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _first_scalar(array: np.ndarray | None, cast):
    if array is None or array.size == 0:
        return None
    return cast(array.reshape(-1)[0])
