"""EAGLE-1/2 (Li et al. 2024): a one-layer draft head over [token embedding ; target feature] grows a
token tree, static (``eagle_choices``) or EAGLE-2's dynamic tree. Greedy only, as in TensorRT-LLM.

TensorRT-LLM: ``EagleDecodingConfig``; engine path ``examples/eagle/convert_checkpoint.py`` and
``trtllm-build --speculative_decoding_mode eagle``. Reference engine: :mod:`specbuild.methods.eagle.engine`.
Training: :mod:`specbuild.methods.eagle.train`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from specbuild.util.strict import FieldProblem

from ..base import Conversion, SpeculationMethod, Training, Tree, TrtllmMapping, chain, chain_of, tree_depth
from ..heads import check_head_sizes, head_weights, locate_head_dir
from ..token_map import TokenMapParams

if TYPE_CHECKING:
    from specbuild.util.checkpoints import CheckpointSource
    from specbuild.builder.recipe import LoadedRecipe

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.pt")  # EAGLE's and EAGLE-3's; pickles read weights_only


class EagleSpeculation(TokenMapParams):
    """EAGLE-1/2 (Li et al. 2024): a one-layer draft head over [token embedding ; target feature]
    grows a token tree, static (``eagle_choices``, depth == ``num_eagle_layers``) or EAGLE-2's
    dynamic tree (``use_dynamic_tree``, ``dynamic_tree_max_topK``). TensorRT-LLM:
    ``EagleDecodingConfig``; ``posterior_threshold`` enables typical acceptance."""

    method: Literal["eagle"]
    """The speculation method: this section's settings are chosen by it."""
    eagle_model: str = Field(min_length=1)
    """Folder with the EAGLE head (config.json and weights; relative to the recipe, may start with $SPECBUILD_CACHE)."""
    max_draft_len: int = Field(63, ge=1, le=256)  # examples/eagle: at most 256
    """Tree nodes verified per step at most."""
    num_eagle_layers: int = Field(4, ge=1, le=16)
    """Draft tree depth (EAGLE's draft steps); equals the depth of eagle_choices."""
    max_non_leaves_per_layer: int = Field(10, ge=1)
    """Nodes expanded per tree level at most."""
    eagle_choices: Tree | None = None
    """Static token tree as paths of top-k indices; null: the dynamic tree or TensorRT-LLM's default."""
    use_dynamic_tree: bool = False
    """EAGLE-2: grow the tree by cumulative draft log-probability instead of a fixed shape."""
    dynamic_tree_max_topK: int | None = Field(None, ge=1)
    """EAGLE-2: children considered per expanded node."""
    posterior_threshold: float | None = Field(None, gt=0, lt=1)
    """Typical acceptance threshold (TensorRT-LLM engine path); null: exact matching."""

    @model_validator(mode="after")
    def _consistent(self) -> "EagleSpeculation":
        if self.eagle_choices is not None:
            depth = tree_depth(self.eagle_choices)
            if depth != self.num_eagle_layers:
                raise FieldProblem(
                    ("eagle_choices",),
                    f"eagle_choices are {depth} deep but num_eagle_layers is {self.num_eagle_layers}; "
                    "TensorRT-LLM requires them to be equal (TensorRT-LLM#2588)"
                )
            if len(self.eagle_choices) > self.max_draft_len:
                raise FieldProblem(
                    ("eagle_choices",),
                    f"eagle_choices has {len(self.eagle_choices)} nodes, more than max_draft_len {self.max_draft_len}; "
                    "raise max_draft_len or list fewer nodes",
                )
        if self.use_dynamic_tree and self.eagle_choices is not None:
            raise FieldProblem(("eagle_choices",), "use_dynamic_tree builds the tree at run time; remove eagle_choices")
        if self.use_dynamic_tree and self.dynamic_tree_max_topK is None:
            raise FieldProblem(("use_dynamic_tree",), "use_dynamic_tree needs dynamic_tree_max_topK (candidates per node); add it")
        return self

    def to_llm_api(self) -> dict[str, Any]:
        config = self.llm_api_fields("max_draft_len", "speculative_model_dir=eagle_model", "num_eagle_layers",
                                     "max_non_leaves_per_layer") | {"eagle3_one_model": False}
        optional = {
            "eagle_choices": self.eagle_choices,
            "use_dynamic_tree": self.use_dynamic_tree or None,
            "dynamic_tree_max_topK": self.dynamic_tree_max_topK,
            "posterior_threshold": self.posterior_threshold,
        }
        return config | {k: v for k, v in optional.items() if v is not None}


