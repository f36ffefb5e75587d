"""The TensorRT-LLM repository's front model: per-request routing of num_draft_tokens and the
draft -> target loop, which must give exactly the target's greedy tokens whatever the draft says.

The engines are toy greedy language models behind the same call the front makes to the
``tensorrtllm`` models (tokens in, new tokens out, draft tokens verified by the target); the two
behaviours TensorRT-LLM may show for a request with draft tokens (stop after the accepted prefix +
one token, or keep generating to ``request_output_len``) are both exercised.
"""

from __future__ import annotations

import random

import pytest
from specbuild.triton_repo.models.trtllm_front import (
    EngineResult,
    FrontConfig,
    Route,
    draft_loop_generate,
    generate_request,
    route,
)

VOCAB = 50
END = 0


def target_next(ids: list[int]) -> int:
    return (sum(ids) * 31 + len(ids) * 7) % VOCAB


def greedy(next_token, ids, n, end_id=END) -> list[int]:
    ids, out = list(ids), []
    for _ in range(n):
        token = next_token(ids)
        out.append(token)
        ids.append(token)
        if token == end_id:
            break
    return out


class ToyEngines:
    """``generate`` as the front calls it; records every call."""

    def __init__(self, draft_next, *, stop_after_verify: bool, end_id: int = END, target=target_next):
        self.draft_next = draft_next
        self.target = target
        self.stop_after_verify = stop_after_verify
        self.end_id = end_id
        self.calls: list[tuple] = []

    def __call__(self, model, ids, max_new, draft, extra):
        self.calls.append((model, len(ids), max_new, None if draft is None else list(draft), dict(extra)))
        if model == "tensorrt_llm_draft":
            return EngineResult(greedy(self.draft_next, ids, max_new, self.end_id))
        if draft is None:
            return EngineResult(greedy(self.target, ids, max_new, self.end_id))
        out, ctx, accepted = [], list(ids), 0
        for d in draft:  # verify: keep the draft while it equals the target's greedy token
            t = self.target(ctx)
            out.append(t)
            ctx.append(t)
            if t != d or t == self.end_id:
                break
            accepted += 1
        else:
            t = self.target(ctx)
            out.append(t)
            ctx.append(t)
        if not self.stop_after_verify and out[-1] != self.end_id:
            out += greedy(self.target, ctx, max_new - len(out), self.end_id)
        return EngineResult(out[:max_new], accepted, len(draft))


DRAFT_TARGET = FrontConfig("draft_target", 4, draft_model="tensorrt_llm_draft")


def noisy_draft(seed: int, agree: float):
    rng = random.Random(seed)
    return lambda ids: target_next(ids) if rng.random() < agree else rng.randrange(1, VOCAB)


@pytest.mark.parametrize("stop_after_verify", [True, False])
@pytest.mark.parametrize("agree", [0.0, 0.6, 1.0])
def test_draft_target_loop_equals_target_greedy(stop_after_verify, agree):
    for seed in range(20):
        prompt = [random.Random(seed).randrange(1, VOCAB) for _ in range(5)]
        for k in (1, 3, 4):
            for max_tokens in (1, 7, 30):
                engines = ToyEngines(noisy_draft(seed, agree), stop_after_verify=stop_after_verify)
                gen = draft_loop_generate(engines, DRAFT_TARGET, prompt, max_tokens, k, END, {})
                assert gen.tokens == greedy(target_next, prompt, max_tokens), (seed, k, max_tokens)
                assert 0 <= gen.accepted_draft_tokens <= gen.draft_tokens
                assert all(call[2] <= k + 1 for call in engines.calls)
                if agree == 1.0 and stop_after_verify:
                    assert gen.accepted_draft_tokens == gen.draft_tokens


def test_draft_target_stops_at_the_end_id():
    prompt = [3, 4, 5]
    end_id = greedy(target_next, prompt, 12)[-1]  # the 12th greedy token ends the generation
    plain = greedy(target_next, prompt, 200, end_id)
    assert plain[-1] == end_id and len(plain) <= 12
    for stop_after_verify in (True, False):
        engines = ToyEngines(noisy_draft(1, 0.7), stop_after_verify=stop_after_verify, end_id=end_id)
        assert draft_loop_generate(engines, DRAFT_TARGET, prompt, 200, 4, end_id, {}).tokens == plain


