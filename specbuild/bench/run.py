"""Running a sweep: requests from worker threads (closed loop) or at arrival times (open loop), one
point per draft length at each load level, recipes served for the sweep (:func:`serve_recipes`),
and ``specbuild bench`` itself (:func:`run_bench`)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

import numpy as np

from specbuild.prompts import Prompt, apply_chat_template, load_prompts

from specbuild.client.environment import environment
from .checks import counter_problems, read_counters_or_none
from .plan import BenchError, Deployment, Load, SweepPlan, is_url, openai_deployments, sweep_size, url_deployments
from .points import PointResult, summarize_point
from .records import RequestRecord
from .stats import disturbed_note, exceeds_speedup_bound
from .report import SweepResult, notes, point_line, points_table, request_row


class ThreadClients:
    """One SpecClient per worker thread (tritonclient clients are not shared across threads)."""

    def __init__(self, deployment: Deployment, timeout_s: float):
        self.deployment, self.timeout_s = deployment, timeout_s
        self._local = threading.local()
        self._all: list = []
        self._lock = threading.Lock()

    def get(self):
        client = getattr(self._local, "client", None)
        if client is None:
            client = make_client(self.deployment, self.timeout_s)
            self._local.client = client
            with self._lock:
                self._all.append(client)
        return client

    def close(self) -> None:
        for client in self._all:
            client.close()


def make_client(deployment: Deployment, timeout_s: float):
    """A client for ``deployment``: SpecClient (Triton) or OpenAIClient (``protocol="openai"``)."""
    if deployment.protocol == "openai":
        from specbuild.client.openai_client import OpenAIClient

        tokenizer = None
        return OpenAIClient(deployment.url, chat=deployment.openai_chat, draft_field=deployment.per_request_draft,
                            tokenizer=tokenizer, timeout_s=timeout_s)
    from specbuild.client.sdk import SpecClient

    # retries=0: a silently retried request would count its back-off as latency.
    return SpecClient(deployment.url, protocol=deployment.protocol, timeout_s=timeout_s, retries=0)


def timed_request(
    client, prompt: Prompt, text: str, *, max_tokens: int, end_id: int | None, fields: dict, stream: bool = False
) -> RequestRecord:
    """Send one greedy request (streamed or not); the SDK's result becomes a :class:`RequestRecord`.
    A prompt with its own ``max_tokens`` (synthetic sets) asks for that many tokens."""
    max_tokens = prompt.max_tokens or max_tokens
    if stream:
        return _streamed_request(client, prompt, text, max_tokens=max_tokens, end_id=end_id, fields=fields)
    result = client.generate(text, max_tokens=max_tokens, end_id=end_id, **fields)
    return RequestRecord(
        prompt_id=prompt.id,
        latency_s=result.latency_s,
        num_tokens=len(result.output_ids),
        accepted=result.total_accepted_draft_tokens or 0,
        drafts=result.total_draft_tokens or 0,
        acceptance_rate=result.acceptance_rate,
        output_ids=tuple(result.output_ids),
        finish_reason=getattr(result, "finish_reason", None),
        perf_reported=result.total_draft_tokens is not None,
        max_tokens=max_tokens,
        acceptance_source=getattr(result, "acceptance_source", None),
    )


def _streamed_request(client, prompt: Prompt, text: str, *, max_tokens: int, end_id: int | None, fields: dict) -> RequestRecord:
    """One request through ``generate_stream``: a chunk per decoding step, perf counters cumulative."""
    chunks = list(client.generate_stream(text, max_tokens=max_tokens, end_id=end_id, **fields))
    if not chunks:
        from specbuild.client.sdk import RequestError

        raise RequestError(f"streamed request for {prompt.id!r} returned no response with tokens")
    last = chunks[-1]
    output_ids = tuple(t for chunk in chunks for t in chunk.output_ids)
    return RequestRecord(
        prompt_id=prompt.id,
        latency_s=last.latency_s,
        num_tokens=len(output_ids),
        accepted=last.total_accepted_draft_tokens or 0,
        drafts=last.total_draft_tokens or 0,
        acceptance_rate=last.acceptance_rate,
        ttft_s=chunks[0].latency_s,
        step_tokens=tuple(len(chunk.output_ids) for chunk in chunks),
        output_ids=output_ids,
        perf_reported=last.total_draft_tokens is not None,
        chunk_times_s=tuple(chunk.latency_s for chunk in chunks),
        max_tokens=max_tokens,
        acceptance_source=getattr(last, "acceptance_source", None),
    )


def arrival_times(num_requests: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send times (seconds after the start) of an open-loop point: the first at 0, then gaps drawn from
    a gamma distribution with shape ``burstiness`` and mean ``1 / rate`` (scale ``1 / (rate *
    burstiness)``), as vLLM's ``bench serve`` draws them; burstiness 1 = Poisson arrivals.
    Example: rate 2/s -> gaps average 0.5 s. Returns shape [num_requests]."""
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=max(0, num_requests - 1))
    return np.concatenate([[0.0], np.cumsum(gaps)])


