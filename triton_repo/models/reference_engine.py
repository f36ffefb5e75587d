"""Triton Python-backend ``tensorrt_llm`` model served by specbuild's reference engine.

It takes and returns the tensors of TensorRT-LLM's ``tensorrt_llm`` model (``input_ids``,
``input_lengths``, ``request_output_len``, ``end_id``, ``pad_id`` -> ``output_ids`` [beam, len],
``sequence_length``, and with ``return_perf_metrics`` the speculative-decoding metrics
``acceptance_rate``, ``total_accepted_draft_tokens``, ``total_draft_tokens``), plus the BLS
model's ``num_draft_tokens`` (0 = plain decoding on the same engine: the non-speculative baseline)
and, for a Lookahead engine, the request's ``(w, n, g)`` as TensorRT-LLM's ``lookahead_window_size``,
``lookahead_ngram_size``, ``lookahead_verification_set_size``. specbuild's own
``return_logit_margin`` asks for ``logit_margin`` / ``runner_up_ids``: the target's top-two logit
margin and second choice at each generated position (see :class:`Margins`), so a client can tell a
numerical near-tie from a real divergence.

Requests run with in-flight batching (:class:`~specbuild.engine.scheduler.Scheduler`); on a decoupled
deployment a request with ``streaming`` true gets one response per decoding step (TensorRT-LLM's
``streaming`` input, ``model_transaction_policy { decoupled: true }``).

The Triton glue (:class:`TritonPythonModel`) only converts tensors; :func:`parse_batch`,
:func:`pack_outputs` and :func:`pack_step` are plain numpy functions that the tests call directly.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np

from specbuild.engine.scheduler import DropRequest, RequestTimedOut
from specbuild.engine.stream import StepOutput, collect, merge
from specbuild.engine.types import GenerationRequest, GenerationResult
from specbuild.interface import ENGINE, LOOKAHEAD_INPUTS, REFERENCE
from specbuild.triton_repo.models.common import (
    as_bool,
    error_response,
    model_parameters,
    optional_input,
    per_row,
    required_input,
)
from specbuild.triton_repo.models.outbox import CHECK_CANCELLATION, CancellationWatch, Mailbox, Outbox

# The tensorrt_llm inputs this model serves (the contract's, specbuild.interface), read per request.
INPUTS = ENGINE.served_by(REFERENCE).input_names


@dataclass(frozen=True)
class Row:
    """One sequence of a batch: the engine request and how to shape its outputs."""

    request: GenerationRequest
    pad_id: int
    exclude_input_in_output: bool
    return_perf_metrics: bool
    return_logit_margin: bool = False
    streaming: bool = False


def parse_batch(inputs: dict[str, np.ndarray | None], *, default_pad_id: int, default_exclude_input: bool) -> list[Row]:
    """Requests from TensorRT-LLM-named tensors.

    Args:
        inputs: ``input_ids`` [batch, max_len] int32 (right-padded), ``input_lengths`` [batch, 1],
            ``request_output_len`` [batch, 1]; optional (None when absent) ``end_id``, ``pad_id``,
            ``num_draft_tokens`` [batch, 1] int32, ``return_perf_metrics``,
            ``exclude_input_in_output`` [batch, 1] bool, and the sampling parameters ``temperature``,
            ``runtime_top_p`` [batch, 1] fp32, ``runtime_top_k`` [batch, 1] int32, ``seed`` [batch, 1]
            uint64 (absent temperature: greedy), and ``lookahead_window_size``, ``lookahead_ngram_size``,
            ``lookahead_verification_set_size`` [batch, 1] int32 (all three or none),
            ``return_logit_margin`` [batch, 1] bool, ``streaming`` [batch, 1] bool (one response per
            decoding step; decoupled deployments only).

    Raises:
        ValueError: a required tensor is missing, a shape does not match the batch, or only some of
            the three lookahead tensors are given.
    """
    ids = inputs.get("input_ids")
    if ids is None or inputs.get("request_output_len") is None:
        raise ValueError("input_ids and request_output_len are required")
    ids = ids.reshape(ids.shape[0], -1) if ids.ndim != 2 else ids
    batch = ids.shape[0]
    lengths = per_row(inputs.get("input_lengths"), batch, "input_lengths") or [ids.shape[1]] * batch
    column = {name: per_row(inputs.get(name), batch, name) for name in INPUTS if name not in ("input_ids", "input_lengths")}
    lookahead = [column[name] for name in LOOKAHEAD_INPUTS]
    if any(c is None for c in lookahead) and any(c is not None for c in lookahead):
        raise ValueError(f"{', '.join(LOOKAHEAD_INPUTS)} go together: send all three or none")
    rows = []
    for b in range(batch):
        pick = lambda name, default, b=b: default if column[name] is None else column[name][b]  # noqa: E731
        if not 0 <= lengths[b] <= ids.shape[1]:
            raise ValueError(f"input_lengths[{b}] = {lengths[b]} is outside [0, {ids.shape[1]}]")
        request = GenerationRequest(
            input_ids=ids[b, : lengths[b]].tolist(),
            max_tokens=int(column["request_output_len"][b]),
            end_id=pick("end_id", None),
            num_draft_tokens=pick("num_draft_tokens", None),
            temperature=pick("temperature", None),
            top_k=pick("runtime_top_k", None),
            top_p=pick("runtime_top_p", None),
            seed=pick("seed", None),
            lookahead_config=None if lookahead[0] is None else tuple(int(c[b]) for c in lookahead),
        )
        rows.append(
            Row(
                request=request,
                pad_id=int(pick("pad_id", default_pad_id)),
                exclude_input_in_output=bool(pick("exclude_input_in_output", default_exclude_input)),
                return_perf_metrics=bool(pick("return_perf_metrics", False)),
                return_logit_margin=bool(pick("return_logit_margin", False)),
                streaming=bool(pick("streaming", False)),
            )
        )
    return rows


def pack_outputs(
    rows: list[Row], results: list[GenerationResult], margins: list[Margins | None] | None = None
) -> dict[str, np.ndarray]:
    """Output tensors for a batch: ``output_ids`` [batch, 1, max_len] int32 padded with each row's
    pad_id, ``sequence_length`` [batch, 1] int32, the streaming tensors of a whole (final) answer
    (``stream_prefix_ids`` [batch, 0], ``stream_final`` [batch, 1] true), and only when a row of the
    request asked for them (see :func:`_perf`, :func:`_pack_margins`): the three perf-metric tensors
    [batch, 1] and ``logit_margin`` [batch, n] fp32 / ``runner_up_ids`` [batch, n] int32.

    Outputs nobody asked for are left out rather than filled with placeholders, so every value a
    client receives is a real figure (and the HTTP JSON never carries NaN, which strict JSON parsers
    reject)."""
    sequences = [
        (r.output_ids if row.exclude_input_in_output else row.request.input_ids + r.output_ids)
        for row, r in zip(rows, results)
    ]
    width = max(1, max(len(s) for s in sequences))
    output_ids = np.empty((len(rows), 1, width), dtype=np.int32)
    for b, (row, seq) in enumerate(zip(rows, sequences)):
        output_ids[b, 0, :] = row.pad_id
        output_ids[b, 0, : len(seq)] = seq
    return {
        "output_ids": output_ids,
        "sequence_length": np.array([[len(s)] for s in sequences], dtype=np.int32),
        **_perf(rows, results),
        **_pack_margins(margins or [None] * len(rows), [row.pad_id for row in rows]),
        "stream_prefix_ids": np.zeros((len(rows), 0), dtype=np.int32),
        "stream_final": np.ones((len(rows), 1), dtype=np.bool_),
    }


def pack_step(row: Row, step: StepOutput, *, sent: list[int]) -> dict[str, np.ndarray]:
    """Output tensors of one streamed response (batch 1): this step's tokens and the running counters.

    ``output_ids`` [1, 1, n] holds the tokens the step emitted (TensorRT-LLM streaming: only the new
    tokens), preceded on the first response by the prompt when ``exclude_input_in_output`` is false,
    so the concatenated stream equals the non-streamed ``output_ids``; ``sequence_length`` [1, 1] = n;
    the perf metrics are the totals so far, when asked for (``logit_margin`` / ``runner_up_ids`` are
    not streamed: absent). ``stream_prefix_ids`` [1, len(sent)] repeats what earlier
    responses carried and ``stream_final`` [1, 1] marks the last step: postprocessing needs both to
    turn each step into exactly the text it adds (a token may complete a character that an earlier
    token began), so the streamed texts concatenate to the non-streamed ``text_output``.
    """
    new = step.token_ids if sent or row.exclude_input_in_output else row.request.input_ids + step.token_ids
    result = GenerationResult(new, step.finish_reason or "length", step.total_draft_tokens,
                              step.total_accepted_draft_tokens, step.num_decoding_iterations)
    return {
        "output_ids": np.array([[new]], dtype=np.int32).reshape(1, 1, len(new)),
        "sequence_length": np.array([[len(new)]], dtype=np.int32),
        **_perf([row], [result]),
        "stream_prefix_ids": np.array([sent], dtype=np.int32).reshape(1, len(sent)),
        "stream_final": np.array([[step.is_final]], dtype=np.bool_),
    }


def _perf(rows: list[Row], results: list[GenerationResult]) -> dict[str, np.ndarray]:
    """The three perf-metric tensors [batch, 1] when any row asked for ``return_perf_metrics``
    (every row's own figures: a batch shares one response), else none (``{}``)."""
    if not any(row.return_perf_metrics for row in rows):
        return {}
    metric = lambda values, dtype: np.array([[v] for v in values], dtype=dtype)  # noqa: E731
    return {
        "acceptance_rate": metric([r.acceptance_rate for r in results], np.float32),
        "total_accepted_draft_tokens": metric([r.total_accepted_draft_tokens for r in results], np.int32),
        "total_draft_tokens": metric([r.total_draft_tokens for r in results], np.int32),
    }


@dataclass(frozen=True)
class Margins:
    """The target's top-two logits at each generated position (specbuild's ``return_logit_margin``).

    ``margin[i]`` = largest - second-largest target logit (logit units, >= 0) when the target scored
    generated token ``i``; ``runner_up_ids[i]`` = the token with the second-largest logit. A greedy
    divergence at position ``i`` where the other side chose ``runner_up_ids[i]`` and ``margin[i]`` is
    tiny is a numerical near-tie, not a bug in the acceptance logic.
    """

    margin: list[float]
    runner_up_ids: list[int]


def logit_margins(engine, prompt_ids: list[int], output_ids: list[int]) -> Margins:
    """The engine's teacher-forced margins (:meth:`~specbuild.runtime.ReferenceEngine.logit_margins`:
    one causal pass over ``prompt_ids + output_ids[:-1]``, fp32 CPU rounding ~1e-6 from the incremental
    decode). Empty output -> empty Margins."""
    if not output_ids:
        return Margins([], [])
    return Margins(*engine.logit_margins(prompt_ids, output_ids))


def _pack_margins(margins: list[Margins | None], pad_ids: list[int] | None = None) -> dict[str, np.ndarray]:
    """``logit_margin`` [batch, n] fp32 and ``runner_up_ids`` [batch, n] int32, n = the longest row;
    ``{}`` when no row has margins (the request did not ask for them).

    Rows shorter than n are padded like ``output_ids``: margin 0.0, runner-up = the row's pad id
    (``pad_ids``, default 0); only the row's generated-token count of entries is data.
    :class:`_BatchReply` computes margins for every row of a request that asked, so no row is None
    when another is not.
    """
    if all(m is None for m in margins):
        return {}
    pads = pad_ids or [0] * len(margins)
    width = max(len(m.margin) for m in margins if m is not None)
    margin = np.zeros((len(margins), width), dtype=np.float32)
    runner_up = np.array([[pad] * width for pad in pads], dtype=np.int32).reshape(len(margins), width)
    for b, m in enumerate(margins):
        if m is not None:
            margin[b, : len(m.margin)] = m.margin
            runner_up[b, : len(m.runner_up_ids)] = m.runner_up_ids
    return {"logit_margin": margin, "runner_up_ids": runner_up}


class TritonPythonModel:
    """Loads the engine directory named by parameter ``engine_dir`` (TensorRT-LLM: gpt_model_path) and
    serves it with in-flight batching (:class:`~specbuild.engine.scheduler.Scheduler`, up to the build's
    ``max_batch_size`` requests in flight, new ones joining between steps).

    ``execute`` validates each request and hands it to the scheduler (so ``execute`` returns at once
    and Triton can deliver the next requests while earlier ones decode); the scheduler's thread queues
    each step and an :class:`~specbuild.triton_repo.models.outbox.Outbox` thread answers through the
    request's response sender, so sending never holds up the next decoding iteration. Decoupled deployments (``serve.decoupled``) answer a
    ``streaming`` request with one response per decoding step, the last flagged
    ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; every other request gets exactly one final response.

    A request leaves the engine early, wherever it is (queued for a KV slot, waiting for its
    prefill, decoding), answered once with a ``CANCELLED`` error, when:

    - its client cancelled it: every request in flight is polled every 100 ms
      (:class:`~specbuild.triton_repo.models.outbox.CancellationWatch`,
      ``InferenceResponseSender.is_cancelled()``). Through an ensemble this reaches only requests the
      ensemble had not yet passed on when the client cancelled: Triton's ensemble scheduler cancels the
      steps it schedules after the cancellation, not the one already running
      (core ``ensemble_scheduler.cc``, ``ScheduleSteps``);
    - its Triton request ``timeout`` (microseconds; tritonclient's ``infer(..., timeout=)``, which an
      ensemble copies to its steps) passed since ``execute`` took it: the engine's own deadline
      (:class:`~specbuild.engine.scheduler.RequestTimedOut`), which needs no round trip and works
      through the ensemble. The SDK sends its ``timeout_s`` with every non-streamed request.
    """

    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        from specbuild.runtime import ReferenceEngine
        from specbuild.engine.scheduler import Scheduler

        self.pb_utils = pb_utils
        params = model_parameters(args)
        device = params.get("device") or "cpu"
        self.engine = ReferenceEngine.from_engine_dir(params["engine_dir"], device=device)
        self.exclude_input = as_bool(params.get("exclude_input_in_output", "true"))
        self.pad_id = int(params.get("pad_id", self.engine.end_id))
        self.stream_interval = _stream_interval(params.get("stream_interval", "1"))
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.metrics = _Counters(pb_utils, args["model_name"])
        self.outbox = Outbox()
        self.cancellation = CancellationWatch()
        self.scheduler = Scheduler(self.engine)

    def execute(self, requests):
        final = self.pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._submit(request, sender)
            except ValueError as exc:  # bad input, e.g. InvalidRequestError: 400 / INVALID_ARGUMENT
                sender.send(error_response(self.pb_utils, f"{type(exc).__name__}: {exc}", invalid_argument=True), flags=final)
            except Exception as exc:  # noqa: BLE001 - every failure becomes an error response
                sender.send(error_response(self.pb_utils, f"{type(exc).__name__}: {exc}"), flags=final)
        return None

    def finalize(self):
        self.cancellation.close()
        self.scheduler.close()
        self.outbox.close()

    def _submit(self, request, sender) -> None:
        """Parse and validate every row, then queue them; raises ValueError for a bad request."""
        pb = self.pb_utils
        inputs = {name: optional_input(pb, request, name) for name in INPUTS}
        required_input(pb, request, "input_ids")
        rows = parse_batch(inputs, default_pad_id=self.pad_id, default_exclude_input=self.exclude_input)
        streaming = any(row.streaming for row in rows)
        if streaming and not self.decoupled:
            raise ValueError(
                "streaming=true needs a decoupled deployment (recipe serve.decoupled: true, "
                "model_transaction_policy { decoupled: true }); send stream=false here"
            )
        if streaming and len(rows) != 1:
            raise ValueError(f"streaming=true takes one sequence per request, got a batch of {len(rows)}")
        prepared = [self.engine.prepare(row.request) for row in rows]  # every row valid before any runs
        reply = _StreamReply(self, request, rows[0], sender) if streaming else _BatchReply(self, request, rows, sender)
        timeout_s = request_timeout_s(request)
        for b, seq in enumerate(prepared):
            self.scheduler.submit_prepared(seq, functools.partial(reply.on_step, b), reply.on_error, timeout_s=timeout_s)
        reply.seqs = prepared
        self.cancellation.watch(reply)

    def send(self, sender, outputs: dict[str, np.ndarray], *, final: bool) -> None:
        pb = self.pb_utils
        response = pb.InferenceResponse(output_tensors=[pb.Tensor(k, v) for k, v in outputs.items()])
        sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def send_error(self, sender, exc: BaseException) -> None:
        response = error_response(self.pb_utils, f"{type(exc).__name__}: {exc}", invalid_argument=isinstance(exc, ValueError),
                                  cancelled=isinstance(exc, (ClientCancelled, RequestTimedOut)))
        sender.send(response, flags=self.pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def request_timeout_s(request) -> float | None:
    """The Triton request's ``timeout`` in seconds (python backend ``InferenceRequest.timeout()``,
    microseconds; 0 = none), or None when it has none."""
    timeout_us = int(getattr(request, "timeout", lambda: 0)() or 0)
    return timeout_us / 1e6 if timeout_us > 0 else None


class ClientCancelled(RuntimeError):
    """The client cancelled the request (Triton request cancellation)."""

    def __init__(self) -> None:
        super().__init__("the client cancelled the request")


class _Reply(Mailbox):
    """Answers one Triton request. The scheduler's thread calls :meth:`on_step` / :meth:`on_error`, which
    only queue (:mod:`~specbuild.triton_repo.models.outbox`); the outbox thread sends the responses and,
    when the model's :class:`~specbuild.triton_repo.models.outbox.CancellationWatch` asks, whether the
    client cancelled. A failed or cancelled request is answered once with an error (final flag), its
    sequences (``seqs``) are cancelled in the scheduler wherever they are, and its remaining steps are
    dropped; nothing is sent or asked after the final response."""

    def __init__(self, model: TritonPythonModel, request, sender) -> None:
        super().__init__(model.outbox)
        self.model, self.request, self.sender = model, request, sender
        self.seqs: list = []  # the scheduler's sequences of this request's rows
        self.ended = False  # the final response (or error) went out; outbox thread only
        self.failed = False  # answered with an error: the scheduler's thread drops later steps

    def check(self) -> None:
        """Raise DropRequest once the request has been answered with an error (failed, cancelled)."""
        if self.failed:
            raise DropRequest("request already answered")

    def on_error(self, exc: BaseException) -> None:
        self.put(exc)

    def deliver(self, items: list) -> None:
        """Send ``items`` in order (outbox thread): a step (:meth:`deliver_step`), an error (final), a
        cancellation check; nothing once the final response or an error went out."""
        for item in items:
            if self.ended:
                return
            if item is CHECK_CANCELLATION:
                if self._client_cancelled():
                    self._fail(ClientCancelled())
            elif isinstance(item, BaseException):
                self._fail(item)
            else:
                try:
                    self.deliver_step(item)
                except Exception:
                    self._end(failed=True)
                    raise

    def _client_cancelled(self) -> bool:
        """Whether the client cancelled: the sender's ``is_cancelled()`` (the python backend's call for a
        decoupled model, valid after ``execute`` returned), else the request's."""
        is_cancelled = getattr(self.sender, "is_cancelled", None) or getattr(self.request, "is_cancelled", None)
        return bool(is_cancelled and is_cancelled())

    def deliver_step(self, step: StepOutput) -> None:
        raise NotImplementedError

    def _fail(self, exc: BaseException) -> None:
        self._end(failed=True)
        self.model.send_error(self.sender, exc)

    def _end(self, *, failed: bool) -> None:
        """No more responses or checks; on failure, stop the request's rows in the engine (queued,
        waiting for prefill or decoding: :meth:`~specbuild.engine.scheduler.Scheduler.cancel`)."""
        self.ended = True
        self.model.cancellation.unwatch(self)
        if failed:
            self.failed = True
            for seq in self.seqs:
                self.model.scheduler.cancel(seq)


class _BatchReply(_Reply):
    """One final response for a whole request (all its rows), sent when the last row finishes."""

    def __init__(self, model: TritonPythonModel, request, rows: list[Row], sender) -> None:
        super().__init__(model, request, sender)
        self.rows = rows
        self.steps: list[list[StepOutput]] = [[] for _ in rows]
        self.margins: list[Margins | None] = [None] * len(rows)

    def on_step(self, b: int, step: StepOutput) -> None:
        self.check()
        self.steps[b].append(step)
        if all(s and s[-1].is_final for s in self.steps):
            if any(row.return_logit_margin for row in self.rows):  # one response: every row or none
                # a pass of the engine's model: on the engine's own thread (engine/threads.py)
                self.margins = [logit_margins(self.model.engine, row.request.input_ids, collect(s).output_ids)
                                for row, s in zip(self.rows, self.steps)]
            self.put(step)

    def deliver_step(self, step: StepOutput) -> None:
        del step
        results = [collect(s) for s in self.steps]
        self.model.metrics.record(results)
        self._end(failed=False)
        self.model.send(self.sender, pack_outputs(self.rows, results, self.margins), final=True)


class _StreamReply(_Reply):
    """The responses of a single-row streaming request: one per decoding step, or with the model's
    ``stream_interval`` N > 1 as TensorRT-LLM's PyTorch executor streams (``PyExecutor._handle_responses``):
    a response at the request's first iteration (the prefill), its last, and every N-th, each carrying
    the tokens of the iterations since the previous one (:func:`~specbuild.engine.stream.merge`)."""

    def __init__(self, model: TritonPythonModel, request, row: Row, sender) -> None:
        super().__init__(model, request, sender)
        self.row = row
        self.steps: list[StepOutput] = []
        self.unsent: list[StepOutput] = []
        self.sent: list[int] = []

    def on_step(self, b: int, step: StepOutput) -> None:
        del b
        self.check()
        self.put(step)

    def deliver_step(self, step: StepOutput) -> None:
        self.steps.append(step)
        self.unsent.append(step)
        iteration = len(self.steps)  # 1 = the prefill
        if not (iteration == 1 or step.is_final or iteration % self.model.stream_interval == 0):
            return
        outputs = pack_step(self.row, merge(self.unsent), sent=self.sent)
        self.unsent = []
        self.sent += outputs["output_ids"][0, 0].tolist()
        if step.is_final:
            self.model.metrics.record([collect(self.steps)])
            self._end(failed=False)
        self.model.send(self.sender, outputs, final=step.is_final)


def _stream_interval(value: str) -> int:
    """The ``stream_interval`` parameter (TensorRT-LLM's ``LlmArgs.stream_interval``: iterations per
    streamed response). Raises ValueError unless it is an integer >= 1."""
    try:
        interval = int(value)
    except ValueError:
        interval = 0
    if interval < 1:
        raise ValueError(f"parameter stream_interval must be an integer >= 1 (iterations per streamed response), got {value!r}")
    return interval


class _Counters:
    """Prometheus counters on Triton's metrics port, like TensorRT-LLM's backend publishes its own."""

    def __init__(self, pb_utils, model_name: str):
        labels = {"model": model_name}
        # The families must outlive their metrics (Triton refuses to update an orphaned metric).
        self.families = [
            pb_utils.MetricFamily(name=name, description=text, kind=pb_utils.MetricFamily.COUNTER)
            for name, text in (
                ("specbuild_draft_tokens_total", "Draft tokens sent to verification"),
                ("specbuild_accepted_draft_tokens_total", "Draft tokens accepted"),
                ("specbuild_generated_tokens_total", "Tokens generated"),
            )
        ]
        self.draft, self.accepted, self.generated = (f.Metric(labels=labels) for f in self.families)

    def record(self, results: list[GenerationResult]) -> None:
        for r in results:
            self.draft.increment(r.total_draft_tokens)
            self.accepted.increment(r.total_accepted_draft_tokens)
            self.generated.increment(len(r.output_ids))
