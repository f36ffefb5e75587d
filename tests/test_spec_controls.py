"""TensorRT-LLM's runtime speculation controls in the reference engine (engine/spec_controls.py):
the per-iteration draft length is exactly upstream's choice, bad controls are refused, and every
method stays lossless, and drafts as well after re-enabling, when its draft length drops to 0 and
comes back (the bug class of TensorRT-LLM PR #16888)."""

from __future__ import annotations

import dataclasses
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from method_engines import CASES, NEW_TOKENS, PROMPTS, greedy  # noqa: E402
from upstream_spec_controls import UPSTREAM_1_2, UPSTREAM_1_3_SCHEDULE, load  # noqa: E402

from specbuild.runtime import ReferenceEngine  # noqa: E402
from specbuild.engine.scheduler import Scheduler  # noqa: E402
from specbuild.engine.spec_controls import (  # noqa: E402
    RuntimeControls,
    SpeculationGate,
    draft_len_for_batch_size,
    runtime_draft_len,
)
from specbuild.engine.stream import collect  # noqa: E402
from specbuild.engine.worker import Worker  # noqa: E402

UPSTREAM = load(UPSTREAM_1_2)
SCHEDULES = [None, {1: 4}, {1: 4, 4: 2, 8: 0}, {1: 4, 2: 3, 3: 2, 16: 1, 33: 0}, {1: 2, 64: 0}]
CONCURRENCIES = [None, 0, 1, 4, 7, 16]
MAX_NUM_TOKENS = [8, 20, 64, 256, 8192]
# Every method whose drafter keeps state across steps; a new method is one more entry of CASES.
SWITCH_CASES = [(m, k) for m, k in CASES if m != "plain"]


@pytest.fixture(scope="module")
def plain(method_engines) -> dict[tuple[int, ...], list[int]]:
    engine = method_engines["plain", "random"]
    return {tuple(p): engine.generate(greedy(p, NEW_TOKENS + 8, num_draft_tokens=0)).output_ids for p in PROMPTS}


def test_the_engines_choice_is_upstreams_for_batch_sizes_1_to_64(model):
    """The worker's per-iteration K for 1-64 running requests, every schedule, max_concurrency and
    max_num_tokens here, equals TensorRT-LLM 1.2's ``_prepare_and_schedule_batch`` (run from its source
    text, tests/upstream_spec_controls.py): K when it speculates, 0 when it does not."""
    checked = 0
    worker = Worker(model, max_batch_size=48, max_seq_len=8, max_block=5, max_num_tokens=8)
    for max_num_tokens in MAX_NUM_TOKENS:
        for schedule in SCHEDULES:
            for max_concurrency in CONCURRENCIES:
                worker.controls, worker.max_num_tokens = RuntimeControls(4, schedule, max_concurrency), max_num_tokens
                for batch_size in range(1, 65):
                    worker.running = [object()] * batch_size
                    use, k = UPSTREAM["prepare_and_schedule_batch"](schedule, max_concurrency, False, worker.running, 48,
                                                                   max_num_tokens, 4)
                    assert worker._choose_draft_len() == (k if use else 0), (max_num_tokens, schedule, max_concurrency, batch_size)
                    checked += 1
    assert checked == len(MAX_NUM_TOKENS) * len(SCHEDULES) * len(CONCURRENCIES) * 64
    closed = SpeculationGate(1, 0.5)
    closed.record(1.0)
    worker.gate, worker.max_num_tokens = closed, 64
    for schedule in SCHEDULES:  # a closed acceptance gate: off wherever the schedule itself does not say 0
        worker.controls = RuntimeControls(4, schedule, acceptance_window=1, acceptance_length_threshold=0.5)
        for batch_size in range(1, 65):
            worker.running = [object()] * batch_size
            use, k = UPSTREAM["prepare_and_schedule_batch"](schedule, None, True, worker.running, 48, 64, 4)
            assert worker._choose_draft_len() == (k if use else 0) == 0


def test_schedule_lookup_is_the_largest_threshold_at_or_below_the_batch_size():
    schedule = {1: 4, 4: 2, 8: 0}
    assert [draft_len_for_batch_size(schedule, b) for b in range(1, 10)] == [4, 4, 4, 2, 2, 2, 2, 0, 0]
    assert all(draft_len_for_batch_size(schedule, b) == UPSTREAM["get_draft_len_for_batch_size"](schedule, b) for b in range(0, 70))
    # the 1.3 line reads the keys the other way (PR #10860): the engine follows 1.2, the recipes' version
    later = load(UPSTREAM_1_3_SCHEDULE)["get_draft_len_for_batch_size"]
    assert [later(schedule, b, 4) for b in (1, 2, 5, 9)] == [4, 2, 0, 0]


