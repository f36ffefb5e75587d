"""Requests whose client is gone leave the engine at once, wherever they are (issue 35, kv-exhaust).

A request holds its KV slot from admission to its end (engine/scheduler.py: GUARANTEED_NO_EVICT over
whole-sequence slots), so abandoned work must leave promptly or it blocks everyone behind it. Each
test pauses the engine's loop inside a callback (callbacks run on the scheduler's thread) to put a
request exactly where it is meant to be (queued for a slot, admitted but waiting for its prefill,
decoding), cancels it or lets its ``timeout_s`` pass, and checks that it never runs again, that its
slot is free, and that the requests that stayed give exactly plain greedy decoding.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from method_engines import PROMPTS, greedy  # noqa: E402

from specbuild.runtime import EngineLimits, ReferenceEngine  # noqa: E402
from specbuild.engine.scheduler import RequestTimedOut, Scheduler  # noqa: E402
from specbuild.engine.stream import collect  # noqa: E402

NGRAM = {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2}
SHORT, LONG = PROMPTS[0], PROMPTS[1]  # 6 and 13 tokens


def engine_with(model, *, max_batch_size: int, max_num_tokens: int | None = None) -> ReferenceEngine:
    limits = EngineLimits(max_batch_size=max_batch_size, max_input_len=64, max_seq_len=160, max_draft_len=4,
                          max_num_tokens=max_num_tokens)
    return ReferenceEngine(model, limits=limits, end_id=-1, speculative_config=NGRAM)


@pytest.fixture(scope="module")
def plain(model) -> dict[tuple[int, ...], list[int]]:
    engine = engine_with(model, max_batch_size=1)
    return {tuple(p): engine.generate(greedy(p, max_tokens=40, num_draft_tokens=0)).output_ids for p in PROMPTS}


class Track:
    """One request's callbacks: its steps and errors, and an event when it ended either way."""

    def __init__(self, pause_at: int | None = None, action=None) -> None:
        self.steps, self.errors, self.ended = [], [], threading.Event()
        self.pause_at, self.action = pause_at, action

    def on_step(self, step) -> None:
        self.steps.append(step)
        if len(self.steps) == self.pause_at and self.action is not None:
            self.action()  # on the scheduler's thread: the engine waits for it
        if step.is_final:
            self.ended.set()

    def on_error(self, exc: BaseException) -> None:
        self.errors.append(exc)
        self.ended.set()

    def output(self) -> list[int]:
        return collect(iter(self.steps)).output_ids


def submit(scheduler: Scheduler, prompt, track: Track, *, max_tokens: int = 40, timeout_s: float | None = None):
    return scheduler.submit(greedy(prompt, max_tokens=max_tokens), track.on_step, track.on_error, timeout_s=timeout_s)


def free_slots(scheduler: Scheduler) -> int:
    return len(scheduler.worker.pool._free)


def settle(scheduler: Scheduler, timeout_s: float = 30.0) -> None:
    """Wait until nothing runs or waits in ``scheduler``."""
    deadline = time.monotonic() + timeout_s
    while scheduler._pending or scheduler._entries:
        assert time.monotonic() < deadline, "the scheduler did not drain"
        time.sleep(0.005)


