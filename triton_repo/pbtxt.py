"""Typed Triton model configurations rendered to ``config.pbtxt``.

The specs mirror ``inference.ModelConfig`` (model_config.proto) fields one to one, so the rendered
text parses with Triton's own protobuf schema (``tritonclient.grpc.model_config_pb2``); the tests
do exactly that. No template placeholders exist that could survive unfilled. The tensors are
:class:`specbuild.interface.Tensor` specs, the deployment's contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from specbuild.interface import DataType, Tensor  # noqa: F401 - the tensor specs rendered here


@dataclass(frozen=True)
class DynamicBatching:
    """``dynamic_batching { ... }``: Triton groups queued requests into batches of up to
    ``preferred_batch_size`` (``()``: Triton's default, max_batch_size), waiting at most
    ``max_queue_delay_microseconds``; ``max_queue_size`` 0 = unbounded queue."""

    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    max_queue_size: int = 0


@dataclass(frozen=True)
class EnsembleStep:
    """``input_map``: step-model input -> ensemble tensor; ``output_map``: step-model output -> ensemble tensor."""

    model_name: str
    input_map: dict[str, str]
    output_map: dict[str, str]
    model_version: int = -1


@dataclass(frozen=True)
class ModelConfig:
    """A model's ``config.pbtxt``. Exactly one of ``backend`` / ``platform`` is set."""

    name: str
    max_batch_size: int
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    backend: str | None = None
    platform: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    instance_count: int = 1
    instance_kind: Literal["KIND_CPU", "KIND_GPU", "KIND_MODEL"] = "KIND_CPU"
    decoupled: bool = False
    steps: tuple[EnsembleStep, ...] = ()
    dynamic_batching: DynamicBatching | None = None

    def __post_init__(self) -> None:
        if (self.backend is None) == (self.platform is None):
            raise ValueError(f"model {self.name!r}: set exactly one of backend / platform")


def quote(value: str) -> str:
    """A protobuf text-format string literal."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def render(config: ModelConfig) -> str:
    """``config`` as protobuf text format (the contents of config.pbtxt)."""
    lines = [f"name: {quote(config.name)}"]
    if config.backend is not None:
        lines.append(f"backend: {quote(config.backend)}")
    else:
        lines.append(f"platform: {quote(config.platform)}")
    lines.append(f"max_batch_size: {config.max_batch_size}")
    if config.decoupled:
        lines.append("model_transaction_policy {\n  decoupled: true\n}")
    if config.dynamic_batching is not None:
        lines.append(_dynamic_batching(config.dynamic_batching))
    lines.append(_tensors("input", config.inputs))
    lines.append(_tensors("output", config.outputs))
    if config.platform != "ensemble":
        lines.append(f"instance_group [\n  {{\n    count: {config.instance_count}\n    kind: {config.instance_kind}\n  }}\n]")
    if config.steps:
        lines.append(_ensemble(config.steps))
    for key, value in config.parameters.items():
        lines.append(f"parameters {{\n  key: {quote(key)}\n  value: {{\n    string_value: {quote(value)}\n  }}\n}}")
    return "\n".join(lines) + "\n"


def _tensors(kind: str, tensors: tuple[Tensor, ...]) -> str:
    blocks = []
    for t in tensors:
        body = [f"name: {quote(t.name)}", f"data_type: {t.data_type}", f"dims: [ {', '.join(map(str, t.dims))} ]"]
        if t.optional:
            body.append("optional: true")
        if t.allow_ragged_batch:
            body.append("allow_ragged_batch: true")
        if t.reshape is not None:
            body.append(f"reshape: {{ shape: [ {', '.join(map(str, t.reshape))} ] }}")
        blocks.append("  {\n" + "\n".join(f"    {b}" for b in body) + "\n  }")
    return f"{kind} [\n" + ",\n".join(blocks) + "\n]"


def _dynamic_batching(d: DynamicBatching) -> str:
    body = []
    if d.preferred_batch_size:
        body.append(f"preferred_batch_size: [ {', '.join(map(str, d.preferred_batch_size))} ]")
    if d.max_queue_delay_microseconds:
        body.append(f"max_queue_delay_microseconds: {d.max_queue_delay_microseconds}")
    if d.max_queue_size:
        body.append(f"default_queue_policy {{ max_queue_size: {d.max_queue_size} }}")
    return "dynamic_batching {" + "".join(f"\n  {b}" for b in body) + ("\n}" if body else " }")


def _ensemble(steps: tuple[EnsembleStep, ...]) -> str:
    rendered = []
    for s in steps:
        body = [f"model_name: {quote(s.model_name)}", f"model_version: {s.model_version}"]
        for name, mapping in (("input_map", s.input_map), ("output_map", s.output_map)):
            body += [f"{name} {{ key: {quote(k)} value: {quote(v)} }}" for k, v in mapping.items()]
        rendered.append("    {\n" + "\n".join(f"      {b}" for b in body) + "\n    }")
    return "ensemble_scheduling {\n  step [\n" + ",\n".join(rendered) + "\n  ]\n}"
