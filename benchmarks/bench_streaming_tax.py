"""The streaming tax, side by side in one run: plain decoding (k=0) on an engine in-process against the
same engine served streamed and unary through Triton, for one or more model repositories of that
engine (e.g. two versions of the tensorrt_llm model code, each repository's model.py importing its
own), interleaved round by round. Prints tokens/s per round, each served figure's ratio to the
in-process one of the same round, and the CPU milliseconds per output token of every process
(client = this process; tritonserver and each Python-backend stub), which a loaded machine disturbs
less than wall time.

    python benchmarks/bench_streaming_tax.py --engine-dir specbuild-out/smollm2-greedy/engine \
        --repos new=specbuild-out/smollm2-greedy/triton_repo --conc 1 8 --rounds 2 --json out.json

Modes (--modes): ``stream`` (the ensemble, streamed, SpecClient), ``unary`` (the ensemble, one
response), ``engine`` (streamed ids read straight from the ``tensorrt_llm`` model, prompts tokenized
here: no pre/postprocessing hop, as TensorRT-LLM backend users call its ``tensorrt_llm`` model).

The repositories must be decoupled (recipe serve.decoupled: true, or `specbuild bench` builds them so).
Results: docs/results/2026-12-04-streaming-tax.md."""
import argparse, json, os, queue, statistics, threading, time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
import numpy as np
import psutil
import tritonclient.grpc as grpcclient
from specbuild.prompts import load_prompts
from specbuild.tokenizer import load_tokenizer
from specbuild.runtime import ReferenceEngine
from specbuild.engine.scheduler import Scheduler
from specbuild.engine.types import GenerationRequest
from specbuild.client.sdk import SpecClient
from specbuild.triton_repo.tritonserver import TritonServer

p = argparse.ArgumentParser()
p.add_argument("--engine-dir", default="specbuild-out/smollm2-greedy/engine")
p.add_argument("--repos", nargs="+", required=True, help="NAME=REPOSITORY_DIR, one per served variant")
p.add_argument("--prompts", default="humaneval:4")
p.add_argument("--max-tokens", type=int, default=32)
p.add_argument("--conc", type=int, nargs="+", default=[1])
p.add_argument("--modes", nargs="+", default=["stream", "unary"])
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--k", type=int, default=0)
p.add_argument("--json", default="")
a = p.parse_args()
prompts = load_prompts(a.prompts)

def closed_loop(fn, jobs, c):
    t = time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        n = sum(pool.map(fn, jobs))
    return n, time.perf_counter() - t

def tree(pid):
    root = psutil.Process(pid)
    out = {}
    for c in [root, *root.children(recursive=True)]:
        cmd = " ".join(c.cmdline())
        name = next((m for m in ("tensorrt_llm", "postprocessing", "preprocessing") if f"/{m}/1/model.py" in cmd), "tritonserver")
        out[name] = c
    return out

def cpu(procs):
    return {k: sum(pr.cpu_times()[:2]) for k, pr in procs.items()}

