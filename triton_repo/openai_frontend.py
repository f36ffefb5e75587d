"""An OpenAI-compatible HTTP front for a specbuild Triton deployment (FastAPI + uvicorn).

It answers the routes OpenAI clients and benchmark tools (vLLM's ``bench serve``, AIPerf, genai-perf's
``openai`` endpoint type) speak, and forwards each request to the deployment's ``ensemble`` model
over gRPC, the way Triton's own OpenAI frontend (triton-inference-server/server ``python/openai``)
sits in front of an in-process server::

    GET  /v1/models              the one served model
    POST /v1/completions         prompt -> text (``stream: true``: server-sent events)
    POST /v1/chat/completions    messages -> the tokenizer's chat template -> text (streaming too)
    GET  /health                 200 when the Triton model is ready, else 503
    GET  /metrics                Prometheus text: ``specbuild_*`` counters summed over the responses

Request fields (OpenAI's): ``model``, ``prompt`` (a string, a list of one string, or token ids) or ``messages``,
``max_tokens`` (chat also ``max_completion_tokens``; default: chat what is left of the deployment's
``max_seq_len`` after the prompt, as OpenAI and vLLM; completions 16), ``temperature`` (default 1.0, OpenAI's;
0 = greedy), ``top_p``, ``seed`` (omitted at temperature > 0: a fresh random seed per request, so
unseeded sampled answers differ as with OpenAI and vLLM; the Triton interface, which this front does
not change, keeps TensorRT-LLM's default seed), ``stream``, ``stream_options.include_usage``, ``stop`` (a string or a
list: the text is cut before the first one, ``finish_reason: "stop"``; see
:mod:`specbuild.triton_repo.openai_stop`). Every other field, OpenAI's or vLLM's, is in the table of
:mod:`specbuild.triton_repo.openai_fields`: accepted when it cannot change the output or is sent at its
neutral value (``frequency_penalty: 0``), else refused with a 400 naming it; unknown fields are refused.
Extension fields, named as vLLM names them where vLLM has one:

- ``top_k`` (int, 0 or -1 = off), ``ignore_eos`` (bool: generate ``max_tokens`` tokens; Triton's
  ``end_id = -1``) -- vLLM's sampling extensions;
- ``return_token_ids`` (bool; vLLM >= 0.10.2's name and layout): the response carries ``token_ids``
  (generated ids) on each choice and ``prompt_token_ids`` (the prompt as the deployment's tokenizer
  splits it); streamed, each chunk carries the ids it adds, ``prompt_token_ids`` on the first;
- ``num_draft_tokens`` (int >= 0; specbuild): draft length of this request, 0 = speculation off on
  the same deployment (the non-speculative baseline ``specbuild verify`` compares against).

Every response (streamed: every chunk with content, totals so far) carries the speculation figures
as the extension object ``spec_decode``, in the vocabulary of :class:`specbuild.interface.SpecDecodeMetrics`:
``total_draft_tokens``, ``total_accepted_draft_tokens`` (the Triton outputs' names),
``acceptance_rate`` (accepted / drafted; ``null`` when nothing was drafted), ``num_spec_steps``
(verification steps after the prefill: tokens - 1 - accepted) and ``mean_acceptance_length``
(1 + accepted / steps: tokens per step, bonus token included; AIPerf's names), and
``acceptance_source`` (``perf_metrics``, ``derived``, or ``none`` with every figure null when the
deployment left the counts out). specbuild 0.1's keys
``draft_tokens``, ``accepted_draft_tokens``, ``decode_steps`` and ``acceptance_length`` are sent too,
with the same values, for one more release.
Every body is strict JSON: no NaN or Infinity.

Streaming needs a decoupled deployment (recipe ``serve.decoupled: true``) for one event per decoding
step; on a deployment that is not decoupled a streamed request gets its whole answer as one event, and
the response says so in its ``X-Specbuild-Streaming: one-event`` header (``per-step`` otherwise).

Access and limits (API key, body size, prompt tokens, ``max_tokens``, concurrency per client):
:mod:`specbuild.triton_repo.openai_access`.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from specbuild.interface import SPEC_DECODE_KEY, SpecDecodeMetrics
from specbuild.triton_repo.openai_access import AccessGuard, FrontLimits
from specbuild.triton_repo.openai_fields import RefusedField, Route, check_fields
from specbuild.triton_repo.openai_stop import Piece, StopCutter, cut_whole, parse_stop

# Counters on /metrics, the same names the Triton model publishes (reference_engine._Counters), so a
# bench's counter cross-check reads either.
COUNTERS = (
    ("specbuild_draft_tokens_total", "Draft tokens sent to verification"),
    ("specbuild_accepted_draft_tokens_total", "Draft tokens accepted"),
    ("specbuild_generated_tokens_total", "Tokens generated"),
)


class FrontendError(Exception):
    """A request the front refuses; ``status`` is the HTTP status, ``param`` the field at fault."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind


