"""Medusa as a method of the reference engine (Cai et al. 2024): greedy equivalence on its trees
(TensorRT-LLM's default mc_sim_7b_63 and a user tree), per-request tree caps, refusals, the builder and
the real server.

Heads: "random" (nearly every node rejected) and "lm_head" (every head is the target's own LM head,
accepted where the tiny model's top candidates repeat). The "same" draft, stopping, and the refusals
every method shares are in tests/test_method_equivalence.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from drive import assert_equals_plain
from conftest import served, verify_lossless, write_recipe
from specbuild.engine import GenerationRequest, InvalidRequestError, worker
from specbuild.runtime import EngineLimits, ReferenceEngine
from specbuild.methods.medusa.engine import MedusaConfig, MedusaHeads, save_medusa_heads
from specbuild.engine.tree import SpecTree
from specbuild.methods.base import MC_SIM_7B_63

VOCAB, HIDDEN = 384, 64
CONFIG = MedusaConfig(medusa_num_heads=4, medusa_num_layers=1, hidden_size=HIDDEN, vocab_size=VOCAB)
USER_CHOICES = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # 7 nodes, depth 3
TREES = {"mc_sim_7b_63": None, "user": USER_CHOICES}
LIMITS = EngineLimits(max_batch_size=1, max_input_len=64, max_seq_len=160, max_draft_len=len(MC_SIM_7B_63))
PROMPTS = [[17, 203, 44, 91, 300, 12], [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [42]]
NEW_TOKENS = 16


def medusa_config(heads_dir: Path | None, choices=None, **extra) -> dict:
    config = {"decoding_type": "Medusa", "num_medusa_heads": 4, **extra}
    if heads_dir is not None:
        config["speculative_model_dir"] = str(heads_dir)
    return config if choices is None else {**config, "medusa_choices": choices}


def _heads_state(model, kind: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    heads = MedusaHeads(CONFIG)
    if kind == "lm_head":  # ResBlocks zeroed (x + SiLU(0) = x), projection = the target's lm_head
        with torch.no_grad():
            for head in heads.heads:
                head[0].linear.weight.zero_()
                head[0].linear.bias.zero_()
                head[1].weight.copy_(model.lm_head.weight)
    return heads.heads.state_dict()


@pytest.fixture(scope="module")
def heads_dirs(model, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("medusa_heads")
    return {kind: save_medusa_heads(root / kind, _heads_state(model, kind), CONFIG) for kind in ("random", "lm_head")}


@pytest.fixture(scope="module")
def engines(model, heads_dirs) -> dict[tuple[str, str], ReferenceEngine]:
    return {
        (kind, tree): ReferenceEngine(model, limits=LIMITS, end_id=-1, speculative_config=medusa_config(path, choices))
        for kind, path in heads_dirs.items()
        for tree, choices in TREES.items()
    }


@pytest.fixture(scope="module")
def plain_outputs(engines) -> list[list[int]]:
    return [_run(engines["random", "user"], p, num_draft_tokens=0).output_ids for p in PROMPTS]


def _run(engine, prompt, max_tokens=NEW_TOKENS, **kwargs):
    return engine.generate(GenerationRequest(prompt, max_tokens, **{"end_id": -1, **kwargs}))


# --- greedy equivalence --------------------------------------------------------------------------


# random heads on the user tree: tests/test_method_equivalence.py
EQUIVALENCE = [("random", "mc_sim_7b_63")] + [("lm_head", tree) for tree in TREES]


@pytest.mark.parametrize("num_draft_tokens", ["max", 1])
@pytest.mark.parametrize("kind, tree", EQUIVALENCE)
def test_medusa_engine_equals_plain_greedy(engines, plain_outputs, kind, tree, num_draft_tokens):
    engine = engines[kind, tree]
    nodes = SpecTree.from_choices(TREES[tree] or MC_SIM_7B_63).num_nodes
    k = nodes if num_draft_tokens == "max" else num_draft_tokens
    for prompt, plain in zip(PROMPTS, plain_outputs):
        result = _run(engine, prompt, num_draft_tokens=None if num_draft_tokens == "max" else k)
        assert_equals_plain(result, plain, prompt)
        assert 0 < result.total_draft_tokens <= k * result.num_decoding_iterations
        assert result.total_accepted_draft_tokens < result.total_draft_tokens


def test_lm_head_heads_get_drafts_accepted(engines):
    accepted = sum(_run(engines["lm_head", "user"], p, max_tokens=24).total_accepted_draft_tokens for p in PROMPTS)
    assert accepted > 0


def test_num_draft_tokens_keeps_the_first_nodes_in_tree_order(engines, monkeypatch):
    """k = 2 on the user tree verifies [0] and [1] only: 2 nodes per step, depth 1."""
    verified = []
    real_accept = worker.accept_tree_greedy

    def recording_accept(tree, *args):
        verified.append(tree.paths)
        return real_accept(tree, *args)

    monkeypatch.setattr(worker, "accept_tree_greedy", recording_accept)
    result = _run(engines["random", "user"], PROMPTS[0], max_tokens=6, num_draft_tokens=2)
    assert verified and all(paths == ((0,), (1,)) for paths in verified[:-1])
    assert verified[-1] == ()  # one token left: no node could be emitted, a plain step
    assert result.total_draft_tokens == 2 * (len(verified) - 1)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 6, 9])
def test_max_tokens_never_exceeded_on_the_default_tree(engines, plain_outputs, max_tokens):
    result = _run(engines["random", "mc_sim_7b_63"], PROMPTS[0], max_tokens=max_tokens)
    assert result.output_ids == plain_outputs[0][:max_tokens]
    assert result.finish_reason == "length"


# --- refusals ------------------------------------------------------------------------------------


def test_num_draft_tokens_past_the_tree_is_refused(engines):
    with pytest.raises(InvalidRequestError, match=r"num_draft_tokens=64 is out of range; allowed: 0\.\.63"):
        _run(engines["random", "user"], PROMPTS[0], num_draft_tokens=64)


@pytest.mark.parametrize(
    "config, message",
    [
        (MedusaConfig(4, 1, 32, VOCAB), r"hidden_size=32, vocab_size=384 but the target has hidden_size=64, vocab_size=384"),
        (MedusaConfig(4, 1, HIDDEN, 400), r"hidden_size=64, vocab_size=400 but the target has hidden_size=64, vocab_size=384"),
    ],
)
def test_heads_of_another_size_are_refused(model, tmp_path, config, message):
    heads_dir = save_medusa_heads(tmp_path / "heads", MedusaHeads(config).heads.state_dict(), config)
    with pytest.raises(ValueError, match=message):
        ReferenceEngine(model, limits=LIMITS, end_id=-1, speculative_config=medusa_config(heads_dir))


@pytest.mark.parametrize(
    "extra, limits, message",
    [
        ({}, EngineLimits(1, 64, 160, 7), r"max_draft_len=63 exceeds the built max_draft_len=7"),
        ({"medusa_choices": [[0], [0, 0]], "max_draft_len": 1}, LIMITS, r"max_draft_len=1 is below the tree's 2 nodes"),
        ({"medusa_choices": [[0], [0, 0], [0, 0, 0]], "num_medusa_heads": 2}, LIMITS, r"3 deep but num_medusa_heads=2"),
        ({"medusa_choices": []}, LIMITS, r"medusa_choices is empty"),
        ({"medusa_choices": [[0, 1]]}, LIMITS, r"tree choice \[0, 1\] has no parent"),
        ({"medusa_heads": 4}, LIMITS, r"unknown Medusa speculative_config keys \['medusa_heads'\]"),
    ],
)
def test_bad_speculative_config_is_refused(model, heads_dirs, extra, limits, message):
    with pytest.raises(ValueError, match=message):
        ReferenceEngine(model, limits=limits, end_id=-1, speculative_config=medusa_config(heads_dirs["random"], **extra))


def test_heads_directory_is_needed_outside_an_engine_directory(model):
    with pytest.raises(ValueError, match="needs speculative_model_dir"):
        ReferenceEngine(model, limits=LIMITS, end_id=-1, speculative_config=medusa_config(None))


# --- builder and the real server -----------------------------------------------------------------

E2E_CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # 6 nodes, depth 3


def medusa_recipe(tmp_path: Path, checkpoint: Path, heads: str) -> Path:
    speculation = f"  method: medusa\n  medusa_model: {heads}\n  num_medusa_heads: 3\n  medusa_choices: {E2E_CHOICES}\n"
    return write_recipe(tmp_path / "r.yaml", checkpoint, speculation=speculation)


def _three_heads(model, tmp: Path, *, pt: bool = False) -> Path:
    config = MedusaConfig(3, 1, HIDDEN, VOCAB)
    state = {k: v for k, v in _heads_state(model, "lm_head").items() if not k.startswith("3.")}
    heads_dir = save_medusa_heads(tmp, state, config)
    if pt:  # the FasterDecoding .pt format, read with weights_only=True
        torch.save(state, heads_dir / "medusa_lm_head.pt")
        (heads_dir / "medusa_lm_head.safetensors").unlink()
    return heads_dir


def test_missing_or_mismatched_heads_are_refused_before_any_work(tiny_checkpoint, tmp_path):
    from specbuild.builder.recipe import RecipeError, load_recipe
    from specbuild.pipeline import check_inputs

    with pytest.raises(RecipeError, match=r"r.yaml:\d+: speculation.medusa_model: .*no such directory"):
        check_inputs(load_recipe(str(medusa_recipe(tmp_path, tiny_checkpoint, "heads"))))
    (tmp_path / "heads").mkdir()
    (tmp_path / "heads" / "config.json").write_text(json.dumps({**CONFIG.__dict__, "vocab_size": 400}))
    with pytest.raises(RecipeError, match=r"medusa_model: .*neither medusa_lm_head.safetensors nor medusa_lm_head.pt"):
        check_inputs(load_recipe(str(medusa_recipe(tmp_path, tiny_checkpoint, "heads"))))
    (tmp_path / "heads" / "medusa_lm_head.safetensors").write_bytes(b"")
    with pytest.raises(RecipeError, match=r"medusa_model: .*vocab_size=400 but the target has vocab_size=384"):
        check_inputs(load_recipe(str(medusa_recipe(tmp_path, tiny_checkpoint, "heads"))))


@pytest.mark.e2e
def test_medusa_recipe_is_lossless_through_triton(model, tiny_checkpoint, tmp_path):
    """recipe (heads as a .pt, relative path) -> engine dir with medusa/ -> tritonserver -> verify."""
    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine, engine_fingerprint, locate_target, locate_weights

    _three_heads(model, tmp_path / "heads", pt=True)
    loaded = load_recipe(str(medusa_recipe(tmp_path, tiny_checkpoint, "heads")))
    build = build_reference_engine(loaded, tmp_path / "engine", log=lambda m: None)
    engine_dir = build.engine_dir
    assert sorted(p.name for p in (engine_dir / "medusa").iterdir()) == ["config.json", "medusa_lm_head.safetensors"]
    config = json.loads((engine_dir / "config.json").read_text())
    assert config["speculative_config"] == {"decoding_type": "Medusa", "max_draft_len": 6, "num_medusa_heads": 3, "medusa_choices": E2E_CHOICES}
    assert config["build_config"]["max_draft_len"] == 6 and config["build_config"]["speculative_decoding_mode"] == 4
    weights = tmp_path / "heads" / "medusa_lm_head.pt"
    os.utime(weights, (weights.stat().st_atime, weights.stat().st_mtime + 10))  # other heads -> another engine
    assert engine_fingerprint(loaded, locate_target(loaded), locate_weights(loaded)) != build.fingerprint
    with served(engine_dir, tmp_path) as client:
        verify_lossless(client)
