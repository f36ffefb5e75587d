"""Medusa (Cai et al. 2024): heads on the target's last hidden state propose a token tree, verified in
one pass with a tree attention mask. Greedy only, as in TensorRT-LLM.

TensorRT-LLM: ``MedusaDecodingConfig``; engine path ``examples/medusa/convert_checkpoint.py`` and
``trtllm-build --speculative_decoding_mode medusa``. Reference engine:
:mod:`specbuild.methods.medusa.engine`. Training: :mod:`specbuild.methods.medusa.train`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from specbuild.util.strict import FieldProblem

from ..base import MC_SIM_7B_63, Conversion, SpeculationMethod, Training, Tree, TrtllmMapping, chain, chain_of, tree_depth
from ..heads import check_head_sizes, head_weights, locate_head_dir
from ..token_map import TokenMapParams

if TYPE_CHECKING:
    from specbuild.util.checkpoints import CheckpointSource
    from specbuild.builder.recipe import LoadedRecipe

WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")  # FasterDecoding's; the .pt read weights_only


class MedusaSpeculation(TokenMapParams):
    """Medusa heads on the target's last hidden state propose a token tree verified in one pass with
    a tree attention mask (Cai et al. 2024). Greedy only, as in TensorRT-LLM.

    ``medusa_model``: a directory with ``config.json`` (``medusa_num_heads``, ``medusa_num_layers``)
    and ``medusa_lm_head.safetensors`` (or ``.pt``, read with ``weights_only=True``).
    ``medusa_choices``: the tree (None: TensorRT-LLM's default 63-node ``mc_sim_7b_63``); its
    depth must not exceed ``num_medusa_heads``. ``max_draft_len``: tree nodes verified per step at
    most, at least the tree's node count (omitted: the node count)."""

    method: Literal["medusa"]
    """The speculation method: this section's settings are chosen by it."""
    medusa_model: str = Field(min_length=1)
    """Folder with the heads' config.json and medusa_lm_head.safetensors (relative to the recipe, may start with $SPECBUILD_CACHE)."""
    num_medusa_heads: int = Field(4, ge=1, le=16)  # TensorRT-LLM's convert_checkpoint default is 4
    """Medusa heads; the tree's depth must not exceed it."""
    medusa_choices: Tree | None = None
    """The token tree as paths of top-k indices; null: TensorRT-LLM's 63-node mc_sim_7b_63."""
    max_draft_len: int | None = Field(None, ge=1)
    """Tree nodes verified per step at most; null: the tree's node count."""

    @model_validator(mode="after")
    def _depth_and_budget(self) -> "MedusaSpeculation":
        depth = tree_depth(self.medusa_choices or [])
        if depth > self.num_medusa_heads:
            raise FieldProblem(
                ("medusa_choices",),
                f"medusa_choices are {depth} deep but num_medusa_heads={self.num_medusa_heads} (one head per tree level); "
                "raise num_medusa_heads or use a shallower tree",
            )
        nodes = len(self.medusa_choices if self.medusa_choices is not None else MC_SIM_7B_63)
        if self.max_draft_len is None:
            object.__setattr__(self, "max_draft_len", nodes)
        elif self.max_draft_len < nodes:
            raise FieldProblem(
                ("max_draft_len",),
                f"max_draft_len={self.max_draft_len} is below the tree's {nodes} nodes (Medusa verifies every node of "
                "medusa_choices each step); omit it to use the node count",
            )
        return self

    def to_llm_api(self) -> dict[str, Any]:
        config = self.llm_api_fields("max_draft_len", "num_medusa_heads")
        if self.medusa_choices is not None:
            config["medusa_choices"] = self.medusa_choices
        return config


# --- weights: the head directory -------------------------------------------------------------------


def locate_heads(loaded: LoadedRecipe) -> CheckpointSource:
    """The head directory (``config.json`` + ``medusa_lm_head.safetensors`` or ``.pt``), not loaded.

    Raises:
        RecipeError: at ``speculation.medusa_model``.
    """
    return locate_head_dir(
        loaded, field="medusa_model", weight_files=WEIGHT_FILES, label="Medusa heads",
        hint="point medusa_model at a Medusa head directory (config.json with medusa_num_heads, medusa_num_layers + "
             "medusa_lm_head.safetensors)",
    )


def check_sizes(loaded: LoadedRecipe, target_dir: Path, heads_dir: Path) -> None:
    """``hidden_size`` / ``vocab_size`` in config.json against the target's (FasterDecoding's configs
    carry neither: then they are checked when the heads are loaded).

    Raises:
        RecipeError: a size differs (located at ``speculation.medusa_model``).
    """
    check_head_sizes(loaded, "medusa_model", "Medusa heads", heads_dir, target_dir)


# --- TensorRT-LLM, training ------------------------------------------------------------------------


def _convert_flags(spec: MedusaSpeculation) -> tuple[str, ...]:
    return ("--num_medusa_heads", str(spec.num_medusa_heads), "--num_medusa_layers", "1", "--max_medusa_token_len", str(spec.max_draft_len))


def _engine_model(spec: MedusaSpeculation) -> dict[str, Any]:
    return {"medusa_choices": spec.medusa_choices}


def _held_out_config(spec: MedusaSpeculation, artefact: Path, draft_len: int) -> dict[str, Any]:
    """The heads measured as a chain ``[[0], [0, 0], ...]`` of ``draft_len`` nodes (one head per node).

    Raises:
        ValueError: ``draft_len`` exceeds the head count.
    """
    heads = spec.num_medusa_heads
    if draft_len > heads:
        raise ValueError(f"train.eval_draft_len={draft_len} exceeds the {heads} Medusa heads")
    return chain_of(spec, artefact, draft_len) | {"num_medusa_heads": heads, "medusa_choices": chain(draft_len)}


METHOD = SpeculationMethod(
    name="medusa",
    title="Medusa",
    params=MedusaSpeculation,
    trtllm=TrtllmMapping(
        decoding_type="Medusa",
        speculative_decoding_mode="medusa",
        decoding_mode="medusa",
        unavailable={"pytorch": "TensorRT-LLM's PyTorch backend has no Medusa"},
        greedy_only=True,  # TensorRT-LLM's Medusa decoding mode does not sample
        conversion=Conversion(script="medusa/convert_checkpoint.py", weights_flag="--medusa_model_dir", flags=_convert_flags),
        engine_model=_engine_model,
    ),
    weights=head_weights("medusa", field="medusa_model", what="the Medusa head directory", locate=locate_heads, check_fit=check_sizes),
    engine="specbuild.methods.medusa.engine:ENGINE",  # heads loaded once; their tree cut to each request's first k nodes
    training=Training(train="specbuild.methods.medusa.train:train_for", held_out_config=_held_out_config),
)
