"""Run a soak: serve (or reach) a recipe, calibrate plain decoding, drive the open-loop mix, sample
every interval, inject faults, judge the pass criteria, and write ``soak.json`` and ``soak.png``.

Serving: the recipe is built decoupled through :func:`specbuild.deploy.build_recipe` and served by a
``specbuild serve REPO --openai-port P --restart on-failure`` subprocess on free loopback ports, so a
killed tritonserver is brought back by specbuild's own supervision. With ``grpc_url`` set the harness
uses a running deployment instead (``server_pid`` for RSS and the process faults).
"""

from __future__ import annotations

import io
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specbuild.util.atomic import write_file_atomic
from specbuild.soak import faults as fault_mod
from specbuild.soak.ledger import (
    Criterion,
    FaultWindow,
    Ledger,
    Outcome,
    RequestRecord,
    classify,
    judge_lost,
    judge_outputs,
    judge_p99_drift,
    judge_rss,
    summarize,
    totals,
)
from specbuild.soak.load import (
    Clients,
    Endpoints,
    Mix,
    OpenLoop,
    RequestPlan,
    SoakPrompt,
    calibrate,
    draw,
    execute,
    fill_slots,
    new_record,
    prompt_pool,
)


@dataclass
class SoakConfig:
    """What to run. Times in seconds; ``fraction`` of the calibrated plain-decoding token throughput."""

    recipe: str
    results_dir: Path
    duration_s: float = 3600.0
    interval_s: float = 60.0
    warmup_s: float | None = None  # None: a tenth of the duration, at most 300 s
    fraction: float = 0.7
    concurrency: int = 4
    calibrate_s: float = 30.0
    timeout_s: float = 60.0
    grace_s: float = 10.0
    faults: tuple[str, ...] = ()
    stall_s: float = 10.0
    disk_hold_s: float = 5.0
    recovery_give_up_s: float = 180.0
    mix: Mix = field(default_factory=Mix)
    max_requests: int = 100_000
    max_in_flight: int = 64
    seed: int = 0
    prompts: int = 6  # the recipe's verify prompts used (plus the long and near-max ones)
    grpc_url: str | None = None
    openai_url: str | None = None
    server_pid: int | None = None
    output_root: Path | None = None
    drift_window_s: float = 600.0
    fill_slots: bool = True  # write every KV slot once before the load (load.fill_slots)

    @property
    def warmup(self) -> float:
        return self.warmup_s if self.warmup_s is not None else min(300.0, self.duration_s / 10)


@dataclass
class Deployment:
    """What the soak talks to."""

    endpoints: Endpoints
    root_pid: int | None
    tokenizer_dir: Path
    max_input_len: int
    max_seq_len: int
    max_batch_size: int
    texts: list[tuple[str, str]]
    serve_log: Path | None = None


# --- serving ------------------------------------------------------------------------------------------


