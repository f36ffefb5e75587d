"""The deployment's contract (specbuild.interface) and everything that must follow it: the generated
config.pbtxt of every repository kind (parsed with Triton's own schema), the tensor names the
Python-backend models read and write, the client SDK's requests, and the table in docs/interface.md.
A tensor renamed, retyped or reshaped in one place and not the other fails here. No model needed."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from specbuild import interface
from specbuild.interface import ENGINE, ENSEMBLE, LLMAPI, MODELS, REFERENCE, TRTLLM, GenerateOptions, Tensor
from specbuild.triton_repo.reference_repository import ReferenceRepoSpec, write_reference_repository

ROOT = Path(__file__).parents[1]
ENGINE_RECIPES = ("llama-draft", "llama-eagle", "llama-lookahead", "llama-medusa")


def declared(t) -> tuple:
    """A parsed config tensor as (name, data type, dims, optional, ragged, reshape); outputs have no
    ``optional`` or ``allow_ragged_batch`` field (False)."""
    reshape = list(t.reshape.shape) if t.HasField("reshape") else None
    flags = (getattr(t, "optional", False), getattr(t, "allow_ragged_batch", False))
    return (t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims), *flags, reshape)


def expected(t: Tensor, *, reshape: bool = True) -> tuple:
    shape = list(t.reshape) if reshape and t.reshape is not None else None
    return (t.name, t.data_type, list(t.dims), t.optional, t.allow_ragged_batch, shape)


def parse_repository(repo: Path) -> dict[str, model_config_pb2.ModelConfig]:
    return {p.parent.name: text_format.Parse(p.read_text(), model_config_pb2.ModelConfig()) for p in repo.glob("*/config.pbtxt")}


def assert_follows(config: model_config_pb2.ModelConfig, model: interface.ModelInterface, *, reshape: bool = True) -> None:
    assert [declared(t) for t in config.input] == [expected(t, reshape=reshape) for t in model.inputs], config.name
    assert [declared(t) for t in config.output] == [expected(t, reshape=reshape) for t in model.outputs], config.name


# --- the repositories ------------------------------------------------------------------------------


def test_reference_repository_declares_exactly_the_contract(tmp_path):
    configs = parse_repository(write_reference_repository(ReferenceRepoSpec(tmp_path, end_id=2, pad_id=0, max_batch_size=4), tmp_path / "repo"))
    assert set(configs) == {m.name for m in MODELS}
    for model in MODELS:
        # the Python engine model reads [batch, 1] scalars: upstream's reshapes are left out
        assert_follows(configs[model.name], model.served_by(REFERENCE), reshape=False)
    assert all(not t.HasField("reshape") for t in configs["tensorrt_llm"].input)


@pytest.mark.parametrize("name", ENGINE_RECIPES)
def test_tensorrt_llm_repository_declares_exactly_the_contract(name, tmp_path):
    from test_trtllm_repo import write

    _, configs = write(name, tmp_path, build="  baseline_engine: true\n")
    assert_follows(configs["ensemble"], ENSEMBLE.served_by(TRTLLM))
    engines = [c for c in configs.values() if c.backend == "tensorrtllm"]
    assert engines and {c.name for c in engines} <= {"tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_baseline"}
    for config in engines:
        assert_follows(config, ENGINE.served_by(TRTLLM))
    for model in (interface.PREPROCESSING, interface.POSTPROCESSING):
        assert_follows(configs[model.name], model)


def test_llmapi_repository_declares_exactly_the_contract(tmp_path):
    from test_trtllm_plan import llama

    from specbuild.builder.trtllm_plan import plan_pytorch
    from specbuild.triton_repo.tensorrtllm import write_llmapi_repository

    loaded = llama("llama-eagle3")
    configs = parse_repository(write_llmapi_repository(loaded, plan_pytorch(loaded, tmp_path), tmp_path / "repo"))
    assert set(configs) == {"ensemble"}
    assert_follows(configs["ensemble"], ENSEMBLE.served_by(LLMAPI))


def test_upstream_engine_tensors_are_the_trtllm_share():
    """The engine tensors the tests hold as upstream's copy are the contract's ``trtllm`` share."""
    from test_trtllm_repo import UPSTREAM_ENGINE_INPUTS

    ours = {t.name: (t.data_type, list(t.dims), None if t.reshape is None else list(t.reshape), t.optional)
            for t in ENGINE.served_by(TRTLLM).inputs}
    assert ours == UPSTREAM_ENGINE_INPUTS


# --- the contract is consistent with itself ------------------------------------------------------


def test_contract_is_consistent():
    for model in MODELS:
        names = [t.name for t in model.inputs + model.outputs]
        assert len(set(t.name for t in model.inputs)) == len(model.inputs), model.name
        assert len(set(t.name for t in model.outputs)) == len(model.outputs), model.name
        assert all(t.data_type in interface.WIRE_TYPES for t in model.inputs + model.outputs), names
        assert all(set(t.served_by) <= set(interface.DEPLOYMENTS) for t in model.inputs + model.outputs)
    for t in ENSEMBLE.inputs:
        if t.engine_name:  # passed unchanged by the reference ensemble's wiring (the trtllm front may decide it)
            engine = ENGINE.input(t.engine_name)
            assert engine.data_type == t.data_type and (REFERENCE not in t.served_by or REFERENCE in engine.served_by), t.name
    for t in ENSEMBLE.outputs:
        if t.engine_name:
            assert ENGINE.output(t.engine_name).data_type == t.data_type, t.name
        if t.asked_by:
            assert ENSEMBLE.input(t.asked_by).data_type == "TYPE_BOOL" and t.served_by <= ENSEMBLE.input(t.asked_by).served_by
    with pytest.raises(KeyError, match="no ensemble input 'prompt'"):
        ENSEMBLE.input("prompt")
    with pytest.raises(ValueError, match="deployment must be one of"):
        ENSEMBLE.served_by("vllm")


# --- the client ----------------------------------------------------------------------------------


class RecordingTritonClient:
    """The parts of a tritonclient module the SDK uses to build a request; records each tensor."""

    def __init__(self):
        self.inputs: dict[str, tuple[list[int], str, np.ndarray]] = {}
        self.outputs: list[str] = []
        recorder = self

        class InferInput:
            def __init__(self, name, shape, datatype):
                self.name, self.shape, self.datatype = name, shape, datatype

            def set_data_from_numpy(self, array):
                recorder.inputs[self.name] = (self.shape, self.datatype, array)

        self.InferInput = InferInput
        self.InferRequestedOutput = lambda name: recorder.outputs.append(name) or name


EVERY_OPTION = GenerateOptions(max_tokens=8, num_draft_tokens=2, end_id=-1, return_perf_metrics=True, exclude_input_in_output=False,
                               temperature=0.7, top_k=5, top_p=0.9, seed=2**40, lookahead_config=(4, 3, 2),
                               return_logit_margin=True, return_generation_logits=True)


def test_client_requests_use_only_contract_tensors_with_their_types():
    from specbuild.client.sdk import input_tensors

    tc = RecordingTritonClient()
    input_tensors(tc, {**EVERY_OPTION.tensor_values("def f():"), "stream": True})
    assert set(tc.inputs) == set(ENSEMBLE.input_names) - {"pad_id"}  # every option reaches its tensor
    for name, (shape, datatype, array) in tc.inputs.items():
        spec = ENSEMBLE.input(name)
        assert (shape, datatype, array.dtype) == ([1, *spec.dims], spec.wire_type, np.dtype(spec.numpy_dtype)), name
    assert tc.inputs["text_input"][2][0, 0] == b"def f():" and tc.inputs["seed"][2][0, 0] == 2**40
    # the probed outputs are asked for only when the model's metadata declares them (SpecClient._output_names)
    assert set(EVERY_OPTION.output_names()) == set(ENSEMBLE.output_names) - set(interface.PROBED_OUTPUTS)


def test_client_sends_only_what_is_set():
    plain = GenerateOptions(max_tokens=4)
    assert set(plain.tensor_values("x")) == {"text_input", "max_tokens", "return_perf_metrics", "exclude_input_in_output"}
    assert plain.output_names() == ("text_output", "output_ids", "sequence_length", *interface.PERF_OUTPUTS)
    assert GenerateOptions(max_tokens=4, return_perf_metrics=False).output_names() == ("text_output", "output_ids", "sequence_length")


def test_generate_options_check_and_combine():
    base = GenerateOptions(max_tokens=4, temperature=0.5)
    assert GenerateOptions.of(base, num_draft_tokens=0) == GenerateOptions(max_tokens=4, temperature=0.5, num_draft_tokens=0)
    assert GenerateOptions.of(None, max_tokens=2) == GenerateOptions(max_tokens=2)
    assert GenerateOptions(max_tokens=1, lookahead_config=[4, 3, 2]).lookahead_config == (4, 3, 2)
    with pytest.raises(ValueError, match="max_tokens"):
        GenerateOptions(max_tokens=0)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        base.replace(num_draft_tokens=-1)
    with pytest.raises(ValueError, match="lookahead_config"):
        GenerateOptions(max_tokens=1, lookahead_config=(4, 3))
    with pytest.raises(TypeError, match="max_token"):
        GenerateOptions.of(None, max_token=3)
    with pytest.raises(ValueError, match="prompt must be a str"):
        base.tensor_values(b"bytes")


@pytest.mark.parametrize("fields, message", [
    ({"max_tokens": 2**32 + 8}, "max_tokens=4294967304 does not fit its INT32"),  # numpy would wrap it to 8
    ({"max_tokens": 10**12}, "max_tokens=1000000000000 does not fit"),
    ({"max_tokens": 8, "num_draft_tokens": 2**32}, "num_draft_tokens=4294967296 does not fit"),  # would wrap to 0: no speculation
    ({"max_tokens": 8, "top_k": 2**32 + 1}, "top_k=4294967297 does not fit"),
    ({"max_tokens": 8, "end_id": -(2**31) - 1}, "end_id=-2147483649 does not fit"),
    ({"max_tokens": 8, "seed": -1}, "seed=-1 does not fit its UINT64"),  # would wrap to 2**64 - 1
    ({"max_tokens": 8, "seed": 2**64}, "seed=18446744073709551616 does not fit its UINT64"),
    ({"max_tokens": 8, "lookahead_config": (2, 2**31, 1)}, "lookahead_ngram_size=2147483648 does not fit"),
    ({"max_tokens": 8, "temperature": float("inf")}, "temperature=inf is not a finite FP32"),
    ({"max_tokens": 8, "top_p": 1e39}, "top_p=1e\\+39 is not a finite FP32"),
    ({"max_tokens": "8"}, "max_tokens must be an integer, got '8'"),
    ({"max_tokens": True}, "max_tokens must be an integer, got True"),
    ({"max_tokens": 8.0}, "max_tokens must be an integer"),
    ({"max_tokens": 8, "num_draft_tokens": 1.5}, "num_draft_tokens must be an integer"),
    ({"max_tokens": 8, "temperature": "hot"}, "temperature must be a number"),
])
def test_a_value_its_tensor_cannot_carry_is_refused_not_wrapped(fields, message):
    with pytest.raises(ValueError, match=message):
        GenerateOptions(**fields)


def test_the_edges_of_each_tensor_type_are_sent_unchanged():
    import numpy as np

    edge = GenerateOptions(max_tokens=2**31 - 1, num_draft_tokens=0, end_id=-(2**31), top_k=np.int64(5), seed=2**64 - 1, temperature=0)
    values = edge.tensor_values("x")
    assert (values["max_tokens"], values["end_id"], values["seed"], values["top_k"]) == (2**31 - 1, -(2**31), 2**64 - 1, 5)


# --- the Python-backend models -------------------------------------------------------------------

# Calls whose string arguments are tensor names, in the models' sources.
TENSOR_CALLS = {"required_input", "optional_input", "_scalar", "pick", "Tensor", "get_output_tensor_by_name", "get_input_tensor_by_name"}
MODEL_SOURCES = ("preprocessing", "postprocessing", "reference_engine", "trtllm_front", "llmapi_front")


def tensor_name_literals(path: Path) -> set[str]:
    """String constants given to TENSOR_CALLS and to ``requested_output_names=`` in ``path``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            args = list(node.args) if func in TENSOR_CALLS else []
            args += [v for k in node.keywords if k.arg == "requested_output_names" for v in getattr(k.value, "elts", [])]
            names |= {a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return names


@pytest.mark.parametrize("module", MODEL_SOURCES)
def test_models_name_only_contract_tensors(module):
    every = {t.name for m in MODELS for t in m.inputs + m.outputs}
    names = tensor_name_literals(ROOT / "triton_repo" / "models" / f"{module}.py")
    assert names, f"no tensor names found in {module}.py: the scan is broken"
    assert names <= every, f"{module}.py names tensors the contract does not have: {sorted(names - every)}"


def test_reference_engine_model_reads_and_writes_the_contract():
    from specbuild.engine.stream import StepOutput
    from specbuild.engine.types import GenerationResult
    from specbuild.triton_repo.models import reference_engine as model

    served = ENGINE.served_by(REFERENCE)
    assert model.INPUTS == served.input_names
    inputs = {"input_ids": np.array([[5, 6, 7]], np.int32), "request_output_len": np.array([[2]], np.int32),
              "return_perf_metrics": np.array([[True]]), "return_logit_margin": np.array([[True]])}
    rows = model.parse_batch(inputs, default_pad_id=0, default_exclude_input=True)
    packed = model.pack_outputs(rows, [GenerationResult([8, 9], "length", 2, 1, 1)], [model.Margins([0.5, 1.5], [3, 4])])
    streamed = model.pack_step(rows[0], StepOutput([8], 0, 0, 0), sent=[])
    for outputs in (packed, streamed):
        for name, array in outputs.items():
            spec = served.output(name)
            assert array.dtype == np.dtype(spec.numpy_dtype) and array.ndim == 1 + len(spec.dims), name
    assert set(packed) == set(served.output_names)


# --- docs/interface.md ---------------------------------------------------------------------------


def test_docs_table_is_the_contract():
    doc = (ROOT / "docs" / "interface.md").read_text(encoding="utf-8")
    assert interface.with_table(doc) == doc, "docs/interface.md is stale: run `python -m specbuild.interface docs/interface.md`"
    for t in ENSEMBLE.inputs + ENSEMBLE.outputs:
        assert f"| `{t.name}` |" in doc


def test_contract_is_importable_without_numpy_or_torch():
    import subprocess
    import sys

    code = "import sys, specbuild.interface; assert 'numpy' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
