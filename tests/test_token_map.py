"""The hot-token map (``speculative_token_map``, FR-Spec): reading and checking its files, the draft
projection it restricts, lossless decoding with it for every method that takes one, and its way from a
recipe into an engine directory."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from conftest import hf_greedy
from specbuild.engine import GenerationRequest
from specbuild.runtime import EngineLimits, ReferenceEngine
from specbuild.engine.draft_linear import DraftProjection
from specbuild.methods.eagle.engine import EagleConfig, EagleHead, save_eagle_head
from specbuild.methods.medusa.engine import MedusaConfig, MedusaHeads, save_medusa_heads
from specbuild.methods.token_map import read_token_ids, write_token_map
from tiny_models import make_tiny_llama

VOCAB, HIDDEN = 384, 64
PROMPTS = [[17, 203, 44, 91, 300, 12], [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]]
NEW_TOKENS = 20


# --- files --------------------------------------------------------------------------------------


def test_every_file_format_reads_the_same_ids(tmp_path):
    ids = [7, 3, 300, 0, 42]
    (tmp_path / "list.json").write_text(json.dumps(ids))
    write_token_map(tmp_path / "ours.json", ids, token_map_size=5)
    save_file({"hot": torch.tensor(ids)}, str(tmp_path / "map.safetensors"))
    torch.save(torch.tensor(ids), tmp_path / "sglang.pt")  # SGLang's --speculative-token-map format
    for name in ("list.json", "ours.json", "map.safetensors", "sglang.pt"):
        assert read_token_ids(tmp_path / name, VOCAB) == ids, name


class Payload:
    def __reduce__(self):
        return (print, ("unpickled!",))


@pytest.mark.parametrize("content, message", [
    ([], "lists no token ids"),
    ([1, 2.5], "entry 1 is 2.5, not a token id"),
    ([1, True], "entry 1 is True"),
    ([1, 384], "token id 384 at index 1 is outside the vocabulary \\[0, 384\\)"),
    ([-1], "token id -1 at index 0 is outside"),
    ([4, 5, 4], "token id 4 is listed twice \\(index 2\\)"),
    ({"ids": [1]}, "must be a JSON list of token ids or an object with a token_ids list"),
])
def test_bad_token_maps_are_refused_with_the_entry_at_fault(tmp_path, content, message):
    path = tmp_path / "map.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message):
        read_token_ids(path, VOCAB)


def test_unreadable_token_map_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no token map at"):
        read_token_ids(tmp_path / "absent.json", VOCAB)
    (tmp_path / "map.txt").write_text("1 2 3")
    with pytest.raises(ValueError, match="unknown suffix '.txt'"):
        read_token_ids(tmp_path / "map.txt", VOCAB)
    (tmp_path / "broken.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="not readable JSON"):
        read_token_ids(tmp_path / "broken.json", VOCAB)
    save_file({"a": torch.tensor([1]), "b": torch.tensor([2])}, str(tmp_path / "two.safetensors"))
    with pytest.raises(ValueError, match="holds 2 tensors"):
        read_token_ids(tmp_path / "two.safetensors", VOCAB)
    torch.save(torch.tensor([[1, 2]]), tmp_path / "matrix.pt")
    with pytest.raises(ValueError, match="one 1-D integer tensor"):
        read_token_ids(tmp_path / "matrix.pt", VOCAB)
    (tmp_path / "evil.pt").write_bytes(pickle.dumps(Payload(), protocol=2))
    with pytest.raises(pickle.UnpicklingError):  # weights_only: never runs the pickle's code
        read_token_ids(tmp_path / "evil.pt", VOCAB)


def test_write_token_map_leaves_no_partial_file(tmp_path):
    path = write_token_map(tmp_path / "sub" / "map.json", [3, 1], coverage=0.5)
    assert json.loads(path.read_text()) == {"format": "specbuild-token-map-1", "coverage": 0.5, "token_ids": [3, 1]}
    assert [p.name for p in path.parent.iterdir()] == ["map.json"]


# --- the projection -----------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3])
def test_projection_over_a_token_map_scores_only_its_tokens(bias, rows):
    torch.manual_seed(0)
    linear = nn.Linear(HIDDEN, VOCAB, bias=bias)
    hot = torch.randperm(VOCAB)[:50].tolist()
    x = torch.randn(rows, HIDDEN)
    with torch.inference_mode():
        full, restricted = DraftProjection(linear)(x), DraftProjection(linear, hot)(x)
    assert restricted.shape == (rows, VOCAB)
    torch.testing.assert_close(restricted[:, hot], full[:, hot], rtol=1e-5, atol=1e-5)
    cold = sorted(set(range(VOCAB)) - set(hot))
    assert torch.isneginf(restricted[:, cold]).all()
    best_hot = torch.tensor(hot)[full[:, hot].argmax(-1)]
    assert restricted.argmax(-1).tolist() == best_hot.tolist()
    assert torch.softmax(restricted, -1)[:, cold].sum() == 0


def test_projection_refuses_ids_outside_the_vocabulary():
    linear = nn.Linear(HIDDEN, VOCAB)
    for bad in ([], [VOCAB], [-1], [3, 3]):
        with pytest.raises(ValueError, match="distinct token ids in \\[0, 384\\)"):
            DraftProjection(linear, bad)


# --- decoding with a map ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain(model):
    return hf_greedy(model, PROMPTS, NEW_TOKENS)


def _engine(model, config, max_draft_len, **kwargs) -> ReferenceEngine:
    limits = EngineLimits(max_batch_size=4, max_input_len=64, max_seq_len=160, max_draft_len=max_draft_len)
    return ReferenceEngine(model, limits=limits, end_id=-1, speculative_config=config, **kwargs)


def _run(engine, prompts=PROMPTS):
    return [engine.generate(GenerationRequest(list(p), NEW_TOKENS, end_id=-1)) for p in prompts]


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    torch.manual_seed(3)
    medusa = MedusaConfig(medusa_num_heads=3, medusa_num_layers=1, hidden_size=HIDDEN, vocab_size=VOCAB)
    eagle = EagleConfig(hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                        num_hidden_layers=1, rms_norm_eps=1e-6, max_position_embeddings=512)
    hot = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))[:96].tolist()
    token_map = str(write_token_map(root / "map.json", hot))
    return hot, {
        "draft_target": ({"decoding_type": "DraftTarget", "max_draft_len": 4, "speculative_token_map": token_map,
                          "speculative_model_dir": str(make_tiny_llama(root / "draft", seed=1, num_hidden_layers=1))}, 4),
        "medusa": ({"decoding_type": "Medusa", "num_medusa_heads": 3, "medusa_choices": [[0], [1], [0, 0], [0, 0, 0]],
                    "speculative_token_map": token_map,
                    "speculative_model_dir": str(save_medusa_heads(root / "medusa", MedusaHeads(medusa).heads.state_dict(), medusa))}, 4),
        "eagle": ({"decoding_type": "Eagle", "max_draft_len": 6, "num_eagle_layers": 3, "use_dynamic_tree": True,
                   "dynamic_tree_max_topK": 3, "speculative_token_map": token_map,
                   "speculative_model_dir": str(save_eagle_head(root / "eagle", EagleHead(eagle).state_dict(), eagle))}, 6),
    }


@pytest.mark.parametrize("method", ["draft_target", "medusa", "eagle"])
def test_decoding_with_a_token_map_equals_plain_greedy_and_drafts_only_its_tokens(model, plain, configs, method, monkeypatch):
    hot, by_method = configs
    config, k = by_method[method]
    engine = _engine(model, config, k)
    drafted: list[int] = []
    from specbuild.engine import worker

    original = worker.Worker._check_block  # every block drafted, alone or in a batched draft

    def record(self, block):
        drafted.extend(block.tokens[1:])
        return original(self, block)

    monkeypatch.setattr(worker.Worker, "_check_block", record)
    results = _run(engine)
    assert [r.output_ids for r in results] == plain
    assert sum(r.total_draft_tokens for r in results) > 0
    assert drafted and set(drafted) <= set(hot), f"{method} drafted tokens outside the map"


def test_a_perfect_draft_is_accepted_only_within_the_map(model, tiny_checkpoint, plain, tmp_path):
    """The target as its own draft (its weights unrounded: ``draft_weights="float32"``): every draft is
    accepted with the whole vocabulary, none when the map holds none of the tokens the target says; the
    output is plain greedy's either way."""
    emitted = {t for out in plain for t in out}
    maps = {"all": list(range(VOCAB)), "none of the output": sorted(set(range(VOCAB)) - emitted)}
    accepted = {}
    for name, ids in maps.items():
        config = {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model_dir": str(tiny_checkpoint),
                  "speculative_token_map": str(write_token_map(tmp_path / f"{len(ids)}.json", ids))}
        results = _run(_engine(model, config, 3, draft_weights="float32"))
        assert [r.output_ids for r in results] == plain, name
        accepted[name] = sum(r.total_accepted_draft_tokens for r in results) / sum(r.total_draft_tokens for r in results)
    assert accepted["all"] == 1.0
    assert accepted["none of the output"] == 0.0