@contextmanager
def deployment(config: SoakConfig, log: Callable[[str], None] = print) -> Iterator[Deployment]:
    """Build and serve ``config.recipe`` (or reach ``config.grpc_url``) for the duration of the block."""
    from specbuild.builder.recipe import load_recipe

    loaded = load_recipe(config.recipe)
    build_cfg = loaded.recipe.build
    if config.grpc_url is not None:
        from specbuild.triton_repo.openai_frontend import config_from_deployment

        front = config_from_deployment(config.grpc_url)
        texts = _texts(loaded, config.prompts)
        yield Deployment(Endpoints(config.grpc_url, config.openai_url, None, config.timeout_s), config.server_pid,
                         Path(front.tokenizer_dir), build_cfg.max_input_len, build_cfg.max_seq_len, build_cfg.max_batch_size, texts)
        return
    from specbuild.deploy import build_recipe
    from specbuild.pipeline import RunPaths, default_output_dir
    from specbuild.triton_repo.tritonserver import free_port

    output_dir = (config.output_root / loaded.recipe.name) if config.output_root else default_output_dir(loaded)
    build = build_recipe(loaded, RunPaths(Path(output_dir)), decoupled=True, log=log)
    ports = _free_ports(4, free_port)
    serve_log = config.results_dir / "serve.log"
    serve_log.parent.mkdir(parents=True, exist_ok=True)
    command = [*_specbuild_command(), "serve", str(build.repo_dir), "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
               "--metrics-port", str(ports[2]), "--openai-port", str(ports[3]), "--restart", "on-failure", "--max-restarts", "20",
               "--log-file", str(config.results_dir / "tritonserver.log")]
    log("serving: " + " ".join(command))
    with open(serve_log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        endpoints = Endpoints(f"127.0.0.1:{ports[1]}", f"http://127.0.0.1:{ports[3]}/v1", loaded.recipe.name, config.timeout_s)
        _wait_ready(endpoints, process, timeout_s=loaded.recipe.serve.startup_timeout_s + 60)
        yield Deployment(endpoints, process.pid, build.paths.engine_dir / "tokenizer", build_cfg.max_input_len,
                         build_cfg.max_seq_len, build_cfg.max_batch_size, _texts(loaded, config.prompts, build.prompts), serve_log)
    finally:
        if process.poll() is None:
            process.send_signal(2)  # SIGINT: serve stops tritonserver in order
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _specbuild_command() -> list[str]:
    found = shutil.which("specbuild", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-c", "from specbuild.cli import main; main()"]


def _free_ports(n: int, free_port) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _texts(loaded, n: int, prompts=None) -> list[tuple[str, str]]:
    if prompts is None:
        from specbuild.pipeline import check_runnable

        prompts = check_runnable(loaded).prompts
    return [(p.id, p.text) for p in list(prompts)[:n]]


def _wait_ready(endpoints: Endpoints, process: subprocess.Popen, *, timeout_s: float) -> None:
    from specbuild.client.openai_client import OpenAIClient
    from specbuild.client.sdk import ClientError, ServerUnavailableError, SpecClient

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerUnavailableError(f"specbuild serve exited with status {process.returncode} while starting")
        try:
            with SpecClient(endpoints.grpc_url, retries=0) as c:
                c.wait_ready(timeout_s=2)
            with OpenAIClient(endpoints.openai_url, timeout_s=5) as o:
                if o.models():
                    return
        except ClientError:
            pass
        time.sleep(1.0)
    raise ServerUnavailableError(f"the served recipe was not ready on {endpoints.grpc_url} within {timeout_s:g} s")


# --- the run ------------------------------------------------------------------------------------------


class Soak:
    """One soak run over a :class:`Deployment`."""

    def __init__(self, config: SoakConfig, dep: Deployment, pool: list[SoakPrompt], references: dict[str, list[int]],
                 log: Callable[[str], None] = print) -> None:
        self.config, self.dep, self.pool, self.references, self.log = config, dep, pool, references, log
        self.ledger = Ledger()
        self.clients = Clients(dep.endpoints)
        self.tree = fault_mod.ServedTree(dep.root_pid) if dep.root_pid else None
        self.intervals: list[dict] = []
        self.samples: list[dict] = []
        self.fault_results: list[fault_mod.FaultResult] = []
        self.fault_errors: list[str] = []
        self.t0 = time.monotonic()
        self.rng = random.Random(config.seed)
        self.rng_lock = threading.Lock()
        self.done = threading.Event()
        self.live: fault_mod.LiveResults | None = None
        self.disk: fault_mod.SmallDisk | None = None
        self.calibration: dict = {}
        self.rate_per_s = 0.0
        self.faults_done_at: float | None = None

    def clock(self) -> float:
        return time.monotonic() - self.t0

    def windows(self) -> list[FaultWindow]:
        return [FaultWindow(f.name, f.start, f.end) for f in self.fault_results]

    def send(self, request_id: int) -> None:
        with self.rng_lock:
            plan = draw(self.rng, self.pool, self.config.mix)
        if plan.kind.startswith("openai") and self.dep.endpoints.openai_url is None:
            plan.kind = plan.kind.replace("openai", "triton")
        self._run(plan, request_id)

    def _run(self, plan: RequestPlan, request_id: int) -> RequestRecord:
        record = new_record(self.ledger, request_id, plan, self.clock())
        execute(plan, record, self.clients, self.references, self.clock)
        return record

    # --- periodic sampling ---

    def sample_once(self, t0: float, t1: float) -> dict:
        now = self.clock()
        summary = summarize(self.ledger.snapshot(), t0=t0, t1=t1, now=now, timeout_s=self.config.timeout_s,
                            grace_s=self.config.grace_s, faults=self.windows())
        server = self.tree.sample() if self.tree else {}
        self.samples.append({"t_s": now, **server})
        summary["server"] = server
        self.intervals.append(summary)
        e2e = summary["e2e_s"]
        self.log(f"[{now:6.0f} s] completed {summary['completed']} cancelled {summary['cancelled']} rejected {summary['rejected']} "
                 f"fault_error {summary['fault_error']} failed {summary['failed']} lost {summary['lost']} | "
                 f"e2e p50 {_fmt(e2e['p50'])} p99 {_fmt(e2e['p99'])} s | acc {_fmt(summary['acceptance_length'])} | "
                 f"sampled {summary['sampled']} mismatches {summary['mismatches']} | "
                 f"RSS {server.get('rss', 0) / 2**20:.0f} MiB threads {server.get('server_threads', 0)}+{server.get('stub_threads', 0)}")
        if self.live is not None:
            self.live.write(self.live_payload())
        return summary

    def live_payload(self) -> dict:
        return {"complete": False, "t_s": self.clock(), "intervals": self.intervals}

    def sampler(self) -> None:
        t_prev = 0.0
        while not self.done.wait(max(0.0, t_prev + self.config.interval_s - self.clock())):
            t = self.clock()
            self.sample_once(t_prev, t)
            t_prev = t

    # --- faults ---

    def load_end(self) -> float:
        """The load runs ``duration_s``, and with faults on until one interval after the last fault
        has recovered (at most ``recovery_give_up_s`` beyond), so requests after each fault are seen."""
        c = self.config
        if not c.faults:
            return c.duration_s
        hard = c.duration_s + c.recovery_give_up_s + c.interval_s
        if self.faults_done_at is None:
            return min(hard, max(c.duration_s, self.clock() + c.interval_s))
        return min(hard, max(c.duration_s, self.faults_done_at + c.interval_s))

    def fault_times(self) -> list[tuple[float, str]]:
        names = list(self.config.faults)
        span = self.config.duration_s - self.config.warmup
        return [(self.config.warmup + (i + 0.5) * span / len(names), name) for i, name in enumerate(names)]

    def run_faults(self) -> None:
        try:
            self._run_faults()
        finally:
            self.faults_done_at = self.clock()

    def _run_faults(self) -> None:
        for at, name in self.fault_times():
            if self.done.wait(max(0.0, at - self.clock())):
                return
            self.log(f"[{self.clock():6.0f} s] fault {name}")
            try:
                result = self.inject(name)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported, not fatal
                self.fault_errors.append(f"{name}: {type(exc).__name__}: {exc}")
                self.log(f"  could not inject {name}: {exc}")
                continue
            if result not in self.fault_results:
                self.fault_results.append(result)
            self.log(f"  {name}: recovered in {_fmt(result.recovery_s)} s; {json.dumps(result.detail)[:300]}")

    def inject(self, name: str) -> fault_mod.FaultResult:
        c = self.config
        url = self.dep.endpoints.grpc_url
        if name in ("kill", "stall") and self.tree is None:
            raise RuntimeError(f"{name} needs the server's pid (--server-pid) or a deployment the soak serves itself")
        if name == "kill":
            pending = fault_mod.FaultResult("kill", self.clock())
            self.fault_results.append(pending)  # the window is open while the server is down
            try:
                result = fault_mod.kill(self.tree, url, self.clock, give_up_s=c.recovery_give_up_s)
            finally:
                self.fault_results.remove(pending)
            return result
        if name == "stall":
            pending = fault_mod.FaultResult("stall", self.clock())
            self.fault_results.append(pending)
            try:
                return fault_mod.stall(self.tree, url, self.clock, stall_s=c.stall_s, give_up_s=c.recovery_give_up_s)
            finally:
                self.fault_results.remove(pending)
        if name == "disk-full":
            return fault_mod.disk_full(self.live, self.disk, self.live_payload, self.clock, hold_s=c.disk_hold_s)
        if name == "kv-exhaust":
            return self.kv_exhaust()
        raise ValueError(f"unknown fault {name!r}; choose from {fault_mod.FAULTS}")

    def kv_exhaust(self) -> fault_mod.FaultResult:
        """``max_batch_size + 2`` requests at once of the near-max prompt, each up to ``max_seq_len``
        (capped at 4x the mix's longest output), on their own threads beside the normal load; recovered
        when, after they ended (answered or timed out), a probe request succeeds."""
        near = max(self.pool, key=lambda p: p.tokens)
        n = self.dep.max_batch_size + 2
        max_tokens = max(1, min(self.dep.max_seq_len - near.tokens, 4 * max(self.config.mix.max_tokens)))
        result = fault_mod.FaultResult("kv-exhaust", self.clock(), detail={"long_requests": n, "prompt_tokens": near.tokens,
                                                                             "max_tokens": max_tokens})
        self.fault_results.append(result)
        plans = [RequestPlan("triton-unary", near, max_tokens) for _ in range(n)]
        ids = [10**6 + len(self.fault_results) * 1000 + i for i in range(n)]
        threads = [threading.Thread(target=self._run, args=(p, i), daemon=True) for p, i in zip(plans, ids)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.config.timeout_s + self.config.grace_s)
        result.detail["long_done_s"] = self.clock() - result.start
        result.recovery_s = fault_mod.probe_until_ok(self.dep.endpoints.grpc_url, since=result.start, clock=self.clock,
                                                     give_up_s=self.config.recovery_give_up_s)
        result.end = self.clock()
        longs = [r for r in self.ledger.snapshot() if r.id in set(ids)]
        result.detail["long_outcomes"] = dict(Counter(r.status or "in flight" for r in longs))
        result.detail["long_errors"] = sorted({r.error.split(":")[0] for r in longs if r.error})
        return result

    # --- whole run ---

    def run(self) -> dict:
        c = self.config
        max_out = max(c.mix.max_tokens)
        mean_out = sum(c.mix.max_tokens) / len(c.mix.max_tokens)
        tokens_per_s = self.calibration["tokens_per_s"]
        self.rate_per_s = max(1e-3, c.fraction * tokens_per_s / mean_out)
        self.log(f"load: {c.fraction:.0%} of {tokens_per_s:.1f} plain tokens/s = {self.rate_per_s:.3f} requests/s "
                 f"(outputs of {list(c.mix.max_tokens)} tokens, reference {max_out}) for {c.duration_s:.0f} s")
        loop = OpenLoop(self.rate_per_s, c.duration_s, c.max_requests, c.max_in_flight, seed=c.seed + 1)
        with ExitStack() as stack:
            self.disk = fault_mod.SmallDisk(c.results_dir / "live")
            if "disk-full" in c.faults:
                self.disk.mount()
                stack.callback(self.disk.unmount)
            self.live = fault_mod.LiveResults(self.disk.path)
            self.t0 = time.monotonic()
            threads = [threading.Thread(target=self.sampler, name="soak-sampler", daemon=True),
                       threading.Thread(target=self.run_faults, name="soak-faults", daemon=True)]
            for t in threads:
                t.start()
            requests = loop.run(self.send, self.clock, self.load_end)
            deadline = time.monotonic() + c.timeout_s + c.grace_s
            for t in requests:
                t.join(max(0.0, deadline - time.monotonic()))
            end = self.clock()
            self.done.set()
            for t in threads:
                t.join(c.recovery_give_up_s + c.timeout_s)
            self.sample_once(self.intervals[-1]["t1_s"] if self.intervals else 0.0, end + 1e-6)
            live_check = fault_mod.check_complete(self.live.directory) if self.live else None
            if self.disk is not None and self.disk.mounted:
                shutil.copytree(self.disk.path, c.results_dir / "live-copy", dirs_exist_ok=True)
        self.clients.close()
        report = self.report(end, loop, live_check)
        self.log("\n".join(format_criteria(report)))
        return report

    def report(self, end: float, loop: OpenLoop, live_check: dict | None) -> dict:
        c = self.config
        records = self.ledger.snapshot()
        now = self.clock()
        windows = self.windows()
        counts = totals(records, now=now, timeout_s=c.timeout_s, grace_s=c.grace_s, faults=windows)
        for f in self.fault_results:
            f.clients = fault_clients(records, f, now=now, timeout_s=c.timeout_s, grace_s=c.grace_s, faults=windows)
        criteria = [judge_lost(counts), judge_outputs(records),
                    Criterion("no unexpected error", counts["failed"] == 0, f"{counts['failed']} failed: "
                              + "; ".join(sorted({(r.error or 'a bad request was answered')[:120] for r in records
                                                   if classify(r, now=now, timeout_s=c.timeout_s, grace_s=c.grace_s, faults=windows) is Outcome.FAILED})[:5]))]
        restarted = any(f.name == "kill" for f in self.fault_results)
        rss = [(s["t_s"], s["rss"]) for s in self.samples if s.get("rss")]
        if restarted:
            criteria.append(Criterion("RSS growth after warm-up < 5 %", None, "not judged: the kill fault restarted the server"))
        else:
            criteria.append(judge_rss(rss, warmup_s=c.warmup))
        if c.faults:
            criteria.append(Criterion("p99 E2E of the last window within 20 % of the first after warm-up", None,
                                      "not judged: faults were injected"))
        else:
            criteria.append(judge_p99_drift(records, warmup_s=c.warmup, end_s=min(end, c.duration_s), now=now, timeout_s=c.timeout_s,
                                            grace_s=c.grace_s, window_s=c.drift_window_s))
        for f in self.fault_results:
            criteria.append(fault_criterion(f, c.timeout_s + c.grace_s))
        for e in self.fault_errors:
            criteria.append(Criterion(f"fault {e.split(':')[0]} injected", False, e))
        return {
            "complete": True,
            "config": _jsonable(asdict(c)),
            "calibration": self.calibration,
            "rate_per_s": self.rate_per_s,
            "duration_s": end,
            "sent": loop.sent,
            "shed": loop.shed,
            "totals": counts,
            "by_kind": _by_kind(records, now=now, timeout_s=c.timeout_s, grace_s=c.grace_s, faults=windows),
            "intervals": self.intervals,
            "server_samples": self.samples,
            "faults": [_jsonable(asdict(f)) for f in self.fault_results],
            "live_results": {"writes": self.live.writes if self.live else 0,
                             "failures": len(self.live.failures) if self.live else 0, "check": live_check},
            "criteria": [x.as_dict() for x in criteria],
            "passed": all(x.passed is not False for x in criteria),
        }


def fault_clients(records: list[RequestRecord], fault: fault_mod.FaultResult, *, now: float, timeout_s: float,
                  grace_s: float, faults: list[FaultWindow]) -> dict:
    """What clients saw around ``fault``: outcomes of requests overlapping it, error kinds, the longest
    time an errored request waited for its error, and completions of requests sent after it ended."""
    end = fault.end if fault.end is not None else now
    during = [r for r in records if r.start <= end + grace_s and (r.end is None or r.end >= fault.start)]
    after = [r for r in records if r.start > end]
    errored = [r for r in during if r.status == "error" and r.end is not None and not r.bad]  # bad: rejected as meant
    return {
        "during": dict(Counter(o.value if (o := classify(r, now=now, timeout_s=timeout_s, grace_s=grace_s, faults=faults)) else "in_flight"
                               for r in during)),
        "errors": dict(Counter((r.error or "").split(":")[0] for r in errored)),
        "examples": {kind: next(r.error[:200] for r in errored if (r.error or "").split(":")[0] == kind)
                     for kind in {(r.error or "").split(":")[0] for r in errored}},
        "slowest_error_s": max((r.end - r.start for r in errored), default=None),
        "completed_after": sum(1 for r in after if classify(r, now=now, timeout_s=timeout_s, grace_s=grace_s, faults=faults) is Outcome.COMPLETED),
        "sent_after": len(after),
    }


def fault_criterion(f: fault_mod.FaultResult, limit_s: float) -> Criterion:
    seen = f.clients
    if f.name == "disk-full":
        after = f.detail.get("after", {})
        ok = f.recovery_s is not None and not after.get("incomplete") and not after.get("temporaries") and not f.detail.get("during", {}).get("incomplete")
        return Criterion("fault disk-full: results on disk complete, writing resumes", ok,
                         f"{f.detail.get('mode')}: {f.detail.get('failed_writes')} writes failed while full; during {f.detail.get('during')}; after {after}")
    slow = seen.get("slowest_error_s")
    ok = (f.recovery_s is not None and seen.get("completed_after", 0) > 0 and (slow is None or slow <= limit_s)
          and seen.get("during", {}).get("lost", 0) == 0)
    return Criterion(f"fault {f.name}: clients get errors in time, never hang, succeed after", ok,
                     f"recovered in {_fmt(f.recovery_s)} s; during {seen.get('during')}; errors {seen.get('errors')}; "
                     f"slowest error {_fmt(slow)} s; {seen.get('completed_after')}/{seen.get('sent_after')} completed after")


def _by_kind(records, **kw) -> dict:
    out: dict[str, Counter] = {}
    for r in records:
        o = classify(r, **kw)
        out.setdefault(r.kind, Counter())[o.value if o else "in_flight"] += 1
    return {k: dict(v) for k, v in out.items()}


def format_criteria(report: dict) -> list[str]:
    lines = ["", "pass criteria:"]
    for c in report["criteria"]:
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[c["passed"]]
        lines.append(f"  {mark}  {c['name']}: {c['detail']}")
    lines.append(f"soak {'PASSED' if report['passed'] else 'FAILED'}: {json.dumps(report['totals'])}")
    return lines


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


# --- entry point --------------------------------------------------------------------------------------


def run_soak(config: SoakConfig, log: Callable[[str], None] = print) -> dict:
    """Serve, calibrate, soak, write ``soak.json`` and ``soak.png`` under ``config.results_dir``
    (atomically: a file there is whole or absent). Returns the report (``passed``: no criterion failed).

    Raises ``ValueError`` for an unknown fault; the SDK's ``ClientError`` when the deployment does not serve
    the calibration; ``RecipeError`` for a recipe that cannot run here."""
    unknown = [f for f in config.faults if f not in fault_mod.FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; choose from {', '.join(fault_mod.FAULTS)}")
    config.results_dir.mkdir(parents=True, exist_ok=True)
    with deployment(config, log) as dep:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(dep.tokenizer_dir))
        pool = prompt_pool(dep.texts, tokenizer, max_input_len=dep.max_input_len)
        log("prompts: " + ", ".join(f"{p.name} ({p.tokens} tokens)" for p in pool))
        calibration, references = calibrate(dep.endpoints, pool, max_tokens=max(config.mix.max_tokens),
                                            concurrency=config.concurrency, min_s=config.calibrate_s, log=log)
        slots_s = fill_slots(dep.endpoints, max(pool, key=lambda p: p.tokens), slots=dep.max_batch_size,
                             max_tokens=max(config.mix.max_tokens), log=log) if config.fill_slots else None
        soak = Soak(config, dep, pool, references, log)
        soak.calibration = {**asdict(calibration), "tokens_per_s": calibration.tokens_per_s,
                            "requests_per_s": calibration.requests_per_s, "fill_slots_s": slots_s}
        report = soak.run()
        report["prompts"] = [asdict(p) | {"text": None} for p in pool]
        if dep.serve_log is not None:
            report["serve_restarts_logged"] = sum("restart" in line and "ready again" in line
                                                  for line in dep.serve_log.read_text(errors="replace").splitlines())
    write_report(report, config.results_dir)
    return report


def write_report(report: dict, results_dir: Path) -> None:
    write_file_atomic(results_dir / "soak.json", (json.dumps(report, indent=1) + "\n").encode())
    try:
        write_file_atomic(results_dir / "soak.png", plot(report))
    except ImportError:
        pass


def plot(report: dict) -> bytes:
    """The time series as a PNG: requests per interval by outcome, latency percentiles, server RSS and
    threads, acceptance length; faults as vertical lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    iv = report["intervals"]
    t = [(i["t1_s"]) / 60 for i in iv]
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    for key in ("completed", "cancelled", "rejected", "fault_error", "failed", "lost"):
        axes[0].plot(t, [i[key] for i in iv], marker=".", label=key)
    axes[0].set_ylabel("requests / interval")
    axes[0].legend(fontsize=7, ncol=3)
    for key, style in (("e2e_s", "-"), ("ttft_s", "--")):
        for q in ("p50", "p99"):
            axes[1].plot(t, [i[key][q] for i in iv], style, marker=".", label=f"{key[:-2]} {q}")
    axes[1].set_ylabel("seconds")
    axes[1].legend(fontsize=7, ncol=2)
    s = report["server_samples"]
    ts = [x["t_s"] / 60 for x in s]
    axes[2].plot(ts, [x.get("server_rss", 0) / 2**20 for x in s], marker=".", label="tritonserver RSS")
    axes[2].plot(ts, [x.get("stub_rss", 0) / 2**20 for x in s], marker=".", label="stubs RSS")
    axes[2].set_ylabel("MiB")
    twin = axes[2].twinx()
    twin.plot(ts, [x.get("server_threads", 0) + x.get("stub_threads", 0) for x in s], "k:", label="threads")
    twin.set_ylabel("threads")
    axes[2].legend(fontsize=7, loc="lower left")
    axes[3].plot(t, [i["acceptance_length"] for i in iv], marker=".")
    axes[3].set_ylabel("acceptance length")
    axes[3].set_xlabel("minutes")
    for f in report["faults"]:
        for ax in axes:
            ax.axvspan(f["start"] / 60, (f["end"] if f["end"] is not None else f["start"]) / 60, color="red", alpha=0.12)
            ax.axvline(f["start"] / 60, color="red", alpha=0.4)
        axes[0].annotate(f["name"], (f["start"] / 60, 0), fontsize=7, color="red")
    fig.suptitle(f"soak: {report['config']['recipe']}, {report['rate_per_s']:.2f} req/s, "
                 f"{'PASSED' if report['passed'] else 'FAILED'}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()
