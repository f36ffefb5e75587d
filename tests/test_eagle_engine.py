"""EAGLE-1/2 as a method of the reference engine (Li et al. 2024): greedy equivalence through
``ReferenceEngine.generate``, per-request caps, stopping, refusals, the builder and the real server.

Heads: "random" (nearly every node rejected) and "pass_through" (the head returns its input feature, so
the target's lm_head guesses the root again: accepted where the tiny model repeats itself); an oracle
proposer swapped in for the head is the "same" draft (the whole depth accepted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import write_recipe
from specbuild.client.prompts import Prompt
from specbuild.engine import EngineLimits, GenerationRequest, InvalidRequestError, ReferenceEngine
from specbuild.engine import target as target_model
from specbuild.engine.methods import eagle
from specbuild.engine.methods.eagle import EagleConfig, EagleHead, TreeDraft, save_eagle_head
from specbuild.engine.tree import MC_SIM_7B_63, SpecTree

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


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)


def _head(kind: str, config: EagleConfig = CONFIG) -> EagleHead:
    torch.manual_seed(3)
    head = EagleHead(config)
    if kind == "pass_through":  # fc = [0 | I], the layer's outputs zeroed: output = input feature
        with torch.no_grad():
            head.fc.weight.zero_()
            head.fc.bias.zero_()
            head.fc.weight[:, HIDDEN:] = torch.eye(HIDDEN)
            head.layers[0].self_attn.o_proj.weight.zero_()
            head.layers[0].mlp.down_proj.weight.zero_()
    return head


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


@pytest.mark.parametrize("num_draft_tokens", ["max", 1])
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("kind", ["random", "pass_through"])
def test_eagle_engine_equals_plain_greedy(engines, plain_outputs, kind, tree, num_draft_tokens):
    engine = engines[kind, tree]
    k = None if num_draft_tokens == "max" else 1
    cap = {"mc_sim_7b_63": 63, "user": 7, "dynamic": 12}[tree] if k is None else k
    for prompt, plain in zip(PROMPTS, plain_outputs):
        result = _run(engine, prompt, num_draft_tokens=k)
        assert result.output_ids == plain, f"prompt {prompt}"
        assert result.finish_reason == "length"
        assert result.num_decoding_iterations >= 2
        assert result.num_decoding_iterations == len(plain) - 1 - result.total_accepted_draft_tokens
        assert 0 < result.total_draft_tokens <= cap * result.num_decoding_iterations


def test_pass_through_head_gets_drafts_accepted(engines):
    accepted = sum(_run(engines["pass_through", "dynamic"], p, max_tokens=24).total_accepted_draft_tokens for p in PROMPTS)
    assert accepted > 0


@pytest.mark.parametrize("tree, k, expected", [("user", 2, ((0,), (1,))), ("dynamic", 2, None)])
def test_num_draft_tokens_caps_the_tree(engines, monkeypatch, tree, k, expected):
    """Static: the first k nodes in node order; dynamic: the k best nodes (EAGLE-2 reranking)."""
    verified = []
    real_step = eagle.EagleProposer.propose

    def recording_propose(self, state, root, max_depth):
        draft = real_step(self, state, root, max_depth)
        verified.append(draft.tree)
        return draft

    monkeypatch.setattr(eagle.EagleProposer, "propose", recording_propose)
    result = _run(engines["random", tree], PROMPTS[0], max_tokens=6, num_draft_tokens=k)
    assert all(t.num_nodes == k for t in verified[:-1]) and verified[-1].num_nodes == 0  # last: one token left
    if expected is not None:
        assert all(t.paths == expected for t in verified[:-1])
    assert result.total_draft_tokens == k * (len(verified) - 1)
    assert engines["random", tree]._method_state.proposer.tree_config.max_draft_len == TREES[tree]["max_draft_len"]


# --- a "same" draft: the oracle's path is always right ---------------------------------------------


class _OracleProposer:
    """The target's true continuation on the all-zeros path, wrong tokens elsewhere (a FeatureTreeProposer)."""

    def __init__(self, tree: SpecTree, prompt: list[int], plain: list[int]) -> None:
        self.tree, self.prompt_len, self.plain = tree, len(prompt), plain

    def new_state(self) -> list[int]:
        return []

    def capped(self, num_draft_tokens: int) -> _OracleProposer:
        return _OracleProposer(self.tree.first(num_draft_tokens), [0] * self.prompt_len, self.plain)

    def update(self, state, next_tokens, features):
        assert features.shape == (len(next_tokens), HIDDEN)
        state += next_tokens

    def propose(self, state, root, max_depth):
        tree = self.tree.truncated(max_depth)
        emitted = len(state) - self.prompt_len + 1
        truth = [self.plain[min(emitted + d, len(self.plain) - 1)] for d in range(tree.max_depth)]
        return TreeDraft(tree, [root] + [(truth[len(p) - 1] + p[-1]) % VOCAB for p in tree.paths])


@pytest.fixture
def oracle_engine(engines, plain_outputs, monkeypatch):
    tree = SpecTree.from_choices(USER_CHOICES)
    monkeypatch.setattr(eagle, "make_eagle_proposer", lambda loaded: _OracleProposer(tree, PROMPTS[0], plain_outputs[0]))
    return engines["random", "user"]