@dataclass(frozen=True)
class FrontendConfig:
    """Where the deployment answers and what the front calls it.

    Attributes:
        triton_url: the deployment's gRPC ``host:port``.
        model: the name ``/v1/models`` lists and requests may name.
        tokenizer_dir: the deployment's tokenizer (chat template, prompt token ids).
        decoupled: the deployment streams (one response per decoding step).
        timeout_s: per-request timeout towards Triton (seconds).
        num_draft_tokens: draft length of requests that do not send ``num_draft_tokens``; ``None`` =
            the engine's max_draft_len, 0 = a door with speculation off (a baseline URL for
            ``specbuild verify --openai-baseline``).
        api_key: the key requests must send as ``Authorization: Bearer KEY``; None = none asked.
        limits: body size, prompt tokens, ``max_tokens`` and concurrency limits (:class:`FrontLimits`).
        max_seq_len: the deployment's prompt + output limit (tokens): a chat request without ``max_tokens``
            gets what is left of it (OpenAI's and vLLM's chat default); None: not known, 16.
    """

    triton_url: str
    model: str
    tokenizer_dir: str
    decoupled: bool = False
    timeout_s: float = 600.0
    num_draft_tokens: int | None = None
    api_key: str | None = field(default=None, repr=False)
    limits: FrontLimits = FrontLimits()
    max_seq_len: int | None = None


UNSEEDED_RANGE = 2**63
"""Seeds drawn for unseeded sampled requests lie in ``[0, UNSEEDED_RANGE)``: inside TensorRT-LLM's UINT64
``seed`` and every signed 64-bit conversion on the way."""


