"""Streaming: every decode path is a step generator, so the concatenated stream equals the
non-streamed output by construction; here that is checked for every method (engine), for the text
(incremental detokenization), and through a real decoupled tritonserver with a gRPC stream."""

from __future__ import annotations

import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from method_engines import CASES, PROMPTS, greedy  # noqa: E402

from specbuild.engine import InvalidRequestError  # noqa: E402
from specbuild.engine.stream import collect  # noqa: E402
from specbuild.engine.types import GenerationRequest, GenerationResult  # noqa: E402
from specbuild.triton_repo.models.reference_engine import Row, pack_outputs, pack_step  # noqa: E402
from specbuild.triton_repo.models.tokenization import detokenize_step, load_tokenizer  # noqa: E402


@pytest.mark.parametrize("method, kind", CASES)
def test_stream_concatenates_to_the_non_streamed_output(method_engines, method, kind):
    engine = method_engines[method, kind]
    for prompt in PROMPTS:
        steps = list(engine.generate_stream(greedy(prompt)))
        whole = engine.generate(greedy(prompt))
        assert [t for s in steps for t in s.token_ids] == whole.output_ids
        assert collect(steps) == whole
        assert [s.is_final for s in steps] == [False] * (len(steps) - 1) + [True]
        assert len(steps) == 1 + whole.num_decoding_iterations  # prefill + one per target pass
        assert all(s.token_ids for s in steps)
    if kind == "same":  # several tokens accepted in one step, streamed as one chunk
        assert max(len(s.token_ids) for s in steps) > 1


def test_stream_stops_inside_an_accepted_chunk(method_engines):
    engine = method_engines["ngram", "same"]
    plain = engine.generate(greedy(PROMPTS[0])).output_ids
    end_id = plain[6]
    steps = list(engine.generate_stream(greedy(PROMPTS[0], end_id=end_id)))
    assert [t for s in steps for t in s.token_ids] == plain[: plain.index(end_id) + 1]
    assert steps[-1].finish_reason == "stop"


def test_a_bad_request_fails_before_any_step(method_engines):
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        method_engines["ngram", "random"].generate_stream(GenerationRequest([1, 2], 0))


def test_streamed_texts_concatenate_to_the_whole_text(tiny_checkpoint):
    """Random ids (byte tokens that split UTF-8 characters included) cut at random step boundaries."""
    tokenizer = load_tokenizer(str(tiny_checkpoint))
    rng = random.Random(0)
    byte_tokens = [i for i in range(len(tokenizer)) if len(tokenizer.convert_ids_to_tokens(i)) == 1][:256]
    for _ in range(200):
        ids = [rng.choice(byte_tokens) if rng.random() < 0.5 else rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 12))]
        cuts = sorted(rng.sample(range(1, len(ids)), rng.randrange(len(ids)))) if len(ids) > 1 else []
        chunks = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)])]
        texts = [detokenize_step(tokenizer, ids[: sum(map(len, chunks[:i]))], c, final=i == len(chunks) - 1) for i, c in enumerate(chunks)]
        assert "".join(texts) == tokenizer.decode(ids, skip_special_tokens=True), ids


@pytest.mark.parametrize("exclude_input", [True, False])
def test_streamed_tensors_concatenate_to_the_non_streamed_ones(method_engines, exclude_input):
    engine = method_engines["ngram", "same"]
    row = Row(greedy(PROMPTS[1]), pad_id=0, exclude_input_in_output=exclude_input, return_perf_metrics=True, streaming=True)
    steps = list(engine.generate_stream(row.request))
    sent: list[int] = []
    for step in steps:
        out = pack_step(row, step, sent=sent)
        assert out["stream_final"][0, 0] == step.is_final and out["stream_prefix_ids"][0].tolist() == sent
        assert out["sequence_length"][0, 0] == out["output_ids"].shape[-1]
        sent += out["output_ids"][0, 0].tolist()
    whole = pack_outputs([row], [collect(steps)])
    assert sent == whole["output_ids"][0, 0].tolist()
    assert out["total_accepted_draft_tokens"][0, 0] == whole["total_accepted_draft_tokens"][0, 0] > 0