def test_the_gate_closes_on_a_low_rolling_mean_and_stays_closed():
    """TensorRT-LLM's SpeculationGate tests, replayed: no verdict before ``window`` requests, then the mean
    of (tokens per iteration - 1) over the last ``window``."""
    gate = SpeculationGate(window=3, threshold=0.5)
    assert [gate.record(2.0) for _ in range(3)] == [False, False, False] and gate.last_mean == pytest.approx(1.0)
    gate = SpeculationGate(window=3, threshold=0.7)
    assert [gate.record(x) for x in (1.1, 1.2, 1.3)] == [False, False, True] and gate.last_mean == pytest.approx(0.2)
    assert gate.record(100.0) is False and gate.disabled
    controls = RuntimeControls(4, acceptance_window=3, acceptance_length_threshold=0.7)
    assert runtime_draft_len(controls, gate, num_active=1, max_batch_size=4, max_num_tokens=64) == 0


@pytest.mark.parametrize(("config", "message"), [
    ({"draft_len_schedule": {2: 4}}, "must include batch size 1"),
    ({"draft_len_schedule": {1: 3}}, r"draft_len_schedule\[1\] must equal max_draft_len"),
    ({"draft_len_schedule": {1: 4, 4: 5}}, "must be <= max_draft_len"),
    ({"draft_len_schedule": {1: 4, 0: 2}}, "threshold must be >= 1"),
    ({"draft_len_schedule": {1: 4, "x": 2}}, "must be an integer"),
    ({"max_concurrency": -1}, "max_concurrency must be a non-negative integer"),
    ({"max_concurrency": 2.5}, "max_concurrency must be a non-negative integer"),
    ({"acceptance_window": True}, "acceptance_window must be a non-negative integer"),
    ({"acceptance_length_threshold": -0.1}, "acceptance_length_threshold must be a non-negative number"),
])
def test_bad_controls_are_refused_when_the_engine_loads(model, config, message):
    speculative_config = {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2, **config}
    from method_engines import limits

    with pytest.raises(ValueError, match=message):
        ReferenceEngine(model, limits=limits("ngram"), end_id=-1, speculative_config=speculative_config)


def test_json_keys_of_an_engine_config_are_read_as_batch_sizes():
    assert RuntimeControls.from_config({"draft_len_schedule": {"4": 2, "1": 4}}, 4).draft_len_schedule == {1: 4, 4: 2}


# ------------------------------------------------------------------------------------------------------
# K -> 0 -> K: every method stays lossless and drafts as if it had speculated throughout.

PATTERN = [None, None, None, 0, 0, 0]  # per iteration (the prefill first): None = no cap, 0 = off; then None


def _record_steps(engine: ReferenceEngine, request, pattern: list[int | None] | None) -> tuple[list[int], list[tuple]]:
    """Run ``request`` alone, forcing each iteration's K from ``pattern`` (None: no cap); returns the output
    and per verify step ``(context length, K, block tokens, accepted drafts)``."""
    seq = engine.prepare(request)
    worker = Worker(engine.model, max_batch_size=1, max_seq_len=len(seq.input_ids) + seq.max_tokens,
                    max_block=engine.limits.max_block, max_num_tokens=engine.limits.tokens_per_iteration)
    ks = iter(pattern or [])
    worker._choose_draft_len = lambda: next(ks, None)
    steps: list[tuple] = []
    accept = worker._accept

    def recording(s, block, logits, hidden):
        position, k = len(s.state.context), worker.runtime_draft_len
        out = accept(s, block, logits, hidden)
        steps.append((position, k, tuple(block.tokens), out.total_accepted_draft_tokens))
        return out

    worker._accept = recording
    worker.add(seq)
    outputs = []
    while not seq.done:
        for _, item in worker.step():
            if isinstance(item, BaseException):
                raise item
            outputs.append(item)
    accepted = [b[3] for b in steps]
    steps = [(p, k, t, a - (accepted[i - 1] if i else 0)) for i, (p, k, t, a) in enumerate(steps)]
    return collect(outputs).output_ids, steps


def _engine(method_engines, method: str, kind: str) -> ReferenceEngine:
    engine = method_engines[method, kind]
    if kind == "random" and method in ("ngram", "sa"):  # the real n-gram / suffix-automaton proposer: drafts from the context only
        return ReferenceEngine(engine.model, limits=engine.limits, end_id=-1, speculative_config=engine.speculative_config)
    return engine