def test_a_tree_wider_than_the_map_is_refused(model, configs, tmp_path):
    _, by_method = configs
    config, k = by_method["eagle"]
    tiny_map = str(write_token_map(tmp_path / "two.json", [1, 2]))
    with pytest.raises(ValueError, match="the tree needs top-3 candidates, the token map has 2 tokens"):
        _engine(model, config | {"speculative_token_map": tiny_map}, k)
    with pytest.raises(FileNotFoundError, match="no token map at"):
        _engine(model, config | {"speculative_token_map": str(tmp_path / "absent.json")}, k)


# --- from a recipe into an engine directory -----------------------------------------------------


def _medusa_recipe(tmp_path, checkpoint, configs, *, token_map: str, extra: str = "", backend: str = "") -> Path:
    from conftest import write_recipe

    medusa_dir = configs[1]["medusa"][0]["speculative_model_dir"]
    speculation = (f"  method: medusa\n  medusa_model: {medusa_dir}\n  num_medusa_heads: 3\n"
                   f"  medusa_choices: [[0], [1], [0, 0]]\n  speculative_token_map: {token_map}\n")
    recipe = write_recipe(tmp_path / "r.yaml", checkpoint, method="medusa", speculation=speculation, extra=extra)
    if backend:
        recipe.write_text(recipe.read_text().replace("build:\n", f"build:\n  backend: {backend}\n"))
    return recipe


