"""The reference engine model's response path: steps are queued on the engine's thread and sent by the
outbox thread, in order, with cancellation and errors answered once (triton_repo/models/outbox.py).
The real Triton path (a decoupled tritonserver) is covered by test_streaming.py and test_server.py."""

from __future__ import annotations

import threading
import time

import pytest

from specbuild.engine.scheduler import DropRequest
from specbuild.engine.stream import StepOutput
from specbuild.engine.types import GenerationRequest
from specbuild.triton_repo.models import reference_engine as model
from specbuild.triton_repo.models.outbox import CancellationWatch, Mailbox, Outbox


class Recorder(Mailbox):
    def __init__(self, outbox: Outbox, fail_on: object = None) -> None:
        super().__init__(outbox)
        self.delivered: list = []
        self.threads: set[str] = set()
        self.fail_on = fail_on

    def deliver(self, items: list) -> None:
        self.threads.add(threading.current_thread().name)
        for item in items:
            if item == self.fail_on:
                raise RuntimeError("delivery failed")
            self.delivered.append(item)


def test_each_mailbox_is_delivered_in_order_off_the_posting_thread():
    outbox = Outbox()
    boxes = [Recorder(outbox) for _ in range(3)]
    for i in range(200):
        boxes[i % 3].put(i)
    outbox.close()
    assert [b.delivered for b in boxes] == [list(range(j, 200, 3)) for j in range(3)]
    assert {t for b in boxes for t in b.threads} == {"specbuild-outbox"}


def test_a_failing_delivery_leaves_the_other_mailboxes_served():
    outbox = Outbox()
    bad, good = Recorder(outbox, fail_on=1), Recorder(outbox)
    for i in range(3):
        bad.put(i)
        good.put(i)
    outbox.close()
    assert good.delivered == [0, 1, 2]
    assert bad.delivered[:1] == [0]


class FakeScheduler:
    def __init__(self) -> None:
        self.cancelled: list = []

    def cancel(self, seq) -> None:
        self.cancelled.append(seq)


class FakeModel:
    """What a reply needs of TritonPythonModel: the outbox, the cancellation watch, the scheduler
    (cancel, recorded), send / send_error (recorded), metrics, stream_interval."""

    def __init__(self, send_gate: threading.Event | None = None, period_s: float = 0.005) -> None:
        self.outbox = Outbox()
        self.cancellation = CancellationWatch(period_s)
        self.scheduler = FakeScheduler()
        self.sent: list[tuple[str, object, bool]] = []
        self.gate = send_gate
        self.stream_interval = 1
        self.metrics = type("Metrics", (), {"record": lambda self, results: None})()

    def send(self, sender, outputs, *, final: bool) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        self.sent.append(("response", outputs["output_ids"][0, 0].tolist(), final))

    def send_error(self, sender, exc: BaseException) -> None:
        self.sent.append(("error", str(exc), True))


class FakeRequest:
    """A Triton request (its ``is_cancelled``, counted) whose response sender is itself."""

    def __init__(self) -> None:
        self.cancelled = False
        self.checks = 0

    def is_cancelled(self) -> bool:
        self.checks += 1
        return self.cancelled


def _wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _row() -> model.Row:
    return model.Row(GenerationRequest([1, 2, 3], 6), pad_id=0, exclude_input_in_output=True,
                     return_perf_metrics=False, streaming=True)


STEPS = [StepOutput([5], 0, 0, 0), StepOutput([6, 7], 1, 1, 1), StepOutput([8, 9, 4], 3, 3, 2, "length")]


def test_a_stream_step_is_queued_without_waiting_for_the_send():
    gate = threading.Event()
    fake = FakeModel(send_gate=gate)
    reply = model._StreamReply(fake, FakeRequest(), _row(), sender=None)
    start = time.perf_counter()
    for step in STEPS:
        reply.on_step(0, step)  # the engine's thread: must not block on the (gated) send
    assert time.perf_counter() - start < 1.0 and fake.sent == []
    gate.set()
    fake.outbox.close()
    assert fake.sent == [("response", [5], False), ("response", [6, 7], False), ("response", [8, 9, 4], True)]


def test_a_cancelled_stream_gets_one_error_and_its_steps_are_dropped():
    fake, request = FakeModel(), FakeRequest()
    reply = model._StreamReply(fake, request, _row(), sender=request)
    reply.seqs = ["seq"]
    fake.cancellation.watch(reply)
    reply.on_step(0, STEPS[0])
    _wait_until(lambda: fake.sent)
    request.cancelled = True
    _wait_until(lambda: reply.failed)
    with pytest.raises(DropRequest):
        reply.on_step(0, STEPS[1])
    fake.outbox.close()
    assert fake.sent == [("response", [5], False), ("error", "the client cancelled the request", True)]
    assert fake.scheduler.cancelled == ["seq"]  # the engine is told, not only the client


