"""``specbuild check-draft``: seeded defects each fail with a message naming the field and the fix; the
project's own EAGLE-3 / EAGLE / Medusa / draft-model layouts pass (as the train code writes them); the
published EAGLE-3 head config the llama recipes name passes; the export loads in every engine's terms;
the engines' expectations agree with the loader facts in tests/data/eagle3_loaders.json.

Target: a tiny random 8-layer Llama (fp32, 384 tokens); heads written by the project's save functions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from specbuild.builder.check_draft import EAGLE3_LOADERS, ENGINES, check_draft, detect_method
from specbuild.builder.draft_export import export_eagle3
from specbuild.builder.draft_files import CheckpointFiles, DraftFileError
from specbuild.cli import main
from specbuild.methods.eagle.engine import EagleHead, save_eagle_head
from specbuild.methods.eagle3.engine import Eagle3Config, Eagle3Head, load_eagle3_head, save_eagle3_head
from specbuild.methods.medusa.engine import MedusaConfig, MedusaHeads, save_medusa_heads
from specbuild.methods.eagle.train import eagle_config_for
from specbuild.methods.eagle3.train import eagle3_config_for
from conftest import write_recipe
from tiny_models import make_tiny_llama

DATA = Path(__file__).parent / "data"
LAYERS, DRAFT_VOCAB = 8, 96


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("target") / "ckpt", seed=1, num_hidden_layers=LAYERS)


@pytest.fixture(scope="module")
def target_config(target):
    return AutoConfig.from_pretrained(target)


@pytest.fixture(scope="module")
def project_eagle3(tmp_path_factory, target_config) -> Path:
    """The EAGLE-3 head as methods/eagle3/train.py writes it: the target's lm_head (none of its own), no d2t."""
    config = eagle3_config_for(target_config)
    torch.manual_seed(3)
    return save_eagle3_head(tmp_path_factory.mktemp("e3") / "head", Eagle3Head(config, lm_head=False).state_dict(), config)


@pytest.fixture(scope="module")
def draft_vocab_eagle3(tmp_path_factory, target_config) -> Path:
    """An EAGLE-3 head with its own 96-token lm_head and d2t (draft id d -> target id 3 d)."""
    config = Eagle3Config(**{**eagle3_config_for(target_config).__dict__, "draft_vocab_size": DRAFT_VOCAB})
    torch.manual_seed(4)
    head = Eagle3Head(config, d2t=True)
    head.d2t.copy_(torch.arange(DRAFT_VOCAB) * 2)
    return save_eagle3_head(tmp_path_factory.mktemp("e3v") / "head", head.state_dict(), config)


def _copy(src: Path, dst: Path, *, config: dict | None = None, tensors: dict | None = None, drop: tuple[str, ...] = ()) -> Path:
    """``src`` copied to ``dst`` with config.json keys and tensors replaced (a seeded defect)."""
    shutil.copytree(src, dst)
    if config is not None:
        raw = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**raw, **config}))
    if tensors is not None or drop:
        state = {k: v for k, v in load_file(str(dst / "model.safetensors")).items() if k not in drop}
        save_file({**state, **(tensors or {})}, str(dst / "model.safetensors"))
    return dst


def _failed(result) -> dict[str, str]:
    return {f.check: f"{f.detail} | fix: {f.fix}" for f in result.findings if f.status == "fail"}


def _target_embedding(target: Path) -> torch.Tensor:
    return load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]


# --- the project's own layouts ---------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_project_eagle3_head_passes_every_engine(project_eagle3, target, engine):
    result = check_draft(project_eagle3, target, engine=engine)
    assert result.method == "eagle3"
    assert result.ok, _failed(result)
    assert {f.check for f in result.findings} >= {"architecture", "hidden size", "vocab_size", "lm_head", "d2t",
                                                  "aux layer ids", "rope", "embed_tokens", "dtype", "tensors"}
    assert {f.check: f.detail for f in result.findings}["lm_head"].startswith("no lm_head.weight: ")


