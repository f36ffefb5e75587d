"""Soak and fault benchmark of a served recipe (``benchmarks/soak.py``; docs/bench.md, "Soak").

    ledger    one record per request and its outcome, windows, percentiles, the pass criteria
    load      the prompt pool, the request mix (Triton gRPC / OpenAI front, streamed / unary,
              cancelling, bad, reconnecting) and the open-loop arrivals
    faults    the served process tree (tritonserver, its Python-backend stubs) and the faults
              (SIGKILL, SIGSTOP/SIGCONT, a full results disk, an exhausted KV pool)
    harness   serve, calibrate, load, sample every interval, inject faults, write JSON and PNG
"""