def test_requests_cancelled_or_timed_out_in_the_queue_never_run(model, plain):
    """One slot, held by A; B and C wait for it. B is cancelled, C's timeout passes: neither is ever
    prefilled, C gets RequestTimedOut("queued"), and A and a later D give plain greedy output."""
    engine = engine_with(model, max_batch_size=1)
    with Scheduler(engine) as scheduler:
        b, c = Track(), Track()
        waiting = {}

        def while_a_holds_the_slot():
            waiting["b"] = submit(scheduler, LONG, b)
            submit(scheduler, PROMPTS[2], c, timeout_s=0.05)
            scheduler.cancel(waiting["b"])
            time.sleep(0.1)  # C's timeout passes while it waits for the slot

        a = Track(pause_at=2, action=while_a_holds_the_slot)
        submit(scheduler, SHORT, a)
        assert a.ended.wait(60) and c.ended.wait(60)
        d = Track()
        submit(scheduler, PROMPTS[3], d)
        assert d.ended.wait(60)
        settle(scheduler)
        assert free_slots(scheduler) == 1
    assert a.output() == plain[tuple(SHORT)] and d.output() == plain[tuple(PROMPTS[3])]
    assert b.steps == [] and b.errors == [] and not waiting["b"].prefilled
    assert c.steps == [] and len(c.errors) == 1 and isinstance(c.errors[0], RequestTimedOut)
    assert c.errors[0].stage == "queued" and c.errors[0].generated == 0
    assert "queued for a KV slot" in str(c.errors[0])


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_a_request_waiting_for_its_prefill_is_dropped_and_its_slot_goes_to_the_next(model, plain, how):
    """Two slots, 8 tokens an iteration: A (6-token prompt) decodes, B (13 tokens) is admitted but its
    prefill waits while A takes the budget, C waits for a slot. Cancelling B, or letting its timeout
    pass, frees its slot before it ever runs: C is admitted and both A and C equal plain greedy."""
    engine = engine_with(model, max_batch_size=2, max_num_tokens=8)
    with Scheduler(engine) as scheduler:
        b, c = Track(), Track()
        seqs = {}

        def submit_b_and_c():
            seqs["b"] = submit(scheduler, LONG, b, timeout_s=0.3 if how == "timeout" else None)
            seqs["c"] = submit(scheduler, PROMPTS[3], c, max_tokens=16)

        def b_waits_for_its_prefill():
            assert seqs["b"] in scheduler.worker.running and not seqs["b"].prefilled  # admitted, not prefilled
            assert seqs["c"] not in scheduler.worker.running  # no slot for C
            if how == "cancel":
                scheduler.cancel(seqs["b"])
            else:
                time.sleep(0.4)

        a = Track(pause_at=1, action=submit_b_and_c)
        a_steps = a.on_step

        def a_on_step(step):
            a_steps(step)
            if len(a.steps) == 4:
                b_waits_for_its_prefill()

        scheduler.submit(greedy(SHORT, max_tokens=40), a_on_step, a.on_error)
        assert a.ended.wait(60) and c.ended.wait(60)
        settle(scheduler)
        assert free_slots(scheduler) == 2
    assert a.output() == plain[tuple(SHORT)]
    assert c.output() == plain[tuple(PROMPTS[3])][:16]
    assert b.steps == [] and not seqs["b"].prefilled
    if how == "cancel":
        assert b.errors == []
    else:
        assert len(b.errors) == 1 and b.errors[0].stage == "prefill" and b.errors[0].generated == 0


def test_a_decoding_request_past_its_timeout_stops_and_the_others_go_on(model, plain):
    """A's timeout passes after its third step: A gets RequestTimedOut("decoding") and no more steps;
    B, decoding beside it, finishes with plain greedy output; both slots end free."""
    engine = engine_with(model, max_batch_size=2)
    with Scheduler(engine) as scheduler:
        a = Track(pause_at=3, action=lambda: time.sleep(0.4))
        b = Track()
        submit(scheduler, SHORT, a, timeout_s=0.3)
        submit(scheduler, LONG, b)
        assert a.ended.wait(60) and b.ended.wait(60)
        settle(scheduler)
        assert free_slots(scheduler) == 2
    assert b.output() == plain[tuple(LONG)]
    assert len(a.steps) == 3 and not a.steps[-1].is_final
    (error,) = a.errors
    assert isinstance(error, RequestTimedOut) and error.stage == "decoding"
    assert error.generated == len(a.output()) > 0
    assert a.output() == plain[tuple(SHORT)][: error.generated]  # what it produced before was right


def test_a_timeout_must_be_positive(model):
    with Scheduler(engine_with(model, max_batch_size=1)) as scheduler, pytest.raises(ValueError, match="timeout_s must be > 0"):
        scheduler.submit(greedy(SHORT), print, print, timeout_s=0)


class TritonRequest:
    """A Triton request as the reference engine model sees it, and its response sender: ``is_cancelled``
    (what the client did) and ``send`` (recorded)."""

    def __init__(self) -> None:
        self.cancelled = False
        self.sent: list = []

    def is_cancelled(self) -> bool:
        return self.cancelled