def test_decoupled_repository_streams_only_the_engine_model(tmp_path):
    """TensorRT-LLM's layout: tensorrt_llm decoupled, the ensemble's ``stream`` input feeding its
    ``streaming``, and the streaming tensors routed to postprocessing (parsed with Triton's schema)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from specbuild.triton_repo.pbtxt import render
    from specbuild.triton_repo.reference_repository import ReferenceRepoSpec, reference_models

    for decoupled in (False, True):
        models = reference_models(ReferenceRepoSpec(tmp_path, end_id=0, pad_id=0, max_batch_size=4, decoupled=decoupled))
        parsed = {m.name: text_format.Parse(render(m), model_config_pb2.ModelConfig()) for m in models}
        assert {n for n, c in parsed.items() if c.model_transaction_policy.decoupled} == ({"tensorrt_llm"} if decoupled else set())
        steps = {s.model_name: s for s in parsed["ensemble"].ensemble_scheduling.step}
        assert steps["tensorrt_llm"].input_map["streaming"] == "stream"
        assert "stream" in {t.name for t in parsed["ensemble"].input}
        assert steps["postprocessing"].input_map["STREAM_PREFIX_IDS"] == steps["tensorrt_llm"].output_map["stream_prefix_ids"]
        assert steps["postprocessing"].input_map["STREAM_FINAL"] == steps["tensorrt_llm"].output_map["stream_final"]
        # the steps of requests in flight reach postprocessing together: one execute() takes them all
        assert parsed["postprocessing"].HasField("dynamic_batching") and parsed["preprocessing"].HasField("dynamic_batching")


# --- through a real decoupled tritonserver (conftest.decoupled_server) ----------------------------


TEXT_PROMPTS = [
    "for i in range(10):\n    print(i, i * i)\nfor i in range(10):\n    print(i",
    "def fib(n):\n    if n < 2:\n        return n\n",
    "The quick brown fox jumps over the lazy dog.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
]


def _streamed(client, prompt: str, **kwargs) -> tuple[list[list[int]], str, object]:
    chunks = list(client.generate_stream(prompt, max_tokens=24, end_id=-1, **kwargs))
    return [c.output_ids for c in chunks], "".join(c.text for c in chunks), chunks[-1]


@pytest.mark.e2e
def test_stream_through_triton_equals_the_non_streamed_response(decoupled_server):
    from specbuild.client.sdk import SpecClient

    server, _ = decoupled_server
    with SpecClient(server.grpc_url) as client:
        client.wait_ready()
        for prompt in TEXT_PROMPTS:
            whole = list(client.generate_stream(prompt, max_tokens=24, end_id=-1, stream=False))
            assert len(whole) == 1
            steps, text, last = _streamed(client, prompt)
            assert [t for s in steps for t in s] == whole[0].output_ids and len(whole[0].output_ids) == 24
            assert text == whole[0].text
            assert last.total_accepted_draft_tokens == whole[0].total_accepted_draft_tokens
            assert len(steps) == 24 - last.total_accepted_draft_tokens  # prefill + one chunk per target pass
            if prompt == TEXT_PROMPTS[0]:
                assert max(len(s) for s in steps) > 1  # drafts accepted: several tokens in one response
        steps, _, _ = _streamed(client, TEXT_PROMPTS[0], exclude_input_in_output=False)
        whole = list(client.generate_stream(TEXT_PROMPTS[0], max_tokens=24, end_id=-1, exclude_input_in_output=False, stream=False))
        assert [t for s in steps for t in s] == whole[0].output_ids


@pytest.mark.e2e
def test_bad_streamed_request_gets_an_error_and_the_server_keeps_serving(decoupled_server):
    from specbuild.client.sdk import RequestError, SpecClient

    server, _ = decoupled_server
    with SpecClient(server.grpc_url) as client:
        with pytest.raises(RequestError, match="num_draft_tokens"):
            list(client.generate_stream("x = 1", max_tokens=4, num_draft_tokens=99))
        with pytest.raises(RequestError, match="end_id"):
            list(client.generate_stream("x = 1", max_tokens=4, end_id=10_000))
        steps, _, last = _streamed(client, "x = 1")
        assert sum(map(len, steps)) == 24


@pytest.mark.e2e
def test_decoupled_client_verifies_a_decoupled_deployment(decoupled_server):
    """Recipe ``serve.decoupled: true``: plain ``infer`` is refused, so ``SpecClient(decoupled=True)``
    sends each request over a stream; ``verify`` (what ``specbuild recipe`` runs) then passes."""
    from specbuild.client.prompts import Prompt
    from specbuild.client.sdk import RequestError, SpecClient
    from specbuild.client.verify import verify

    server, _ = decoupled_server
    with SpecClient(server.grpc_url) as plain_client:
        with pytest.raises(RequestError):
            plain_client.generate(TEXT_PROMPTS[0], max_tokens=8)
    with SpecClient(server.grpc_url, decoupled=True) as client:
        result = client.generate(TEXT_PROMPTS[0], max_tokens=24, end_id=-1)
        (whole,) = client.generate_stream(TEXT_PROMPTS[0], max_tokens=24, end_id=-1, stream=False)
        assert result.output_ids == whole.output_ids and result.text == whole.text
        assert result.finish_reason == "length" and result.total_accepted_draft_tokens > 0
        report = verify(client, [Prompt(f"p{i}", t) for i, t in enumerate(TEXT_PROMPTS[:2])], max_tokens=16)
    assert report.all_match


def test_decoupled_recipe_needs_grpc_verification(tmp_path, tiny_checkpoint):
    from conftest import write_recipe

    from specbuild.builder.recipe import RecipeError, load_recipe

    path = write_recipe(tmp_path / "r.yaml", tiny_checkpoint, extra="verify: {protocol: http}\n")
    path.write_text(path.read_text().replace("serve:\n", "serve:\n  decoupled: true\n"))
    with pytest.raises(RecipeError, match="verify.protocol.*grpc"):
        load_recipe(str(path))


@pytest.mark.e2e
def test_four_concurrent_streams_equal_each_alone(decoupled_server):
    from specbuild.client.sdk import SpecClient

    server, _ = decoupled_server
    with SpecClient(server.grpc_url) as client:
        alone = [_streamed(client, p)[:2] for p in TEXT_PROMPTS]
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda p: _streamed(client, p)[:2], TEXT_PROMPTS))
    assert together == alone


@pytest.mark.e2e
def test_a_thread_streams_request_after_request_on_one_connection(decoupled_server):
    """A worker's requests share its gRPC stream connection; one left half-read is cancelled and its
    connection dropped, and a stream opened while another of the thread is unfinished gets its own."""
    from specbuild.client.sdk import SpecClient

    server, _ = decoupled_server
    with SpecClient(server.grpc_url) as client:
        first = _streamed(client, TEXT_PROMPTS[1])[:2]
        connection = client._local.stream_client
        assert _streamed(client, TEXT_PROMPTS[1])[:2] == first and client._local.stream_client is connection
        outer = client.generate_stream(TEXT_PROMPTS[2], max_tokens=24, end_id=-1)
        head = next(outer)  # the thread's connection is busy with this stream
        assert _streamed(client, TEXT_PROMPTS[1])[:2] == first  # a second connection, closed afterwards
        rest = list(outer)
        assert [t for c in [head, *rest] for t in c.output_ids] == [t for s in _streamed(client, TEXT_PROMPTS[2])[0] for t in s]
        abandoned = client.generate_stream(TEXT_PROMPTS[0], max_tokens=24, end_id=-1)
        next(abandoned)
        reused = client._local.stream_client
        abandoned.close()  # cancelled: its connection is not reused
        assert client._local.stream_client is None and reused is not None
        assert _streamed(client, TEXT_PROMPTS[1])[:2] == first


def test_result_counters_survive_collect():
    """collect() keeps the last step's counters (the non-streamed result is the collected stream)."""
    from specbuild.engine.stream import DecodeState

    state = DecodeState([1, 2], max_tokens=5, end_id=-1)
    steps = [state.first(7), state.step([3, 4, 9], drafted=3, accepted=2), state.step([8, 6], drafted=2, accepted=1)]
    # clipped at max_tokens: the accepted 8 kept, the bonus 6 dropped; the step's last kept token counts as the
    # target's (not accepted), so tokens = 1 + steps + accepted (specbuild.interface.spec_steps)
    assert collect(steps) == GenerationResult([7, 3, 4, 9, 8], "length", 5, 2, 2)
    assert steps[-1].token_ids == [8] and steps[-1].is_final



def test_a_plain_call_to_a_streaming_deployment_says_how_to_stream(decoupled_server):
    """Triton refuses ModelInfer on a decoupled model; the error tells the user what to use instead."""
    from specbuild.client.sdk import RequestError, SpecClient

    server, _ = decoupled_server
    with SpecClient(server.grpc_url) as client:
        client.wait_ready()
        with pytest.raises(RequestError, match=r"decoupled=True\) or `specbuild verify --streaming`"):
            client.generate("def f():", max_tokens=4)
