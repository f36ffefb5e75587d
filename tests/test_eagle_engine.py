"""EAGLE-1/2 as a method of the reference engine (Li et al. 2024): greedy equivalence on its trees
(TensorRT-LLM's default, a user tree, EAGLE-2's dynamic tree), per-request caps, refusals, the builder
and the real server.

Heads: "random" (nearly every node rejected) and "pass_through" (the head returns its input feature, so
the target's lm_head guesses the root again: accepted where the tiny model repeats itself). The "same"
draft, stopping, and the refusals every method shares are in tests/test_method_equivalence.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from drive import assert_equals_plain
from conftest import build_with_pt_head, served, verify_lossless, write_recipe
from tiny_models import make_pass_through
from specbuild.engine import GenerationRequest
from specbuild.runtime import EngineLimits, ReferenceEngine
from specbuild.methods.eagle import engine as eagle
from specbuild.methods.eagle.engine import EagleConfig, EagleHead, save_eagle_head
from specbuild.methods.base import MC_SIM_7B_63

VOCAB, HIDDEN = 384, 64
CONFIG = EagleConfig(
    hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
    rms_norm_eps=1e-6, max_position_embeddings=512,
)
USER_CHOICES = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # 7 nodes, depth 3
TREES = {
    "mc_sim_7b_63": {"num_eagle_layers": 4},
    "user": {"eagle_choices": USER_CHOICES, "num_eagle_layers": 3, "max_draft_len": 7},
    "dynamic": {"use_dynamic_tree": True, "dynamic_tree_max_topK": 3, "num_eagle_layers": 4, "max_draft_len": 12},
}
LIMITS = EngineLimits(max_batch_size=1, max_input_len=64, max_seq_len=160, max_draft_len=len(MC_SIM_7B_63))
PROMPTS = [[17, 203, 44, 91, 300, 12], [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [42]]
NEW_TOKENS = 16


def eagle_config(head_dir: Path | None, tree: str = "user", **extra) -> dict:
    config = {"decoding_type": "Eagle", **TREES[tree], **extra}
    return config if head_dir is None else {**config, "speculative_model_dir": str(head_dir)}


def _head(kind: str, config: EagleConfig = CONFIG) -> EagleHead:
    torch.manual_seed(3)
    head = EagleHead(config)
    return make_pass_through(head) if kind == "pass_through" else head  # pass_through: output = input feature


@pytest.fixture(scope="module")
def head_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eagle_heads")
    return {kind: save_eagle_head(root / kind, _head(kind).state_dict(), CONFIG) for kind in ("random", "pass_through")}


@pytest.fixture(scope="module")
def engines(model, head_dirs) -> dict[tuple[str, str], ReferenceEngine]:
    return {
        (kind, tree): ReferenceEngine(model, limits=LIMITS, end_id=-1, speculative_config=eagle_config(path, tree))
        for kind, path in head_dirs.items()
        for tree in TREES
    }


@pytest.fixture(scope="module")
def plain_outputs(engines) -> list[list[int]]:
    return [_run(engines["random", "user"], p, num_draft_tokens=0).output_ids for p in PROMPTS]


def _run(engine, prompt, max_tokens=NEW_TOKENS, **kwargs):
    return engine.generate(GenerationRequest(prompt, max_tokens, **{"end_id": -1, **kwargs}))


# --- greedy equivalence --------------------------------------------------------------------------


# random heads on the user tree: tests/test_method_equivalence.py
EQUIVALENCE = [("random", "mc_sim_7b_63"), ("random", "dynamic")] + [("pass_through", tree) for tree in TREES]


@pytest.mark.parametrize("num_draft_tokens", ["max", 1])
@pytest.mark.parametrize("kind, tree", EQUIVALENCE)
def test_eagle_engine_equals_plain_greedy(engines, plain_outputs, kind, tree, num_draft_tokens):
    engine = engines[kind, tree]
    k = None if num_draft_tokens == "max" else 1
    cap = {"mc_sim_7b_63": 63, "user": 7, "dynamic": 12}[tree] if k is None else k
    for prompt, plain in zip(PROMPTS, plain_outputs):
        result = _run(engine, prompt, num_draft_tokens=k)
        assert_equals_plain(result, plain, prompt)
        assert 0 < result.total_draft_tokens <= cap * result.num_decoding_iterations


def test_pass_through_head_gets_drafts_accepted(engines):
    accepted = sum(_run(engines["pass_through", "dynamic"], p, max_tokens=24).total_accepted_draft_tokens for p in PROMPTS)
    assert accepted > 0


@pytest.mark.parametrize("tree, k, expected", [("user", 2, ((0,), (1,))), ("dynamic", 2, None)])
def test_num_draft_tokens_caps_the_tree(engines, monkeypatch, tree, k, expected):
    """Static: the first k nodes in node order; dynamic: the k best nodes (EAGLE-2 reranking)."""
    verified = []
    real_step = eagle.propose_batch  # every proposal, alone or for a batch

    def recording_propose(proposers, states, roots, max_depths):
        drafts = real_step(proposers, states, roots, max_depths)
        verified.extend(draft.tree for draft in drafts)
        return drafts

    monkeypatch.setattr(eagle, "propose_batch", recording_propose)
    result = _run(engines["random", tree], PROMPTS[0], max_tokens=6, num_draft_tokens=k)
    assert all(t.num_nodes == k for t in verified[:-1]) and verified[-1].num_nodes == 0  # last: one token left
    if expected is not None:
        assert all(t.paths == expected for t in verified[:-1])
    assert result.total_draft_tokens == k * (len(verified) - 1)
    assert engines["random", tree]._method_state.proposer.tree_config.max_draft_len == TREES[tree]["max_draft_len"]


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 9])
def test_max_tokens_never_exceeded_on_the_dynamic_tree(engines, plain_outputs, max_tokens):
    result = _run(engines["random", "dynamic"], PROMPTS[0], max_tokens=max_tokens)
    assert result.output_ids == plain_outputs[0][:max_tokens]
    assert result.finish_reason == "length"


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tree, extra, limits, message",
    [
        ("mc_sim_7b_63", {}, EngineLimits(1, 64, 160, 7), r"max_draft_len=63 exceeds the built max_draft_len=7"),
        ("user", {"num_eagle_layers": 4}, LIMITS, r"3 deep but num_eagle_layers is 4"),
        ("user", {"posterior_threshold": 0.09}, LIMITS, r"posterior_threshold"),
        ("user", {"medusa_choices": [[0]]}, LIMITS, r"unknown Eagle speculative_config keys \['medusa_choices'\]"),
    ],
)
def test_bad_speculative_config_is_refused(model, head_dirs, tree, extra, limits, message):
    with pytest.raises(ValueError, match=message):
        ReferenceEngine(model, limits=limits, end_id=-1, speculative_config=eagle_config(head_dirs["random"], tree, **extra))


def test_head_of_another_size_is_refused(model, tmp_path):
    config = EagleConfig(**{**CONFIG.__dict__, "hidden_size": 32, "intermediate_size": 64})
    head_dir = save_eagle_head(tmp_path / "head", EagleHead(config).state_dict(), config)
    with pytest.raises(ValueError, match="EAGLE head hidden_size 32 != target hidden_size 64"):
        ReferenceEngine(model, limits=LIMITS, end_id=-1, speculative_config=eagle_config(head_dir))


def test_head_directory_is_needed_outside_an_engine_directory(model):
    with pytest.raises(ValueError, match="needs speculative_model_dir"):
        ReferenceEngine(model, limits=LIMITS, end_id=-1, speculative_config=eagle_config(None))


# --- builder and the real server -----------------------------------------------------------------

E2E_CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # 6 nodes, depth 3


def eagle_recipe(tmp_path: Path, checkpoint: Path, head: str, extra: str = "") -> Path:
    speculation = (
        f"  method: eagle\n  eagle_model: {head}\n  max_draft_len: 6\n  num_eagle_layers: 3\n"
        f"  eagle_choices: {E2E_CHOICES}\n{extra}"
    )
    return write_recipe(tmp_path / "r.yaml", checkpoint, speculation=speculation)


def test_missing_mismatched_or_unsupported_heads_are_refused_before_any_work(tiny_checkpoint, tmp_path):
    from specbuild.builder.recipe import RecipeError, load_recipe
    from specbuild.builder.reference import build_reference_engine
    from specbuild.pipeline import check_inputs, check_runnable

    def recipe(extra=""):
        return load_recipe(str(eagle_recipe(tmp_path, tiny_checkpoint, "head", extra)))

    with pytest.raises(RecipeError, match=r"r.yaml:\d+: speculation.eagle_model: .*no such directory"):
        check_inputs(recipe())
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "config.json").write_text(json.dumps({**CONFIG.__dict__, "hidden_size": 32, "vocab_size": 400}))
    with pytest.raises(RecipeError, match=r"eagle_model: .*none of model.safetensors, pytorch_model.bin, model.pt"):
        check_inputs(recipe())
    (tmp_path / "head" / "model.safetensors").write_bytes(b"")
    with pytest.raises(RecipeError, match=r"eagle_model: .*hidden_size=32, vocab_size=400 but the target has hidden_size=64, vocab_size=384"):
        check_inputs(recipe())
    for check in (check_inputs, check_runnable, lambda r: build_reference_engine(r, tmp_path / "engine")):
        with pytest.raises(RecipeError, match=r"speculation.posterior_threshold: typical acceptance .* not in the reference engine yet"):
            check(recipe("  posterior_threshold: 0.09\n"))
    assert not (tmp_path / "engine").exists()


def test_eagle_recipe_passes_check_runnable(tiny_checkpoint, tmp_path):
    from specbuild.builder.recipe import load_recipe
    from specbuild.pipeline import check_runnable

    save_eagle_head(tmp_path / "head", _head("random").state_dict(), CONFIG)
    checked = check_runnable(load_recipe(str(eagle_recipe(tmp_path, tiny_checkpoint, "head"))))
    assert checked.reference.weights.path == tmp_path / "head" and checked.reference.fit_checked


@pytest.mark.e2e
def test_eagle_recipe_is_lossless_through_triton(tiny_checkpoint, tmp_path):
    """recipe (head as a .pt, relative path) -> engine dir with eagle/ -> tritonserver -> verify."""
    head_dir = save_eagle_head(tmp_path / "head", _head("pass_through").state_dict(), CONFIG)
    recipe = eagle_recipe(tmp_path, tiny_checkpoint, "head")
    engine_dir, config = build_with_pt_head(recipe, head_dir, _head("pass_through").state_dict(), tmp_path, "eagle")
    assert config["speculative_config"] == {
        "decoding_type": "Eagle", "max_draft_len": 6, "num_eagle_layers": 3, "max_non_leaves_per_layer": 10,
        "eagle3_one_model": False, "eagle_choices": E2E_CHOICES,
    }
    assert config["build_config"]["max_draft_len"] == 6 and config["build_config"]["speculative_decoding_mode"] == 32
    with served(engine_dir, tmp_path) as client:
        verify_lossless(client)