# --- weights: the head directory (EAGLE-1/2 and EAGLE-3 alike) --------------------------------------


def locate_head(loaded: LoadedRecipe, kind: str = "EAGLE-1/2") -> CheckpointSource:
    """The ``kind`` head directory (``config.json`` + ``model.safetensors``, ``pytorch_model.bin`` or
    ``model.pt``), not loaded; relative paths are relative to the recipe.

    Raises:
        RecipeError: at ``speculation.eagle_model``.
    """
    return locate_head_dir(
        loaded, field="eagle_model", weight_files=WEIGHT_FILES, label="EAGLE head",
        hint=f"point eagle_model at an {kind} head directory (config.json with hidden_size, num_hidden_layers, ... + model.safetensors)",
    )


def check_sizes(loaded: LoadedRecipe, target_dir: Path, head_dir: Path) -> None:
    """``hidden_size`` / ``vocab_size`` in config.json against the target's (a size the head's config
    lacks is checked at load).

    Raises:
        RecipeError: a size differs (located at ``speculation.eagle_model``).
    """
    check_head_sizes(loaded, "eagle_model", "EAGLE head", head_dir, target_dir)


# --- reference engine, TensorRT-LLM, training ------------------------------------------------------


def _reference_check(spec: EagleSpeculation) -> tuple[str, str] | None:
    if spec.posterior_threshold is None:
        return None
    return ("posterior_threshold",
            "typical acceptance (posterior_threshold) is not in the reference engine yet; it decodes greedily with exact "
            "token matching: remove posterior_threshold, or set build.backend: tensorrt (TensorRT-LLM's engine path, GPU)")


def _check_trtllm(loaded: LoadedRecipe, path: str) -> None:
    """The engine path's tensorrt_llm model takes eagle_choices only (no dynamic tree, no typical acceptance)."""
    spec = loaded.recipe.speculation
    if path != "tensorrt":
        return
    runtime_only = [name for name in ("use_dynamic_tree", "posterior_threshold") if getattr(spec, name)]
    if runtime_only:
        raise loaded.error(("speculation", runtime_only[0]),
                           f"{runtime_only[0]} is a TensorRT-LLM runtime option that its Triton backend does not take "
                           "(the tensorrt_llm model has only eagle_choices); remove it, or give a static tree with eagle_choices")


def _convert_flags(spec: EagleSpeculation) -> tuple[str, ...]:
    return ("--max_draft_len", str(spec.max_draft_len), "--num_eagle_layers", str(spec.num_eagle_layers),
            "--max_non_leaves_per_layer", str(spec.max_non_leaves_per_layer))


def _engine_model(spec: EagleSpeculation) -> dict[str, Any]:
    return {"eagle_choices": spec.eagle_choices}


def _held_out_config(spec: EagleSpeculation, artefact: Path, draft_len: int) -> dict[str, Any]:
    """The head measured with the static chain ``[[0], [0, 0], ...]`` of ``draft_len`` nodes."""
    return chain_of(spec, artefact, draft_len) | {"num_eagle_layers": draft_len, "eagle_choices": chain(draft_len)}


METHOD = SpeculationMethod(
    name="eagle",
    title="EAGLE",
    params=EagleSpeculation,
    trtllm=TrtllmMapping(
        decoding_type="Eagle",
        speculative_decoding_mode="eagle",
        decoding_mode="eagle",
        unavailable={"pytorch": "TensorRT-LLM's PyTorch backend runs EAGLE-3 only (method: eagle3)"},
        paged_context_fmha=True,
        conversion=Conversion(script="eagle/convert_checkpoint.py", weights_flag="--eagle_model_dir", flags=_convert_flags),
        no_pipeline_parallel="EAGLE supports no pipeline parallelism (TensorRT-LLM asserts pp_size == 1)",
        check=_check_trtllm,
        engine_model=_engine_model,
    ),
    weights=head_weights("eagle", field="eagle_model", what="the EAGLE head directory", locate=locate_head, check_fit=check_sizes),
    engine="specbuild.methods.eagle.engine:ENGINE",  # the head loaded once; trees of at most k nodes per request
    training=Training(train="specbuild.methods.eagle.train:train_for", held_out_config=_held_out_config),
    # EagleDecodingConfig keys that change nothing in a greedy, single-process engine.
    ignored_config_keys=("greedy_sampling", "eagle3_one_model"),
    reference_check=_reference_check,
)