def run_point(
    clients: ThreadClients,
    prompts: Sequence[tuple[Prompt, str]],
    *,
    concurrency: int,
    num_requests: int,
    max_tokens: int,
    end_id: int | None,
    fields: dict,
    on_done: Callable[[], None] = lambda: None,
    request_rate: float | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
) -> tuple[list[RequestRecord], float]:
    """``num_requests`` requests (prompts cycled); returns them and the wall seconds of the point.

    Closed loop (``request_rate`` None): ``concurrency`` threads, each sending its next request when
    the previous one returns. Open loop: requests are sent at :func:`arrival_times`, at most
    ``concurrency`` in flight (0 = no cap; a request arriving at a full cap waits for a slot and its
    latency counts from when it is sent, as in vLLM). Each record's ``start_s`` is its send time.
    """
    jobs = [prompts[i % len(prompts)] for i in range(num_requests)]
    start = time.perf_counter()

    def one(job: tuple[Prompt, str]) -> RequestRecord:
        sent = time.perf_counter() - start
        record = timed_request(
            clients.get(), job[0], job[1], max_tokens=max_tokens, end_id=end_id, fields=fields, stream=clients.deployment.stream
        )
        on_done()
        return dataclasses.replace(record, start_s=sent)

    workers = concurrency if request_rate is None or concurrency else num_requests
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="bench")
    try:
        if request_rate is None:
            futures = [pool.submit(one, job) for job in jobs]
        else:
            futures = []
            for job, at in zip(jobs, arrival_times(num_requests, request_rate, burstiness, seed)):
                delay = start + at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                futures.append(pool.submit(one, job))
        records = [f.result() for f in futures]
    finally:  # on Ctrl-C or a failed request: requests not yet sent are dropped, not run
        pool.shutdown(wait=True, cancel_futures=True)
    return records, time.perf_counter() - start


def prepare_prompts(source: str, deployment: Deployment, mode: str, tokenizer) -> list[tuple[Prompt, str]]:
    """The prompts of ``source`` with the text to send (chat-templated when ``mode`` says so; see
    :func:`~specbuild.prompts.apply_chat_template`).

    Raises:
        BenchError: the set wants the chat template and the deployment has no tokenizer (pass --tokenizer).
    """
    if source.startswith("synthetic") and tokenizer is not None:
        from specbuild.prompts import synthetic_prompts

        prompts = synthetic_prompts(source, tokenizer)  # exact input token counts with the deployment's tokenizer
    else:
        prompts = load_prompts(source)
    try:
        sent = apply_chat_template(prompts, source, mode, tokenizer)
    except ValueError as exc:
        raise BenchError(f"{deployment.name}: {exc}") from None
    return [(p, s.text) for p, s in zip(prompts, sent)]