class ServingModel:
    """The parts of the Triton model (triton_repo/models/reference_engine.py) a reply uses, around a
    real scheduler: outbox, cancellation watch, send / send_error."""

    def __init__(self, scheduler: Scheduler) -> None:
        from specbuild.triton_repo.models.outbox import CancellationWatch, Outbox

        self.scheduler, self.outbox, self.cancellation = scheduler, Outbox(), CancellationWatch(0.01)
        self.metrics = type("Metrics", (), {"record": lambda self, results: None})()
        self.stream_interval = 1

    def send(self, sender, outputs, *, final: bool) -> None:
        sender.sent.append(("response", outputs["output_ids"][0, 0].tolist(), final))

    def send_error(self, sender, exc: BaseException) -> None:
        sender.sent.append(("error", str(exc), True))

    def submit(self, prompt, *, streaming: bool, max_tokens: int = 40) -> tuple[TritonRequest, object]:
        from specbuild.triton_repo.models import reference_engine as triton_model

        request = TritonRequest()
        row = triton_model.Row(greedy(prompt, max_tokens=max_tokens), pad_id=0, exclude_input_in_output=True,
                               return_perf_metrics=False, streaming=streaming)
        reply = (triton_model._StreamReply(self, request, row, request) if streaming
                 else triton_model._BatchReply(self, request, [row], request))
        seq = self.scheduler.engine.prepare(row.request)
        self.scheduler.submit_prepared(seq, lambda step: reply.on_step(0, step), reply.on_error)
        reply.seqs = [seq]
        self.cancellation.watch(reply)
        return request, seq


@pytest.mark.parametrize("streaming", [False, True])
def test_a_client_cancelling_a_queued_request_reaches_the_engine(model, plain, streaming):
    """Through the Triton model's reply path: B waits for the only slot (no step, so no response to
    piggyback a check on) when its client cancels. The watch notices, B's client gets one error, and
    the engine drops B without running it; A keeps its plain greedy output."""
    engine = engine_with(model, max_batch_size=1)
    with Scheduler(engine) as scheduler:
        serving = ServingModel(scheduler)
        queued = {}

        def cancel_b_while_a_holds_the_slot():
            queued["request"], queued["seq"] = serving.submit(LONG, streaming=streaming)
            queued["request"].cancelled = True
            deadline = time.monotonic() + 10
            while not queued["request"].sent:  # answered while the engine is paused right here
                assert time.monotonic() < deadline, "the cancelled client got no answer"
                time.sleep(0.005)

        a = Track(pause_at=2, action=cancel_b_while_a_holds_the_slot)
        submit(scheduler, SHORT, a)
        assert a.ended.wait(60)
        settle(scheduler)
        assert free_slots(scheduler) == 1
        serving.outbox.close()
    assert a.output() == plain[tuple(SHORT)]
    assert queued["request"].sent == [("error", "the client cancelled the request", True)]
    assert not queued["seq"].prefilled and queued["seq"].state.output == []


# --- through a real decoupled tritonserver (the tiny n-gram engine) ----------------------------------


def _generated_tokens(server) -> float:
    """The engine's ``specbuild_generated_tokens_total`` (recorded when a request completes)."""
    import re
    import urllib.request

    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10).read().decode()
    match = re.search(r'^specbuild_generated_tokens_total\{model="tensorrt_llm"\} (\S+)', text, re.M)
    return float(match.group(1)) if match else 0.0


def _open_stream(server, model_name: str, inputs):
    import queue

    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    arrivals: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrivals.put((result, error)))
    return client, arrivals