with ExitStack() as stack:
    servers = {}
    for spec in a.repos:
        name, repo = spec.split("=")
        s = stack.enter_context(TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=Path(repo) / f"tritonserver-{name}.log"))
        servers[name] = (s, tree(s.pid))
    tok = load_tokenizer(str(Path(a.engine_dir) / "tokenizer"))
    ids = [tok(p.text, add_special_tokens=True)["input_ids"] for p in prompts]
    engine = ReferenceEngine.from_engine_dir(a.engine_dir)
    me = psutil.Process()
    clients = {n: SpecClient(s.grpc_url, decoupled=True, retries=0) for n, (s, _) in servers.items()}
    f = {"num_draft_tokens": a.k}
    def one(client, stream):
        def go(pr):
            if stream:
                return sum(len(c.output_ids) for c in client.generate_stream(pr.text, max_tokens=a.max_tokens, end_id=-1, **f))
            return len(client.generate(pr.text, max_tokens=a.max_tokens, end_id=-1, **f).output_ids)
        return go
    def engine_stream(url):
        """Streamed ids from the tensorrt_llm model: one gRPC client (channel) per worker thread."""
        local = threading.local()
        def go(x):
            c = getattr(local, "c", None)
            if c is None:
                c = local.c = grpcclient.InferenceServerClient(url)
            arrivals = queue.Queue()
            values = {"input_ids": np.array([x], np.int32), "input_lengths": np.array([[len(x)]], np.int32),
                      "request_output_len": np.array([[a.max_tokens]], np.int32), "end_id": np.array([[-1]], np.int32),
                      "num_draft_tokens": np.array([[a.k]], np.int32), "streaming": np.array([[True]])}
            inputs = []
            for name, v in values.items():
                t = grpcclient.InferInput(name, list(v.shape), "BOOL" if v.dtype == bool else "INT32")
                t.set_data_from_numpy(v); inputs.append(t)
            outputs = [grpcclient.InferRequestedOutput("output_ids"), grpcclient.InferRequestedOutput("sequence_length")]
            c.start_stream(callback=lambda result, error: arrivals.put((result, error)))
            n, final = 0, False
            try:
                c.async_stream_infer("tensorrt_llm", inputs, outputs=outputs, enable_empty_final_response=True)
                while not final:
                    r, e = arrivals.get(timeout=600)
                    if e is not None:
                        raise e
                    resp = r.get_response()
                    final = resp.parameters["triton_final_response"].bool_param
                    if resp.outputs:
                        n += int(r.as_numpy("sequence_length").reshape(-1)[0])
            finally:
                c.stop_stream()
            return n
        return go
    for n, c in clients.items():
        c.wait_ready(120); one(c, True)(prompts[0]); one(c, False)(prompts[0])
        if "engine" in a.modes:
            engine_stream(servers[n][0].grpc_url)(ids[0])
    configs = [("inproc", None)] + [(f"{m}-{n}", n) for n in clients for m in a.modes]
    res, cpus = {}, {}
    for r in range(a.rounds):
        for c in a.conc:
            for cfg, n in configs:
                procs = {"client": me} if n is None else {"client": me, **servers[n][1]}
                if n is None:
                    with Scheduler(engine) as s:
                        s.generate(GenerationRequest(ids[0], 2, end_id=-1, num_draft_tokens=a.k))
                        before = cpu(procs)
                        k, w = closed_loop(lambda x: len(s.generate(GenerationRequest(x, a.max_tokens, end_id=-1, num_draft_tokens=a.k)).output_ids), ids, c)
                elif cfg.startswith("engine"):
                    before = cpu(procs)
                    k, w = closed_loop(engine_stream(servers[n][0].grpc_url), ids, c)
                else:
                    before = cpu(procs)
                    k, w = closed_loop(one(clients[n], cfg.startswith("stream")), prompts, c)
                after = cpu(procs)
                res.setdefault((c, cfg), []).append(k / w)
                cpus.setdefault((c, cfg), []).append({x: 1000 * (after[x] - before[x]) / k for x in after})
                print(f"round {r} C={c} {cfg}: {k / w:.1f} tok/s  load {os.getloadavg()[0]:.1f}", flush=True)
    report = []
    for (c, cfg), v in res.items():
        base = res[(c, "inproc")]
        ratio = [x / y for x, y in zip(v, base)]
        per = {x: statistics.median(d[x] for d in cpus[(c, cfg)]) for x in cpus[(c, cfg)][0]}
        report.append({"concurrency": c, "config": cfg, "tok_s": v, "ratio_to_inproc": ratio, "cpu_ms_per_token": per})
        print(f"C={c} {cfg:12s} median {statistics.median(v):6.1f} tok/s  ratio {statistics.median(ratio):.3f} {[round(x, 2) for x in ratio]}  "
              f"CPU ms/tok " + " ".join(f"{x}={y:.2f}" for x, y in per.items()) + f" sum={sum(per.values()):.2f}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "load_end": os.getloadavg(), "report": report}, indent=1))
