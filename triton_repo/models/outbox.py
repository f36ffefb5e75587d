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

Cancellation is polled for every request in flight, every ``CANCELLATION_CHECK_PERIOD_S``, by a
:class:`CancellationWatch` thread, as TensorRT-LLM's Triton backend polls all its active requests
(its ``cancellation_check_period_ms`` parameter, default 100 ms). The watch only posts a check to
the request's mailbox; the outbox thread asks the server, in order with the request's responses, so a
check never follows the final response. Polling per request rather than per decoding step is what
reaches a request that produces no steps: one queued for a KV slot or waiting for its prefill.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

log = logging.getLogger(__name__)

CANCELLATION_CHECK_PERIOD_S = 0.1


CHECK_CANCELLATION = object()  # a mailbox item: ask the server whether the client cancelled


class Mailbox:
    """One request's undelivered items (steps, an error, :data:`CHECK_CANCELLATION`), appended on the
    engine's or the watch's thread and handed in order to :meth:`deliver` on the outbox thread.
    Subclasses implement :meth:`deliver`."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self._items: list = []
        self._lock = threading.Lock()
        self._check_queued = False  # a CHECK_CANCELLATION waits in _items
        self.queued = False  # guarded by the outbox's condition

    def put(self, item: object) -> None:
        """Queue ``item`` for delivery (engine thread; returns at once)."""
        with self._lock:
            self._items.append(item)
        self.outbox.post(self)

    def check_cancellation(self) -> None:
        """Queue one :data:`CHECK_CANCELLATION` unless one is already waiting (watch thread)."""
        with self._lock:
            if self._check_queued:
                return
            self._check_queued = True
            self._items.append(CHECK_CANCELLATION)
        self.outbox.post(self)

    def take(self) -> list:
        """Everything queued since the last call, oldest first."""
        with self._lock:
            items, self._items, self._check_queued = self._items, [], False
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


class CancellationWatch:
    """A thread that asks every watched :class:`Mailbox` to check its request's cancellation every
    ``period_s`` seconds (:meth:`Mailbox.check_cancellation`), from :meth:`watch` until :meth:`unwatch`."""

    def __init__(self, period_s: float = CANCELLATION_CHECK_PERIOD_S, *, name: str = "specbuild-cancellation") -> None:
        self.period_s = period_s
        self._watched: set[Mailbox] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def watch(self, mailbox: Mailbox) -> None:
        with self._lock:
            self._watched.add(mailbox)

    def unwatch(self, mailbox: Mailbox) -> None:
        with self._lock:
            self._watched.discard(mailbox)

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            with self._lock:
                watched = list(self._watched)
            for mailbox in watched:
                mailbox.check_cancellation()


__all__ = ["CANCELLATION_CHECK_PERIOD_S", "CHECK_CANCELLATION", "CancellationWatch", "Mailbox", "Outbox"]