def test_a_recipe_names_a_missing_token_map_before_any_work(tmp_path, tiny_checkpoint, configs):
    from specbuild.builder.recipe import RecipeError, load_recipe
    from specbuild.pipeline import check_recipe

    loaded = load_recipe(str(_medusa_recipe(tmp_path, tiny_checkpoint, configs, token_map="absent.json")))
    with pytest.raises(RecipeError, match="speculation.speculative_token_map.*no token map at .*absent.json.*train.token_map_size"):
        check_recipe(loaded)
    train = "train:\n  prompts: prompts.txt\n  token_map_size: 64\n"
    loaded = load_recipe(str(_medusa_recipe(tmp_path, tiny_checkpoint, configs, token_map="absent.json", extra=train)))
    check_recipe(loaded)  # the train stage writes it


def test_the_plan_names_the_map_and_who_writes_it(tmp_path, tiny_checkpoint, configs):
    from specbuild.builder.recipe import load_recipe
    from specbuild.pipeline import RunPaths, plan_lines

    train = "train:\n  prompts: prompts.txt\n  token_map_size: 64\n"
    (tmp_path / "prompts.txt").write_text("def add(a, b):\n")  # plan reads the training prompts, as the run would
    loaded = load_recipe(str(_medusa_recipe(tmp_path, tiny_checkpoint, configs, token_map="map.json", extra=train)))
    lines = plan_lines(loaded, RunPaths(tmp_path / "out"))
    assert f"drafts    over a token map {tmp_path / 'map.json'} (written by the train stage: the target's 64 most frequent predictions)" in lines
    write_token_map(tmp_path / "map.json", [1, 2, 3])
    lines = plan_lines(loaded, RunPaths(tmp_path / "out"))
    assert f"drafts    over a token map {tmp_path / 'map.json'} (the draft scores only its tokens)" in lines