def check_prompt_lengths(deployment: Deployment, prepared: Mapping[str, Sequence[tuple[Prompt, str]]]) -> None:
    """Refuse, before anything is measured, a prompt longer than the deployment's ``max_input_len``
    (counted with its tokenizer, special tokens included, as its preprocessing model counts).
    ``prepared``: prompt set -> its :func:`prepare_prompts`.

    Raises:
        BenchError: naming the set, the prompt, its length and the limit, and the ways out.
    """
    if deployment.max_input_len is None or deployment.tokenizer_dir is None:
        return
    tokenizer = _tokenizer(deployment)
    for source, prompts in prepared.items():
        for prompt, text in prompts:
            n = len(tokenizer(text, add_special_tokens=True)["input_ids"])
            if n > deployment.max_input_len:
                raise BenchError(
                    f"{deployment.name}: prompt {prompt.id} of {source} has {n} tokens, more than its max_input_len "
                    f"{deployment.max_input_len}; leave that set out, or build a deployment with a larger "
                    "build.max_input_len (and max_seq_len)"
                )


def _tokenizer(deployment: Deployment):
    if deployment.tokenizer_dir is None:
        return None
    from specbuild.tokenizer import load_tokenizer

    return load_tokenizer(deployment.tokenizer_dir)


def run_sweep(
    deployments: Sequence[Deployment],
    plan: SweepPlan,
    *,
    timeout_s: float = 600.0,
    progress: Callable[[str, int], None] = lambda description, advance: None,
    log: Callable[[str], None] = lambda message: None,
    wait_s: float = 30.0,
    in_process: Callable[[Deployment], object | None] | None = None,
) -> SweepResult:
    """Run ``plan`` on each deployment in turn (deployments must already answer; see :func:`serve_recipes`).

    ``timeout_s``: per request (seconds); ``wait_s``: how long each deployment may take to be ready.
    ``in_process``: ``--serving-overhead``'s arm factory (:func:`specbuild.bench.overhead.in_process_arm`):
    where it gives an arm for a deployment, every plain closed-loop run is also run in-process, next to
    the served one, into :attr:`PointResult.in_process_tok_s`.

    ``progress(description, advance)`` is called as each request finishes. Order per deployment:
    prompt set -> load level -> repeat -> draft length, so the draft lengths compared at one load are
    measured next to each other in time, and repeats interleave them.

    Raises:
        BenchError: a draft length past a deployment's limits (before any request is sent), or a bad
            prompt set.
        specbuild.client.sdk.ClientError: a request failed.
    """
    for d in deployments:
        for k in plan.draft_lengths_for(d):
            d.request_fields(k)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env = environment()  # at the start: the commit and packages that ran, not those present when it ended
    start = time.perf_counter()
    points: list[PointResult] = []
    rows: list[dict] = []
    watch = LoadWatch(log)
    watch.check()
    for deployment in deployments:
        points += _sweep_deployment(deployment, plan, rows, timeout_s=timeout_s, wait_s=wait_s, progress=progress,
                                    log=log, watch=watch, in_process=in_process)
    env["cpu"]["load_average_1_5_15_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    env["cpu"]["load_average_1_max_during"] = watch.highest
    return SweepResult(plan, list(deployments), points, started_at, time.perf_counter() - start, requests=rows,
                       environment=env)


class LoadWatch:
    """Warns once, through ``log``, when the machine's 1-minute load average exceeds its CPU count
    during a sweep (timings then include waiting for a CPU); :meth:`check` after each point.
    ``highest``: the highest load average seen (None where the OS has no load average)."""

    def __init__(self, log: Callable[[str], None], *, read=None, cpus: int | None = None):
        self.log = log
        self.read = read or (os.getloadavg if hasattr(os, "getloadavg") else None)
        self.cpus = cpus or os.cpu_count() or 1
        self.highest: float | None = None
        self.warned = False

    def check(self) -> None:
        if self.read is None:
            return
        load = float(self.read()[0])
        self.highest = load if self.highest is None else max(self.highest, load)
        if load > self.cpus and not self.warned:
            self.warned = True
            self.log(f"warning: the machine is busy: 1-minute load average {load:.1f} on {self.cpus} CPUs; timings "
                     "include waiting for a CPU and may drift (use --repeats 3; bench.json records the load)")


def _sweep_deployment(deployment: Deployment, plan: SweepPlan, rows: list[dict], *, timeout_s, wait_s=30.0, progress, log,
                      watch: LoadWatch | None = None, in_process=None) -> list[PointResult]:
    synthetic = any(s.startswith("synthetic") for s in plan.prompt_sets)
    tokenizer = _tokenizer(deployment) if plan.chat_template != "never" or synthetic else None
    clients = ThreadClients(deployment, timeout_s)
    points = []
    arm = None
    try:
        clients.get().wait_ready(timeout_s=min(wait_s, timeout_s))
        arm = in_process(deployment) if in_process is not None else None
        prepared = {source: prepare_prompts(source, deployment, plan.chat_template, tokenizer) for source in plan.prompt_sets}
        check_prompt_lengths(deployment, prepared)  # before any point: a too-long prompt would end the sweep midway
        for source, prompts in prepared.items():
            for prompt, text in prompts[: plan.warmup]:
                timed_request(
                    clients.get(), prompt, text, max_tokens=plan.max_tokens, end_id=plan.end_id, fields={}, stream=deployment.stream
                )
            baseline: dict[str, tuple[int, ...]] = {}
            for load in plan.loads():
                for point in _measure_load(deployment, plan, clients, prompts, source, load, baseline, rows, progress, arm=arm):
                    points.append(point)
                    log(point_line(point))
                if watch is not None:
                    watch.check()
    finally:
        clients.close()
        if arm is not None:
            arm.close()
    return points


def measurement_order(ks: Sequence[int], num_requests: int, concurrency: int, *, open_loop: bool = False,
                      repeat: int = 0) -> list[tuple[int, int, int]]:
    """The runs of one load level and repeat, in the order they are sent: ``(k, requests, first prompt)``.

    The k = 0 baseline is split into two halves, one before and one after the k > 0 points, so a
    machine that speeds up or slows down during the level weighs on the baseline as on the average
    k > 0 point (a baseline measured first takes all the drift: a speed-up above its tokens/step bound
    follows). The halves send the same requests as one run would (the second half continues the
    prompts where the first stopped), so the run time stays the same. Where a half could not keep the
    level full (closed loop: fewer requests than ``concurrency``; open loop: fewer than 2), the
    baseline is sent whole in the middle of the k > 0 points instead, again at the same cost. Odd
    repeats send the k > 0 points in reverse order (ABBA over repeats).

    Example: ks [0, 2, 4], 8 requests at C=1 -> [(0, 4, 0), (2, 8, 0), (4, 8, 0), (0, 4, 4)];
    4 requests at C=4 -> [(2, 4, 0), (0, 4, 0), (4, 4, 0)].
    """
    others = [k for k in ks if k != 0]
    if repeat % 2:
        others.reverse()
    if 0 not in ks or not others:
        return [(k, num_requests, 0) for k in ks]
    first = (num_requests + 1) // 2
    second = num_requests - first
    fills = second >= (2 if open_loop else max(1, concurrency))
    if fills:
        return [(0, first, 0)] + [(k, num_requests, 0) for k in others] + [(0, second, first)]
    middle = len(others) // 2
    return [(k, num_requests, 0) for k in others[:middle]] + [(0, num_requests, 0)] + [(k, num_requests, 0) for k in others[middle:]]


def _measure_load(deployment, plan, clients, prompts, source, load: Load, baseline, rows, progress, *, arm=None
                  ) -> list[PointResult]:
    """Every draft length at one load level, ``plan.repeats`` times; one point per k. The order of the
    runs in each repeat: :func:`measurement_order` (the baseline around the k > 0 points). With an
    in-process ``arm`` (``--serving-overhead``) and a closed-loop level with k = 0, each repeat also runs
    the plain requests in-process, after the served runs in even repeats and before them in odd ones."""
    ks = plan.draft_lengths_for(deployment)
    server = {k: [] for k in ks}  # OpenAI targets: (before, after) /metrics readings per repeat
    runs: dict[int, list[tuple[list[RequestRecord], float]]] = {k: [] for k in ks}
    checks: dict[int, list[str]] = {k: [] for k in ks}
    checked: dict[int, bool] = {k: True for k in ks}
    num_requests = plan.num_requests(len(prompts), load.concurrency)
    in_process: list[float] = []

    def run_in_process() -> None:
        if arm is not None and 0 in ks and load.request_rate is None:
            in_process.append(arm.tok_s(prompts, max_tokens=plan.max_tokens, concurrency=load.concurrency,
                                        num_requests=num_requests))

    for repeat in range(plan.repeats):
        if repeat % 2:
            run_in_process()
        parts: dict[int, list[tuple[list[RequestRecord], float]]] = {k: [] for k in ks}
        order = measurement_order(ks, num_requests, load.concurrency, open_loop=load.request_rate is not None, repeat=repeat)
        for part, (k, count, offset) in enumerate(order):
            label = f"{deployment.name} {source} {load.label} k={k}" + (f" #{repeat + 1}" if plan.repeats > 1 else "")
            before = read_counters_or_none(deployment.metrics_url)
            server_before = _server_acceptance(deployment)
            records, wall_s = run_point(
                clients, prompts[offset % len(prompts):] + prompts[:offset % len(prompts)], concurrency=load.concurrency,
                num_requests=count, max_tokens=plan.max_tokens,
                end_id=plan.end_id, fields=deployment.request_fields(k), on_done=lambda label=label: progress(label, 1),
                request_rate=load.request_rate, burstiness=plan.burstiness, seed=plan.seed + repeat + 1000 * part,
            )
            after = read_counters_or_none(deployment.metrics_url) if before is not None else None
            if deployment.protocol == "openai":
                server[k].append((server_before, _server_acceptance(deployment)))
            if after is None:
                checked[k] = False
            else:
                checks[k] += counter_problems(before, after, records)
            parts[k].append((records, wall_s))
        for k in ks:  # a split baseline: one run of its two halves, the second's send times after the first's
            records, wall = [], 0.0
            for part_records, part_wall in parts[k]:
                records += [dataclasses.replace(r, repeat=repeat, start_s=r.start_s + wall) for r in part_records]
                wall += part_wall
            runs[k].append((records, wall))
        if not repeat % 2:
            run_in_process()
    points = [_make_point(deployment, plan, source, load, k, runs[k], checks[k], checked[k], baseline, rows) for k in ks]
    flag_disturbed_baseline(points)
    for point in points:
        point.server_acceptance = _sum_over_repeats(server[point.draft_len])
        if point.draft_len == 0:
            point.in_process_tok_s = in_process
    return points


def flag_disturbed_baseline(points: Sequence[PointResult]) -> None:
    """Mark each k > 0 point whose measured speed-up over the k = 0 point of its level (time per output
    token at k = 0 / at k) exceeds its tokens per step by more than
    :data:`~specbuild.bench.stats.DISTURBED_MARGIN`: a speculative step costs at least one target
    pass, so tokens per step bounds the speed-up; past it the baseline was measured on a slower
    machine than the point (``baseline_disturbed``, with a note). Points of one load level."""
    base = next((p for p in points if p.draft_len == 0), None)
    if base is None:
        return
    for p in points:
        if p.draft_len and p.tpot_ms > 0 and exceeds_speedup_bound(base.tpot_ms / p.tpot_ms, p.tokens_per_step):
            p.baseline_disturbed = True
            p.notes.append(disturbed_note(base.tpot_ms / p.tpot_ms, p.tokens_per_step, base_tpot_ms=base.tpot_ms, tpot_ms=p.tpot_ms))


def _server_acceptance(deployment: Deployment):
    """The speculation figures an OpenAI target's ``/metrics`` shows now; None when it has none."""
    if deployment.protocol != "openai":
        return None
    from specbuild.client.openai_client import metrics_url_of, read_server_acceptance
    from specbuild.client.sdk import ClientError

    try:
        return read_server_acceptance(metrics_url_of(deployment.url))
    except ClientError:
        return None


def _sum_over_repeats(readings) -> dict | None:
    """acceptance_over each repeat, counters summed over repeats (gauges: the last repeat's)."""
    from specbuild.client.openai_client import acceptance_over, with_server_figures

    per_repeat = [acceptance_over(before, after) for before, after in readings]
    per_repeat = [r for r in per_repeat if r]
    if not per_repeat:
        return None
    if per_repeat[-1]["source"] == "sglang":
        return per_repeat[-1]
    total = {"source": per_repeat[-1]["source"]}
    for key in ("drafts", "draft_tokens", "accepted_tokens", "generated_tokens"):
        if any(key in r for r in per_repeat):
            total[key] = sum(r.get(key, 0.0) for r in per_repeat)
    return {"source": total["source"], **with_server_figures({k: v for k, v in total.items() if k != "source"}, total["source"])}


def _make_point(deployment, plan, source, load: Load, k, runs, counter_checks, counters_checked, baseline, rows) -> PointResult:
    records = [r for recs, _ in runs for r in recs]
    summary = summarize_point(records, wall_s=[w for _, w in runs], draft_len=k, max_tokens=plan.max_tokens, slo=plan.slo,
                              stability_percentage=plan.stability_percentage, stream_interval=deployment.stream_interval)
    summary["problems"] += counter_checks
    if k == 0:
        baseline.update({r.prompt_id: r.output_ids for r in records})
    compared = [r for r in records if r.prompt_id in baseline]
    matches = [r.output_ids == baseline[r.prompt_id] for r in compared]
    summary["problems"] += [
        f"{r.prompt_id} (k={k}, {load.label}): output ids differ from k=0" for r, m in zip(compared, matches) if not m
    ]
    point = PointResult(
        deployment=deployment.name,
        method=deployment.method,
        prompt_set=source,
        draft_len=k,
        concurrency=load.concurrency,
        request_rate=load.request_rate,
        burstiness=plan.burstiness if load.request_rate is not None else None,
        ids_match_baseline=sum(matches) / len(matches) if matches else None,
        counters_checked=counters_checked,
        acceptance_source="+".join(sorted({r.acceptance_source for r in records if r.acceptance_source})) or None,
        **summary,
    )
    rows += [request_row(point, r) for r in records]
    return point


def deployment_for_recipe(served, *, stream: bool = False) -> Deployment:
    """The :class:`Deployment` of a recipe being served (a :class:`specbuild.deploy.ServedRecipe`)."""
    spec = served.loaded.recipe.speculation
    lookahead = None
    if spec.method == "lookahead":
        lookahead = (spec.max_window_size, spec.max_ngram_size, spec.max_verification_set_size)
    return Deployment(
        name=served.name,
        method=spec.method,
        url=served.grpc_url,
        protocol="grpc",
        max_draft_len=spec.draft_tokens_per_step,  # a request's num_draft_tokens may go up to this (EAGLE-3 trees: nodes)
        lookahead=lookahead,
        metrics_url=served.metrics_url,
        tokenizer_dir=str(served.tokenizer_dir),
        stream=stream,
        stream_interval=getattr(served.loaded.recipe.serve, "stream_interval", 1),
        max_input_len=served.loaded.recipe.build.max_input_len,
        recipe=str(Path(served.loaded.path).resolve()),
    )


@contextmanager
def serve_recipes(
    recipes: Sequence[str], *, output_root: Path | None = None, stream: bool = True, log=print
) -> Iterator[list[Deployment]]:
    """Deploy each recipe (:func:`specbuild.deploy.deploy`: build or reuse its engine and repository,
    one tritonserver per recipe on free ports) and yield their :class:`Deployment` s; every server is
    stopped on exit.

    ``stream``: serve decoupled (one response per decoding step, whatever the recipe's
    ``serve.decoupled``) and stream every request, so TTFT and per-step acceptance are measured. A
    mode other than the recipe's is served from its own repository beside the deployment folder's
    ``triton_repo/`` (:func:`specbuild.deploy.repository_dir`), which is left as the recipe says.

    Servers start one after another and all run during the sweep (a sweep measures one at a time).
    Raises ``specbuild.builder.recipe.RecipeError`` for a recipe that cannot run here.
    """
    from specbuild.deploy import deploy

    with ExitStack() as stack:
        deployments = []
        for recipe in recipes:
            served = stack.enter_context(deploy(
                recipe, output_root=output_root, decoupled=stream, free_ports=True, log_name="tritonserver-bench.log",
                stage=_announce_server(recipe, log), log=log,
            ))
            log(f"{served.name}: serving {served.build.repo_dir} ({'decoupled' if served.decoupled else 'not decoupled'})")
            deployments.append(deployment_for_recipe(served, stream=stream))
        yield deployments


def _announce_server(recipe: str, log):
    """deploy's stage hook for bench: one line as the server starts."""

    def stage(name: str):
        if name == "serve":
            log(f"starting tritonserver for {recipe}")
        return nullcontext()

    return stage


def run_bench(targets: Sequence[str], plan: SweepPlan, *, console, output_root: Path | None = None,
              timeout_s: float = 600.0, wait_s: float = 30.0, stream: bool | None = None, openai_urls: Sequence[str] = (),
              openai_chat: bool = False, openai_draft_len: int | None = None, labels: Sequence[str] = (),
              serving_overhead: bool = False, **url_options) -> SweepResult:
    """``specbuild bench``: serve the recipe targets, sweep every target with a progress bar, print
    the table and the notes. ``url_options`` go to :func:`url_deployments`; ``labels`` name the
    host:port targets, then the ``openai_urls`` (:func:`openai_deployments`), in order.

    ``stream``: ``None`` = stream the recipes (served decoupled) and the OpenAI targets, not the
    host:port targets (a deployment that is not decoupled refuses streamed requests, a decoupled one
    plain ones).

    ``serving_overhead``: also run each reference recipe's plain closed-loop points in-process, next to
    the served runs (:mod:`specbuild.bench.overhead`).

    Raises ``BenchError``, ``specbuild.builder.recipe.RecipeError``, ``specbuild.client.sdk.ClientError``.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    if not targets and not openai_urls:
        raise BenchError("give at least one target: a recipe name or path, a running server's host:port, or --openai URL")
    set_sizes = {s: len(load_prompts(s)) for s in plan.prompt_sets}  # fails fast on a bad set
    urls = [t for t in targets if is_url(t)]
    recipes = [t for t in targets if not is_url(t)]
    openai = openai_deployments(openai_urls, labels=list(labels)[len(urls):], chat=openai_chat, stream=stream is not False,
                                draft_len=openai_draft_len, tokenizer_dir=url_options.get("tokenizer_dir"))
    log = lambda message: console.print(f"[dim]{message}[/dim]")  # noqa: E731
    with serve_recipes(recipes, output_root=output_root, stream=stream is not False, log=log) as served:
        from .probe import with_server_method

        remote = url_deployments(urls, stream=bool(stream), labels=list(labels)[: len(urls)], **url_options)
        deployments = served + [with_server_method(d) for d in remote] + openai
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console, transient=False) as bar:
            task = bar.add_task("bench", total=sweep_size(plan, deployments, set_sizes))
            in_process = None
            if serving_overhead:
                from .overhead import in_process_arm

                in_process = lambda d: in_process_arm(d, plan, log=lambda line: bar.console.print(f"[dim]{line}[/dim]"))  # noqa: E731
            result = run_sweep(
                deployments, plan, timeout_s=timeout_s, wait_s=wait_s, in_process=in_process,
                progress=lambda description, advance: bar.update(task, description=description, advance=advance),
                log=lambda line: bar.console.print(line, highlight=False),
            )
            # the label was the last request's point; the finished bar says what finished
            bar.update(task, description=f"bench: {len(result.points)} points done")
    console.print(points_table(result.points, width=console.width))
    for line in notes(result):
        console.print(f"note: {line}")
    return result
