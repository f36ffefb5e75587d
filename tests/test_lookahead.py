"""Lookahead decoding: config, n-gram pool, the step layout and mask, and greedy equivalence on a tiny Llama."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from conftest import hf_greedy
from drive import generate_alone
from specbuild.engine import worker
from specbuild.engine.forward import RowBlock, forward_blocks
from specbuild.engine.kv_pool import KVPool, KVShape
from specbuild.methods.lookahead import engine as lookahead
from specbuild.methods.lookahead.engine import (
    LookaheadConfig,
    LookaheadDrafter,
    LookaheadParams,
    LookaheadState,
    NGramPool,
    build_step_layout,
    load_lookahead,
)
from specbuild.methods import method_named
from specbuild.methods.lookahead import lookahead_max_draft_len

CONFIGS = [(4, 3, 4), (3, 3, 2), (1, 1, 0), (5, 4, 3)]
REPETITIVE = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
PROMPTS = [[17, 203, 44, 91, 300, 12], REPETITIVE, [42]]
NEW_TOKENS = 40

# The worked example of build_step_layout's docstring, (w, n, g) = (3, 3, 2): its mask rows ("  0 a    | x").
WORKED_EXAMPLE = "\n".join(line for line in build_step_layout.__doc__.splitlines() if re.match(r"\s+\d+ \w+\s+\|", line))


@pytest.fixture(scope="module")
def plain_outputs(model) -> list[list[int]]:
    return hf_greedy(model, PROMPTS, NEW_TOKENS)


# --- config ------------------------------------------------------------------------------------


def _engine_config(speculative_config: dict) -> LookaheadConfig:
    """The engine's (W, N, G) from a speculative_config, validated by the recipe's model."""
    return load_lookahead(method_named("lookahead").parse_speculative_config(speculative_config), None)


def test_config_from_speculative_config():
    config = _engine_config(
        {"decoding_type": "Lookahead", "max_window_size": 7, "max_ngram_size": 7, "max_verification_set_size": 7}
    )
    assert config.maxima == (7, 7, 7) and config.max_draft_len == 83
    assert _engine_config({"decoding_type": "Lookahead"}).maxima == (4, 3, 4)
    assert _engine_config({"max_draft_len": 15}).max_draft_len == 15


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"max_window_size": 4, "window": 3}, r"unknown Lookahead speculative_config keys \['window'\]"),
        ({"max_window_size": 0}, "max_window_size must be an integer >= 1"),
        ({"max_verification_set_size": -1}, "max_verification_set_size must be an integer >= 0"),
        ({"method": "ngram"}, r"speculative_config.method: Input should be 'lookahead'"),
        ({"max_window_size": 4, "max_ngram_size": 3, "max_verification_set_size": 4, "max_draft_len": 14}, "= 15"),
    ],
)
def test_config_rejects(config, message):
    with pytest.raises(ValueError, match=message):
        _engine_config(config)


def test_engine_config_built_directly_refuses_out_of_range_maxima():
    with pytest.raises(ValueError, match="max_window_size must be an integer >= 1"):
        LookaheadConfig(0, 3, 4)
    with pytest.raises(ValueError, match="max_verification_set_size must be an integer >= 0"):
        LookaheadConfig(4, 3, -1)


def test_per_request_window_within_the_maxima():
    config = LookaheadConfig(4, 3, 4)
    assert config.resolve() == LookaheadParams(4, 3, 4)
    assert config.resolve((1, 1, 0)) == LookaheadParams(1, 1, 0)
    for bad in [(5, 3, 4), (4, 4, 4), (4, 3, 5), (0, 3, 4), (4, 0, 4), (4, 3, -1)]:
        with pytest.raises(ValueError, match="must satisfy"):
            config.resolve(bad)


# --- pool ----------------------------------------------------------------------------------------


def test_pool_keeps_the_newest_g_distinct_continuations():
    pool = NGramPool(ngram=3, capacity=2)
    for ngram in ([5, 6, 7], [5, 8, 9], [5, 6, 7]):
        pool.add(ngram)
    assert pool.guesses(5, 2) == [(6, 7), (8, 9)]
    pool.add([5, 1, 2])
    assert pool.guesses(5, 4) == [(1, 2), (6, 7)]
    assert pool.guesses(6, 4) == []
    with pytest.raises(ValueError, match="3-grams"):
        pool.add([5, 6])


def test_pool_from_tokens_and_zero_capacity():
    pool = NGramPool(ngram=2, capacity=4)
    pool.add_all([1, 2, 1, 3])
    assert pool.guesses(1, 4) == [(3,), (2,)] and pool.guesses(2, 4) == [(1,)] and len(pool) == 3
    empty = NGramPool(ngram=3, capacity=0)
    empty.add_all([1, 2, 3, 4])
    assert len(empty) == 0


# --- layout and mask -------------------------------------------------------------------------------


def test_mask_of_the_worked_example():
    a, b1, b2, c0, c1, c2, u0, u1, v0, v1 = range(100, 110)
    layout = build_step_layout(a, [[-1, b1, b2], [c0, c1, c2]], [[u0, u1], [v0, v1]], LookaheadParams(3, 3, 2))
    assert layout.tokens == list(range(100, 110))
    assert layout.positions == [0, 1, 2, 1, 2, 3, 1, 2, 1, 2]
    assert layout.lookahead_index == [[0, 1, 2], [3, 4, 5]]
    assert layout.candidate_index == [[6, 7], [8, 9]]
    assert layout.num_tokens == 10 == 1 + lookahead_max_draft_len(3, 3, 2)
    expected = torch.tensor([[c == "x" for c in line[18::4].ljust(10)] for line in WORKED_EXAMPLE.splitlines()])
    torch.testing.assert_close(layout.allowed, expected)
    assert WORKED_EXAMPLE in build_step_layout.__doc__  # the docstring shows the tested mask


@pytest.mark.parametrize(("w", "n", "g"), list(itertools.product([1, 2, 4, 7], [1, 2, 3, 5, 7], [0, 1, 4, 7])))
def test_full_step_fills_the_engine_budget_exactly(w, n, g):
    params = LookaheadParams(w, n, g)
    levels = [[1] * w for _ in range(n - 1)]
    candidates = [[2] * (n - 1) for _ in range(g)] if n > 1 else []
    layout = build_step_layout(0, levels, candidates, params)
    assert layout.num_tokens == params.tokens_per_step
    assert layout.num_tokens == (1 if n == 1 else 1 + lookahead_max_draft_len(w, n, g))
    assert (layout.allowed.sum(dim=1) == torch.tensor(layout.positions) + 1).all()  # one token per position


def test_layout_rejects_oversized_branches():
    params = LookaheadParams(3, 3, 1)
    with pytest.raises(ValueError, match="candidates"):
        build_step_layout(0, [[0, 1, 2]], [[1, 2], [3, 4]], params)
    with pytest.raises(ValueError, match="candidates"):
        build_step_layout(0, [[0, 1, 2]], [[1, 2, 3]], params)
    with pytest.raises(ValueError, match="window levels"):
        build_step_layout(0, [[0, 1, 2]] * 3, [], params)
    with pytest.raises(ValueError, match="plain decoding"):
        build_step_layout(0, [[0]], [], LookaheadParams(1, 1, 0))


def test_block_logits_equal_a_causal_pass_over_each_chain(model):
    """Every window token and candidate token is scored as if its chain had been decoded sequentially."""
    prefix, params = [17, 203, 44, 91], LookaheadParams(3, 4, 2)
    levels = [[12, 30, 31], [40, 41, 42], [50, 51, 52]]
    layout = build_step_layout(12, levels, [[60, 61, 62], [70, 71]], params)
    with torch.inference_mode():
        pool = KVPool(KVShape.of(model), num_slots=1, capacity=64, dtype=model.dtype, device="cpu")
        slot = pool.allocate()
        forward_blocks(model, pool, [RowBlock(slot, prefix, logits_from=len(prefix) - 1)])
        pool.commit(slot, list(range(len(prefix))))
        block = forward_blocks(model, pool, [RowBlock(slot, layout.tokens, layout.positions, layout.allowed)]).logits[0]  # [T, vocab]
        for row in range(layout.num_tokens):
            chain = [layout.tokens[k] for k in layout.allowed[row].nonzero().flatten().tolist()]
            sequential = model(torch.tensor([prefix + chain])).logits[0, -1]  # [vocab]
            torch.testing.assert_close(block[row], sequential, atol=1e-4, rtol=1e-4)


# --- greedy equivalence ------------------------------------------------------------------------------


def lookahead_generate_greedy(model, prompt, *, max_tokens, config: LookaheadConfig, end_id=-1, window=None):
    """Greedy lookahead decoding of one prompt with the request's ``window`` (None: the built ``(W, N, G)``),
    through the worker alone. Raises ValueError for a window outside ``(W, N, G)``."""
    params = config.resolve(window)
    return generate_alone(model, LookaheadDrafter(params), prompt, max_tokens=max_tokens, max_block=params.tokens_per_step,
                          end_id=end_id)


@pytest.mark.parametrize("wng", CONFIGS)
def test_token_identical_to_plain_greedy(model, plain_outputs, wng):
    for prompt, expected in zip(PROMPTS, plain_outputs):
        result = lookahead_generate_greedy(model, prompt, max_tokens=NEW_TOKENS, config=LookaheadConfig(*wng))
        assert result.output_ids == expected, (wng, prompt)
        assert result.finish_reason == "length"
        assert result.num_decoding_iterations >= 2
        assert result.num_decoding_iterations == NEW_TOKENS - 1 - result.total_accepted_draft_tokens


def test_smaller_per_request_window_and_plain_decoding(model, plain_outputs):
    config = LookaheadConfig(5, 4, 3)
    for window in [(2, 3, 1), (1, 1, 0)]:
        result = lookahead_generate_greedy(model, REPETITIVE, max_tokens=NEW_TOKENS, config=config, window=window)
        assert result.output_ids == plain_outputs[1]
    assert result.total_draft_tokens == 0 and result.num_decoding_iterations == NEW_TOKENS - 1


def test_repetitive_prompt_accepts_draft_tokens(model):
    result = lookahead_generate_greedy(model, REPETITIVE, max_tokens=NEW_TOKENS, config=LookaheadConfig(4, 3, 4))
    assert result.total_accepted_draft_tokens > 0
    assert result.acceptance_length > 1.0


def test_jacobi_branch_alone_yields_accepted_ngrams(model, plain_outputs, monkeypatch):
    """With no prompt or output n-grams in the pool, accepted drafts can only come from the lookahead branch."""
    monkeypatch.setattr(NGramPool, "add_all", lambda self, tokens: None)
    result = lookahead_generate_greedy(model, PROMPTS[0], max_tokens=NEW_TOKENS, config=LookaheadConfig(5, 4, 3))
    assert result.output_ids == plain_outputs[0]
    assert result.total_accepted_draft_tokens > 0


def test_tokens_per_step_stay_within_the_engine_budget(model, monkeypatch):
    sizes: list[int] = []

    def recording_forward(model, pool, rows, **kwargs):
        sizes.extend(len(row.tokens) for row in rows if row.logits_from == 0)  # the steps, not the prefill
        return forward_blocks(model, pool, rows, **kwargs)

    monkeypatch.setattr(worker, "forward_blocks", recording_forward)
    for wng in CONFIGS:
        sizes.clear()
        lookahead_generate_greedy(model, REPETITIVE, max_tokens=NEW_TOKENS, config=LookaheadConfig(*wng))
        budget = 1 + lookahead_max_draft_len(*wng)
        assert sizes and max(sizes) <= budget, (wng, sizes)
        if wng[1] > 1:
            assert max(sizes) > 1 + wng[0]  # the window fills up past level 0 (warm-up is over)


def test_end_token_inside_an_accepted_chunk_stops_there(model, plain_outputs, monkeypatch):
    chunks: list[list[int]] = []
    accept = worker.accept_tree_greedy

    def recording_accept(*args):
        outcome = accept(*args)
        chunks.append(outcome.emitted_tokens)
        return outcome

    monkeypatch.setattr(worker, "accept_tree_greedy", recording_accept)
    config = LookaheadConfig(4, 3, 4)
    lookahead_generate_greedy(model, REPETITIVE, max_tokens=NEW_TOKENS, config=config)
    expected, start, end = plain_outputs[1], 1, None
    for chunk in chunks:
        for offset, token in enumerate(chunk[:-1]):  # an end token with accepted tokens after it
            if expected.index(token) == start + offset:
                end = (token, start + offset)
                break
        if end:
            break
        start += len(chunk)
    assert end is not None, f"no accepted chunk with a first-seen token before its last token: {chunks}"
    end_id, index = end
    result = lookahead_generate_greedy(model, REPETITIVE, max_tokens=NEW_TOKENS, config=config, end_id=end_id)
    assert result.output_ids == expected[: index + 1]
    assert result.finish_reason == "stop"


def test_window_starts_from_the_prompt_and_fills_up():
    params = LookaheadParams(4, 3, 2)
    state = LookaheadState.start([7, 8, 9], params)
    assert len(state.levels) == 1 and state.levels[0][0] == 9 and set(state.levels[0]) <= {7, 8, 9}
    state.advance([1, 2, 3, 4], [8, 9, 5], 5)
    assert state.levels == [[5, *state.levels[0][1:]], [1, 2, 3, 4]]
    level0 = state.levels[0]
    state.advance([11, 12, 13, 14], [9, 5, 6], 6)  # full: one n-gram per column joins the pool
    assert state.pool is not None
    assert state.pool.guesses(5, 2)[0] == (1, 11)  # column 0: (last, level 1, new) = (5, 1, 11)
    assert (4, 14) in state.pool.guesses(level0[3], 2)
    assert state.levels == [[6, 2, 3, 4], [11, 12, 13, 14]]


def test_errors(model):
    with pytest.raises(ValueError, match="must satisfy"):
        lookahead_generate_greedy(model, [1, 2], max_tokens=4, config=LookaheadConfig(4, 3, 4), window=(5, 3, 4))
    assert lookahead.LookaheadState.start([3], LookaheadParams(1, 1, 0)).pool is None