def test_sglang_leaves_a_missing_lm_head_unloaded_when_a_draft_vocabulary_is_declared(draft_vocab_eagle3, target, tmp_path):
    head = _copy(draft_vocab_eagle3, tmp_path / "no_lm_head", drop=("lm_head.weight", "d2t"))
    assert "SGLang leaves lm_head unloaded when config.json has draft_vocab_size" in _failed(check_draft(head, target, engine="sglang"))["lm_head"]
    assert "the target's lm_head has 384 rows" in _failed(check_draft(head, target, engine="vllm"))["lm_head"]


def test_export_writes_the_portable_layout(project_eagle3, target, tmp_path):
    torch.manual_seed(0)
    third_party = _copy(project_eagle3, tmp_path / "third_party", tensors={"embed_tokens.weight": torch.randn(384, 64)})
    state = load_file(str(third_party / "model.safetensors"))
    save_file({("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in state.items()},
              str(third_party / "model.safetensors"))
    assert not check_draft(third_party, target, engine="sglang").ok and not check_draft(third_party, target, engine="vllm").ok

    out = export_eagle3(third_party, target, tmp_path / "portable")
    for engine in ENGINES:
        result = check_draft(out, target, engine=engine)
        assert result.ok, (engine, _failed(result))
    exported = CheckpointFiles.open(out)
    assert exported.config["draft_vocab_size"] == exported.config["vocab_size"] == 384
    assert exported.config["architectures"] == ["LlamaForCausalLMEagle3"] and exported.config["tie_word_embeddings"] is False
    assert "embed_tokens.weight" not in exported.tensors and "midlayer.hidden_norm.weight" in exported.tensors
    lm_head = load_file(str(out / "model.safetensors"))["lm_head.weight"]
    assert torch.equal(lm_head, load_file(str(target / "model.safetensors"))["lm_head.weight"])
    load_eagle3_head(out)  # the reference engine loads the exported layout
    with pytest.raises(DraftFileError, match="is the draft directory itself"):
        export_eagle3(out, target, out)


def test_draft_vocabulary_head_with_d2t_passes_every_engine(draft_vocab_eagle3, target):
    for engine in ENGINES:
        result = check_draft(draft_vocab_eagle3, target, engine=engine)
        assert result.ok, (engine, _failed(result))
    d2t = {f.check: f.detail for f in result.findings}["d2t"]
    assert "96 draft ids -> distinct target ids in [0, 285]" in d2t


def test_layers0_names_load_in_trtllm_and_vllm_but_not_sglang(draft_vocab_eagle3, target, tmp_path):
    state = load_file(str(draft_vocab_eagle3 / "model.safetensors"))
    renamed = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in state.items()}
    head = tmp_path / "layers0"
    shutil.copytree(draft_vocab_eagle3, head)
    save_file(renamed, str(head / "model.safetensors"))
    assert check_draft(head, target, engine="vllm").ok and check_draft(head, target, engine="trtllm").ok
    assert "rename layers.0.* to midlayer.*" in _failed(check_draft(head, target, engine="sglang"))["tensors"]


def test_project_eagle_medusa_and_draft_model_layouts_pass(tmp_path, target, target_config):
    config = eagle_config_for(target_config)
    eagle = save_eagle_head(tmp_path / "eagle", EagleHead(config).state_dict(), config)
    medusa_config = MedusaConfig(medusa_num_heads=3, medusa_num_layers=1, hidden_size=64, vocab_size=target_config.vocab_size)
    medusa = save_medusa_heads(tmp_path / "medusa", MedusaHeads(medusa_config).heads.state_dict(), medusa_config)
    draft = make_tiny_llama(tmp_path / "draft", seed=7, hidden_size=32, num_hidden_layers=1)
    for path, method in ((eagle, "eagle"), (medusa, "medusa"), (draft, "draft_target")):
        assert detect_method(CheckpointFiles.open(path)) == method
        for engine in ("reference", "trtllm"):
            result = check_draft(path, target, engine=engine)
            assert result.method == method and result.ok, (method, engine, _failed(result))


# --- seeded defects -----------------------------------------------------------------------------------------


def test_wrong_hidden_size_names_both_sizes(tmp_path, target, target_config):
    config = Eagle3Config(**{**eagle3_config_for(target_config).__dict__, "hidden_size": 32, "intermediate_size": 64,
                             "head_dim": 8, "target_hidden_size": None})
    head = save_eagle3_head(tmp_path / "h32", Eagle3Head(config, lm_head=False).state_dict(), config)
    failed = _failed(check_draft(head, target))
    assert "hidden_size=32 but the target's is 64" in failed["hidden size"]
    assert "train the head on this target" in failed["hidden size"]


def test_random_embed_tokens_fail_for_vllm_and_are_flagged_elsewhere(project_eagle3, target, tmp_path):
    embedding = _target_embedding(target)
    torch.manual_seed(0)
    random = _copy(project_eagle3, tmp_path / "random", tensors={"embed_tokens.weight": torch.randn_like(embedding)})
    failed = _failed(check_draft(random, target, engine="vllm"))
    assert "differs from the target's embeddings" in failed["embed_tokens"] and "TorchSpec#38" in failed["embed_tokens"]
    assert "remove embed_tokens.weight" in failed["embed_tokens"]
    sglang = {f.check: f for f in check_draft(random, target, engine="sglang").findings}["embed_tokens"]
    assert sglang.status == "warn" and "ignored by SGLang" in sglang.detail

    same = _copy(project_eagle3, tmp_path / "same", tensors={"embed_tokens.weight": embedding.clone()})
    embed = {f.check: f for f in check_draft(same, target, engine="vllm").findings}["embed_tokens"]
    assert embed.status == "ok" and "equal to the target's" in embed.detail


def test_missing_model_type_fails_for_vllm_and_tensorrt_llm_and_warns_for_sglang(project_eagle3, target, tmp_path):
    """vLLM (observed) and TensorRT-LLM (config_utils.load_pretrained_config -> AutoConfig) parse the head's
    config.json with transformers' AutoConfig, which refuses one without model_type."""
    raw = json.loads((project_eagle3 / "config.json").read_text())
    assert raw["model_type"] == "llama"  # the trainer writes it
    head = _copy(project_eagle3, tmp_path / "no_model_type")
    (head / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if k != "model_type"}))
    failed = _failed(check_draft(head, target, engine="vllm"))
    assert list(failed) == ["model_type"]
    assert "Should have a `model_type` key" in failed["model_type"] and '"model_type": "llama"' in failed["model_type"]
    assert check_draft(head, target, engine="vllm", method="eagle3", config_only=True).failed[0].check == "model_type"
    statuses = {e: {f.check: f.status for f in check_draft(head, target, engine=e).findings}["model_type"] for e in ENGINES}
    assert statuses == {"reference": "ok", "trtllm": "fail", "vllm": "fail", "sglang": "warn"}
    exported = export_eagle3(head, target, tmp_path / "exported")
    assert check_draft(exported, target, engine="vllm").ok