def test_a_request_that_never_produced_a_step_is_still_polled_and_cancelled():
    """Queued for a KV slot or waiting for its prefill, a request gets no steps: the watch polls it
    anyway, so a cancelled client is answered once and its rows are cancelled in the engine."""
    fake, request = FakeModel(), FakeRequest()
    reply = model._BatchReply(fake, request, [_row(), _row()], sender=request)
    reply.seqs = ["row0", "row1"]
    fake.cancellation.watch(reply)
    _wait_until(lambda: request.checks >= 2)
    assert fake.sent == []
    request.cancelled = True
    _wait_until(lambda: fake.sent)
    fake.outbox.close()
    assert fake.sent == [("error", "the client cancelled the request", True)]
    assert fake.scheduler.cancelled == ["row0", "row1"]


def test_no_cancellation_check_follows_the_final_response():
    """After the final response the python backend may free the request's response factory: the
    sender is never asked again."""
    fake, request = FakeModel(period_s=0.001), FakeRequest()
    reply = model._StreamReply(fake, request, _row(), sender=request)
    fake.cancellation.watch(reply)
    for step in STEPS:
        reply.on_step(0, step)
    _wait_until(lambda: len(fake.sent) == 3)
    checks = request.checks
    time.sleep(0.05)
    fake.outbox.close()
    assert request.checks == checks and fake.scheduler.cancelled == []
    assert fake.sent[-1] == ("response", [8, 9, 4], True)


@pytest.mark.parametrize("timeout_us, expected", [(0, None), (2_500_000, 2.5), (None, None)])
def test_the_triton_request_timeout_is_read_in_seconds(timeout_us, expected):
    request = type("R", (), {"timeout": lambda self: timeout_us})() if timeout_us is not None else object()
    assert model.request_timeout_s(request) == expected


def test_an_engine_error_follows_the_steps_sent_before_it():
    fake = FakeModel()
    reply = model._StreamReply(fake, FakeRequest(), _row(), sender=None)
    reply.on_step(0, STEPS[0])
    reply.on_error(ValueError("drafter failed"))
    reply.on_error(ValueError("a second error is not sent"))
    fake.outbox.close()
    assert fake.sent == [("response", [5], False), ("error", "drafter failed", True)]


def test_a_batch_reply_sends_one_final_response_when_every_row_is_done():
    fake = FakeModel()
    rows = [_row(), _row()]
    reply = model._BatchReply(fake, FakeRequest(), rows, sender=None)
    for step in STEPS:
        reply.on_step(0, step)
    reply.on_step(1, StepOutput([3], 0, 0, 0, "stop"))
    fake.outbox.close()
    assert fake.sent == [("response", [5, 6, 7, 8, 9, 4], True)]


def test_stream_interval_merges_the_iterations_between_responses():
    """TensorRT-LLM's stream_interval = 2: responses at iteration 1 (the prefill), 2, 4 and the last (5)."""
    fake = FakeModel()
    fake.stream_interval = 2
    reply = model._StreamReply(fake, FakeRequest(), _row(), sender=None)
    steps = [StepOutput([5], 0, 0, 0), StepOutput([6], 0, 0, 1), StepOutput([7, 8], 1, 1, 2), StepOutput([9], 1, 1, 3),
             StepOutput([4], 1, 1, 4, "length")]
    for step in steps:
        reply.on_step(0, step)
    fake.outbox.close()
    assert fake.sent == [("response", [5], False), ("response", [6], False), ("response", [7, 8, 9], False),
                         ("response", [4], True)]


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_bad_stream_interval_is_refused_with_its_name(value):
    with pytest.raises(ValueError, match="stream_interval must be an integer >= 1"):
        model._stream_interval(value)


def test_recipe_stream_interval_reaches_the_engine_model_parameters(tmp_path, tiny_checkpoint):
    from conftest import write_recipe

    from specbuild.builder.recipe import RecipeError, load_recipe
    from specbuild.triton_repo.reference_repository import ReferenceRepoSpec, reference_models

    path = write_recipe(tmp_path / "r.yaml", tiny_checkpoint, method="none")
    path.write_text(path.read_text().replace("serve:\n", "serve:\n  decoupled: true\n  stream_interval: 4\n"))
    assert load_recipe(str(path)).recipe.serve.stream_interval == 4
    (engine,) = [m for m in reference_models(ReferenceRepoSpec(tmp_path, 0, 0, 4, stream_interval=4)) if m.name == "tensorrt_llm"]
    assert engine.parameters["stream_interval"] == "4"
    path.write_text(path.read_text().replace("stream_interval: 4", "stream_interval: 0"))
    with pytest.raises(RecipeError, match="stream_interval"):
        load_recipe(str(path))