def test_tensorrt_llm_paths_refuse_a_token_map(tmp_path, tiny_checkpoint, configs):
    from specbuild.builder.recipe import RecipeError, load_recipe
    from specbuild.builder.trtllm_plan import check_recipe as check_trtllm

    (tmp_path / "map.json").write_text("[1, 2, 3]")
    loaded = load_recipe(str(_medusa_recipe(tmp_path, tiny_checkpoint, configs, token_map="map.json", backend="tensorrt")))
    with pytest.raises(RecipeError, match="TensorRT-LLM has no hot-token map.*remove speculative_token_map, or set build.backend: reference"):
        check_trtllm(loaded, "tensorrt", "1.2.0")


def test_the_engine_directory_carries_the_checked_map_and_decodes_with_it(tmp_path, tiny_checkpoint, configs, model):
    from specbuild.builder.recipe import RecipeError, load_recipe
    from specbuild.builder.reference import build_reference_engine

    hot, _ = configs
    write_token_map(tmp_path / "map.json", hot)
    loaded = load_recipe(str(_medusa_recipe(tmp_path, tiny_checkpoint, configs, token_map="map.json")))
    built = build_reference_engine(loaded, tmp_path / "engine", log=lambda m: None)
    config = json.loads((built.engine_dir / "config.json").read_text())
    assert config["speculative_config"]["speculative_token_map"] == "token_map.json"
    assert read_token_ids(built.engine_dir / "token_map.json", VOCAB) == hot
    engine = ReferenceEngine.from_engine_dir(built.engine_dir)
    assert engine.speculative_config["speculative_token_map"] == "token_map.json"
    results = _run(engine)
    assert [r.output_ids for r in results] == hf_greedy(model, PROMPTS, NEW_TOKENS)

    assert config["specbuild"]["draft_weights"] == "auto"  # build.draft_weights reaches the engine
    from specbuild.engine import rowgemm

    if rowgemm.library() is not None:  # auto: the heads' projections stream bfloat16 weights on a float32 CPU target
        assert {p.packed.packed.dtype for p in engine._method_state.proposer._projections} == {torch.bfloat16}
    recipe = _medusa_recipe(tmp_path, tiny_checkpoint, configs, token_map="map.json")
    recipe.write_text(recipe.read_text().replace("build:\n", "build:\n  draft_weights: float32\n"))
    kept = build_reference_engine(load_recipe(str(recipe)), tmp_path / "engine-f32", log=lambda m: None).engine_dir
    assert json.loads((kept / "config.json").read_text())["specbuild"]["draft_weights"] == "float32"
    engine = ReferenceEngine.from_engine_dir(kept)
    assert all(p.packed is None or p.packed.packed.dtype == torch.float32 for p in engine._method_state.proposer._projections)
    assert [r.output_ids for r in _run(engine)] == [r.output_ids for r in results]

    write_token_map(tmp_path / "map.json", hot[:40])  # a new map is a new engine
    assert build_reference_engine(loaded, tmp_path / "engine", log=lambda m: None).rebuilt
    (tmp_path / "map.json").write_text(json.dumps([1, VOCAB + 5]))
    with pytest.raises(RecipeError, match="speculation.speculative_token_map.*token id 389 at index 1 is outside the vocabulary"):
        build_reference_engine(loaded, tmp_path / "engine2", log=lambda m: None)
    assert not (tmp_path / "engine2").exists()