def test_d2t_out_of_range_is_refused(draft_vocab_eagle3, target, tmp_path):
    bad = _copy(draft_vocab_eagle3, tmp_path / "d2t", tensors={"d2t": torch.arange(DRAFT_VOCAB, dtype=torch.int64) * 4})
    failed = _failed(check_draft(bad, target, engine="sglang"))
    assert "map outside the target vocabulary [0, 384)" in failed["d2t"] and "d2t[i] = target_id - i" in failed["d2t"]

    missing = _copy(draft_vocab_eagle3, tmp_path / "no_d2t", drop=("d2t",))
    assert "draft id i would be read as target id i" in _failed(check_draft(missing, target, engine="vllm"))["d2t"]


def test_wrong_architecture_name(draft_vocab_eagle3, target, tmp_path):
    head = _copy(draft_vocab_eagle3, tmp_path / "arch", config={"architectures": ["MedusaModel"]})
    for engine in ("reference", "vllm", "sglang"):
        failed = _failed(check_draft(head, target, engine=engine, method="eagle3"))
        assert "['MedusaModel']" in failed["architecture"] and "LlamaForCausalLMEagle3" in failed["architecture"]
    assert check_draft(head, target, engine="trtllm", method="eagle3").ok  # TensorRT-LLM does not read the name
    llama = _copy(draft_vocab_eagle3, tmp_path / "llama", config={"architectures": ["LlamaForCausalLM"]})
    assert check_draft(llama, target, engine="vllm", method="eagle3").ok  # vLLM maps it to Eagle3LlamaForCausalLM
    assert "architecture" in _failed(check_draft(llama, target, engine="sglang", method="eagle3"))


