"""In-flight batching: greedy output for a prompt is the same alone or with three other requests in
flight, for every method, with a "same" draft (everything accepted) and a "random" one (rejections),
EOS disabled, at least two verify steps; in the engine's scheduler and through a real tritonserver.
(One request alone: tests/test_method_equivalence.py.)"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from method_engines import CASES, DRAFT_LEN, METHODS, NEW_TOKENS, PROMPTS, check_greedy, check_mixed_batch, check_sampled_batch, greedy  # noqa: E402

from specbuild.engine.scheduler import Scheduler  # noqa: E402
from specbuild.engine.stream import collect  # noqa: E402


@pytest.fixture(scope="module")
def plain(method_engines) -> dict[tuple[int, ...], list[int]]:
    engine = method_engines["plain", "random"]
    return {tuple(p): engine.generate(greedy(p, num_draft_tokens=0)).output_ids for p in PROMPTS}


@pytest.mark.parametrize("method, kind", CASES)
def test_four_requests_in_flight_equal_plain_greedy(method_engines, plain, method, kind):
    engine = method_engines[method, kind]
    with Scheduler(engine, max_batch_size=4) as scheduler:
        streams = [scheduler.stream(greedy(p)) for p in PROMPTS]  # all four submitted before any result is read
        results = [collect(s) for s in streams]
    assert scheduler.max_active_seen == 4
    check_greedy(method, kind, results, plain)


@pytest.mark.parametrize("method, kind", CASES)
def test_eight_mixed_requests_joining_at_different_times_equal_plain_greedy(method_engines, plain, method, kind):
    """Batches of 8 whose rows join at different times, with different prompt lengths, per-request draft
    lengths and plain rows mixed in: every output equals plain greedy decoding, and every request's
    acceptance counters equal those of the same request run alone (batching never changes them)."""
    check_mixed_batch(method_engines[method, kind], plain, method, kind)


def test_sampled_requests_give_the_same_tokens_in_a_batch(method_engines):
    """Each request owns its seeded sampler: batching does not change a sampled output either."""
    check_sampled_batch(method_engines["draft_target", "random"])


def test_requests_join_between_steps_and_take_turns(method_engines):
    """A, B running; C submitted: C's prefill comes before A and B finish, then every iteration steps all three."""
    engine = method_engines["plain", "random"]
    events: list[tuple[str, int, bool]] = []
    errors: list[BaseException] = []
    two_steps = threading.Event()
    done = threading.Semaphore(0)

    def recorder(name):
        def on_step(step):
            events.append((name, step.num_decoding_iterations, step.is_final))
            if name == "A" and step.num_decoding_iterations == 2:
                two_steps.set()
            if step.is_final:
                done.release()
        return on_step

    with Scheduler(engine, max_batch_size=4) as scheduler:
        for name, prompt in zip("AB", PROMPTS):
            scheduler.submit(greedy(prompt, max_tokens=40), recorder(name), errors.append)
        assert two_steps.wait(60)
        scheduler.submit(greedy(PROMPTS[2], max_tokens=40), recorder("C"), errors.append)
        for _ in range(3):
            assert done.acquire(timeout=120)
    assert not errors
    names = [name for name, _, _ in events]
    first_c, last_a = names.index("C"), len(names) - 1 - names[::-1].index("A")
    assert first_c < last_a
    assert names[first_c : first_c + 6] == list("CABCAB")  # joined between iterations, then one step each per pass
    assert names.count("C") == 40 and events[-1][2]  # prefill + 39 one-token steps, then final
    # one target pass per iteration serves every request in flight (time-slicing would need ~120)
    assert scheduler.iterations < 60, scheduler.iterations


def test_max_batch_size_bounds_the_requests_in_flight(method_engines, plain):
    engine = method_engines["ngram", "random"]
    with Scheduler(engine, max_batch_size=2) as scheduler:
        results = [collect(s) for s in [scheduler.stream(greedy(p)) for p in PROMPTS]]
    assert scheduler.max_active_seen == 2
    assert [r.output_ids for r in results] == [plain[tuple(p)] for p in PROMPTS]


class _FailingDrafter:
    """Wraps a request's drafter and raises at its third draft (a broken proposer)."""

    def __init__(self, inner) -> None:
        self.inner, self.drafts, self.wants_hidden = inner, 0, inner.wants_hidden

    def start(self, *args):
        self.inner.start(*args)

    def draft(self, context, **kwargs):
        self.drafts += 1
        if self.drafts == 3:
            raise RuntimeError("proposer broke")
        return self.inner.draft(context, **kwargs)

    def update(self, *args):
        self.inner.update(*args)