@pytest.mark.parametrize("method, kind", SWITCH_CASES)
def test_draft_length_to_zero_and_back_stays_lossless_and_drafts_as_before(method_engines, plain, method, kind):
    """One request whose K goes max -> 0 (three iterations) -> max: its output equals plain greedy
    decoding; after re-enabling, the method drafts again (it proposes drafts), and at every position
    both runs verify, it proposes the same block and gets the same drafts accepted as the same request
    speculating throughout: the drafter's state (EAGLE features, draft KV, n-gram pool) kept up while
    it did not draft. Lookahead's window is history-dependent by design, so it is held to the first two."""
    engine = _engine(method_engines, method, kind)
    drafted_after = compared = 0
    for prompt in PROMPTS:
        request = greedy(prompt, NEW_TOKENS + 8)
        switched, steps = _record_steps(engine, request, PATTERN)
        throughout, reference = _record_steps(engine, request, None)
        assert switched == throughout == plain[tuple(prompt)], (method, kind, prompt)
        assert [k for _, k, _, _ in steps[2:5]] == [0, 0, 0] and all(len(t) == 1 for _, _, t, _ in steps[2:5])
        after = steps[5:]
        if not after:
            continue
        drafted_after += sum(len(t) - 1 for _, _, t, _ in after)
        if method == "lookahead":
            continue
        by_position = {p: (t, a) for p, _, t, a in reference}
        shared = [(p, t, a) for p, _, t, a in after if p in by_position]
        assert all(by_position[p] == (t, a) for p, t, a in shared), (method, kind, prompt)
        compared += sum(len(t) > 1 for _, t, _ in shared)
        if kind == "same":  # everything drafted is accepted after re-enabling too
            assert all(a > 0 for _, _, _, a in after[:-1]), (method, kind, prompt)
    assert drafted_after > 0, (method, kind)  # it drafts again (an n-gram finds no match in some prompts)
    assert compared > 0 or method == "lookahead" or kind == "same", (method, kind)  # drafts were compared


def _scheduled_engine(engine: ReferenceEngine, off_at: int) -> ReferenceEngine:
    """``engine`` (its own proposer: oracle or real) with ``draft_len_schedule {1: max_draft_len, off_at: 0}``."""
    config = dict(engine.speculative_config)
    top = ReferenceEngine(engine.model, limits=engine.limits, end_id=-1,
                          speculative_config={**config, "max_concurrency": 64}).runtime_controls.max_draft_len
    scheduled = ReferenceEngine(engine.model, limits=engine.limits, end_id=-1,
                                speculative_config={**config, "draft_len_schedule": {1: top, off_at: 0}})
    scheduled._method = dataclasses.replace(scheduled._method, make_drafter=engine._method.make_drafter)
    return scheduled


@pytest.mark.parametrize("method, kind", SWITCH_CASES)
def test_a_batch_crossing_the_schedules_threshold_stays_lossless(method_engines, plain, method, kind):
    """Schedule ``{1: max_draft_len, 3: 0}``: a request decodes alone (drafting); after its first verify
    step two short ones join (3 in flight: K = 0); they finish first and it drafts again. Every output
    equals plain greedy decoding."""
    engine = _scheduled_engine(_engine(method_engines, method, kind), 3)
    others = [greedy(p, 3) for p in (PROMPTS[0], PROMPTS[2])]
    ks: list[int | None] = []
    steps: list = []
    other_steps: list[list] = [[], []]
    done = threading.Semaphore(0)

    def on_step(step):
        steps.append(step)
        ks.append(scheduler.worker.runtime_draft_len)
        if step.num_decoding_iterations == 1:  # join now: the next iterations run 3 requests
            for i, request in enumerate(others):
                scheduler.submit(request, lambda s, i=i: (other_steps[i].append(s), s.is_final and done.release()), pytest.fail)
        if step.is_final:
            done.release()

    with Scheduler(engine, max_batch_size=4) as scheduler:
        scheduler.submit(greedy(PROMPTS[1], NEW_TOKENS + 8), on_step, pytest.fail)
        for _ in range(3):
            assert done.acquire(timeout=120)
    assert collect(steps).output_ids == plain[tuple(PROMPTS[1])], (method, kind)
    for request, got in zip(others, other_steps):
        assert collect(got).output_ids == plain[tuple(request.input_ids)][:3], (method, kind)
    assert ks[1] > 0 and 0 in ks, ks  # it drafted alone, then not with 3 in flight
    assert any(k > 0 for k in ks[ks.index(0):]), ks  # and again once alone


