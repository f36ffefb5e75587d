"""Torch work done once outside the engine's thread (loading) leaves no OpenMP pool behind (engine/threads.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from specbuild import runtime
from specbuild.runtime import EngineLimits, ReferenceEngine
from specbuild.engine.threads import on_fresh_thread

PROBE = textwrap.dedent(
    """
    import os, time, torch
    from specbuild.engine.threads import on_fresh_thread

    def tasks():  # the process's OS threads, OpenMP workers included
        return len(os.listdir("/proc/self/task"))

    def matmul():
        a = torch.randn(512, 512)
        for _ in range(20):
            a = a @ a / 512
        return float(a.sum())

    base = tasks()
    on_fresh_thread(matmul)
    # libgomp releases a finished thread's pool from a thread-exit destructor; its workers exit
    # asynchronously, so allow them a moment (a pool that outlives its thread never goes)
    deadline = time.monotonic() + 5
    while tasks() != base and time.monotonic() < deadline:
        time.sleep(0.01)
    after_fresh = tasks()
    matmul()
    after_main = tasks()
    print(base, after_fresh, after_main)
    """
)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_work_on_a_fresh_thread_leaves_no_openmp_pool_where_the_callers_own_work_does():
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True, timeout=120)
    base, after_fresh, after_main = map(int, out.stdout.split())
    if after_main == base:
        pytest.skip("this torch build starts no OpenMP pool for a matmul (no libgomp workers to count)")
    assert after_fresh == base, "the fresh thread's OpenMP workers outlived it"
    assert after_main > base  # the calling thread's pool stays: what on_fresh_thread avoids


def test_on_fresh_thread_returns_the_result_and_reraises_on_the_caller():
    caller = threading.get_ident()
    assert on_fresh_thread(lambda x, y=0: (x + y, threading.get_ident()), 2, y=3)[0] == 5
    assert on_fresh_thread(threading.get_ident) != caller
    with pytest.raises(KeyError, match="missing"):
        on_fresh_thread(lambda: {}["missing"])


def test_engine_loads_and_packs_its_model_off_the_calling_thread(tiny_checkpoint, monkeypatch):
    seen = []
    load_target, pack_linears = runtime.target_model.load_target, runtime.pack_linears
    monkeypatch.setattr(runtime.target_model, "load_target", lambda *a, **k: seen.append(threading.get_ident()) or load_target(*a, **k))
    monkeypatch.setattr(runtime, "pack_linears", lambda *a, **k: seen.append(threading.get_ident()) or pack_linears(*a, **k))
    limits = EngineLimits(max_batch_size=1, max_input_len=16, max_seq_len=32, max_draft_len=0)
    engine = ReferenceEngine.from_pretrained(tiny_checkpoint, speculative_config=None, limits=limits)
    assert len(seen) == 2 and threading.get_ident() not in seen
    assert engine.model is not None
    with pytest.raises(FileNotFoundError):  # a load error still reaches the caller
        ReferenceEngine.from_pretrained(tiny_checkpoint / "absent", speculative_config=None, limits=limits)