def test_a_failing_request_fails_alone_in_its_batch(method_engines, plain):
    engine = method_engines["ngram", "random"]
    errors, steps = [], []
    with Scheduler(engine, max_batch_size=4) as scheduler:
        goods = [scheduler.stream(greedy(p)) for p in (PROMPTS[0], PROMPTS[2])]
        bad = engine.prepare(greedy(PROMPTS[1]))
        bad.drafter = _FailingDrafter(bad.drafter)
        scheduler.submit_prepared(bad, steps.append, errors.append)
        assert [collect(g).output_ids for g in goods] == [plain[tuple(PROMPTS[0])], plain[tuple(PROMPTS[2])]]
    assert len(errors) == 1 and "proposer broke" in str(errors[0])
    assert len(steps) == 3 and not steps[-1].is_final  # prefill + two steps, then the error ended it


@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3"])
def test_requests_of_one_head_draft_together_and_a_broken_one_fails_alone(method_engines, plain, monkeypatch, method):
    """The worker drafts the rows of one Medusa / EAGLE / EAGLE-3 head in one call (draft_batch); when that call
    fails because of one row, each row drafts alone: that row fails, the others go on unchanged."""
    engine = method_engines[method, "random"]
    kind = type(engine.prepare(greedy(PROMPTS[0])).drafter)
    widths = []
    real = kind.draft_batch.__func__

    def counting(cls, drafters, *args, **kwargs):
        widths.append(len(drafters))
        return real(cls, drafters, *args, **kwargs)

    monkeypatch.setattr(kind, "draft_batch", classmethod(counting))
    errors, steps = [], []
    with Scheduler(engine, max_batch_size=4) as scheduler:
        bad = engine.prepare(greedy(PROMPTS[1]))
        drafter, fed = bad.drafter, []

        def broken_update(context, step, _real=drafter.update):
            _real(context, step)
            fed.append(step)
            if len(fed) == 2:  # its state goes bad: the next draft raises for this row only
                if method in ("eagle", "eagle3"):
                    drafter.pending = (drafter.pending[0], drafter.pending[1][:, :-1])  # features of the wrong width
                else:
                    drafter.hidden = drafter.hidden[:-1]

        drafter.update = broken_update
        scheduler.submit_prepared(bad, steps.append, errors.append)
        goods = [scheduler.stream(greedy(p)) for p in (PROMPTS[0], PROMPTS[2], PROMPTS[3])]
        assert [collect(g).output_ids for g in goods] == [plain[tuple(p)] for p in (PROMPTS[0], PROMPTS[2], PROMPTS[3])]
    assert len(errors) == 1 and len(steps) == 3  # prefill + two steps, then its draft failed
    assert max(widths) >= 3  # rows were drafted together


def test_a_cancelled_request_leaves_the_others_running(method_engines, plain):
    engine = method_engines["plain", "random"]
    seen = []
    with Scheduler(engine, max_batch_size=4) as scheduler:
        doomed = scheduler.submit(greedy(PROMPTS[1], max_tokens=140), seen.append, seen.append)
        scheduler.cancel(doomed)
        assert collect(scheduler.stream(greedy(PROMPTS[0]))).output_ids == plain[tuple(PROMPTS[0])]
    assert not any(getattr(s, "is_final", False) for s in seen)  # never finished, never errored
    assert not scheduler.worker.running


def test_a_callback_may_drop_its_request(method_engines, plain):
    """DropRequest (a cancelled client, a request answered with an error) stops that request only."""
    from specbuild.engine.scheduler import DropRequest

    engine = method_engines["plain", "random"]
    seen = []

    def drop_after_two(step):
        seen.append(step)
        if len(seen) == 2:
            raise DropRequest("cancelled")

    with Scheduler(engine, max_batch_size=4) as scheduler:
        scheduler.submit(greedy(PROMPTS[1]), drop_after_two, lambda exc: seen.append(exc))
        assert collect(scheduler.stream(greedy(PROMPTS[0]))).output_ids == plain[tuple(PROMPTS[0])]
    assert len(seen) == 2 and not seen[-1].is_final


# --- through a real tritonserver: every method, four concurrent requests -----------------------------