def test_a_recipes_controls_reach_the_built_engine(tiny_checkpoint, tmp_path):
    """build.draft_len_schedule / max_concurrency / acceptance gate -> the engine's config.json
    speculative_config (TensorRT-LLM's names) -> the engine the Triton model loads from it."""
    import json

    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"name: scheduled\ntarget:\n  checkpoint: {tiny_checkpoint}\n"
        "speculation:\n  method: ngram\n  max_draft_len: 4\n  max_matching_ngram_size: 2\n"
        "build:\n  max_batch_size: 8\n  max_input_len: 64\n  max_seq_len: 128\n  draft_len_schedule: {1: 4, 4: 2, 6: 0}\n"
        "  max_concurrency: 5\n  acceptance_window: 3\n  acceptance_length_threshold: 0.25\n")
    engine_dir = build_reference_engine(load_recipe(str(recipe)), tmp_path / "engine", log=lambda m: None).engine_dir
    config = json.loads((engine_dir / "config.json").read_text())["speculative_config"]
    assert (config["draft_len_schedule"], config["max_concurrency"], config["acceptance_window"],
            config["acceptance_length_threshold"]) == ({"1": 4, "4": 2, "6": 0}, 5, 3, 0.25)
    engine = ReferenceEngine.from_engine_dir(engine_dir)
    assert engine.runtime_controls == RuntimeControls(4, {1: 4, 4: 2, 6: 0}, 5, 3, 0.25)
    assert engine.speculation_gate == SpeculationGate(3, 0.25)
    with Scheduler(engine) as scheduler:
        assert scheduler.worker.controls is engine.runtime_controls and scheduler.worker.gate is engine.speculation_gate
        results = [collect(s) for s in [scheduler.stream(greedy(p, 6)) for p in PROMPTS]]
    count = engine.speculation_gate._count
    plain = [engine.generate(greedy(p, 6, num_draft_tokens=0)).output_ids for p in PROMPTS]
    assert [r.output_ids for r in results] == plain
    assert engine.speculation_gate._count == count  # requests that asked for no speculation are not recorded
    gate = engine.speculation_gate
    assert gate._count >= 3 and gate.last_mean is not None  # finished requests were recorded, batched or alone
    assert gate.disabled == (gate.last_mean < 0.25)
    after = engine.generate(greedy(PROMPTS[1], 8))  # a repetitive prompt: n-gram drafts while speculation is on
    assert (after.total_draft_tokens == 0) == gate.disabled


def test_a_requests_num_draft_tokens_stays_its_cap_under_the_iterations_k(method_engines):
    """Each step drafts min(K, the request's num_draft_tokens): a request asking for 2 drafts 2 while K
    is 4 and 1 while K is 1; one asking for 4 drafts 1 while K is 1."""
    engine = method_engines["ngram", "same"]
    for asked, pattern, expected in ((2, [None] * 20, 2), (2, [1] * 20, 1), (4, [1] * 20, 1), (4, [None] * 20, 4)):
        _, steps = _record_steps(engine, greedy(PROMPTS[0], NEW_TOKENS, num_draft_tokens=asked), [None, *pattern])
        drafts = [len(t) - 1 for _, _, t, _ in steps]
        assert max(drafts) == expected and all(d == expected for d in drafts[:-2]), (asked, pattern, drafts)


@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle3_tree", "lookahead"])
def test_a_smaller_iteration_k_verifies_fewer_tree_nodes(method_engines, plain, method):
    """For trees the iteration's K caps the nodes, as a request's num_draft_tokens does (TensorRT-LLM's
    runtime draft length: 1 + K tokens per request and step, what the scheduler reserves): K = 1 verifies
    one node, fewer tokens per step than no cap, and the output is unchanged. EAGLE-3's K is a depth
    (its max_draft_len counts draft layers, max_total_draft_tokens the nodes: TensorRT-LLM's
    EagleDecodingConfig): K = 1 keeps depth-1 nodes only. (Lookahead verifies candidates cut to K
    tokens; its Jacobi window always runs.)"""
    engine = _engine(method_engines, method, "random")
    for prompt in PROMPTS[:2]:
        request = greedy(prompt, NEW_TOKENS + 8)
        capped, capped_steps = _record_steps(engine, request, [None] + [1] * 64)
        free, free_steps = _record_steps(engine, request, None)
        assert capped == free == plain[tuple(prompt)], (method, prompt)
        assert all(a <= 1 for _, _, _, a in capped_steps), (method, capped_steps)
        if method not in ("lookahead", "eagle3_tree"):
            assert all(len(t) <= 2 for _, _, t, _ in capped_steps[1:]), (method, capped_steps)  # 1 + K tokens
        mean = lambda steps: sum(len(t) for _, _, t, _ in steps) / len(steps)  # noqa: E731
        assert mean(capped_steps) < mean(free_steps), (method, mean(capped_steps), mean(free_steps))
