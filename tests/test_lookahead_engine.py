"""Lookahead decoding as a method of the reference engine (Fu et al. 2024): greedy equivalence for
per-request (w, n, g), refusals, Triton parsing and the real server. Stopping, and the refusals every
method shares, are in tests/test_method_equivalence.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from drive import assert_equals_plain
from conftest import served, text_prompts, verify_lossless, write_recipe
from specbuild.engine import GenerationRequest, InvalidRequestError
from specbuild.runtime import EngineLimits, ReferenceEngine
from specbuild.methods.lookahead import lookahead_max_draft_len

MAXIMA = (4, 3, 4)  # (W, N, G) -> max_draft_len 15
SPEC = {"decoding_type": "Lookahead", "max_window_size": 4, "max_ngram_size": 3, "max_verification_set_size": 4}
LIMITS = EngineLimits(max_batch_size=1, max_input_len=64, max_seq_len=160, max_draft_len=lookahead_max_draft_len(*MAXIMA))
REPETITIVE = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
PROMPTS = [[17, 203, 44, 91, 300, 12], REPETITIVE, [42]]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def engine(model) -> ReferenceEngine:
    return ReferenceEngine(model, limits=LIMITS, end_id=-1, speculative_config=SPEC)


@pytest.fixture(scope="module")
def plain_outputs(engine) -> list[list[int]]:
    return [_run(engine, p, num_draft_tokens=0).output_ids for p in PROMPTS]


def _run(engine, prompt, max_tokens=NEW_TOKENS, **kwargs):
    return engine.generate(GenerationRequest(prompt, max_tokens, **{"end_id": -1, **kwargs}))


# --- greedy equivalence --------------------------------------------------------------------------


@pytest.mark.parametrize("window", [None, (4, 3, 4), (2, 2, 1), (3, 3, 0), (1, 1, 0)])
def test_lookahead_engine_equals_plain_greedy(engine, plain_outputs, window):
    drafted = 0
    for prompt, plain in zip(PROMPTS, plain_outputs):
        result = _run(engine, prompt, lookahead_config=window)
        assert_equals_plain(result, plain, prompt)
        drafted += result.total_draft_tokens
    if window in (None, (4, 3, 4)):
        assert drafted > 0
    if window == (1, 1, 0):  # plain decoding
        assert drafted == 0


def test_repetitive_prompt_gets_drafts_accepted(engine):
    assert _run(engine, REPETITIVE, max_tokens=40).total_accepted_draft_tokens > 0


def test_num_draft_tokens_zero_is_plain_decoding(engine, plain_outputs):
    result = _run(engine, PROMPTS[1], num_draft_tokens=0, lookahead_config=(4, 3, 4))
    assert result.output_ids == plain_outputs[1]
    assert result.total_draft_tokens == 0 and result.num_decoding_iterations == NEW_TOKENS - 1


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "window, message",
    [
        ((5, 3, 4), r"lookahead_config=\(5, 3, 4\) is out of range: .*1 <= w <= 4"),
        ((0, 1, 0), r"lookahead_config=\(0, 1, 0\) is out of range"),
        ((4, 3, 5), r"0 <= g <= 4"),
        ((4, 3), r"lookahead_config=\(4, 3\); allowed: None or three integers"),
        ((4.0, 3, 4), r"allowed: None or three integers"),
    ],
)
def test_lookahead_config_outside_the_build_is_refused(engine, window, message):
    with pytest.raises(InvalidRequestError, match=message):
        _run(engine, PROMPTS[0], lookahead_config=window)


@pytest.mark.parametrize(
    "config, limits, message",
    [
        (SPEC, EngineLimits(1, 64, 160, 14), r"max_draft_len=15 exceeds the built max_draft_len=14"),
        ({**SPEC, "max_draft_len": 16}, LIMITS, r"max_draft_len 16 does not match \(W, N, G\)"),
        ({**SPEC, "window": 4}, LIMITS, r"unknown Lookahead speculative_config keys \['window'\]"),
    ],
)
def test_bad_speculative_config_is_refused(model, config, limits, message):
    with pytest.raises(ValueError, match=message):
        ReferenceEngine(model, limits=limits, end_id=-1, speculative_config=config)


# --- Triton tensors ------------------------------------------------------------------------------


def test_parse_batch_reads_lookahead_tensors():
    from specbuild.triton_repo.models.reference_engine import parse_batch

    base = {"input_ids": np.array([[1, 2], [3, 4]], dtype=np.int32), "request_output_len": np.array([[4], [4]], dtype=np.int32)}
    window = {
        "lookahead_window_size": np.array([[2], [1]], dtype=np.int32),
        "lookahead_ngram_size": np.array([[3], [1]], dtype=np.int32),
        "lookahead_verification_set_size": np.array([[1], [0]], dtype=np.int32),
    }
    rows = parse_batch({**base, **window}, default_pad_id=0, default_exclude_input=True)
    assert [r.request.lookahead_config for r in rows] == [(2, 3, 1), (1, 1, 0)]
    assert [r.request.lookahead_config for r in parse_batch(base, default_pad_id=0, default_exclude_input=True)] == [None, None]
    with pytest.raises(ValueError, match="go together"):
        parse_batch({**base, "lookahead_window_size": window["lookahead_window_size"]}, default_pad_id=0, default_exclude_input=True)


def test_repository_declares_lookahead_inputs(tmp_path):
    from specbuild.interface import LOOKAHEAD_INPUTS
    from specbuild.triton_repo.reference_repository import ReferenceRepoSpec, reference_models

    models = {m.name: m for m in reference_models(ReferenceRepoSpec(tmp_path, end_id=0, pad_id=0, max_batch_size=4))}
    for name in ("ensemble", "tensorrt_llm"):
        inputs = {t.name: t for t in models[name].inputs}
        assert all(inputs[n].data_type == "TYPE_INT32" and inputs[n].optional for n in LOOKAHEAD_INPUTS)
    step = next(s for s in models["ensemble"].steps if s.model_name == "tensorrt_llm")
    assert all(step.input_map[n] == n for n in LOOKAHEAD_INPUTS)


# --- recipe and the real server ------------------------------------------------------------------



def lookahead_recipe(tmp_path: Path, checkpoint: Path) -> Path:
    speculation = "  method: lookahead\n  max_window_size: 4\n  max_ngram_size: 3\n  max_verification_set_size: 4\n"
    # max_seq_len + max_draft_len 15 within the tiny model's 512 positions
    return write_recipe(tmp_path / "r.yaml", checkpoint, speculation=speculation, max_seq_len=480)


def test_lookahead_recipe_passes_check_runnable(tiny_checkpoint, tmp_path):
    from specbuild.builder.recipe import load_recipe
    from specbuild.pipeline import check_runnable

    checked = check_runnable(load_recipe(str(lookahead_recipe(tmp_path, tiny_checkpoint))))
    assert checked.reference.target.path == tiny_checkpoint  # lookahead drafts from the target alone
    assert checked.reference.weights is None and checked.reference.fit_checked is False


@pytest.mark.e2e
def test_lookahead_recipe_is_lossless_through_triton(tiny_checkpoint, tmp_path):
    """recipe -> engine dir -> tritonserver -> verify; a (1, 1, 0) request equals the baseline."""
    import json

    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine
    from specbuild.client.sdk import RequestError

    loaded = load_recipe(str(lookahead_recipe(tmp_path, tiny_checkpoint)))
    engine_dir = build_reference_engine(loaded, tmp_path / "engine", log=lambda m: None).engine_dir
    config = json.loads((engine_dir / "config.json").read_text())
    assert config["speculative_config"] == SPEC
    assert config["build_config"]["max_draft_len"] == 15 and config["build_config"]["speculative_decoding_mode"] == 8
    with served(engine_dir, tmp_path) as client:
        verify_lossless(client)
        prompt = text_prompts()[0].text
        baseline = client.generate(prompt, max_tokens=20, end_id=-1, num_draft_tokens=0)
        plain = client.generate(prompt, max_tokens=20, end_id=-1, lookahead_config=(1, 1, 0))
        small = client.generate(prompt, max_tokens=20, end_id=-1, lookahead_config=(2, 2, 1))
        with pytest.raises(RequestError, match=r"lookahead_config=\(5, 3, 4\) is out of range"):
            client.generate(prompt, max_tokens=20, end_id=-1, lookahead_config=(5, 3, 4))
    assert plain.output_ids == baseline.output_ids and plain.total_draft_tokens == 0
    assert small.output_ids == baseline.output_ids
