"""A speculation method as a plugin writes one, in one folder as the built-ins are laid out
(``specbuild/methods/<m>/``): this ``__init__.py`` declares it (settings model, TensorRT-LLM mapping,
``METHOD``; torch-free), ``engine.py`` brings its own drafter, named by an entry string.

tests/test_methods.py installs it the way a plugin distribution would (an ``entry_points.txt`` naming
``toy = toy_method:METHOD`` in the ``specbuild.methods`` group) and checks that it reaches the recipe
schema, recipe validation and the reference engine. "Toy" drafts the last token repeated, e.g. context
``[5, 6, 7]``, ``k = 3`` -> ``[7, 7, 7]``: often wrong, always verified, so output stays the target's.
"""

from __future__ import annotations

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


METHOD = SpeculationMethod(
    name="toy",
    title="toy",
    params=ToySpeculation,
    trtllm=TrtllmMapping(
        decoding_type="Toy",
        unavailable={"tensorrt": "TensorRT-LLM has no toy method", "pytorch": "TensorRT-LLM has no toy method"},
    ),
    engine="toy_method.engine:ENGINE",
)