def test_zero_draft_tokens_is_plain_target_decoding():
    engines = ToyEngines(target_next, stop_after_verify=True)
    gen = generate_request(engines, DRAFT_TARGET, [1, 2, 3], 10, 0, END, {"end_id": END})
    assert gen.tokens == greedy(target_next, [1, 2, 3], 10) and (gen.accepted_draft_tokens, gen.draft_tokens) == (0, 0)
    assert [c[0] for c in engines.calls] == ["tensorrt_llm"] and engines.calls[0][3] is None


def test_routes_per_method():
    lookahead = FrontConfig("lookahead", 83, lookahead=(7, 7, 7))
    assert route(lookahead, 0) == Route("tensorrt_llm", extra={"lookahead_window_size": 1, "lookahead_ngram_size": 1,
                                                               "lookahead_verification_set_size": 0}, speculation_off=True)
    assert route(lookahead, None) == Route("tensorrt_llm") == route(lookahead, 83)
    medusa = FrontConfig("medusa", 63, baseline_model="tensorrt_llm_baseline")
    assert route(medusa, 0) == Route("tensorrt_llm_baseline") and route(medusa, None) == Route("tensorrt_llm")
    assert route(DRAFT_TARGET, None) == Route("tensorrt_llm", draft_loop=True, draft_len=4)
    assert route(DRAFT_TARGET, 2) == Route("tensorrt_llm", draft_loop=True, draft_len=2)
    assert route(FrontConfig("none", 0), 0) == Route("tensorrt_llm")


def test_routes_refuse_what_tensorrt_llm_cannot_do():
    with pytest.raises(ValueError, match=r"eagle has no per-request off switch.*build.baseline_engine: true"):
        route(FrontConfig("eagle", 63), 0)
    with pytest.raises(ValueError, match="medusa's draft length is fixed when the engine is built: send num_draft_tokens 0 or 63"):
        route(FrontConfig("medusa", 63, baseline_model="b"), 5)
    with pytest.raises(ValueError, match="num_draft_tokens 9 exceeds the engine's max_draft_len 4"):
        route(DRAFT_TARGET, 9)


def test_baseline_and_lookahead_off_report_no_drafts():
    engines = ToyEngines(target_next, stop_after_verify=True)
    medusa = FrontConfig("medusa", 63, baseline_model="tensorrt_llm_baseline")
    gen = generate_request(engines, medusa, [1, 2], 5, 0, END, {})
    assert engines.calls[-1][0] == "tensorrt_llm_baseline" and gen.draft_tokens == 0
    gen = generate_request(engines, FrontConfig("lookahead", 83, lookahead=(7, 7, 7)), [1, 2], 5, 0, END, {"end_id": END})
    assert engines.calls[-1][4]["lookahead_verification_set_size"] == 0 and gen.draft_tokens == 0


def test_sampling_on_medusa_is_refused():
    medusa = FrontConfig("medusa", 63, baseline_model="tensorrt_llm_baseline")
    engines = ToyEngines(target_next, stop_after_verify=True)
    with pytest.raises(ValueError, match=r"temperature=0.8: Medusa is greedy-only in TensorRT-LLM"):
        generate_request(engines, medusa, [1, 2], 5, None, END, {"temperature": 0.8})
    assert engines.calls == []
    generate_request(engines, medusa, [1, 2], 5, 0, END, {"temperature": 0.8})  # the baseline engine samples
    assert engines.calls[-1][0] == "tensorrt_llm_baseline"


@pytest.mark.parametrize("stop_after_verify", [True, False])
def test_ngram_loop_equals_target_greedy_and_accepts_repeats(stop_after_verify):
    ngram = FrontConfig("ngram", 4, max_matching_ngram_size=2)
    periodic = lambda ids: ids[-3] if len(ids) >= 3 else 1  # noqa: E731 - a target that repeats with period 3
    engines = ToyEngines(periodic, stop_after_verify=stop_after_verify, target=periodic)
    gen = draft_loop_generate(engines, ngram, [5, 6, 7, 5, 6], 20, 4, END, {})
    assert gen.tokens == greedy(periodic, [5, 6, 7, 5, 6], 20)
    assert gen.accepted_draft_tokens > 10  # the repeats are copied from the context and accepted
    assert all(call[0] == "tensorrt_llm" for call in engines.calls)  # no draft engine
    assert route(ngram, 0) == Route("tensorrt_llm") and route(ngram, None).draft_loop