def test_same_draft_accepts_the_full_depth(oracle_engine, plain_outputs):
    result = _run(oracle_engine, PROMPTS[0])
    assert result.output_ids == plain_outputs[0]
    assert result.num_decoding_iterations == -(-(NEW_TOKENS - 1) // 4)  # 3 accepted + bonus per step
    assert result.total_accepted_draft_tokens == NEW_TOKENS - 1 - result.num_decoding_iterations


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 9])
def test_max_tokens_never_exceeded(oracle_engine, engines, plain_outputs, max_tokens):
    for engine in (oracle_engine, engines["random", "dynamic"]):
        result = _run(engine, PROMPTS[0], max_tokens=max_tokens)
        assert result.output_ids == plain_outputs[0][:max_tokens]
        assert result.finish_reason == "length"


def test_end_token_inside_an_accepted_chunk_stops_there(oracle_engine, plain_outputs):
    plain, mid_chunk = plain_outputs[0], 0
    for end_id in dict.fromkeys(plain):
        first = plain.index(end_id)
        result = _run(oracle_engine, PROMPTS[0], end_id=end_id)
        assert result.output_ids == plain[: first + 1], f"end_id {end_id}"
        assert result.finish_reason == "stop"
        mid_chunk += first % 4 != 0
    assert mid_chunk > 0, "no end token fell inside a multi-token accepted chunk"


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_draft_tokens", [None, 0])
def test_sampling_is_refused(engines, num_draft_tokens):
    with pytest.raises(InvalidRequestError, match="Eagle is greedy-only, as in TensorRT-LLM"):
        _run(engines["random", "user"], PROMPTS[0], temperature=0.7, num_draft_tokens=num_draft_tokens)


def test_lookahead_config_is_refused(engines):
    with pytest.raises(InvalidRequestError, match="this engine runs Eagle, not Lookahead"):
        _run(engines["random", "user"], PROMPTS[0], lookahead_config=(2, 2, 1))


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


def test_method_registry_imports_without_torch():
    code = "import sys, specbuild.engine.methods as m; assert 'Eagle' in m.METHODS and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- builder and the real server -----------------------------------------------------------------

E2E_CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # 6 nodes, depth 3
TEXT_PROMPTS = [
    Prompt("repeat", "for i in range(10):\n    print(i, i * i)\nfor i in range(10):\n    print(i"),
    Prompt("prose", "The quick brown fox jumps over the lazy dog."),
]


def eagle_recipe(tmp_path: Path, checkpoint: Path, head: str, extra: str = "") -> Path:
    recipe = write_recipe(tmp_path / "r.yaml", checkpoint)
    recipe.write_text(recipe.read_text().replace(
        "  method: ngram\n  max_draft_len: 4\n  max_matching_ngram_size: 2\n",
        f"  method: eagle\n  eagle_model: {head}\n  max_draft_len: 6\n  num_eagle_layers: 3\n"
        f"  eagle_choices: {E2E_CHOICES}\n{extra}",
    ))
    return recipe


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
    assert check_runnable(load_recipe(str(eagle_recipe(tmp_path, tiny_checkpoint, "head"))))


@pytest.mark.e2e
def test_eagle_recipe_is_lossless_through_triton(tiny_checkpoint, tmp_path):
    """recipe (head as a .pt, relative path) -> engine dir with eagle/ -> tritonserver -> verify."""
    from specbuild.builder.recipe import load_recipe
    from specbuild.builder.reference import build_reference_engine, engine_fingerprint, locate_eagle, locate_target
    from specbuild.client.sdk import SpecClient
    from specbuild.client.verify import verify
    from specbuild.triton_repo.generate import spec_from_engine_dir, write_reference_repository
    from specbuild.triton_repo.server import TritonServer

    head_dir = save_eagle_head(tmp_path / "head", _head("pass_through").state_dict(), CONFIG)
    torch.save(_head("pass_through").state_dict(), head_dir / "model.pt")  # EAGLE's .pt, read weights_only
    (head_dir / "model.safetensors").unlink()
    loaded = load_recipe(str(eagle_recipe(tmp_path, tiny_checkpoint, "head")))
    build = build_reference_engine(loaded, tmp_path / "engine", log=lambda m: None)
    engine_dir = build.engine_dir
    assert sorted(p.name for p in (engine_dir / "eagle").iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((engine_dir / "config.json").read_text())
    assert config["speculative_config"] == {
        "decoding_type": "Eagle", "max_draft_len": 6, "num_eagle_layers": 3, "max_non_leaves_per_layer": 10,
        "eagle3_one_model": False, "eagle_choices": E2E_CHOICES,
    }
    assert config["build_config"]["max_draft_len"] == 6 and config["build_config"]["speculative_decoding_mode"] == 32
    weights = head_dir / "model.pt"
    os.utime(weights, (weights.stat().st_atime, weights.stat().st_mtime + 10))  # another head -> another engine
    assert engine_fingerprint(loaded, locate_target(loaded), None, None, locate_eagle(loaded)) != build.fingerprint
    repo = write_reference_repository(spec_from_engine_dir(engine_dir), tmp_path / "repo")
    server = TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, log_file=tmp_path / "server.log")
    with server, SpecClient(server.grpc_url) as client:
        client.wait_ready()
        report = verify(client, TEXT_PROMPTS, max_tokens=20, end_id=-1)
    assert report.all_match, [r.divergence for r in report.results if not r.match]
    assert report.total_draft_tokens > 0
