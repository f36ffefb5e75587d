"""Every speculative method against plain greedy decoding, one request at a time, on the shared tiny
target (tests/method_engines.py): a "same" draft (the target's own continuation: everything accepted)
and a "random" one (random heads / draft model / tokens: rejections), EOS disabled, at least two verify
steps; stopping at max_tokens and at an end token inside an accepted chunk; the per-method refusals every
method shares. A new method is covered by adding it to ``method_engines.METHODS``.

What is particular to one method (its format, its tree or window options, real heads that get drafts
accepted) stays in that method's own test file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from method_engines import CASES, DEPTH, METHODS, PROMPTS, check_greedy, greedy  # noqa: E402

from specbuild.engine import InvalidRequestError, stream  # noqa: E402
from specbuild.engine.acceptance import clip_emitted  # noqa: E402
from specbuild.methods import method_for, reference_methods  # noqa: E402

SPECULATIVE = [m for m in METHODS if m != "plain"]


@pytest.fixture(scope="module")
def plain(method_engines) -> dict[tuple[int, ...], list[int]]:
    engine = method_engines["plain", "random"]
    return {tuple(p): engine.generate(greedy(p, num_draft_tokens=0)).output_ids for p in PROMPTS}


def _decoding_type(engine) -> str | None:
    config = engine.speculative_config
    return None if config is None else config["decoding_type"]


# --- greedy equivalence --------------------------------------------------------------------------


# num_draft_tokens: None -> the build's max_draft_len; 1 -> a chain of one, a tree's first node (plain
# has no drafts and lookahead's block is its window, so 1 changes nothing there).
GREEDY = [(m, k, None) for m, k in CASES] + [(m, k, 1) for m, k in CASES if m in DEPTH]


@pytest.mark.parametrize("method, kind, num_draft_tokens", GREEDY)
def test_one_request_equals_plain_greedy(method_engines, plain, method, kind, num_draft_tokens):
    engine = method_engines[method, kind]
    results = [engine.generate(greedy(p, num_draft_tokens=num_draft_tokens)) for p in PROMPTS]
    check_greedy(method, kind, results, plain, depth=num_draft_tokens)
    if method in DEPTH:  # every step verifies drafts, at most the cap (a chain's length, a tree's nodes)
        cap = num_draft_tokens or engine.limits.max_draft_len
        assert all(0 < r.total_draft_tokens <= cap * r.num_decoding_iterations for r in results)
    elif method == "lookahead":  # its pool may hold no candidate yet for a short prompt
        assert sum(r.total_draft_tokens for r in results) > 0


# --- stopping ------------------------------------------------------------------------------------


def _row_linears(obj, seen=None) -> list:
    """Every RowLinear reachable from ``obj`` through modules, dataclasses, lists and specbuild objects."""
    import torch

    from specbuild.engine.rowgemm import RowLinear

    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (torch.Tensor, str, int, float, type(None))):
        return []
    seen.add(id(obj))
    if isinstance(obj, RowLinear):
        return [obj]
    if isinstance(obj, torch.nn.Module):  # its RowLinear layers, and what its modules hold besides (DraftLMHead.project)
        found = [m for m in obj.modules() if isinstance(m, RowLinear)]
        for module in obj.modules():
            for value in vars(module).values():
                if not isinstance(value, (torch.nn.Module, dict)) and type(value).__module__.startswith("specbuild"):
                    found += _row_linears(value, seen)
        return found
    if isinstance(obj, (list, tuple)):
        return [r for item in obj for r in _row_linears(item, seen)]
    if type(obj).__module__.startswith("specbuild") and hasattr(obj, "__dict__"):
        return [r for value in vars(obj).values() for r in _row_linears(value, seen)]
    return []


@pytest.mark.parametrize("method", ["draft_target", "medusa", "eagle", "eagle3"])
def test_draft_side_weights_are_bfloat16_and_the_targets_float32(method_engines, method):
    """build.draft_weights "auto" on a float32 CPU target: the draft model or heads and their vocabulary
    projections stream bfloat16 weights; every test of this suite then shows the output is still plain
    greedy's. The target's own layers are never rounded."""
    import torch

    from specbuild.engine import rowgemm

    if rowgemm.library() is None:
        pytest.skip(f"rowgemm not built here: {rowgemm.unavailable_reason()}")
    engine = method_engines[method, "random"]
    target = _row_linears(engine._model)
    draft_side = [layer for layer in _row_linears(engine._method_state) if all(layer is not t for t in target)]  # EAGLE holds the target's lm_head too
    assert draft_side and {layer.packed.dtype for layer in draft_side} == {torch.bfloat16}
    assert {layer.packed.dtype for layer in target} == {torch.float32}
    state = engine._method_state  # the vocabulary projections each method's drafting calls
    projections = {"draft_target": lambda: [state.model.get_output_embeddings().project],
                   "medusa": lambda: state.proposer._projections,
                   "eagle": lambda: [state.proposer._project], "eagle3": lambda: [state.proposer._project]}[method]()
    assert {p.packed.packed.dtype for p in projections} == {torch.bfloat16}


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("method, kind", CASES)
def test_max_tokens_never_exceeded(method_engines, plain, method, kind, max_tokens):
    engine = method_engines[method, kind]
    for prompt in PROMPTS:
        result = engine.generate(greedy(prompt, max_tokens))
        assert result.output_ids == plain[tuple(prompt)][:max_tokens], prompt
        assert result.finish_reason == "length"
        assert result.total_accepted_draft_tokens <= max_tokens - 1


@pytest.mark.parametrize("method, kind", CASES)
def test_end_token_stops_right_after_its_first_occurrence(method_engines, plain, monkeypatch, method, kind):
    """end_id = each token of the plain output in turn: the output is the plain one cut after the token's
    first occurrence, also when it falls inside a multi-token accepted chunk (a "same" draft makes some)."""
    clipped_chunks = []

    def recording_clip(tokens, *, remaining, end_id):
        kept, stopped = clip_emitted(tokens, remaining=remaining, end_id=end_id)
        if stopped and len(kept) < len(tokens):
            clipped_chunks.append((list(tokens), kept))
        return kept, stopped

    monkeypatch.setattr(stream, "clip_emitted", recording_clip)
    engine = method_engines[method, kind]
    for prompt in PROMPTS[:2]:
        expected = plain[tuple(prompt)]
        for end_id in dict.fromkeys(expected):
            first = expected.index(end_id)
            result = engine.generate(greedy(prompt, end_id=end_id))
            assert result.output_ids == expected[: first + 1], (prompt, end_id)
            assert result.finish_reason == "stop"
            # every step emits its accepted drafts and the bonus token; the last may end before the bonus
            bonus_tokens = first - result.total_accepted_draft_tokens
            assert bonus_tokens <= result.num_decoding_iterations <= bonus_tokens + 1
    if kind == "same":
        assert clipped_chunks, "no end token fell inside a multi-token accepted chunk"


# --- refusals every method shares ------------------------------------------------------------------


@pytest.mark.parametrize("num_draft_tokens", [None, 0])
@pytest.mark.parametrize("method", SPECULATIVE)
def test_sampling_is_refused_by_greedy_only_methods(method_engines, method, num_draft_tokens):
    engine = method_engines[method, "random"]
    if not method_for(engine.speculative_config).engine_method().greedy_only:
        pytest.skip(f"{method} samples (speculative sampling)")
    request = greedy(PROMPTS[0], temperature=0.7, num_draft_tokens=num_draft_tokens)
    with pytest.raises(InvalidRequestError, match=f"{_decoding_type(engine)} is greedy-only, as in TensorRT-LLM"):
        engine.generate(request)


@pytest.mark.parametrize("method", [m for m in METHODS if m != "lookahead"])
def test_lookahead_config_is_refused_by_other_methods(method_engines, method):
    engine = method_engines[method, "random"]
    running = _decoding_type(engine) or "no speculation"
    with pytest.raises(InvalidRequestError, match=f"this engine runs {running}, not Lookahead"):
        engine.generate(greedy(PROMPTS[0], lookahead_config=(2, 2, 1)))


# --- the registry --------------------------------------------------------------------------------


def test_every_registered_method_is_in_the_suite(method_engines):
    covered = {_decoding_type(method_engines[m, "random"]) for m in SPECULATIVE}
    assert covered == set(reference_methods()), "add the new method to tests/method_engines.py (METHODS, _configs, oracles)"


def test_method_registry_imports_without_torch():
    code = (
        "import sys, specbuild.methods as m; "
        "assert {'NGram', 'DraftTarget', 'Lookahead', 'Medusa', 'Eagle', 'Eagle3'} <= set(m.reference_methods()); "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
