"""In-flight batching for the reference engine: one worker thread runs decoding iterations over every request.

TensorRT-LLM's in-flight batching lets new requests join the running batch between decoding iterations
instead of waiting for the whole batch to finish. The :class:`Scheduler` does the same around one
:class:`~specbuild.engine.worker.Worker`::

    thread loop:   admit queued requests while a KV slot is free (max_batch_size), FIFO
                   worker.step(): ONE batched target pass over the running requests' blocks,
                                  then the prefills of the requests admitted since the last one
                   hand each request its step (on_step) or its error (on_error); drop the finished

    iteration   1     2       3         4 ...
    running     A     A B     A B C     A B C            (C submitted during iteration 2)

Greedy output for a prompt is the same alone or in a batch, token for token, and so are its
acceptance counters: every request keeps its own KV slot, drafter, draft length and sampler.
A request that fails (its drafter raised, a callback failed, it was cancelled) leaves the others running.

Admission is TensorRT-LLM's ``GUARANTEED_NO_EVICT`` capacity policy (``capacityScheduler.cpp``) over
slots: a request is admitted, first come first served, only when a KV slot is free, and a slot holds a
whole ``max_seq_len`` sequence, so an admitted request always runs to its end without evicting anyone.
A request therefore holds its slot until it ends, and the pool is only as available as abandoned
requests are quick to leave it. Two ways out, both taken at the next iteration boundary (a
request's prefill is one pass, so at most one pass late), wherever the request is (queued for a
slot, admitted and waiting for its prefill, or decoding):

- :meth:`Scheduler.cancel` (the serving layer found the client gone);
- the request's own timeout (``timeout_s`` at submit; TensorRT-LLM's ``Request.allotted_time_ms``,
  which ends a request with finish reason ``TIMED_OUT``): its ``on_error`` gets :class:`RequestTimedOut`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .stream import StepOutput, collect
from .types import GenerationRequest, GenerationResult
from .worker import InflightRequest, Worker

log = logging.getLogger(__name__)


class DropRequest(Exception):  # noqa: N818 - an instruction, not an error
    """Raised by an ``on_step`` callback to drop its request quietly (answered already, cancelled)."""


class RequestTimedOut(TimeoutError):  # noqa: N818 - TensorRT-LLM's FinishReason TIMED_OUT
    """A request's ``timeout_s`` passed before it finished; the scheduler dropped it and freed its slot.

    ``stage`` says where it was: ``"queued"`` (waiting for a KV slot), ``"prefill"`` (admitted, its
    prefill not run yet) or ``"decoding"``; ``generated``: tokens it had produced.
    """

    def __init__(self, timeout_s: float, stage: str, generated: int) -> None:
        self.timeout_s, self.stage, self.generated = timeout_s, stage, generated
        super().__init__(
            f"the request's timeout of {timeout_s:g} s passed while it was {STAGE_WORDS[stage]} "
            f"({generated} tokens generated); the engine dropped it and freed its KV slot"
        )


STAGE_WORDS = {"queued": "queued for a KV slot", "prefill": "waiting for its prefill", "decoding": "decoding"}


OnStep = Callable[[StepOutput], None]
OnError = Callable[[BaseException], None]


@dataclass
class _Entry:
    seq: InflightRequest
    on_step: OnStep
    on_error: OnError
    timeout_s: float | None = None
    deadline: float | None = None  # time.monotonic() after which the request is dropped

    def stage(self, running: bool) -> str:
        return "queued" if not running else "decoding" if self.seq.prefilled else "prefill"


class Scheduler:
    """Runs requests of one engine concurrently on a worker thread, batched one decoding iteration at a time.

    Example::

        with Scheduler(engine) as scheduler:
            streams = [scheduler.stream(r) for r in requests]       # all in flight together
            results = [collect(s) for s in streams]                  # == [engine.generate(r) ...]

    Args:
        engine: a :class:`~specbuild.runtime.ReferenceEngine` (``prepare``, ``model``, ``limits``).
        max_batch_size: requests in flight at once; None -> the build's ``max_batch_size``. More wait in
            FIFO order and join as running ones finish.

    Raises:
        ValueError: ``max_batch_size < 1``.
    """

    def __init__(self, engine, *, max_batch_size: int | None = None) -> None:
        limits = engine.limits
        max_batch_size = limits.max_batch_size if max_batch_size is None else max_batch_size
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.worker = Worker(
            engine.model,
            max_batch_size=max_batch_size,
            max_seq_len=limits.max_seq_len,
            max_block=limits.max_block,
            max_num_tokens=limits.tokens_per_iteration,  # >= max_block (EngineLimits checks it)
            controls=getattr(engine, "runtime_controls", None),
            gate=getattr(engine, "speculation_gate", None),
        )
        self._pending: deque[_Entry] = deque()
        self._entries: dict[int, _Entry] = {}  # id(seq) -> entry, running ones
        self._cancelled: set[int] = set()
        self._wake = threading.Condition()
        self._closed = False
        self.max_active_seen = 0  # how many requests were ever in flight together (observability, tests)
        self.iterations = 0
        self._thread = threading.Thread(target=self._run, name="specbuild-scheduler", daemon=True)
        self._thread.start()

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def submit(self, request: GenerationRequest, on_step: OnStep, on_error: OnError, *,
               timeout_s: float | None = None) -> InflightRequest:
        """Validate ``request`` now and queue it; ``on_step`` then gets each step on the worker thread,
        the last one with ``finish_reason`` set, or ``on_error`` gets the exception that ended it.

        Callbacks run on the worker thread and must be quick; :class:`DropRequest` from ``on_step``
        drops the request quietly (e.g. cancelled), any other exception drops it and is logged.
        ``timeout_s`` (seconds from now; None: none): past it the request is dropped wherever it is
        and ``on_error`` gets :class:`RequestTimedOut` (checked between iterations).

        Returns:
            the queued sequence (a handle for :meth:`cancel`).

        Raises:
            InvalidRequestError: the engine refuses the request (nothing is queued).
            RuntimeError: the scheduler is closed.
        """
        seq = self.engine.prepare(request)
        self.submit_prepared(seq, on_step, on_error, timeout_s=timeout_s)
        return seq

    def submit_prepared(self, seq: InflightRequest, on_step: OnStep, on_error: OnError, *,
                        timeout_s: float | None = None) -> None:
        """Queue an already validated sequence (``engine.prepare(request)``), e.g. after checking every
        row of a batch before running any; callbacks and ``timeout_s`` as :meth:`submit`.

        Raises:
            RuntimeError: the scheduler is closed.
            ValueError: ``timeout_s`` is not positive.
        """
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds (or None for no timeout), got {timeout_s!r}")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._wake:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            self._pending.append(_Entry(seq, on_step, on_error, timeout_s, deadline))
            self._wake.notify()

    def cancel(self, seq: InflightRequest) -> None:
        """Drop ``seq`` at the next iteration boundary (queued, waiting for its prefill or decoding) and
        free its slot; no further callback is made. Thread-safe; cancelling an ended request does nothing."""
        with self._wake:
            self._cancelled.add(id(seq))
            self._wake.notify()

    def stream(self, request: GenerationRequest, *, timeout_s: float | None = None) -> Iterator[StepOutput]:
        """Submit ``request`` and return an iterator over its steps (blocking until each arrives).

        Raises:
            InvalidRequestError: at once, as :meth:`submit`; a step's exception (:class:`RequestTimedOut`
                past ``timeout_s``) is re-raised by the iterator.
        """
        arrivals: queue.Queue[StepOutput | BaseException] = queue.Queue()
        self.submit(request, arrivals.put, arrivals.put, timeout_s=timeout_s)
        return _drain(arrivals)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Submit ``request`` and wait for its whole result (other requests keep running alongside)."""
        return collect(self.stream(request))

    def close(self) -> None:
        """Stop the worker; requests still queued or running are dropped."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()
        for entry in list(self._entries.values()):
            self.worker.remove(entry.seq)
        self._entries.clear()
        self._pending.clear()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not self._pending and not self._entries:
                    self._wake.wait()
                if self._closed:
                    return
                self._drop_cancelled()
                expired = self._drop_expired(time.monotonic())
                while self._pending and self.worker.has_room:
                    entry = self._pending.popleft()
                    self.worker.add(entry.seq)
                    self._entries[id(entry.seq)] = entry
                self.max_active_seen = max(self.max_active_seen, len(self._entries))
            for entry, exc in expired:
                self._notify_error(entry, exc)
            if not self._entries:
                continue
            try:
                events = self.worker.step()
            except Exception as exc:  # noqa: BLE001 - a failure outside any one row: fail the running ones
                log.exception("decoding iteration failed")
                events = [(entry.seq, exc) for entry in self._entries.values()]
            self.iterations += 1
            for seq, item in events:
                self._deliver(seq, item)

    def _drop_cancelled(self) -> None:
        if not self._cancelled:
            return
        self._pending = deque(e for e in self._pending if id(e.seq) not in self._cancelled)
        for key in [k for k in self._entries if k in self._cancelled]:
            self.worker.remove(self._entries.pop(key).seq)
        self._cancelled.clear()

    def _drop_expired(self, now: float) -> list[tuple[_Entry, RequestTimedOut]]:
        """Remove the queued and running entries whose deadline passed (freeing their slots); returns
        them with their errors, for the caller to hand out once it has released the lock."""
        def late(entry: _Entry) -> bool:
            return entry.deadline is not None and now >= entry.deadline

        def timed_out(entry: _Entry, running: bool) -> tuple[_Entry, RequestTimedOut]:
            return entry, RequestTimedOut(entry.timeout_s, entry.stage(running), len(entry.seq.state.output))

        expired = [timed_out(e, False) for e in self._pending if late(e)]
        if expired:
            self._pending = deque(e for e in self._pending if not late(e))
        for key, entry in [(k, e) for k, e in self._entries.items() if late(e)]:
            expired.append(timed_out(entry, True))
            del self._entries[key]
            self.worker.remove(entry.seq)
        return expired

    def _notify_error(self, entry: _Entry, exc: BaseException) -> None:
        try:
            entry.on_error(exc)
        except Exception:  # noqa: BLE001 - a failing callback must not stop the loop
            log.exception("scheduler on_error callback failed")

    def _deliver(self, seq: InflightRequest, item: StepOutput | BaseException) -> None:
        """Hand one event to its request's callback; drop the request when it ended or its callback failed."""
        entry = self._entries.get(id(seq))
        if entry is None:
            return
        ended = isinstance(item, BaseException) or item.is_final
        try:
            if isinstance(item, BaseException):
                entry.on_error(item)
            else:
                entry.on_step(item)
        except DropRequest:
            ended = True
        except Exception:  # noqa: BLE001 - a failing sender drops its request only
            log.exception("scheduler callback failed; dropping the request")
            ended = True
        if ended:
            self.worker.remove(seq)
            del self._entries[id(seq)]


def _drain(arrivals: queue.Queue) -> Iterator[StepOutput]:
    while True:
        item = arrivals.get()
        if isinstance(item, BaseException):
            raise item
        yield item
        if item.is_final:
            return


__all__ = ["DropRequest", "RequestTimedOut", "Scheduler"]
