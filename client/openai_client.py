"""A client for OpenAI-compatible servers (trtllm-serve, vLLM, SGLang, specbuild's own front) that
returns the same :class:`~specbuild.client.sdk.GenerateResult` as the Triton client, so ``verify`` and
``bench`` run unchanged against either.

Requests go to ``{base_url}/completions`` (or ``/chat/completions`` with ``chat=True``), greedy
(``temperature: 0``) unless sampling is asked, with ``max_tokens``; ``end_id=-1`` becomes
``ignore_eos: true`` (vLLM's and SGLang's sampling extension, also accepted by trtllm-serve).

Token ids (``token_ids``), as each server documents them:

- ``"return-token-ids"`` (default): the request carries ``return_token_ids: true`` and the ids come
  from each choice's ``token_ids`` (vLLM >= 0.10.2, ``vllm/entrypoints/openai/protocol.py``;
  specbuild's front);
- ``"response"``: nothing extra is sent (trtllm-serve's request models forbid unknown fields) and the
  ids are read from the choices' ``token_ids``, which trtllm-serve's ``CompletionResponseChoice``
  carries (``tensorrt_llm/serve/openai_protocol.py``);
- ``"tokenizer"``: the returned text is re-tokenized with the target's tokenizer (SGLang's OpenAI
  routes, any other server): a comparison of text, up to tokenization.

A server that returns no ids in the first two modes is an error naming the third.

Speculation per request: only specbuild's front takes a draft length per request (the
``num_draft_tokens`` extension; 0 = off), sent when ``draft_field=True``. For any other server, give
a second URL serving the same target without speculation and wrap both in :class:`PairedClient`:
``num_draft_tokens=0`` goes to the baseline, anything else to the speculative server.

Acceptance figures per request: specbuild's front returns them in the ``spec_decode`` extension
object; other servers publish them only as server-wide metrics (see :func:`read_server_acceptance`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from specbuild.interface import (
    SPEC_DECODE_KEY,
    SpecDecodeMetrics,
    acceptance_rate,
    mean_acceptance_length,
    steps_from_avg_decoded_tokens_per_iter,
)

from .sdk import GenerateResult, RequestError, RequestTimeoutError, ResponseError, ServerUnavailableError

TokenIds = Literal["return-token-ids", "response", "tokenizer"]
TOKEN_ID_MODES = ("return-token-ids", "response", "tokenizer")
UNSUPPORTED = ("lookahead_config", "return_logit_margin", "return_generation_logits", "exclude_input_in_output")


class OpenAIClient:
    """Blocking client of one OpenAI-compatible server (thread-safe: httpx.Client is).

    Args:
        base_url: e.g. ``http://127.0.0.1:9000/v1`` (a trailing ``/v1`` is added when missing).
        model: the ``model`` field; ``None`` = the first id ``/v1/models`` lists.
        chat: send prompts as one user message to ``/chat/completions`` instead of ``/completions``.
        token_ids: where output ids come from (module docstring).
        tokenizer: a tokenizer (``encode``/``__call__``) for ``token_ids="tokenizer"``.
        draft_field: send ``num_draft_tokens`` (specbuild's front only).
        timeout_s: per-request timeout, seconds.
        api_key: sent as ``Authorization: Bearer KEY``; ``None`` = ``$SPECBUILD_API_KEY`` if set.

    Raises ``ValueError`` for ``token_ids="tokenizer"`` without a tokenizer.
    """

    def __init__(self, base_url: str, *, model: str | None = None, chat: bool = False, token_ids: TokenIds = "return-token-ids",
                 tokenizer=None, draft_field: bool = False, timeout_s: float = 600.0, api_key: str | None = None) -> None:
        import httpx

        if token_ids not in TOKEN_ID_MODES:
            raise ValueError(f"token_ids must be one of {TOKEN_ID_MODES}, got {token_ids!r}")
        if token_ids == "tokenizer" and tokenizer is None:
            raise ValueError("token_ids='tokenizer' needs the target's tokenizer (--tokenizer DIR)")
        self.base_url = normalize_base_url(base_url)
        self.chat, self.token_ids, self.tokenizer, self.draft_field = chat, token_ids, tokenizer, draft_field
        self.timeout_s = timeout_s
        api_key = api_key if api_key is not None else os.environ.get("SPECBUILD_API_KEY")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)), headers=headers)
        self._model = model

    def __enter__(self) -> OpenAIClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def __repr__(self) -> str:
        return f"OpenAIClient({self.base_url!r}, model={self._model!r})"

    # --- server -----------------------------------------------------------------------------------

    def models(self) -> list[dict]:
        """``GET /v1/models``'s ``data`` list. Raises ``ServerUnavailableError`` when nothing answers."""
        return self._get_json("/models").get("data", [])

    @property
    def model(self) -> str:
        if self._model is None:
            listed = self.models()
            if not listed:
                raise ResponseError(f"{self.base_url}/models lists no model; pass the model name")
            self._model = listed[0]["id"]
        return self._model

    def is_specbuild(self) -> bool:
        """The server is specbuild's OpenAI front (its ``/v1/models`` entries are owned by specbuild)."""
        return any(m.get("owned_by") == "specbuild" for m in self.models())

    def wait_ready(self, timeout_s: float = 60.0, *, poll_s: float = 0.5) -> None:
        """Poll ``/v1/models`` until it lists a model. Raises ``ServerUnavailableError`` after ``timeout_s``."""
        if timeout_s != timeout_s:  # nan: every deadline test is False, so the loop never ends
            raise ValueError("timeout_s must be a number of seconds, got nan")
        deadline = time.monotonic() + timeout_s
        while True:
            state = "not ready"
            try:
                if self.models():
                    return
                problem = "/models lists no model"
            except ServerUnavailableError as exc:  # nothing answers: the words the Triton client uses
                state, problem = "is not reachable", str(exc)
            except ResponseError as exc:
                problem = str(exc)
            if time.monotonic() >= deadline:
                raise ServerUnavailableError(f"OpenAI server at {self.base_url} {state}: {problem} (waited {timeout_s:g} s)")
            time.sleep(poll_s)

    # --- generation -------------------------------------------------------------------------------

    def request_body(self, prompt: str, *, max_tokens: int, num_draft_tokens: int | None = None, end_id: int | None = None,
                     temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                     seed: int | None = None, return_perf_metrics: bool = True, stream: bool = False, **unsupported: Any) -> dict:
        """The JSON body for one request. Raises ``RequestError`` for options an OpenAI server cannot
        take (lookahead windows, logit margins), ``ValueError`` for an ``end_id`` other than None / -1."""
        asked = [k for k, v in unsupported.items() if v not in (None, False) and k in UNSUPPORTED]
        unknown = [k for k in unsupported if k not in UNSUPPORTED]
        if unknown:
            raise TypeError(f"unexpected options {unknown}")
        if asked:
            raise RequestError(f"{', '.join(asked)}: not available through the OpenAI API", status="400",
                               server_message=f"{asked[0]} is not part of the OpenAI API")
        if end_id not in (None, -1):
            raise ValueError(f"end_id {end_id}: an OpenAI server takes only its own end token or ignore_eos (end_id -1)")
        del return_perf_metrics  # specbuild's front always reports its spec_decode figures
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "temperature": temperature or 0.0}
        if self.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if temperature:
            body.update({k: v for k, v in (("top_k", top_k), ("top_p", top_p), ("seed", seed)) if v is not None})
        if end_id == -1:
            body["ignore_eos"] = True
        if self.token_ids == "return-token-ids":
            body["return_token_ids"] = True
        if self.draft_field and num_draft_tokens is not None:
            body["num_draft_tokens"] = num_draft_tokens
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        return body

    def generate(self, prompt: str, *, max_tokens: int, **options: Any) -> GenerateResult:
        """One non-streamed generation (options: :meth:`request_body`'s). Raises ``RequestError`` (the
        server's message) for a 4xx/5xx answer, ``RequestTimeoutError``, ``ServerUnavailableError``,
        ``ResponseError`` for a body without choices or token ids."""
        body = self.request_body(prompt, max_tokens=max_tokens, **options)
        start = time.perf_counter()
        data = self._post_json(self._route, body)
        latency_s = time.perf_counter() - start
        choices = data.get("choices") or []
        if not choices:
            raise ResponseError(f"{self.base_url}: response without choices: {str(data)[:200]}")
        choice = choices[0]
        text = choice["message"]["content"] if self.chat else choice.get("text", "")
        ids = self._ids(choice.get("token_ids"), text or "")
        spec = data.get(SPEC_DECODE_KEY) or _from_decoded_per_iter(len(ids), choice.get("avg_decoded_tokens_per_iter"))
        return _result(ids, text or "", latency_s, spec, choice.get("finish_reason"))

    def generate_stream(self, prompt: str, *, max_tokens: int, **options: Any) -> Iterator[GenerateResult]:
        """Stream one generation: a :class:`GenerateResult` per server-sent event that adds tokens;
        ``latency_s`` counts from sending the request, acceptance figures are totals so far. Errors as
        :meth:`generate`."""
        import httpx

        body = self.request_body(prompt, max_tokens=max_tokens, stream=True, **options)
        start = time.perf_counter()
        try:
            with self._http.stream("POST", self.base_url + self._route, json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _status_error(response, self.base_url)
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[len("data:"):].strip()
                    if payload == "[DONE]":
                        return
                    event = _strict_json(payload, self.base_url)
                    if "error" in event:
                        message = event["error"].get("message", str(event["error"]))
                        raise RequestError(f"{self.base_url}: streamed error: {message}", status="500", server_message=message)
                    chunk = _chunk(event, self.chat)
                    if chunk is None:
                        continue
                    text, token_ids, finish = chunk
                    ids = self._ids(token_ids, text)
                    if ids or text:
                        yield _result(ids, text, time.perf_counter() - start, event.get(SPEC_DECODE_KEY), finish)
        except httpx.TimeoutException:
            raise RequestTimeoutError(f"no answer from {self.base_url} within {self.timeout_s:g} s") from None
        except httpx.TransportError as exc:
            raise ServerUnavailableError(f"no answer from {self.base_url}: {exc}") from None

    @property
    def _route(self) -> str:
        return "/chat/completions" if self.chat else "/completions"

    def _ids(self, token_ids, text: str) -> list[int]:
        if self.token_ids == "tokenizer":
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
        if token_ids is None:
            if not text:
                return []  # an event that adds nothing (role header, finish reason)
            raise ResponseError(
                f"{self.base_url} returned no token_ids (mode {self.token_ids!r}); "
                "compare re-tokenized text instead: --openai-token-ids tokenizer --tokenizer DIR"
            )
        return [int(t) for t in token_ids]

    def _get_json(self, route: str) -> dict:
        return self._request_json("GET", route)

    def _post_json(self, route: str, body: dict) -> dict:
        return self._request_json("POST", route, json=body)

    def _request_json(self, method: str, route: str, **kwargs) -> dict:
        """One request; the response as strict JSON. Raises the SDK's typed errors (timeout, no server,
        a 4xx/5xx status)."""
        import httpx

        try:
            response = self._http.request(method, self.base_url + route, **kwargs)
        except httpx.TimeoutException:
            raise RequestTimeoutError(f"no answer from {self.base_url} within {self.timeout_s:g} s") from None
        except httpx.TransportError as exc:
            raise ServerUnavailableError(f"no answer from {self.base_url}: {exc}") from None
        if response.status_code >= 400:
            raise _status_error(response, self.base_url)
        return _strict_json(response.text, self.base_url)


class PairedClient:
    """A speculative server and a baseline server (same target, speculation off) behind one
    ``generate``: ``num_draft_tokens == 0`` goes to ``baseline``, anything else to ``speculative``
    (whose own configured draft length applies). For ``verify --openai URL --openai-baseline URL``."""

    def __init__(self, speculative: OpenAIClient, baseline: OpenAIClient) -> None:
        self.speculative, self.baseline = speculative, baseline

    def _pick(self, options: dict) -> OpenAIClient:
        return self.baseline if options.pop("num_draft_tokens", None) == 0 else self.speculative

    def generate(self, prompt: str, **options: Any) -> GenerateResult:
        return self._pick(options).generate(prompt, **options)

    def generate_stream(self, prompt: str, **options: Any) -> Iterator[GenerateResult]:
        return self._pick(options).generate_stream(prompt, **options)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        self.speculative.wait_ready(timeout_s)
        self.baseline.wait_ready(timeout_s)

    def close(self) -> None:
        self.speculative.close()
        self.baseline.close()

    def __enter__(self) -> PairedClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def normalize_base_url(url: str) -> str:
    """``http://host:port/v1`` from ``host:port``, ``http://host:port`` or ``http://host:port/v1/``."""
    url = url.rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/v1") else url + "/v1"


def _result(ids: list[int], text: str, latency_s: float, spec: dict | None, finish: str | None) -> GenerateResult:
    """A :class:`GenerateResult` from a choice's ids and text and the response's ``spec_decode`` object
    (read by :meth:`SpecDecodeMetrics.from_fields <specbuild.interface.SpecDecodeMetrics.from_fields>`:
    its keys, or specbuild 0.1's)."""
    metrics = SpecDecodeMetrics.from_fields(spec, len(ids))
    return GenerateResult(
        output_ids=ids,
        text=text,
        latency_s=latency_s,
        acceptance_rate=None if metrics is None else metrics.acceptance_rate,
        total_accepted_draft_tokens=None if metrics is None else metrics.total_accepted_draft_tokens,
        total_draft_tokens=None if metrics is None else metrics.total_draft_tokens,
        finish_reason=finish,
        acceptance_source=(spec or {}).get("acceptance_source"),
    )


def _from_decoded_per_iter(num_tokens: int, per_iter: float | None) -> dict | None:
    """trtllm-serve's per-choice ``avg_decoded_tokens_per_iter`` as ``spec_decode`` figures: steps
    from :func:`~specbuild.interface.steps_from_avg_decoded_tokens_per_iter` (the prefill counts as an
    iteration there), accepted = tokens - 1 - steps; drafts unknown."""
    if not per_iter or per_iter <= 0 or not num_tokens:
        return None
    steps = steps_from_avg_decoded_tokens_per_iter(num_tokens, per_iter)
    return SpecDecodeMetrics(num_tokens, None, max(0, num_tokens - 1 - steps), steps).fields(deprecated=False)


def _chunk(event: dict, chat: bool) -> tuple[str, list[int] | None, str | None] | None:
    """(text, token ids, finish reason) of one streamed event; None for events without a choice."""
    choices = event.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
    return text or "", choice.get("token_ids"), choice.get("finish_reason")


def _strict_json(text: str, where: str) -> dict:
    """Parse a body as strict JSON (NaN / Infinity refused). Raises ``ResponseError``."""

    def refuse(token: str):
        raise ValueError(f"{token} is not JSON")

    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError as exc:
        raise ResponseError(f"{where}: response is not strict JSON ({exc}): {text[:200]}") from None


def _status_error(response, where: str) -> RequestError | ServerUnavailableError:
    openai_error = False  # the body is an OpenAI error object: an OpenAI-compatible server answered
    try:
        message = json.loads(response.text).get("error", {}).get("message")
        openai_error = bool(message)
        message = message or response.text
    except (ValueError, AttributeError):
        message = response.text
    status = str(response.status_code)
    if response.status_code in (502, 503):
        return ServerUnavailableError(f"{where} unavailable ({status}): {message}")
    hint = ""
    if response.status_code == 404 and not openai_error:
        try:
            path = response.request.url.path
        except RuntimeError:  # a response built without its request
            path = "that path"
        hint = (f". Nothing answers {path} there: is this an OpenAI-compatible "
                   "front's base URL (specbuild serve --openai-port P gives http://127.0.0.1:P/v1)? A Triton "
                   "HTTP port answers only /v2/...; point --url at Triton instead")
    return RequestError(f"{where} rejected the request ({status}): {message}{hint}", status=status,
                        server_message=str(message))


# --- server-wide acceptance figures (Prometheus / iteration stats) -----------------------------------

# Counter names as each server's source defines them (prometheus_client appends _total to counters).
VLLM_COUNTERS = {  # vllm/v1/metrics/loggers.py (V1 engine)
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}
SGLANG_GAUGES = {  # python/sglang/srt/metrics/collector.py
    "acceptance_length": "sglang:spec_accept_length",
    "acceptance_rate": "sglang:spec_accept_rate",
}
SPECBUILD_COUNTERS = {
    "draft_tokens": "specbuild_draft_tokens_total",
    "accepted_tokens": "specbuild_accepted_draft_tokens_total",
    "generated_tokens": "specbuild_generated_tokens_total",
}


@dataclass(frozen=True)
class ServerAcceptance:
    """Speculation figures a server publishes for all its requests together (not per request).

    ``source``: which exposition they came from (``vllm``, ``sglang``, ``trtllm-serve``,
    ``specbuild``); counters are totals since the server started, gauges the server's recent window.
    """

    source: str
    values: dict[str, float]


def parse_acceptance_metrics(text: str) -> ServerAcceptance | None:
    """The acceptance figures in a ``/metrics`` body: Prometheus text (vLLM counters, SGLang gauges,
    specbuild counters; summed over label sets) or trtllm-serve's JSON list of iteration stats
    (``specDecodingStats.numDraftTokens`` / ``numAcceptedTokens`` summed). ``None`` when none is there.

    Example: ``vllm:spec_decode_num_draft_tokens_total{model_name="m"} 40`` and
    ``vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 30`` -> vllm {draft_tokens: 40,
    accepted_tokens: 30}.
    """
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            stats = json.loads(stripped)
        except ValueError:
            return None
        spec = [s.get("specDecodingStats") for s in stats if isinstance(s, dict) and s.get("specDecodingStats")]
        if not spec:
            return None
        return ServerAcceptance("trtllm-serve", {
            "draft_tokens": float(sum(s.get("numDraftTokens", 0) for s in spec)),
            "accepted_tokens": float(sum(s.get("numAcceptedTokens", 0) for s in spec)),
        })
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            samples[name] = samples.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
    for source, names in (("vllm", VLLM_COUNTERS), ("sglang", SGLANG_GAUGES), ("specbuild", SPECBUILD_COUNTERS)):
        found = {key: samples[name] for key, name in names.items() if name in samples}
        if found:
            return ServerAcceptance(source, found)
    return None


def read_server_acceptance(metrics_url: str, timeout_s: float = 5.0) -> ServerAcceptance | None:
    """GET ``metrics_url`` (e.g. ``http://127.0.0.1:8000/metrics``) and :func:`parse_acceptance_metrics` it.

    Raises ``ServerUnavailableError`` when it does not answer.
    """
    import httpx

    try:
        response = httpx.get(metrics_url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ServerUnavailableError(f"no metrics at {metrics_url}: {exc}") from None
    return parse_acceptance_metrics(response.text)


def acceptance_over(before: ServerAcceptance | None, after: ServerAcceptance | None) -> dict | None:
    """The server's speculation figures over an interval: counter differences (vLLM, specbuild), or the
    ``after`` reading itself for gauges (SGLang: its recent window) and for trtllm-serve (each
    ``/metrics`` read drains the iteration stats since the previous one). Adds ``acceptance_rate``
    (accepted / draft tokens) and, for vLLM, ``acceptance_length`` = 1 + accepted / drafts.
    ``None`` without an ``after`` reading. Example: vLLM drafts 10 -> 30, draft tokens 40 -> 120,
    accepted 20 -> 80 -> rate 0.75, length 4.0."""
    if after is None:
        return None
    if after.source in ("vllm", "specbuild") and before is not None and before.source == after.source:
        values = {k: v - before.values.get(k, 0.0) for k, v in after.values.items()}
    else:
        values = dict(after.values)
    return {"source": after.source, **with_server_figures(values, after.source)}


def with_server_figures(values: dict, source: str) -> dict:
    """``values`` (server-wide counters) with ``acceptance_rate`` (accepted / draft tokens) and, for
    vLLM, ``acceptance_length`` = :func:`~specbuild.interface.mean_acceptance_length` over its
    ``num_drafts`` (vLLM counts a step only when it drafted), added where defined. SGLang's gauges
    are kept as the server reports them."""
    values = dict(values)
    if values.get("draft_tokens"):
        values["acceptance_rate"] = acceptance_rate(values.get("accepted_tokens", 0.0), values["draft_tokens"])
    if source == "vllm" and values.get("drafts"):
        values["acceptance_length"] = mean_acceptance_length(values.get("accepted_tokens", 0.0), values["drafts"])
    return values


def metrics_url_of(base_url: str) -> str:
    """``http://host:port/metrics`` for an OpenAI base URL (vLLM, SGLang, trtllm-serve and specbuild's
    front serve their metrics on the API port)."""
    return normalize_base_url(base_url).removesuffix("/v1") + "/metrics"