def test_small_lm_head_against_a_full_vocabulary_config(draft_vocab_eagle3, target, tmp_path):
    """EAGLE#249: a 32k lm_head whose config.json declares no draft_vocab_size (so 128k rows are built)."""
    raw = json.loads((draft_vocab_eagle3 / "config.json").read_text())
    del raw["draft_vocab_size"]
    head = tmp_path / "small_head"
    shutil.copytree(draft_vocab_eagle3, head)
    (head / "config.json").write_text(json.dumps(raw))
    for engine in ENGINES:
        failed = _failed(check_draft(head, target, engine=engine))
        assert "lm_head.weight has 96 rows but config.json says no draft_vocab_size, so vocab_size=384" in failed["lm_head"]
        assert 'set "draft_vocab_size": 96' in failed["lm_head"]


def test_pickled_weights_are_refused_unopened(project_eagle3, target, tmp_path):
    head = tmp_path / "pickled"
    head.mkdir()
    shutil.copy(project_eagle3 / "config.json", head)
    (head / "pytorch_model.bin").write_bytes(b"not a pickle; never opened")
    failed = _failed(check_draft(head, target))
    assert "only PyTorch pickles (pytorch_model.bin); check-draft never unpickles" in failed["weights"]


# --- the published head the llama recipes name ------------------------------------------------------------


def test_public_eagle3_head_config_passes_for_every_engine(tmp_path):
    head, target = tmp_path / "head", tmp_path / "target"
    head.mkdir(), target.mkdir()
    shutil.copy(DATA / "yuhuili-EAGLE3-LLaMA3.1-Instruct-8B.config.json", head / "config.json")
    shutil.copy(DATA / "meta-llama-Llama-3.1-8B-Instruct.config.json", target / "config.json")
    for engine in ENGINES:
        result = check_draft(head, target, engine=engine, method="eagle3", config_only=True)
        assert result.ok, (engine, _failed(result))
        found = {f.check: f for f in result.findings}
        assert found["draft_vocab_size"].detail == "32000 of 128256, mapped by d2t"
        assert found["rope"].status == "warn"  # the head's own rope (theta 10000, 2048 positions), not Llama 3.1's


# --- the loaders' facts, the CLI -----------------------------------------------------------------------------


def test_engine_expectations_agree_with_the_recorded_loader_facts():
    facts = json.loads((DATA / "eagle3_loaders.json").read_text())["engines"]
    assert set(facts) == set(EAGLE3_LOADERS) == set(ENGINES)
    for engine, loader in EAGLE3_LOADERS.items():
        recorded = facts[engine]
        assert (None if recorded["architectures"] is None else tuple(recorded["architectures"])) == loader.architectures
        assert loader.uses_own_embed_tokens == recorded["embed_tokens"].startswith("checkpoint")
        when = {"target": "always", "unloaded": "never", "target only when draft_vocab_size is absent, else unloaded": "without_draft_vocab_size"}
        assert when[recorded["lm_head_when_absent"]] == loader.lm_head_from_target
        assert loader.aux_ids_count_inputs == recorded["aux_layer_ids"].startswith("layer inputs")
        assert loader.needs_model_type == (recorded["model_type"] == "required")
        assert all("repo" in s for s in recorded["sources"])


def test_cli_table_json_and_exit_codes(project_eagle3, draft_vocab_eagle3, target, tmp_path):
    runner = CliRunner()
    ok = runner.invoke(main, ["check-draft", str(project_eagle3), "--target", str(target)])
    assert ok.exit_code == 0, ok.output
    rows = ok.output.splitlines()[2:]  # after the two header lines naming the directories
    assert "d2t" in ok.output and max(len(line) for line in rows) <= 80
    bad = _copy(draft_vocab_eagle3, tmp_path / "bad", tensors={"d2t": torch.full((DRAFT_VOCAB,), 1000, dtype=torch.int64)})
    failed = runner.invoke(main, ["check-draft", str(bad), "--target", str(target), "--engine", "vllm", "--json"])
    assert failed.exit_code == 4
    report = json.loads(failed.output)
    assert report["ok"] is False and report["engine"] == "vllm"
    assert [c["check"] for c in report["checks"] if c["status"] == "fail"] == ["d2t"]
    missing = runner.invoke(main, ["check-draft", str(tmp_path / "nowhere"), "--target", str(target)])
    assert missing.exit_code == 2 and "no such directory" in missing.output


