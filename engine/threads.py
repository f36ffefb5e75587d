"""Keep a process's torch compute off long-lived threads other than the engine's.

PyTorch's CPU build runs its intra-op parallelism on GNU OpenMP (libgomp). libgomp keeps a pool of
worker threads for every thread that ever ran a parallel region, and keeps it until that thread
exits. While the process holds more pooled threads than CPUs, libgomp throttles the spin-wait of
its idle workers (``gomp_throttled_spin_count_var`` in libgomp's ``env.c``; "more libgomp managed
threads than available CPUs"), so every parallel region wakes its team through the kernel instead.
A decoding step runs a few thousand small parallel regions, and they all pay for it.

That is what happens when a model is loaded on a process's main thread (a Triton Python backend's
``initialize``, a script) and then served from a scheduler thread: the main thread's pool lives on.
Measured on a 2-core Xeon, torch 2.13 (libgomp), ``OMP_NUM_THREADS=2``: one SmolLM2-135M decode
step took 35 ms on the thread that loaded the model and 55-60 ms on a second thread; a loop of
2000 64x64 matmuls 9.2 ms against 137 ms. A thread that has exited leaves nothing behind, so work
done on a short-lived thread (:func:`on_fresh_thread`) costs the scheduler's thread nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_fresh_thread(fn: Callable[..., T], /, *args, **kwargs) -> T:
    """Call ``fn(*args, **kwargs)`` on a new thread that exits when it returns, and return its result.

    Use it for torch work done once outside the engine's own thread (loading and packing a model,
    a reference run): the thread's OpenMP pool goes with it (module docstring).

    Raises:
        whatever ``fn`` raised, re-raised on the calling thread.
    """
    result: list = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            error.append(exc)

    thread = threading.Thread(target=run, name=f"specbuild-{getattr(fn, '__name__', 'call')}")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


__all__ = ["on_fresh_thread"]
