"""In-flight batching for the reference engine: active requests advance one decoding step each, in turn.

TensorRT-LLM's in-flight batching (its ``batch_scheduler_policy``) lets new requests join the running
batch between decoding iterations instead of waiting for the whole batch to finish. The
:class:`Scheduler` does the same over :meth:`ReferenceEngine.generate_stream` step generators::

    thread loop:   admit pending requests while len(active) < max_batch_size
                   for each active request (round-robin): step = next(its steps); on_step(step)
                   drop the finished ones (final step, or an error -> on_error)

    time ->   A0 B0 A1 B1 C0 A2 B2 C1 ...      (C submitted while A and B run: joins after one round)

What it is not: the reference engine time-slices. Each step is its own target forward over one
sequence (its own KV cache, proposer and counters), so greedy output is the same alone or in a
batch, token for token, but concurrent requests do not share a batched GEMM (no amortised weight
reads, unlike TensorRT-LLM). Throughput stays that of one sequence; latency is shared fairly.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .stream import StepOutput, collect
from .types import GenerationRequest, GenerationResult

log = logging.getLogger(__name__)

class DropRequest(Exception):  # noqa: N818 - an instruction, not an error
    """Raised by an ``on_step`` callback to drop its request quietly (answered already, cancelled)."""


OnStep = Callable[[StepOutput], None]
OnError = Callable[[BaseException], None]


@dataclass
class _Active:
    steps: Iterator[StepOutput]
    on_step: OnStep
    on_error: OnError


class Scheduler:
    """Runs requests of one engine concurrently on a worker thread, one decoding step at a time each.

    Example::

        with Scheduler(engine, max_batch_size=4) as scheduler:
            streams = [scheduler.stream(r) for r in requests]       # all four in flight
            results = [collect(s) for s in streams]                  # == [engine.generate(r) ...]

    Args:
        engine: anything with ``generate_stream(request) -> Iterator[StepOutput]`` (a ReferenceEngine).
        max_batch_size: requests in flight at once (the build's ``max_batch_size``); more wait in FIFO
            order and join as running ones finish.

    Raises:
        ValueError: ``max_batch_size < 1``.
    """

    def __init__(self, engine, *, max_batch_size: int) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.engine = engine
        self.max_batch_size = max_batch_size
        self._pending: deque[_Active] = deque()
        self._active: list[_Active] = []
        self._wake = threading.Condition()
        self._closed = False
        self.max_active_seen = 0  # how many requests were ever in flight together (observability, tests)
        self._thread = threading.Thread(target=self._run, name="specbuild-scheduler", daemon=True)
        self._thread.start()

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def submit(self, request: GenerationRequest, on_step: OnStep, on_error: OnError) -> None:
        """Validate ``request`` now and queue it; ``on_step`` then gets each step on the worker thread,
        the last one with ``finish_reason`` set, or ``on_error`` gets the exception a step raised.

        Callbacks run on the worker thread and must be quick; :class:`DropRequest` from ``on_step``
        drops the request quietly (e.g. cancelled), any other exception drops it and is logged.

        Raises:
            InvalidRequestError: the engine refuses the request (nothing is queued).
            RuntimeError: the scheduler is closed.
        """
        self.submit_steps(self.engine.generate_stream(request), on_step, on_error)

    def submit_steps(self, steps: Iterator[StepOutput], on_step: OnStep, on_error: OnError) -> None:
        """Queue an already validated step iterator (``engine.generate_stream(request)``), e.g. after
        checking every row of a batch before running any; callbacks as :meth:`submit`.

        Raises:
            RuntimeError: the scheduler is closed (``steps`` is closed).
        """
        with self._wake:
            if self._closed:
                steps.close()
                raise RuntimeError("the scheduler is closed")
            self._pending.append(_Active(steps, on_step, on_error))
            self._wake.notify()

    def stream(self, request: GenerationRequest) -> Iterator[StepOutput]:
        """Submit ``request`` and return an iterator over its steps (blocking until each arrives).

        Raises:
            InvalidRequestError: at once, as :meth:`submit`; a step's exception is re-raised by the iterator.
        """
        arrivals: queue.Queue[StepOutput | BaseException] = queue.Queue()
        self.submit(request, arrivals.put, arrivals.put)
        return _drain(arrivals)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Submit ``request`` and wait for its whole result (other requests keep running alongside)."""
        return collect(self.stream(request))

    def close(self) -> None:
        """Stop the worker; requests still queued or running are dropped (their generators closed)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()
        for entry in [*self._active, *self._pending]:
            entry.steps.close()
        self._active.clear()
        self._pending.clear()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not self._pending and not self._active:
                    self._wake.wait()
                if self._closed:
                    return
                while self._pending and len(self._active) < self.max_batch_size:
                    self._active.append(self._pending.popleft())
                self.max_active_seen = max(self.max_active_seen, len(self._active))
            for entry in list(self._active):  # one round: one step of each active request
                if not self._advance(entry):
                    self._active.remove(entry)

    @staticmethod
    def _advance(entry: _Active) -> bool:
        """One step of ``entry``; False when it is finished (last step, error, or a failing callback)."""
        try:
            step = next(entry.steps)
        except Exception as exc:  # noqa: BLE001 - reported to the request, the worker goes on
            try:
                entry.on_error(exc if not isinstance(exc, StopIteration) else RuntimeError("no final step"))
            except Exception:  # noqa: BLE001
                log.exception("on_error callback failed")
            return False
        try:
            entry.on_step(step)
        except DropRequest:
            entry.steps.close()
            return False
        except Exception:  # noqa: BLE001 - a failing sender drops its request only
            log.exception("on_step callback failed; dropping the request")
            entry.steps.close()
            return False
        if step.is_final:
            entry.steps.close()
            return False
        return True


def _drain(arrivals: queue.Queue) -> Iterator[StepOutput]:
    while True:
        item = arrivals.get()
        if isinstance(item, BaseException):
            raise item
        yield item
        if item.is_final:
            return


__all__ = ["DropRequest", "Scheduler"]
