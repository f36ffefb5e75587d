"""One speculation metrics vocabulary (specbuild.interface.SpecDecodeMetrics): its definitions, and one
request through the engine in-process, the SDK over tritonserver, the OpenAI front and bench's
records, which must all report the same drafted and accepted counts, steps, acceptance rate and
acceptance length (AIPerf's definitions: the length counts the bonus token)."""

from __future__ import annotations

import httpx
import pytest

from specbuild.interface import (
    DEPRECATED_SPEC_DECODE_FIELDS,
    SPEC_DECODE_FIELDS,
    SpecDecodeMetrics,
    acceptance_rate,
    avg_decoded_tokens_per_iter,
    mean_acceptance_length,
    spec_steps,
    steps_from_avg_decoded_tokens_per_iter,
)

# --- definitions ---------------------------------------------------------------------------------


def test_worked_example_counts_the_bonus_token():
    # 10 tokens: the prefill's first, then 3 verification steps emitting 6 accepted drafts + 3 target tokens
    m = SpecDecodeMetrics(completion_tokens=10, total_draft_tokens=8, total_accepted_draft_tokens=6)
    assert (m.num_spec_steps, m.acceptance_rate, m.mean_acceptance_length) == (3, 0.75, 3.0)
    assert m.mean_acceptance_length == (6 + 3) / 3 == 1 + 6 / 3
    assert avg_decoded_tokens_per_iter(10, 3) == 2.5  # TensorRT-LLM's figure counts the prefill as an iteration
    assert steps_from_avg_decoded_tokens_per_iter(10, 2.5) == 3


def test_undefined_figures_are_none_never_nan_or_zero():
    plain = SpecDecodeMetrics(10, 0, 0)
    assert (plain.acceptance_rate, plain.mean_acceptance_length) == (None, 1.0)
    only_prefill = SpecDecodeMetrics(1, 0, 0)
    assert only_prefill.num_spec_steps == 0 and only_prefill.mean_acceptance_length is None
    assert SpecDecodeMetrics(10, None, 6).acceptance_rate is None  # drafts not reported (trtllm-serve)
    assert acceptance_rate(3, 0) is None and mean_acceptance_length(3, 0) is None
    assert spec_steps(3, 5) == 0  # counts no whole generation can have


def test_pooled_is_a_ratio_of_sums():
    a, b = SpecDecodeMetrics(10, 8, 6), SpecDecodeMetrics(20, 12, 1)  # 3 and 18 steps
    pooled = SpecDecodeMetrics.pooled([a, b])
    assert (pooled.completion_tokens, pooled.total_draft_tokens, pooled.num_spec_steps) == (30, 20, 21)
    assert pooled.mean_acceptance_length == pytest.approx(1 + 7 / 21)
    assert pooled.mean_acceptance_length != pytest.approx((a.mean_acceptance_length + b.mean_acceptance_length) / 2)
    assert SpecDecodeMetrics.pooled([]) is None
    assert SpecDecodeMetrics.pooled([a, SpecDecodeMetrics(5, None, 1)]).total_draft_tokens is None


def test_fields_carry_the_vocabulary_and_the_old_keys_for_one_release():
    fields = SpecDecodeMetrics(10, 8, 6, acceptance_source="perf_metrics").fields()
    assert [fields[k] for k in SPEC_DECODE_FIELDS] == [8, 6, 0.75, 3, 3.0]
    assert all(fields[old] == fields[new] for old, new in DEPRECATED_SPEC_DECODE_FIELDS.items())
    assert fields["acceptance_source"] == "perf_metrics"
    assert set(SpecDecodeMetrics(10, 8, 6).fields(deprecated=False)) == {*SPEC_DECODE_FIELDS, "acceptance_source"}
    unreported = SpecDecodeMetrics.unreported_fields()
    assert unreported["acceptance_source"] == "none" and all(unreported[k] is None for k in SPEC_DECODE_FIELDS)


def test_from_fields_reads_new_and_old_keys():
    new = SpecDecodeMetrics.from_fields({"total_draft_tokens": 8, "total_accepted_draft_tokens": 6, "num_spec_steps": 3}, 10)
    old = SpecDecodeMetrics.from_fields({"draft_tokens": 8, "accepted_draft_tokens": 6, "decode_steps": 3}, 10)
    assert new == old == SpecDecodeMetrics(10, 8, 6)
    assert SpecDecodeMetrics.from_fields(SpecDecodeMetrics.unreported_fields(), 10) is None
    assert SpecDecodeMetrics.from_fields(None, 10) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"total_accepted_draft_tokens": -1}, "total_accepted_draft_tokens must be >= 0, got -1"),
        ({"total_draft_tokens": 2.5}, "total_draft_tokens must be an integer count, got 2.5"),
        ({"completion_tokens": True}, "completion_tokens must be an integer count, got True"),
        ({"acceptance_source": "guessed"}, "acceptance_source must be one of"),
    ],
)
def test_bad_counts_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpecDecodeMetrics(**{"completion_tokens": 10, "total_draft_tokens": 8, "total_accepted_draft_tokens": 6, **kwargs})


