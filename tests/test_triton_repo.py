"""Triton repository generation: configs parse with Triton's own schema, tensor names match
TensorRT-LLM's, and the engine model's tensor conversion round-trips real engine results."""

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from conftest import write_recipe
from specbuild.builder.recipe import load_recipe
from specbuild.builder.reference import build_reference_engine, read_fingerprint
from specbuild.runtime import ReferenceEngine
from specbuild.engine.types import GenerationRequest
from specbuild.triton_repo.reference_repository import (
    REPO_METADATA,
    spec_from_engine_dir,
    write_reference_repository,
)
from specbuild.triton_repo.models.reference_engine import pack_outputs, parse_batch
from specbuild.triton_repo.pbtxt import ModelConfig, Tensor, quote, render


def parse_pbtxt(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.fixture(scope="module")
def engine_dir(tiny_checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("build")
    loaded = load_recipe(str(write_recipe(out / "r.yaml", tiny_checkpoint)))
    return build_reference_engine(loaded, out / "engine", log=lambda m: None).engine_dir


def test_every_generated_config_parses_with_tritons_schema(engine_dir, tmp_path):
    repo = write_reference_repository(spec_from_engine_dir(engine_dir, instance_count=2), tmp_path / "repo")
    configs = {p.parent.name: parse_pbtxt(p) for p in repo.glob("*/config.pbtxt")}
    assert set(configs) == {"ensemble", "preprocessing", "tensorrt_llm", "postprocessing"}
    for name in ("preprocessing", "tensorrt_llm", "postprocessing"):
        assert configs[name].backend == "python" and (repo / name / "1" / "model.py").is_file()
    assert configs["tensorrt_llm"].instance_group[0].count == 2
    ensemble = configs["ensemble"]
    assert ensemble.platform == "ensemble" and (repo / "ensemble" / "1").is_dir()
    inputs = {t.name: t for t in ensemble.input}
    outputs = {t.name for t in ensemble.output}
    assert not inputs["text_input"].optional and not inputs["max_tokens"].optional
    assert inputs["num_draft_tokens"].optional and inputs["return_perf_metrics"].data_type == model_config_pb2.TYPE_BOOL
    assert {"text_output", "output_ids", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"} <= outputs
    params = {k: v.string_value for k, v in configs["tensorrt_llm"].parameters.items()}
    assert Path(params["engine_dir"]) == engine_dir.resolve()
    assert "${" not in "".join(p.read_text() for p in repo.glob("*/config.pbtxt"))


def test_ensemble_steps_are_wired_consistently(engine_dir, tmp_path):
    """Every step input is an ensemble input or an earlier step's output; every ensemble output is produced."""
    repo = write_reference_repository(spec_from_engine_dir(engine_dir), tmp_path / "repo")
    ensemble = parse_pbtxt(repo / "ensemble" / "config.pbtxt")
    available = {t.name for t in ensemble.input}
    for step in ensemble.ensemble_scheduling.step:
        model = parse_pbtxt(repo / step.model_name / "config.pbtxt")
        model_inputs = {t.name for t in model.input}
        model_outputs = {t.name for t in model.output}
        assert set(step.input_map) <= model_inputs, step.model_name
        assert {t.name for t in model.input if not t.optional} <= set(step.input_map), step.model_name
        assert set(step.input_map.values()) <= available, step.model_name
        assert set(step.output_map) <= model_outputs, step.model_name
        available |= set(step.output_map.values())
    outputs = {t.name for t in ensemble.output}
    assert outputs <= available
    # An ensemble output that a step also consumes breaks Triton's pruning of partial requests.
    consumed = {v for step in ensemble.ensemble_scheduling.step for v in step.input_map.values()}
    assert not outputs & consumed


def test_render_escapes_strings_and_rejects_ambiguous_models():
    config = ModelConfig(
        name="m", backend="python", max_batch_size=0,
        inputs=(Tensor("x", "TYPE_INT32", (-1,)),), outputs=(Tensor("y", "TYPE_STRING", (1,)),),
        parameters={"medusa_choices": '{0, 0}, {1}', "path": 'a"b\\c'},
    )
    parsed = text_format.Parse(render(config), model_config_pb2.ModelConfig())
    assert parsed.parameters["path"].string_value == 'a"b\\c'
    assert parsed.parameters["medusa_choices"].string_value == "{0, 0}, {1}"
    assert quote("line\nbreak") == '"line\\nbreak"'
    with pytest.raises(ValueError, match="exactly one of backend / platform"):
        ModelConfig(name="m", max_batch_size=0, inputs=(), outputs=())


def test_repository_write_is_atomic_and_replaces_old(engine_dir, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "stale").write_text("old")
    write_reference_repository(spec_from_engine_dir(engine_dir), repo)
    assert not (repo / "stale").exists() and (repo / REPO_METADATA).is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["repo"]


def test_engine_build_is_cached_until_inputs_change(tiny_checkpoint, tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint)
    first = build_reference_engine(load_recipe(str(recipe)), tmp_path / "engine", log=lambda m: None)
    again = build_reference_engine(load_recipe(str(recipe)), tmp_path / "engine", log=lambda m: None)
    assert first.rebuilt and not again.rebuilt and first.fingerprint == again.fingerprint
    recipe.write_text(recipe.read_text().replace("max_draft_len: 4", "max_draft_len: 3"))
    changed = build_reference_engine(load_recipe(str(recipe)), tmp_path / "engine", log=lambda m: None)
    assert changed.rebuilt and read_fingerprint(tmp_path / "engine") == changed.fingerprint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine", "r.yaml"]


def test_engine_config_is_shaped_like_tensorrt_llm(engine_dir):
    import json

    config = json.loads((engine_dir / "config.json").read_text())
    assert config["build_config"]["speculative_decoding_mode"] == 2  # DRAFT_TOKENS_EXTERNAL
    assert config["build_config"]["max_draft_len"] == 4
    assert config["speculative_config"]["decoding_type"] == "NGram"
    assert config["pretrained_config"]["architecture"] == "LlamaForCausalLM"
    assert (engine_dir / "target" / "model.safetensors").is_file() and (engine_dir / "tokenizer" / "tokenizer.json").is_file()


def test_engine_model_tensors_round_trip_real_results(engine_dir):
    """Padded batch in -> per-row requests -> real engine -> TensorRT-LLM-shaped outputs."""
    engine = ReferenceEngine.from_engine_dir(engine_dir)
    inputs = {
        "input_ids": np.array([[5, 6, 7, 8], [9, 10, 0, 0]], dtype=np.int32),
        "input_lengths": np.array([[4], [2]], dtype=np.int32),
        "request_output_len": np.array([[6], [3]], dtype=np.int32),
        "end_id": np.array([[-1], [-1]], dtype=np.int32),
        "num_draft_tokens": np.array([[0], [4]], dtype=np.int32),
        "return_perf_metrics": np.array([[True], [False]]),
        "exclude_input_in_output": np.array([[True], [False]]),
        "pad_id": None,
    }
    rows = parse_batch(inputs, default_pad_id=0, default_exclude_input=True)
    assert rows[1].request == GenerationRequest(input_ids=[9, 10], max_tokens=3, end_id=-1, num_draft_tokens=4)
    results = [engine.generate(r.request) for r in rows]
    out = pack_outputs(rows, results)
    assert out["output_ids"].shape == (2, 1, 6) and out["output_ids"].dtype == np.int32
    assert out["sequence_length"].tolist() == [[6], [5]]
    assert out["output_ids"][0, 0].tolist() == results[0].output_ids
    assert out["output_ids"][1, 0, :5].tolist() == [9, 10] + results[1].output_ids
    # One response per request: a row asked, so every row carries its own real figures (row 0 plain decoding).
    assert out["total_draft_tokens"].tolist() == [[0], [results[1].total_draft_tokens]]
    assert "logit_margin" not in out and "runner_up_ids" not in out  # nobody asked: absent, no placeholders


def test_outputs_nobody_asked_for_are_absent_not_placeholders(engine_dir):
    engine = ReferenceEngine.from_engine_dir(engine_dir)
    inputs = {"input_ids": np.array([[5, 6, 7]], dtype=np.int32), "request_output_len": np.array([[4]], dtype=np.int32)}
    rows = parse_batch(inputs, default_pad_id=0, default_exclude_input=True)
    out = pack_outputs(rows, [engine.generate(r.request) for r in rows])
    assert set(out) == {"output_ids", "sequence_length", "stream_prefix_ids", "stream_final"}
    assert all(np.isfinite(v).all() for v in out.values() if v.dtype.kind == "f")


def test_parse_batch_rejects_inconsistent_shapes():
    with pytest.raises(ValueError, match="request_output_len"):
        parse_batch({"input_ids": np.zeros((2, 3), np.int32), "request_output_len": np.ones((3, 1), np.int32)},
                    default_pad_id=0, default_exclude_input=True)
    with pytest.raises(ValueError, match="input_lengths\\[0\\] = 5"):
        parse_batch({"input_ids": np.zeros((1, 3), np.int32), "input_lengths": np.array([[5]], np.int32),
                     "request_output_len": np.ones((1, 1), np.int32)}, default_pad_id=0, default_exclude_input=True)
