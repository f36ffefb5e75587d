"""A speculation method as a plugin writes one: its settings model and its ``SpeculationMethod``.

tests/test_methods.py installs it the way a plugin distribution would (an ``entry_points.txt`` naming
``toy = toy_method:METHOD`` in the ``specbuild.methods`` group) and checks that it reaches the recipe
schema, recipe validation and the reference engine. "Toy" drafts the last token repeated, e.g. context
``[5, 6, 7]``, ``k = 3`` -> ``[7, 7, 7]``: often wrong, always verified, so output stays the target's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from specbuild.methods import MethodParams, SpeculationMethod, TrtllmMapping


class ToySpeculation(MethodParams):
    """Repeat the last token as the draft (a test method)."""

    method: Literal["toy"]
    max_draft_len: int = Field(2, ge=1, le=8)
    repeats_of: Literal["last", "first"] = "last"

    def to_llm_api(self) -> dict[str, Any]:
        return {"decoding_type": self.decoding_type, "max_draft_len": self.max_draft_len, "repeats_of": self.repeats_of}


class RepeatProposer:
    """Proposes ``k`` copies of the context's last (or first) token."""

    def __init__(self, spec: ToySpeculation) -> None:
        self.spec = spec

    def propose(self, context: Sequence[int], num_draft_tokens: int, sampler: object = None) -> list[int]:
        del sampler
        token = context[-1] if self.spec.repeats_of == "last" else context[0]
        return [token] * min(num_draft_tokens, self.spec.max_draft_len)

    def update(self, context: Sequence[int], num_accepted: int) -> None:
        del context, num_accepted


def engine():
    from specbuild.engine.methods.base import EngineMethod

    return EngineMethod(make_proposer=RepeatProposer, verification="chain")


METHOD = SpeculationMethod(
    name="toy",
    title="toy",
    params=ToySpeculation,
    trtllm=TrtllmMapping(
        decoding_type="Toy",
        unavailable={"tensorrt": "TensorRT-LLM has no toy method", "pytorch": "TensorRT-LLM has no toy method"},
    ),
    engine=engine,
)