def test_engine_step_cut_at_the_end_token_keeps_the_identity():
    """A step whose accepted drafts contain the end token counts its last kept token as the target's,
    so tokens = 1 + steps + accepted and a client derives the engine's own step count."""
    from specbuild.engine.stream import DecodeState

    state = DecodeState(context=[1, 2], max_tokens=20, end_id=7)
    state.first(5)
    state.step([6, 6, 9], drafted=2, accepted=2)  # both drafts accepted, 9 the bonus
    last = state.step([8, 7, 8, 4], drafted=3, accepted=3)  # drafts [8 7 8] accepted, but 7 ends it
    assert last.finish_reason == "stop" and state.output == [5, 6, 6, 9, 8, 7]
    assert (last.total_accepted_draft_tokens, last.num_decoding_iterations) == (3, 2)
    assert spec_steps(len(state.output), last.total_accepted_draft_tokens) == last.num_decoding_iterations


# --- one request through every door --------------------------------------------------------------

PROMPT = "for i in range(10):\n    print(i, i * i)\nfor i in range(10):\n    print(i"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def front(decoupled_server):
    from specbuild.triton_repo.openai_frontend import OpenAIServer, config_from_deployment

    triton, engine_dir = decoupled_server
    with OpenAIServer(config_from_deployment(triton.grpc_url, model="tiny-ngram"), port=0) as server:
        yield triton, engine_dir, server


def _figures(m: SpecDecodeMetrics) -> tuple:
    return (m.completion_tokens, m.total_draft_tokens, m.total_accepted_draft_tokens, m.num_spec_steps,
            m.acceptance_rate, m.mean_acceptance_length)


@pytest.mark.e2e
def test_one_request_reports_the_same_acceptance_everywhere(front):
    from specbuild.bench.points import summarize_point
    from specbuild.bench.run import timed_request
    from specbuild.client.openai_client import OpenAIClient
    from specbuild.client.prompts import Prompt
    from specbuild.client.sdk import SpecClient
    from specbuild.runtime import ReferenceEngine
    from specbuild.engine.types import GenerationRequest

    triton, engine_dir, server = front
    # The OpenAI front: the raw body, as AIPerf or any OpenAI client reads it.
    body = {"model": "tiny-ngram", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    data = httpx.post(server.url + "/completions", json=body, timeout=120).json()
    choice, spec = data["choices"][0], data["spec_decode"]
    openai = SpecDecodeMetrics(len(choice["token_ids"]), spec["total_draft_tokens"], spec["total_accepted_draft_tokens"],
                               spec["num_spec_steps"])
    assert (spec["acceptance_rate"], spec["mean_acceptance_length"]) == (openai.acceptance_rate, openai.mean_acceptance_length)

    # The engine in this process, on the prompt ids the deployment's tokenizer made.
    engine = ReferenceEngine.from_engine_dir(engine_dir)
    result = engine.generate(GenerationRequest(input_ids=choice["prompt_token_ids"], max_tokens=MAX_TOKENS, end_id=-1))
    assert result.output_ids == choice["token_ids"]

    # The SDK over Triton's gRPC, and bench's records through both doors.
    prompt = Prompt("repeat", PROMPT)
    with SpecClient(triton.grpc_url, decoupled=True) as client:
        sdk = client.generate(PROMPT, max_tokens=MAX_TOKENS, end_id=-1)
        bench_triton = timed_request(client, prompt, PROMPT, max_tokens=MAX_TOKENS, end_id=-1, fields={})
    openai_client = OpenAIClient(server.url, draft_field=True)
    try:
        bench_openai = timed_request(openai_client, prompt, PROMPT, max_tokens=MAX_TOKENS, end_id=-1, fields={})
    finally:
        openai_client.close()
    assert sdk.output_ids == list(bench_triton.output_ids) == list(bench_openai.output_ids) == result.output_ids

    engine_figures = _figures(result.metrics)
    assert result.metrics.num_spec_steps == result.num_decoding_iterations  # the engine's own count
    assert result.total_accepted_draft_tokens > 0 and result.acceptance_length > 1.0  # speculation did something
    for where, metrics in (("SDK", sdk.metrics), ("OpenAI front", openai), ("bench via Triton", bench_triton.metrics),
                           ("bench via OpenAI", bench_openai.metrics)):
        assert _figures(metrics) == engine_figures, where
    assert sdk.mean_acceptance_length == sdk.acceptance_length == result.acceptance_length == spec["mean_acceptance_length"]
    assert sdk.num_spec_steps == spec["num_spec_steps"]  # the vocabulary's names on the SDK's result too
    assert sdk.acceptance_rate == pytest.approx(result.acceptance_rate)  # the FP32 output tensor
    point = summarize_point([bench_triton], wall_s=1.0, draft_len=4, max_tokens=MAX_TOKENS)
    assert point["tokens_per_step"] == result.acceptance_length and point["acceptance_rate"] == result.acceptance_rate