@pytest.mark.e2e
def test_a_request_timeout_reaches_the_engine_through_the_ensemble(decoupled_server):
    """Triton's request ``timeout`` (what the SDK sends with a non-streamed request) passes through the
    ensemble to the engine, which answers with RequestTimedOut instead of running the request; the
    next requests (the SDK's, with their own timeout) are served and speculative equals plain."""
    import tritonclient.grpc as grpcclient

    from specbuild.client.sdk import SpecClient, input_tensors
    from specbuild.interface import GenerateOptions

    server, _ = decoupled_server
    before = _generated_tokens(server)
    options = GenerateOptions(max_tokens=64, end_id=-1)
    client, arrivals = _open_stream(server, "ensemble", None)
    try:
        client.async_stream_infer("ensemble", input_tensors(grpcclient, {**options.tensor_values("x = 1"), "stream": False}),
                                  timeout=1)  # microseconds: over before the engine looks at it
        _, error = arrivals.get(timeout=60)
    finally:
        client.stop_stream()
        client.close()
    assert error is not None and "RequestTimedOut" in error.message() and "queued for a KV slot" in error.message()
    assert _generated_tokens(server) == before  # never ran
    with SpecClient(server.grpc_url, decoupled=True, timeout_s=120) as sdk:
        speculative = sdk.generate("for i in range(10):\n    print(i", max_tokens=24, end_id=-1)
        plain = sdk.generate("for i in range(10):\n    print(i", max_tokens=24, end_id=-1, num_draft_tokens=0)
    assert speculative.output_ids == plain.output_ids and len(plain.output_ids) == 24


@pytest.mark.e2e
def test_a_client_cancelling_a_stream_stops_it_in_the_engine(decoupled_server):
    """A stream sent straight to the engine model (``tensorrt_llm``), cancelled by its client after
    the first response, is dropped by the engine: it never completes (the generated-token counter
    does not move), where the same request left alone runs to its 400 tokens. (Through the ensemble
    a cancellation does not reach a step already running, Triton's ensemble scheduler passes it only
    to steps it schedules later: there the request's timeout is what stops it.)"""
    import numpy as np
    import tritonclient.grpc as grpcclient

    server, _ = decoupled_server

    def tensor(name, value, dtype):
        array = np.array([value], dtype=dtype)
        t = grpcclient.InferInput(name, list(array.shape), {np.int32: "INT32", np.bool_: "BOOL"}[dtype])
        t.set_data_from_numpy(array)
        return t

    inputs = [tensor("input_ids", [5, 6, 7, 8], np.int32), tensor("input_lengths", [4], np.int32),
              tensor("request_output_len", [400], np.int32), tensor("end_id", [-1], np.int32),
              tensor("num_draft_tokens", [0], np.int32), tensor("streaming", [True], np.bool_)]

    def run(cancel_after_first: bool) -> None:
        client, arrivals = _open_stream(server, "tensorrt_llm", inputs)
        try:
            client.async_stream_infer("tensorrt_llm", inputs)
            result, error = arrivals.get(timeout=60)
            assert error is None
            final = result.get_response().parameters["triton_final_response"].bool_param
            while not cancel_after_first and not final:
                result, error = arrivals.get(timeout=60)
                assert error is None
                final = result.get_response().parameters["triton_final_response"].bool_param
        finally:
            client.stop_stream(cancel_requests=cancel_after_first)
            client.close()

    before, start = _generated_tokens(server), time.monotonic()
    run(cancel_after_first=False)
    alone_s = time.monotonic() - start
    assert _generated_tokens(server) - before == 400
    before = _generated_tokens(server)
    run(cancel_after_first=True)
    time.sleep(max(2.0, 2 * alone_s))  # longer than the whole request took alone: it would have completed
    assert _generated_tokens(server) == before


@pytest.mark.e2e
def test_a_stream_timeout_bounds_the_whole_stream_on_both_sides(decoupled_server):
    """``stream_timeout_s`` closes a stream that is still running after that long in all (each response
    came in time) and is sent as its request timeout: the engine drops it too, before it completes."""
    from specbuild.client.sdk import RequestTimeoutError, SpecClient

    server, _ = decoupled_server
    before = _generated_tokens(server)
    with SpecClient(server.grpc_url, timeout_s=60, stream_timeout_s=0.3) as client:
        chunks = 0
        with pytest.raises(RequestTimeoutError, match="stream_timeout_s=0.3 s in all"):
            for _ in client.generate_stream("x = 1", max_tokens=400, end_id=-1, num_draft_tokens=0):
                chunks += 1
    assert chunks >= 1
    time.sleep(5)  # the 400 tokens take ~2.5 s alone here: a stream left running would have completed
    assert _generated_tokens(server) == before
