"""Responses delivered off the engine's loop: one thread sends what the decoding iterations produce.

In Triton's Python backend every ``ResponseSender.send`` waits until the server process has taken
the response (python_backend ``src/response_sender.cc``: the stub thread sleeps on the message's
condition until the server's turn is over), and ``InferenceRequest.is_cancelled()`` is a round trip
to the server as well (``src/pb_cancel.cc``). Done inside the engine's ``on_step`` callbacks, both
stall the next decoding iteration, once per request in flight and per step. Here the engine's
thread only appends each step to its request's :class:`Mailbox`; the :class:`Outbox` thread takes
whatever has accumulated and delivers it, while the engine already computes the next iteration::

    engine thread     step 1: A B C | step 2: A B C | step 3: A B C | ...
    outbox thread            send A1 B1 C1 | send A2 B2 C2 | ...        (order kept per request)

Cancellation is checked from the outbox thread at most once per ``cancellation_check_period_s``
per request, as TensorRT-LLM's Triton backend polls it (its ``cancellation_check_period_ms``
parameter, default 100 ms), instead of once per step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

log = logging.getLogger(__name__)

CANCELLATION_CHECK_PERIOD_S = 0.1


class Mailbox:
    """One request's undelivered items (steps, an error), appended on the engine's thread and handed
    in order to :meth:`deliver` on the outbox thread. Subclasses implement :meth:`deliver`."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self._items: list = []
        self._lock = threading.Lock()
        self.queued = False  # guarded by the outbox's condition

    def put(self, item: object) -> None:
        """Queue ``item`` for delivery (engine thread; returns at once)."""
        with self._lock:
            self._items.append(item)
        self.outbox.post(self)

    def take(self) -> list:
        """Everything queued since the last call, oldest first."""
        with self._lock:
            items, self._items = self._items, []
        return items

    def deliver(self, items: list) -> None:
        """Send ``items`` (outbox thread); ``items`` may be empty."""
        raise NotImplementedError


class Outbox:
    """The thread that delivers every :class:`Mailbox` posted to it, in posting order; a mailbox posted
    again before its turn is delivered once with all its items. A failing ``deliver`` is logged and
    the thread goes on with the next mailbox."""

    def __init__(self, *, name: str = "specbuild-outbox") -> None:
        self._ready: deque[Mailbox] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def post(self, mailbox: Mailbox) -> None:
        with self._cv:
            if not mailbox.queued:
                mailbox.queued = True
                self._ready.append(mailbox)
                self._cv.notify()

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued, then stop the thread (waits up to ``timeout_s`` seconds)."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._ready and not self._closed:
                    self._cv.wait()
                if not self._ready:
                    return
                mailbox = self._ready.popleft()
                mailbox.queued = False
            try:
                mailbox.deliver(mailbox.take())
            except Exception:  # noqa: BLE001 - one request's failure must not stop the others' responses
                log.exception("delivering a response failed")


class CancellationPoll:
    """When a request's cancellation is due for a check: at most once per ``period_s`` seconds."""

    def __init__(self, period_s: float = CANCELLATION_CHECK_PERIOD_S) -> None:
        self.period_s = period_s
        self._last = time.monotonic()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.period_s:
            return False
        self._last = now
        return True


__all__ = ["CANCELLATION_CHECK_PERIOD_S", "CancellationPoll", "Mailbox", "Outbox"]