def test_plan_runs_the_check_for_a_recipe_with_a_local_draft(project_eagle3, draft_vocab_eagle3, target, tmp_path):
    runner = CliRunner()
    recipe = write_recipe(tmp_path / "r.yaml", target, speculation=f"  method: eagle3\n  eagle_model: {project_eagle3}\n  max_draft_len: 3\n")
    plan = runner.invoke(main, ["plan", str(recipe), "--json"])
    assert plan.exit_code == 0, plan.output
    lines = [s for s in json.loads(plan.output)["lines"] if s.startswith("check ")]
    assert lines == [f"check     draft {project_eagle3} for the reference engine: 14 checks: 14 ok"]

    bad = _copy(draft_vocab_eagle3, tmp_path / "bad", tensors={"d2t": torch.full((DRAFT_VOCAB,), 1000, dtype=torch.int64)})
    recipe = write_recipe(tmp_path / "bad.yaml", target, speculation=f"  method: eagle3\n  eagle_model: {bad}\n  max_draft_len: 3\n")
    plan = runner.invoke(main, ["plan", str(recipe), "--json"])
    assert plan.exit_code == 0, plan.output  # the plan shows the failure; the build refuses the head when it loads it
    [line] = [s for s in json.loads(plan.output)["lines"] if s.startswith("check ")]
    assert "1 fail (d2t)" in line and f"run: specbuild check-draft {bad} --target {target} --engine reference" in line


# --- loader contracts beyond the table (upstream sources: module docstring) ---------------------------------


def _statuses(head: Path, target: Path, check: str) -> dict[str, str]:
    """engine -> the status of ``check`` ("absent" where the engine does not report it)."""
    return {e: next((f.status for f in check_draft(head, target, engine=e).findings if f.check == check), "absent") for e in ENGINES}


@pytest.mark.parametrize("config", [
    {"hidden_size": "64"}, {"num_attention_heads": 0}, {"eagle_config": [1, 3, 5]}, {"rope_scaling": [1, 2]},
    {"architectures": "LlamaForCausalLMEagle3"}, {"draft_vocab_size": "96"}, {"eagle_aux_hidden_state_layer_ids": "1,3,5"},
    {"rms_norm_eps": True}, {"tie_word_embeddings": "false"},
], ids=lambda c: next(iter(c)))
def test_a_config_value_of_the_wrong_json_type_is_named_not_a_traceback(project_eagle3, target, tmp_path, config):
    head = _copy(project_eagle3, tmp_path / "bad", config=config)
    key = next(iter(config))
    for engine in ENGINES:
        failed = _failed(check_draft(head, target, engine=engine))
        assert list(failed) == ["config.json"] and f"{key} is {json.dumps(config[key])}" in failed["config.json"], failed
    with pytest.raises(DraftFileError, match=key):
        export_eagle3(head, target, tmp_path / "exported")
    result = CliRunner().invoke(main, ["check-draft", str(head), "--target", str(target)])
    assert result.exit_code == 4 and "Traceback" not in result.output and key in result.output


def test_a_head_without_fc_is_refused_by_every_engine(project_eagle3, target, tmp_path):
    """Every engine builds fc for three captured layers; a checkpoint without it leaves fc random."""
    head = _copy(project_eagle3, tmp_path / "no_fc", drop=("fc.weight",))
    for engine in ENGINES:
        assert "missing fc.weight" in _failed(check_draft(head, target, engine=engine))["tensors"]


def test_num_hidden_layers_missing_or_more_than_one(project_eagle3, target, tmp_path):
    raw = json.loads((project_eagle3 / "config.json").read_text())
    missing = _copy(project_eagle3, tmp_path / "missing")
    (missing / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if k != "num_hidden_layers"}))
    assert _statuses(missing, target, "num_hidden_layers") == {"reference": "ok", "trtllm": "fail", "vllm": "fail", "sglang": "fail"}
    assert '"num_hidden_layers": 1' in _failed(check_draft(missing, target, engine="vllm"))["num_hidden_layers"]
    two = _copy(project_eagle3, tmp_path / "two", config={"num_hidden_layers": 2})
    assert _statuses(two, target, "num_hidden_layers") == {"reference": "fail", "trtllm": "warn", "vllm": "warn", "sglang": "fail"}