class _Request(BaseModel):
    """Fields shared by both routes (see the module docstring)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=0)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int | None = 1
    ignore_eos: bool = False
    return_token_ids: bool = False
    num_draft_tokens: int | None = Field(default=None, ge=0)
    stop: Any = None
    _stop: tuple[str, ...] = PrivateAttr(default=())

    ROUTE: ClassVar[Route] = "completions"

    def check(self, limits: FrontLimits = FrontLimits()) -> None:
        """Raise :class:`FrontendError` (400, ``param`` the field) for a field this front would not honour
        (:func:`~specbuild.triton_repo.openai_fields.check_fields`: unknown fields, values other than the
        neutral ones of what the deployment cannot do), a bad ``stop``, and a ``max_tokens`` over
        ``limits.max_tokens``."""
        sent = {name: getattr(self, name) for name in self.model_fields_set}
        try:
            check_fields({**sent, **(self.model_extra or {})}, self.ROUTE)
        except RefusedField as exc:
            raise FrontendError(str(exc), param=exc.param) from None
        try:
            self._stop = parse_stop(self.stop)
        except ValueError as exc:
            raise FrontendError(str(exc), param="stop") from None
        wanted = _max_tokens(self)
        if self.sent_max_tokens and limits.max_tokens is not None and wanted > limits.max_tokens:
            name = self.max_tokens_param
            raise FrontendError(f"{name}={wanted} is more than this server allows ({limits.max_tokens}, "
                                "specbuild serve --openai-max-tokens)", param=name)

    @property
    def sent_max_tokens(self) -> bool:
        """Whether the request set its length (``max_tokens``, or on chat ``max_completion_tokens``)."""
        return bool(getattr(self, "max_completion_tokens", None) or self.max_tokens)

    @property
    def max_tokens_param(self) -> str:
        """The field that set the length: ``max_completion_tokens`` when a chat request sent it, else ``max_tokens``."""
        return "max_completion_tokens" if getattr(self, "max_completion_tokens", None) else "max_tokens"

    @property
    def prompt_param(self) -> str:
        return "messages" if self.ROUTE == "chat" else "prompt"

    def sampling(self, default_num_draft_tokens: int | None = None) -> dict[str, Any]:
        """SpecClient.generate keyword arguments: greedy at temperature 0; sampling with the request's
        ``seed``, or without one a fresh random seed in ``[0, 2**63)`` (:data:`UNSEEDED_RANGE`), so that
        two unseeded sampled requests differ, as OpenAI's and vLLM's do."""
        k = self.num_draft_tokens if self.num_draft_tokens is not None else default_num_draft_tokens
        options: dict[str, Any] = {"end_id": -1 if self.ignore_eos else None, "num_draft_tokens": k}
        if self.temperature > 0:
            seed = self.seed if self.seed is not None else secrets.randbelow(UNSEEDED_RANGE)
            options.update(temperature=self.temperature, seed=seed)
            options.update(top_p=self.top_p, top_k=None if self.top_k in (None, -1) else self.top_k)
        return options

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """The checked ``stop`` strings (after :meth:`check`)."""
        return self._stop

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionRequest(_Request):
    prompt: Any  # a string, [string], [int, ...] or [[int, ...]]: checked by Frontend.completion_prompt


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]]


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    ROUTE: ClassVar[Route] = "chat"


def spec_decode_fields(num_tokens: int, accepted: int | None, drafted: int | None, source: str | None = None) -> dict[str, Any]:
    """The ``spec_decode`` extension object (:meth:`SpecDecodeMetrics.fields`); ``None`` figures
    become JSON null, never NaN. ``source``: the deployment's ``acceptance_source``. Counts the
    deployment left out (``acceptance_source`` ``none``) give null figures, not zeros.

    ``num_generated_tokens``: the tokens the figures cover (all the engine generated; a stop string
    cut after generation leaves ``usage.completion_tokens`` smaller).

    Example: 10 tokens, 6 of 8 drafts accepted -> rate 0.75, 3 steps, length 3.0.
    """
    fields = (SpecDecodeMetrics.unreported_fields(source or "none") if accepted is None
              else SpecDecodeMetrics(num_tokens, drafted, accepted, acceptance_source=source).fields())
    # the tokens these figures cover: every one the engine generated, which a stop string the front
    # applied after generation (usage.completion_tokens counts only those returned) can exceed
    return {**fields, "num_generated_tokens": num_tokens}


class Frontend:
    """The request logic, apart from FastAPI: one :class:`~specbuild.client.sdk.SpecClient` (thread-safe
    gRPC) towards the deployment, the tokenizer, and the counters behind ``/metrics``."""

    def __init__(self, config: FrontendConfig, restarts: Callable[[], int] | None = None) -> None:
        from specbuild.client.sdk import SpecClient
        from specbuild.triton_repo.models.tokenization import load_tokenizer

        self.config, self.restarts = config, restarts
        self.client = SpecClient(config.triton_url, protocol="grpc", timeout_s=config.timeout_s, retries=0,
                                 decoupled=config.decoupled)
        self.tokenizer = load_tokenizer(config.tokenizer_dir)
        self._lock = threading.Lock()
        self._longest: int | None = None
        self.totals = dict.fromkeys((name for name, _ in COUNTERS), 0)
        self.created = int(time.time())

    def close(self) -> None:
        self.client.close()

    # --- prompt ---------------------------------------------------------------------------------

    def completion_prompt(self, request: CompletionRequest) -> str:
        """The text of a completion's ``prompt``: a string, a list of one string, or token ids.

        Token ids (a list of ints, or a list of one such list; vLLM's ``prompt`` forms) are decoded with
        the deployment's tokenizer, because the ``ensemble`` takes text (``text_input``; docs/interface.md)
        and its preprocessing model tokenizes it. They are accepted only when that text tokenizes back to
        the same ids, so the engine sees exactly the ids sent. Raises :class:`FrontendError` (400,
        ``param: prompt``) for a batch (several prompts), an empty prompt, ids outside the vocabulary,
        ids that do not survive the round trip, and any other type.
        """
        prompt = request.prompt
        if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
            raise FrontendError(f"prompt is a batch of {len(prompt)} prompts; this server takes one prompt per request: "
                                "send one request per prompt", param="prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise FrontendError("prompt is empty", param="prompt")
            return prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return self._text_of_ids(prompt)
        if isinstance(prompt, list) and not prompt:
            raise FrontendError("prompt is empty", param="prompt")
        raise FrontendError(f"prompt must be a string, a list of one string, or token ids (a list of ints); got "
                            f"{_shown(prompt)}", param="prompt")

    def _text_of_ids(self, ids: list[int]) -> str:
        vocab = len(self.tokenizer)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise FrontendError(f"prompt token ids {bad[:5]} are outside this tokenizer's vocabulary [0, {vocab})", param="prompt")
        text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        again = self.prompt_token_ids(text)
        if again != ids:
            raise FrontendError(
                f"prompt token ids {_shown(ids)} cannot be sent as they are: this deployment takes text (text_input), "
                f"and they decode to {_shown(text)}, which its tokenizer splits as {_shown(again)}; send that text, "
                "or the ids it splits into", param="prompt")
        return text

    def chat_prompt(self, request: ChatCompletionRequest) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise FrontendError("this deployment's tokenizer has no chat template: use /v1/completions", param="messages")
        messages = [{"role": m.role, "content": _text_content(m.content)} for m in request.messages]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def prompt_token_ids(self, text: str, param: str = "prompt") -> list[int]:
        """The prompt as the deployment's preprocessing model tokenizes it (special tokens added).

        Raises :class:`FrontendError` (400, ``param``) for more than ``limits.max_prompt_tokens``
        tokens; a text too long for any tokenization within the limit (more characters than the
        limit times the longest vocabulary entry) is refused before tokenising.
        """
        limit = self.config.limits.max_prompt_tokens
        if limit is not None and len(text) > limit * self._longest_token_chars():
            raise FrontendError(f"prompt is {len(text)} characters: more than {limit} tokens can hold; this server takes at most "
                                f"{limit} prompt tokens (specbuild serve --openai-max-prompt-tokens)", param=param)
        ids = list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        if limit is not None and len(ids) > limit:
            raise FrontendError(f"prompt is {len(ids)} tokens; this server takes at most {limit} prompt tokens "
                                "(specbuild serve --openai-max-prompt-tokens)", param=param)
        return ids

    def _longest_token_chars(self) -> int:
        """Characters of the longest vocabulary entry (a byte-level token covers at most that many characters)."""
        if self._longest is None:
            self._longest = max((len(t) for t in self.tokenizer.get_vocab()), default=1) or 1
        return self._longest

    def decode(self, ids) -> str:
        """``ids`` as the deployment's postprocessing model decodes them (special tokens skipped)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # --- generation -----------------------------------------------------------------------------

    def check_model(self, request: _Request) -> None:
        if request.model not in (None, "", self.config.model):
            raise FrontendError(f"model {request.model!r} does not exist; this server serves {self.config.model!r}",
                                status=404, param="model", kind="not_found_error")

    def generate(self, text: str, request: _Request, max_tokens: int):
        """One non-streamed generation (blocking; FastAPI runs it in its thread pool)."""
        result = self._guard(lambda: self.client.generate(text, max_tokens=max_tokens, **request.sampling(self.config.num_draft_tokens)),
                             request)
        self._count(result.num_tokens, result.total_accepted_draft_tokens, result.total_draft_tokens)
        return result

    def generate_stream(self, text: str, request: _Request, max_tokens: int) -> Iterator:
        """Chunks of one generation: one per decoding step on a decoupled deployment, else one."""
        if not self.config.decoupled:
            yield self.generate(text, request, max_tokens)
            return
        chunks = self._guard(lambda: self.client.generate_stream(text, max_tokens=max_tokens, **request.sampling(self.config.num_draft_tokens)),
                             request)
        num_tokens, last = 0, None
        try:
            for chunk in self._guard_iter(chunks, request):
                num_tokens += chunk.num_tokens
                last = chunk
                yield chunk
        finally:
            chunks.close()  # a stop string ended it early: cancel the rest on the server
            if last is not None:
                self._count(num_tokens, last.total_accepted_draft_tokens, last.total_draft_tokens)

    def _count(self, tokens: int, accepted: int | None, drafted: int | None) -> None:
        with self._lock:
            self.totals["specbuild_generated_tokens_total"] += tokens
            self.totals["specbuild_accepted_draft_tokens_total"] += accepted or 0
            self.totals["specbuild_draft_tokens_total"] += drafted or 0

    def metrics_text(self) -> str:
        """Prometheus exposition text of the counters (prometheus_client's format)."""
        from prometheus_client import CollectorRegistry, Counter, generate_latest

        registry = CollectorRegistry()
        with self._lock:
            totals = dict(self.totals)
        for name, text in COUNTERS:
            counter = Counter(name.removesuffix("_total"), text, ["model"], registry=registry)
            counter.labels(model=self.config.model).inc(totals[name])
        if self.restarts is not None:
            Counter("specbuild_server_restarts", "Times specbuild serve --restart brought tritonserver back",
                    registry=registry).inc(self.restarts())
        return generate_latest(registry).decode()

    def ready(self) -> bool:
        """The deployment is live and its ensemble ready (one poll)."""
        from specbuild.client.sdk import ClientError

        try:
            self.client.wait_ready(timeout_s=0.0)
        except ClientError:
            return False
        return True

    @staticmethod
    def _guard(fn, request: _Request | None = None):
        """``fn()`` with the client's errors as :class:`FrontendError`: a request the deployment refused is a
        400 with its user-facing message alone (:func:`server_message`) and ``param`` the request field it
        names; a deployment that does not answer is a 503."""
        from specbuild.client.sdk import ClientError, RequestError

        try:
            return fn()
        except RequestError as exc:
            if not (exc.invalid_argument or _refused_as_bad_input(exc)):
                raise FrontendError(str(exc), status=500, kind="server_error") from None
            message = server_message(exc.server_message or str(exc))
            raise FrontendError(message, param=field_named(message, request)) from None
        except ValueError as exc:
            raise FrontendError(str(exc), param=field_named(str(exc), request)) from None
        except ClientError as exc:
            raise FrontendError(str(exc), status=503, kind="server_error") from None

    @classmethod
    def _guard_iter(cls, chunks, request: _Request | None = None):
        iterator = iter(chunks)
        while True:
            chunk = cls._guard(lambda: next(iterator, None), request)
            if chunk is None:
                return
            yield chunk


def _text_content(content) -> str:
    if isinstance(content, str):
        return content
    parts = [part.get("text", "") for part in content if part.get("type") == "text"]
    if len(parts) != len(content):
        raise FrontendError("only text content parts are supported", param="messages")
    return "".join(parts)


# "in ensemble 'ensemble', " (Triton's ensemble scheduler) and "InvalidRequestError: " (the model's
# exception name, triton_repo/models/common.run_each) before the engine's own message.
_INTERNAL_PREFIX = re.compile(r"^(?:in ensemble '[^']*', )?(?:[A-Za-z_.]*(?:Error|Exception): )?")
# The names the engine's and the ensemble's messages start with -> the OpenAI request field.
_FIELD_OF = {"max_tokens": "max_tokens", "num_draft_tokens": "num_draft_tokens", "temperature": "temperature",
             "top_k": "top_k", "top_p": "top_p", "seed": "seed", "end_id": "ignore_eos", "input_ids": "prompt",
             "text_input": "prompt", "request_output_len": "max_tokens"}


# The Python-backend models report a bad request (a ValueError) as "ValueError: ..." /
# "InvalidRequestError: ..." (triton_repo/models/common.run_each, reference_engine.execute); an error
# response on a gRPC stream carries no status code, so the name is what tells it from a server failure.
_BAD_INPUT = re.compile(r"^(?:in ensemble '[^']*', )?(?:InvalidRequestError|ValueError): ")


def _refused_as_bad_input(exc) -> bool:
    """A streamed error response (no status) whose message names a bad-input exception."""
    return exc.status is None and bool(_BAD_INPUT.match((exc.server_message or "").strip()))


def server_message(message: str) -> str:
    """The deployment's refusal without the transport chain: what the user can act on.

    Example: ``"in ensemble 'ensemble', InvalidRequestError: num_draft_tokens=99 is out of range; ..."`` ->
    ``"num_draft_tokens=99 is out of range; ..."``.
    """
    return _INTERNAL_PREFIX.sub("", message.strip(), count=1) or message


def field_named(message: str, request: _Request | None) -> str | None:
    """The request field a refusal's message is about (its first name, mapped to the OpenAI field), else None.

    Examples: ``"num_draft_tokens=99 is out of range"`` -> ``num_draft_tokens``;
    ``"len(input_ids) + max_tokens = 3 + 900 = 903 exceeds max_seq_len=512"`` -> ``max_tokens``
    (``max_completion_tokens`` when the chat request sent that); ``"input_ids has 900 tokens"`` -> ``prompt``
    (``messages`` on chat).
    """
    text = message.removeprefix("len(input_ids) + ")
    match = re.match(r"([a-z_]+)", text)
    field = _FIELD_OF.get(match.group(1)) if match else None
    if field is None or request is None:
        return field
    if field == "prompt":
        return request.prompt_param
    if field == "max_tokens":
        return request.max_tokens_param
    return field


def validation_message(errors: list[dict[str, Any]], body: Any) -> tuple[str, str | None]:
    """``(message, param)`` for FastAPI's request validation errors.

    A body that is not JSON -> "request body is not valid JSON: Expecting value at line 1 column 12"
    with ``param`` None. A field of the wrong type -> "max_tokens=0: Input should be greater than or
    equal to 1", ``param`` the field's path (``messages.0.role``) without pydantic's union-member tags.
    """
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error") or "JSON decode error"
        where = _line_column(body, first.get("loc", ("body", None))[-1])
        return f"request body is not valid JSON: {reason}{where}", None
    if first.get("loc", ())[:1] == ("body",) and len(first.get("loc", ())) == 1:
        return f"request body must be a JSON object: {first.get('msg', 'invalid request')}", None
    path = [str(p) for p in first.get("loc", ())[1:] if isinstance(p, int) or not _is_union_tag(str(p))]
    param = ".".join(path) or None
    shown = f"{param}={_shown(first['input'])}" if param and "input" in first and first["type"] != "missing" else param
    return f"{shown}: {first.get('msg', 'invalid request')}", param


def _is_union_tag(part: str) -> bool:
    """pydantic's location step naming a union member (``str``, ``list[dict[str,any]]``, ``function-after[...]``)."""
    return part in ("str", "int", "float", "bool", "none") or "[" in part


def _line_column(body: Any, position: Any) -> str:
    if not isinstance(position, int):
        return ""
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else body if isinstance(body, str) else None
    if text is None:
        return f" (character {position})"
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    return f" at line {line} column {column}"


def _shown(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


DEFAULT_MAX_TOKENS = 16  # /v1/completions without max_tokens (OpenAI's legacy default), or chat when the context is unknown


def _max_tokens(request: _Request, prompt_len: int | None = None, config: FrontendConfig | None = None) -> int:
    """The request's output limit: what it sent; else on chat what is left of the deployment's
    ``max_seq_len`` after the prompt (OpenAI's and vLLM's chat default), capped at the server's
    ``--openai-max-tokens``; else :data:`DEFAULT_MAX_TOKENS`."""
    sent = getattr(request, "max_completion_tokens", None) or request.max_tokens
    if sent:
        return sent
    if request.ROUTE == "chat" and config is not None and config.max_seq_len is not None and prompt_len is not None:
        left = max(1, config.max_seq_len - prompt_len)
        return left if config.limits.max_tokens is None else min(left, config.limits.max_tokens)
    return DEFAULT_MAX_TOKENS


def _finish_reason(result, max_tokens: int, ignore_eos: bool) -> str:
    return "length" if ignore_eos or result.num_tokens >= max_tokens else "stop"


def create_app(config: FrontendConfig, *, restarts: Callable[[], int] | None = None):
    """The FastAPI application for ``config`` (the deployment need not be up yet: /health says when).
    ``restarts``: the supervisor's restart count, published as ``specbuild_server_restarts_total``."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool

    front = Frontend(config, restarts)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        front.close()

    app = FastAPI(title="specbuild OpenAI-compatible front", version="1", lifespan=lifespan)
    app.state.front = front
    app.add_middleware(AccessGuard, api_key=config.api_key, limits=config.limits)

    @app.exception_handler(FrontendError)
    async def _frontend_error(request: Request, exc: FrontendError):
        return _error(JSONResponse, str(exc), exc.status, exc.kind, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        message, param = validation_message(exc.errors(), getattr(exc, "body", None))
        return _error(JSONResponse, message, 400, "invalid_request_error", param)

    @app.get("/health")
    async def health():
        ok = await run_in_threadpool(front.ready)
        return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(front.metrics_text(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": config.model, "object": "model", "created": front.created, "owned_by": "specbuild"}]}

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest):
        return await _answer(request, front.completion_prompt, kind="text_completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest):
        return await _answer(request, front.chat_prompt, kind="chat.completion")

    async def _answer(request: _Request, prompt_text: Callable[[Any], str], *, kind: str):
        """Both endpoints: the request checked (limits, model), its prompt text by ``prompt_text``, then
        the answer, streamed or whole."""
        request.check(config.limits)
        front.check_model(request)
        text = await run_in_threadpool(prompt_text, request)
        param = "messages" if kind == "chat.completion" else "prompt"
        prompt_ids = await run_in_threadpool(front.prompt_token_ids, text, param)
        max_tokens = _max_tokens(request, len(prompt_ids), config)
        response_id = f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}"
        if request.stream:
            events = _stream_events(front, request, text, max_tokens, prompt_ids, response_id, kind)
            mode = "per-step" if config.decoupled else "one-event"
            return StreamingResponse(events, media_type="text/event-stream", headers={"X-Specbuild-Streaming": mode})
        result = await run_in_threadpool(front.generate, text, request, max_tokens)
        piece = await run_in_threadpool(_whole_piece, front, request, result)
        return JSONResponse(_whole_body(request, result, piece, max_tokens, prompt_ids, response_id, kind, config.model))

    return app


def _error(response_class, message: str, status: int, kind: str, param: str | None):
    return response_class({"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status)


def _usage(prompt_ids: list[int], completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens}


def _whole_piece(front: Frontend, request: _Request, result) -> Piece:
    """The answer's text and ids, cut before the first stop string when the request has any."""
    if not request.stop_strings:
        return Piece(result.text, list(result.output_ids))
    return cut_whole(request.stop_strings, front.decode, result.text, result.output_ids)


def _whole_body(request, result, piece: Piece, max_tokens, prompt_ids, response_id, kind, model) -> dict:
    finish = "stop" if piece.stopped else _finish_reason(result, max_tokens, request.ignore_eos)
    if kind == "chat.completion":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": piece.text}, "finish_reason": finish, "logprobs": None}
    else:
        choice = {"index": 0, "text": piece.text, "finish_reason": finish, "logprobs": None}
    body: dict[str, Any] = {"id": response_id, "object": kind, "created": int(time.time()), "model": model, "choices": [choice],
                            "usage": _usage(prompt_ids, len(piece.ids)),
                            SPEC_DECODE_KEY: spec_decode_fields(result.num_tokens, result.total_accepted_draft_tokens, result.total_draft_tokens,
                                                                result.acceptance_source)}
    if request.return_token_ids:
        choice["token_ids"] = piece.ids
        if kind == "chat.completion":
            body["prompt_token_ids"] = prompt_ids
        else:
            choice["prompt_token_ids"] = prompt_ids
    return body


def _pieces(front: Frontend, request: _Request, text: str, max_tokens: int) -> Iterator[tuple[Piece, Any]]:
    """``(piece to send, the chunk it came with)`` for each chunk of a streamed generation; with stop
    strings, text that may start one is held back (sent at the end with chunk ``None`` when no stop
    string came), and the generation is cancelled at the first one."""
    chunks = front.generate_stream(text, request, max_tokens)
    with contextlib.closing(chunks):
        if not request.stop_strings:
            for chunk in chunks:
                yield Piece(chunk.text, list(chunk.output_ids)), chunk
            return
        cutter, chunk = StopCutter(request.stop_strings, front.decode), None
        for chunk in chunks:
            piece = cutter.feed(chunk.text, chunk.output_ids)
            yield piece, chunk
            if piece.stopped:
                return
        if chunk is not None:
            yield cutter.finish(), None


def _stream_events(front: Frontend, request, text, max_tokens, prompt_ids, response_id, kind) -> Iterator[str]:
    """Server-sent events of one streamed answer (a sync generator: Starlette iterates it in a thread).

    Errors after the first byte cannot change the HTTP status, so they go out as an ``error`` event.
    """
    chunk_kind = "chat.completion.chunk" if kind == "chat.completion" else "text_completion"
    base = {"id": response_id, "object": chunk_kind, "created": int(time.time()), "model": front.config.model}
    tokens, sent, first, stopped, last = 0, 0, True, False, None
    try:
        if kind == "chat.completion":
            yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        for piece, chunk in _pieces(front, request, text, max_tokens):
            if chunk is not None:
                tokens, last = tokens + chunk.num_tokens, chunk
            stopped = piece.stopped
            if not piece.text and not piece.ids:
                continue
            sent += len(piece.ids)
            choice: dict[str, Any] = {"index": 0, "finish_reason": None, "logprobs": None}
            if kind == "chat.completion":
                choice["delta"] = {"content": piece.text}
            else:
                choice["text"] = piece.text
            if request.return_token_ids:
                choice["token_ids"] = piece.ids
                if first:
                    (base if kind == "chat.completion" else choice)["prompt_token_ids"] = prompt_ids
            event = {**base, "choices": [choice],
                     SPEC_DECODE_KEY: spec_decode_fields(tokens, last.total_accepted_draft_tokens, last.total_draft_tokens,
                                                          last.acceptance_source)}
            base.pop("prompt_token_ids", None)
            first = False
            yield _sse(event)
        finish = "stop" if stopped else "length" if request.ignore_eos or tokens >= max_tokens else "stop"
        end_choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        end_choice["delta" if kind == "chat.completion" else "text"] = {} if kind == "chat.completion" else ""
        yield _sse({**base, "choices": [end_choice]})
        if request.include_usage:
            yield _sse({**base, "choices": [], "usage": _usage(prompt_ids, sent)})
    except FrontendError as exc:
        yield _sse({"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.status}})
    yield "data: [DONE]\n\n"


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, allow_nan=False)}\n\n"


# --- running it ------------------------------------------------------------------------------------


def config_from_deployment(triton_url: str, *, model: str | None = None, timeout_s: float = 600.0,
                           num_draft_tokens: int | None = None) -> FrontendConfig:
    """A :class:`FrontendConfig` read from a running reference deployment: the tokenizer directory from
    its ``preprocessing`` model's ``tokenizer_dir`` parameter, streaming from whether ``tensorrt_llm``
    is decoupled, the served name from ``model`` (else ``ensemble``'s repository recipe name, else
    ``"ensemble"``).

    Raises ``FrontendError`` (status 503) when the deployment cannot be asked.
    """
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(triton_url)
    try:
        pre = client.get_model_config("preprocessing", as_json=True)["config"]
        engine = client.get_model_config("tensorrt_llm", as_json=True)["config"]
    except Exception as exc:  # noqa: BLE001 - any failure: the deployment is not a reference one or not up
        raise FrontendError(f"cannot read the deployment's model configs at {triton_url}: {exc}", status=503) from None
    finally:
        client.close()
    tokenizer_dir = pre.get("parameters", {}).get("tokenizer_dir", {}).get("string_value")
    if not tokenizer_dir:
        raise FrontendError(f"the deployment at {triton_url} names no tokenizer_dir in its preprocessing model", status=503)
    decoupled = bool(engine.get("model_transaction_policy", {}).get("decoupled", False))
    return FrontendConfig(triton_url, model or "ensemble", tokenizer_dir, decoupled=decoupled, timeout_s=timeout_s,
                          num_draft_tokens=num_draft_tokens, max_seq_len=_engine_max_seq_len(engine))


def _engine_max_seq_len(engine_config: dict) -> int | None:
    """``build_config.max_seq_len`` of the engine the ``tensorrt_llm`` model serves (its ``engine_dir``'s
    ``config.json``, as TensorRT-LLM engines store it); None when the front cannot read it (another host)."""
    engine_dir = engine_config.get("parameters", {}).get("engine_dir", {}).get("string_value")
    try:
        value = json.loads((Path(engine_dir) / "config.json").read_text())["build_config"]["max_seq_len"]
    except (TypeError, OSError, ValueError, KeyError):
        return None
    return value if isinstance(value, int) and value > 0 else None


class OpenAIServer:
    """uvicorn serving :func:`create_app` on ``host:port`` in a background thread.

    ``port=0`` picks a free port (read :attr:`url` after :meth:`start`). Use as a context manager, or
    :meth:`start` / :meth:`stop`. Raises ``RuntimeError`` when uvicorn does not come up within
    ``startup_timeout_s``.
    """

    def __init__(self, config: FrontendConfig, *, host: str = "127.0.0.1", port: int = 9000, startup_timeout_s: float = 60.0,
                 restarts: Callable[[], int] | None = None):
        self.config, self.host, self.port, self.startup_timeout_s = config, host, port, startup_timeout_s
        self.restarts = restarts
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port/v1``: the base URL OpenAI clients take."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> OpenAIServer:
        import uvicorn

        from specbuild.triton_repo.tritonserver import free_port

        if self.port == 0:
            self.port = free_port(self.host)
        app = create_app(self.config, restarts=self.restarts)
        self._server = uvicorn.Server(uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", access_log=False))
        self._thread = threading.Thread(target=self._server.run, name="openai-front", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenAI front did not start on {self.host}:{self.port} (port taken?)")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
