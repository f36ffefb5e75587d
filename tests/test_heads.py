"""What the draft-head formats share (methods/head_files.py): where the head directory is (resolved by
the method, methods/base.py), which weight file is read (pickles only with ``weights_only=True``), the
name/shape check and its messages. Each format's own tensors and config keys are tested in
tests/test_medusa.py, tests/test_eagle.py and tests/test_eagle3.py."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from specbuild.methods.eagle.engine import EagleConfig, load_eagle_head
from specbuild.methods.eagle3.engine import Eagle3Config, load_eagle3_head
from specbuild.methods.head_files import HeadFiles, check_state, check_tree_attention, known_keys, read_config_json
from specbuild.methods.medusa.engine import MEDUSA_FILES, load_medusa_heads
from specbuild.methods import registered

FILES = HeadFiles(safetensors="w.safetensors", pickles=("w.bin", "w.pt"))
SIZES = {"hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
         "rms_norm_eps": 1e-6, "max_position_embeddings": 64}
# format -> (loader, config.json, its first pickle name)
FORMATS = {
    "medusa": (load_medusa_heads, {"medusa_num_heads": 1, "medusa_num_layers": 1, "hidden_size": 8, "vocab_size": 16}, "medusa_lm_head.pt"),
    "eagle": (load_eagle_head, {**SIZES, "num_hidden_layers": 1}, "pytorch_model.bin"),
    "eagle3": (load_eagle3_head, Eagle3Config(**SIZES, vocab_size=16).to_json(), "model.pt"),
}


@pytest.mark.parametrize(
    "model_dir, base_dir, expected",
    [(None, Path("/e"), Path("/e/medusa")), ("h", Path("/e"), Path("/e/h")), ("/abs/h", Path("/e"), Path("/abs/h")), ("h", None, Path("h"))],
)
def test_resolve_takes_speculative_model_dir_against_the_engine_dir(model_dir, base_dir, expected):
    config = {"decoding_type": "Medusa"} | ({} if model_dir is None else {"speculative_model_dir": model_dir})
    assert Path(registered()["medusa"].parse_speculative_config(config, base_dir=base_dir).medusa_model) == expected


def test_resolve_needs_a_directory_outside_an_engine_dir():
    with pytest.raises(ValueError, match=r"speculative_config needs speculative_model_dir \(the Medusa head directory\)"):
        registered()["medusa"].parse_speculative_config({"decoding_type": "Medusa"})


def test_builder_subdirs_are_the_engine_dir_layout():
    subdirs = {name: registered()[name].weights.reference.subdir for name in ("draft_target", "medusa", "eagle", "eagle3")}
    assert subdirs == {"draft_target": "draft", "medusa": "medusa", "eagle": "eagle", "eagle3": "eagle3"}


def test_read_prefers_safetensors_then_pickles_in_order(tmp_path):
    torch.save({"x": torch.full((2,), 2.0)}, tmp_path / "w.pt")
    assert FILES.read(tmp_path)["x"].tolist() == [2.0, 2.0]
    torch.save({"x": torch.full((2,), 1.0)}, tmp_path / "w.bin")
    assert FILES.read(tmp_path)["x"].tolist() == [1.0, 1.0]
    save_file({"x": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    assert FILES.read(tmp_path)["x"].tolist() == [0.0, 0.0]


def test_read_names_the_files_it_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"none of \['w.safetensors', 'w.bin', 'w.pt'\] found"):
        FILES.read(tmp_path)
    with pytest.raises(FileNotFoundError, match="neither medusa_lm_head.safetensors nor medusa_lm_head.pt found"):
        MEDUSA_FILES.read(tmp_path)


class _NotAWeight:
    pass


@pytest.mark.parametrize("format_name", list(FORMATS))
def test_every_format_reads_pickles_weights_only(tmp_path, format_name):
    """A .pt/.bin holding anything but tensors is refused before anything in it runs."""
    load, config, pickle_name = FORMATS[format_name]
    (tmp_path / "config.json").write_text(json.dumps(config))
    torch.save({"fc.weight": _NotAWeight()}, tmp_path / pickle_name)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load(tmp_path)


@pytest.mark.parametrize(
    "format_name, message",
    [("medusa", "not a Medusa head directory"), ("eagle", "not an EAGLE head directory"), ("eagle3", "not an EAGLE-3 head directory")],
)
def test_every_format_needs_its_config_json(tmp_path, format_name, message):
    with pytest.raises(FileNotFoundError, match=f"config.json not found: {message}"):
        FORMATS[format_name][0](tmp_path)


def test_read_config_json_and_known_keys(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config.json not found: not a test head"):
        read_config_json(tmp_path, not_a="a test head")
    (tmp_path / "config.json").write_text(json.dumps({**SIZES, "num_hidden_layers": 1, "head_dim": None, "other": 1}))
    raw = read_config_json(tmp_path, not_a="a test head")
    assert known_keys(EagleConfig, raw, "c.json") == {**SIZES, "num_hidden_layers": 1}  # None -> default, unknown dropped
    with pytest.raises(ValueError, match=r"c.json: missing key\(s\) \['intermediate_size', 'num_attention_heads'"):
        known_keys(EagleConfig, {"hidden_size": 8}, "c.json")


def test_check_state_messages(tmp_path):
    expected = {"a": (2, 3), "b": (4,)}
    check_state({"a": torch.zeros(2, 3), "b": torch.zeros(4)}, expected, tmp_path, mismatch="m")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path))}: weights do not fit: missing \['b'\], unexpected \['c'\]$"):
        check_state({"a": torch.zeros(2, 3), "c": torch.zeros(1)}, expected, tmp_path, mismatch="weights do not fit")
    check_state({"a": torch.zeros(2, 3), "b": torch.zeros(4), "c": torch.zeros(1)}, expected, tmp_path, mismatch="m", extra=("c",))
    with pytest.raises(ValueError, match=r"tensor a has shape \(3, 2\), expected \(2, 3\)"):
        check_state({"a": torch.zeros(3, 2), "b": torch.zeros(4)}, expected, tmp_path, mismatch="m")


def test_tree_methods_need_a_mask_attention():
    for attention in ("sdpa", "eager", "specbuild_sdpa"):  # specbuild_sdpa: the engine's own (engine/attention.py)
        check_tree_attention(SimpleNamespace(config=SimpleNamespace(_attn_implementation=attention)), "Medusa")
    flash = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    with pytest.raises(ValueError, match=r"EAGLE tree verification needs the target's attn_implementation in \('eager', 'sdpa', 'specbuild_sdpa'\), it uses 'flash_attention_2'"):
        check_tree_attention(flash, "EAGLE")