def test_engine_specific_config_flags(project_eagle3, target, tmp_path):
    tied = _copy(project_eagle3, tmp_path / "tied", config={"tie_word_embeddings": True})
    assert {e: s for e, s in _statuses(tied, target, "lm_head").items() if s == "fail"} == {"trtllm": "fail", "sglang": "fail"}
    norm = _copy(project_eagle3, tmp_path / "norm", config={"norm_before_residual": True})
    assert _statuses(norm, target, "norm_before_residual") == {"reference": "fail", "trtllm": "warn", "vllm": "ok", "sglang": "warn"}
    raw = json.loads((project_eagle3 / "config.json").read_text())
    ids = [1, 3, 5]
    top = _copy(project_eagle3, tmp_path / "top")
    (top / "config.json").write_text(json.dumps({**{k: v for k, v in raw.items() if k != "eagle_config"},
                                                 "eagle_aux_hidden_state_layer_ids": ids}))
    for engine in ("reference", "sglang"):  # they read eagle_config.eagle_aux_hidden_state_layer_ids only
        warned = [f for f in check_draft(top, target, engine=engine).findings if f.check == "aux layer ids" and f.status == "warn"]
        assert warned and "reads eagle_config.eagle_aux_hidden_state_layer_ids only" in warned[0].detail
    no_eps = _copy(project_eagle3, tmp_path / "no_eps")
    (no_eps / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if k != "rms_norm_eps"}))
    assert "rms_norm_eps" in _failed(check_draft(no_eps, target, engine="reference"))["config keys"]
    assert check_draft(no_eps, target, engine="vllm").ok


def test_d2t_contracts_tensorrt_llm_and_t2d(project_eagle3, draft_vocab_eagle3, target, target_config, tmp_path):
    """A full-size vocabulary with a permuting d2t: TensorRT-LLM has no d2t then; a t2d that contradicts d2t is named."""
    vocab = target_config.vocab_size
    permuted = _copy(project_eagle3, tmp_path / "permuted", config={"draft_vocab_size": vocab}, tensors={
        "lm_head.weight": torch.randn(vocab, target_config.hidden_size),
        "d2t": torch.roll(torch.arange(vocab), 1) - torch.arange(vocab)})
    statuses = _statuses(permuted, target, "d2t")
    assert statuses["trtllm"] == "fail" and statuses["vllm"] == statuses["sglang"] == "warn"
    ids = torch.arange(DRAFT_VOCAB) * 2  # the fixture's d2t: draft d -> target 3 d
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True  # marks target ids d2t[d], as if d2t held target ids rather than offsets
    wrong = _copy(draft_vocab_eagle3, tmp_path / "t2d", tensors={"t2d": t2d})
    finding = next(f for f in check_draft(wrong, target, engine="vllm").findings if f.check == "t2d")
    assert finding.status == "warn" and "disagree" in finding.detail
    right = torch.zeros(vocab, dtype=torch.bool)
    right[torch.arange(DRAFT_VOCAB) * 3] = True
    assert next(f for f in check_draft(_copy(draft_vocab_eagle3, tmp_path / "t2d_ok", tensors={"t2d": right}), target,
                                       engine="vllm").findings if f.check == "t2d").status == "ok"


