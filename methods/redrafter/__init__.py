"""Recurrent Drafter (Cheng et al. 2024, arXiv:2403.09919): an RNN draft head over the target's last
hidden state beam-searches candidates, verified in one pass.

TensorRT-LLM engine path only (``examples/redrafter/convert_checkpoint.py``, ``trtllm-build
--speculative_decoding_mode explicit_draft_tokens``); not in the reference engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from ..base import Conversion, MethodParams, SpeculationMethod, TrtllmMapping, Weights

if TYPE_CHECKING:
    from specbuild.builder.recipe import LoadedRecipe

CONVERTER = "redrafter/convert_checkpoint.py"


class ReDrafterSpeculation(MethodParams):
    """Recurrent Drafter (Cheng et al. 2024, arXiv:2403.09919): an RNN draft head over the target's
    last hidden state beam-searches ``redrafter_num_beams`` candidates of
    ``redrafter_draft_len_per_beam`` tokens each, verified in one pass. TensorRT-LLM engine path
    only (``examples/redrafter/convert_checkpoint.py``, ``--speculative_decoding_mode
    explicit_draft_tokens``); both sizes are fixed when the engine is built.

    ``drafter_model``: a directory with the drafter's ``config.json`` and ``model.safetensors``
    (TensorRT-LLM's converter falls back to unpickling ``model.pt``, which specbuild refuses).
    """

    method: Literal["redrafter"]
    """The speculation method: this section's settings are chosen by it."""
    drafter_model: str = Field(min_length=1)
    """Folder with the drafter's config.json and model.safetensors."""
    redrafter_num_beams: int = Field(5, ge=1, le=64)
    """Candidate beams the drafter searches per step."""
    redrafter_draft_len_per_beam: int = Field(5, ge=1, le=64)
    """Draft tokens per beam."""
    redrafter_greedy_search: bool = True
    """Drafter beam search greedy (not sampled)."""

    @property
    def max_draft_len(self) -> int:
        """Draft tokens verified per step: num_beams * draft_len_per_beam (TensorRT-LLM's
        ReDrafterForCausalLM.prepare_inputs), e.g. 5 beams x 5 tokens -> 25."""
        return self.redrafter_num_beams * self.redrafter_draft_len_per_beam

    def to_llm_api(self) -> dict[str, Any]:
        raise ValueError("ReDrafter has no LLM-API speculative_config; use build.backend: tensorrt")


def check_drafter_weights(loaded: LoadedRecipe, drafter_dir: Path) -> None:
    """A ReDrafter drafter directory holds ``model.safetensors``: TensorRT-LLM's converter would
    otherwise ``torch.load`` (unpickle) ``model.pt``, which can run arbitrary code.

    Raises:
        RecipeError: located at ``speculation.drafter_model``.
    """
    if not (drafter_dir / "model.safetensors").is_file():
        raise loaded.error(("speculation", "drafter_model"),
                           f"{drafter_dir} has no model.safetensors; convert the drafter's model.pt to safetensors first "
                           "(specbuild never lets a pickle be loaded)")


def _convert_flags(spec: ReDrafterSpeculation) -> tuple[str, ...]:
    greedy = () if spec.redrafter_greedy_search else ("--redrafter_no_greedy_search",)
    return ("--redrafter_num_beams", str(spec.redrafter_num_beams),
            "--redrafter_draft_len_per_beam", str(spec.redrafter_draft_len_per_beam), *greedy)


METHOD = SpeculationMethod(
    name="redrafter",
    title="ReDrafter",
    params=ReDrafterSpeculation,
    trtllm=TrtllmMapping(
        decoding_type="ReDrafter",  # TensorRT-LLM's class name; no LLM-API config exists
        speculative_decoding_mode="explicit_draft_tokens",
        decoding_mode="redrafter",
        unavailable={"pytorch": "TensorRT-LLM's PyTorch backend has no ReDrafter"},
        conversion=Conversion(script=CONVERTER, weights_flag="--drafter_model_dir", flags=_convert_flags, pp_flag=False,
                              quantization=()),
        no_pipeline_parallel=f"ReDrafter's converter (examples/{CONVERTER}) has no pipeline parallelism",
    ),
    weights=Weights(field="drafter_model", what="the ReDrafter drafter", role="drafter", check_files=check_drafter_weights),
)