@pytest.fixture(scope="module")
def all_methods_server(method_engines, tiny_checkpoint, tmp_path_factory):
    """One tritonserver with an ``ensemble_<method>`` -> ``tensorrt_llm_<method>`` pair per method (shared
    pre/postprocessing); the engines' real drafts ("random" kind: random heads / draft model)."""
    import dataclasses
    import json

    from conftest import write_recipe

    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine
    from specbuild.triton_repo.reference_repository import SHELL, SHELL_MODULES, reference_models, spec_from_engine_dir
    from specbuild.triton_repo.pbtxt import render
    from specbuild.triton_repo.tritonserver import TritonServer

    out = tmp_path_factory.mktemp("all_methods")
    built = build_reference_engine(load_recipe(str(write_recipe(out / "r.yaml", tiny_checkpoint))), out / "built", log=lambda m: None).engine_dir
    base = json.loads((built / "config.json").read_text())
    repo = out / "repo"
    for method in METHODS:
        engine_dir = out / f"engine_{method}"
        engine_dir.mkdir()
        for part in ("target", "tokenizer"):
            (engine_dir / part).symlink_to(built / part)
        config = {**base, "speculative_config": method_engines[method, "random"].speculative_config}
        config["build_config"] = {**base["build_config"], "max_draft_len": DRAFT_LEN[method], "max_batch_size": 8}
        (engine_dir / "config.json").write_text(json.dumps(config))
        models = {m.name: m for m in reference_models(spec_from_engine_dir(engine_dir))}
        ensemble = models["ensemble"]
        steps = tuple(dataclasses.replace(s, model_name=f"tensorrt_llm_{method}") if s.model_name == "tensorrt_llm" else s for s in ensemble.steps)
        renamed = [dataclasses.replace(ensemble, name=f"ensemble_{method}", steps=steps),
                   dataclasses.replace(models["tensorrt_llm"], name=f"tensorrt_llm_{method}")]
        if method == METHODS[0]:
            renamed += [models["preprocessing"], models["postprocessing"]]
        for model in renamed:
            (repo / model.name / "1").mkdir(parents=True)
            (repo / model.name / "config.pbtxt").write_text(render(model))
            module = SHELL_MODULES.get(model.name.removesuffix(f"_{method}"))
            if module:
                (repo / model.name / "1" / "model.py").write_text(SHELL.format(version="test", module=module))
    with TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=out / "server.log") as server:
        yield server


TEXT_PROMPTS = [
    "for i in range(10):\n    print(i, i * i)\nfor i in range(10):\n    print(i",
    "def fib(n):\n    if n < 2:\n        return n\n",
    "The quick brown fox jumps over the lazy dog.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
]


@pytest.mark.e2e
@pytest.mark.parametrize("method", METHODS)
def test_eight_concurrent_requests_through_triton_equal_plain_greedy(all_methods_server, method):
    """Eight requests in flight on one deployment (max_batch_size 8), half speculative at the default
    draft length and half plain (num_draft_tokens=0), mixed: every output equals plain greedy, and a
    speculative request's acceptance counters equal those it gets alone."""
    from specbuild.client.sdk import SpecClient

    with SpecClient(all_methods_server.grpc_url, model_name=f"ensemble_{method}") as client:
        client.wait_ready()
        baseline = [client.generate(p, max_tokens=NEW_TOKENS, end_id=-1, num_draft_tokens=0) for p in TEXT_PROMPTS]
        alone = [client.generate(p, max_tokens=NEW_TOKENS, end_id=-1, return_perf_metrics=True) for p in TEXT_PROMPTS]
        jobs = [(p, None) for p in TEXT_PROMPTS] + [(p, 0) for p in TEXT_PROMPTS]
        jobs = jobs[::2] + jobs[1::2]  # speculative and plain rows interleaved
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(
                lambda job: client.generate(job[0], max_tokens=NEW_TOKENS, end_id=-1, num_draft_tokens=job[1],
                                            return_perf_metrics=True),
                jobs,
            ))
    expected = {p: r for p, r in zip(TEXT_PROMPTS, baseline)}
    solo = {p: r for p, r in zip(TEXT_PROMPTS, alone)}
    for (prompt, k), result in zip(jobs, together):
        assert result.output_ids == expected[prompt].output_ids and result.text == expected[prompt].text
        assert len(result.output_ids) == NEW_TOKENS
        if k is None:
            assert (result.total_draft_tokens, result.total_accepted_draft_tokens) == (
                solo[prompt].total_draft_tokens, solo[prompt].total_accepted_draft_tokens)
        else:
            assert result.total_draft_tokens == 0
    if method != "plain":
        assert sum(r.total_draft_tokens for r in together) > 0


@pytest.mark.e2e
def test_streaming_needs_a_decoupled_deployment(all_methods_server):
    from specbuild.client.sdk import RequestError, SpecClient

    with SpecClient(all_methods_server.grpc_url, model_name="ensemble_ngram") as client:
        with pytest.raises(RequestError, match="streaming=true needs a decoupled deployment"):
            list(client.generate_stream("x = 1", max_tokens=4))
        (whole,) = client.generate_stream("x = 1", max_tokens=4, end_id=-1, stream=False)  # the stream API, one answer
        assert whole.output_ids == client.generate("x = 1", max_tokens=4, end_id=-1).output_ids