def test_a_head_narrower_than_the_target_needs_its_own_embeddings(target, target_config, tmp_path):
    """target_hidden_size: fc reads 3 x the target's width into a narrower head, which embeds tokens itself."""
    wide = eagle3_config_for(target_config)
    narrow = Eagle3Config(**{**wide.__dict__, "hidden_size": wide.hidden_size // 2, "intermediate_size": wide.intermediate_size // 2,
                             "target_hidden_size": wide.hidden_size, "head_dim": wide.hidden_size // 2 // wide.num_attention_heads})
    torch.manual_seed(5)
    state = Eagle3Head(narrow, lm_head=True).state_dict()
    head = save_eagle3_head(tmp_path / "narrow", state, narrow)
    with_embed = _copy(head, tmp_path / "with", tensors={"embed_tokens.weight": torch.randn(target_config.vocab_size, narrow.hidden_size)})
    for engine in ("trtllm", "vllm", "sglang"):
        assert check_draft(with_embed, target, engine=engine).ok, _failed(check_draft(with_embed, target, engine=engine))
        assert "embed_tokens" in _failed(check_draft(head, target, engine=engine))
    assert "hidden size" in _failed(check_draft(with_embed, target, engine="reference"))


def test_the_reference_keys_are_the_engines_own():
    from specbuild.builder.check_draft import REFERENCE_EAGLE3_KEYS

    assert REFERENCE_EAGLE3_KEYS == Eagle3Config.REQUIRED


@pytest.fixture(scope="module")
def project_eagle(tmp_path_factory, target_config) -> Path:
    config = eagle_config_for(target_config)
    torch.manual_seed(6)
    return save_eagle_head(tmp_path_factory.mktemp("e1") / "head", EagleHead(config).state_dict(), config)


def test_eagle_head_tensors_are_checked_as_the_engine_loads_them(project_eagle, target, tmp_path):
    """A reshaped or missing projection, or more layers in config.json than in the file: the engine refuses
    them at build time, so the check must too."""
    name = "layers.0.self_attn.q_proj.weight"
    reshaped = _copy(project_eagle, tmp_path / "reshaped", tensors={name: torch.zeros(10, 10)})
    assert f"{name} [10, 10]" in _failed(check_draft(reshaped, target))["tensors"]
    assert f"missing {name}" in _failed(check_draft(_copy(project_eagle, tmp_path / "dropped", drop=(name,)), target))["tensors"]
    three = _copy(project_eagle, tmp_path / "three", config={"num_hidden_layers": 3})
    assert "missing layers.1." in _failed(check_draft(three, target))["tensors"]
    as_model = _failed(check_draft(project_eagle, target, method="draft_target"))
    assert "not a whole causal LM" in as_model["weights"] and "--method eagle" in as_model["weights"]


def test_export_writes_only_eagle3_heads_into_a_new_or_earlier_export_folder(project_eagle, project_eagle3, target, tmp_path):
    with pytest.raises(ValueError, match="not an EAGLE-3 head"):
        export_eagle3(project_eagle, target, tmp_path / "e1-out")
    assert not (tmp_path / "e1-out").exists()
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(DraftFileError, match="is a file"):
        export_eagle3(project_eagle3, target, tmp_path / "afile")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me")
    with pytest.raises(DraftFileError, match="holds other files"):
        export_eagle3(project_eagle3, target, busy)
    assert sorted(p.name for p in busy.iterdir()) == ["notes.txt"]
    with pytest.raises(DraftFileError, match="empty"):
        export_eagle3(project_eagle3, target, Path(""))
    out = export_eagle3(project_eagle3, target, tmp_path / "out")
    again = export_eagle3(project_eagle3, target, out)  # an earlier export is replaced
    assert check_draft(again, target, engine="vllm").ok


def test_a_file_for_the_draft_or_a_weights_file_without_tensors_is_named(project_eagle3, target, tmp_path):
    with pytest.raises(DraftFileError, match="is a file; give the checkpoint directory"):
        check_draft(project_eagle3 / "model.safetensors", target)
    empty = _copy(project_eagle3, tmp_path / "empty")
    save_file({}, str(empty / "model.safetensors"))
    assert "model.safetensors hold(s) no tensors" in _failed(check_draft(empty, target))["weights"]
    odd = _copy(project_eagle3, tmp_path / "odd", config={"text_config": [1, 2]})
    check_draft(odd, target)  # a text_config that is not an object is not merged (no traceback)


def test_an_opt_draft_model_passes_as_a_whole_causal_lm(target, tmp_path):
    """OPT names its layers model.decoder.layers.N (vLLM's example draft, facebook/opt-125m)."""
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(vocab_size=384, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2,
                       word_embed_proj_dim=32, max_position_embeddings=512)
    OPTForCausalLM(config).save_pretrained(tmp_path / "opt")
    result = check_draft(tmp_path / "opt", target, engine="trtllm", method="draft_target")
    assert result.ok, _failed(result)
