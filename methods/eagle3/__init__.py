"""EAGLE-3 (Li et al. 2025): the draft head fuses features from three target layers (``midlayer``
format, optional draft vocabulary with ``d2t``) and drafts a chain, or EAGLE-2's dynamic tree
(``use_dynamic_tree``; :mod:`specbuild.methods.eagle3.tree`). Greedy only.

TensorRT-LLM: the PyTorch backend's ``Eagle3DecodingConfig`` (decoding_type ``Eagle`` before 1.3).
Reference engine: :mod:`specbuild.methods.eagle3.engine`. Training: :mod:`specbuild.methods.eagle3.train`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..base import MethodParams, SpeculationMethod, Training, TrtllmMapping, chain_of
from ..eagle import check_sizes, locate_head
from ..heads import head_weights, read_json, target_config

if TYPE_CHECKING:
    from specbuild.util.checkpoints import CheckpointSource
    from specbuild.builder.recipe import LoadedRecipe


class SAEnhancer(BaseModel):
    """TensorRT-LLM's ``SAEnhancerConfig`` (``sa_config``, 1.4 line): suffix-automaton drafts replace
    the head's when the suffix match is at least ``threshold`` tokens long; ``enable_global_pool``
    searches every active request's automaton, not only the request's own."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    threshold: int = Field(4, ge=1)
    """Shortest suffix match (tokens) whose continuation replaces the head's drafts."""
    enable_global_pool: bool = False
    """Search every active request's automaton, not only the request's own."""


class Eagle3Speculation(MethodParams):
    """EAGLE-3 (Li et al. 2025): the draft head fuses features from three target layers (``midlayer``
    format, optional draft vocabulary with ``d2t``). TensorRT-LLM PyTorch backend only."""

    method: Literal["eagle3"]
    """The speculation method: this section's settings are chosen by it."""
    eagle_model: str = Field(min_length=1)
    """Folder with the EAGLE-3 head (relative to the recipe, may start with $SPECBUILD_CACHE)."""
    max_draft_len: int = Field(3, ge=1, le=32)
    """Draft tokens per step (a chain), or the depth of the dynamic tree (use_dynamic_tree)."""
    eagle3_one_model: bool = True
    """TensorRT-LLM: run the head inside the target's model (one model) rather than as a second one; written for
    1.2.x only: from 1.3 the plan leaves it out (the 1.3.0rc27 and 1.4 LLM APIs have no such field; one model
    is the only path)."""
    use_dynamic_tree: bool = False
    """EAGLE-2's dynamic tree (TensorRT-LLM PyTorch backend and the reference engine): each of the max_draft_len
    draft layers expands dynamic_tree_max_topK nodes; the best max_total_draft_tokens nodes are verified."""
    dynamic_tree_max_topK: int | None = Field(None, ge=1, le=64)
    """With use_dynamic_tree: nodes expanded per draft layer."""
    max_total_draft_tokens: int | None = Field(None, ge=1)
    """With use_dynamic_tree: tree nodes the target verifies (default topK * max_draft_len), as
    EagleDecodingConfig checks."""
    sa_config: SAEnhancer | None = None
    """A suffix-automaton enhancer (TensorRT-LLM's SAEnhancerConfig, >= 1.4; the reference engine too): where
    the context's suffix matched earlier for at least threshold tokens, the automaton's continuation
    replaces the head's chain. Chains only: TensorRT-LLM's dynamic-tree worker refuses it."""
    use_rejection_sampling: bool = False
    """Sampled requests: draw the drafts from the head's distribution and accept each with probability
    min(1, p/q) (speculative sampling); false: the head's argmax, accepted when the target's sample matches.
    Both keep the target's distribution. TensorRT-LLM's DecodingBaseConfig field (main; >= 1.4 here)."""

    @model_validator(mode="after")
    def _dynamic_tree(self) -> Eagle3Speculation:
        if self.use_dynamic_tree and self.sa_config is not None:
            # TensorRT-LLM's Eagle3OneModelDynamicTreeWorker raises "Dynamic tree mode does not support relaxed
            # acceptance or suffix-automaton enhancement" (_torch/speculative/eagle3_dynamic_tree.py)
            raise ValueError("sa_config needs a chain (use_dynamic_tree: false): TensorRT-LLM's dynamic-tree EAGLE-3 "
                             "does not support suffix-automaton enhancement; drop one of them")
        if not self.use_dynamic_tree:
            if self.dynamic_tree_max_topK is not None or self.max_total_draft_tokens is not None:
                raise ValueError("dynamic_tree_max_topK / max_total_draft_tokens need use_dynamic_tree: true (a chain drafts max_draft_len tokens)")
            return self
        if self.dynamic_tree_max_topK is None:
            raise ValueError("use_dynamic_tree: true needs dynamic_tree_max_topK (nodes expanded per draft layer), e.g. 10")
        most = self.dynamic_tree_max_topK * self.max_draft_len
        if self.max_total_draft_tokens is not None and not self.max_draft_len <= self.max_total_draft_tokens <= most:
            raise ValueError(f"max_total_draft_tokens must be in [max_draft_len, dynamic_tree_max_topK * max_draft_len] = "
                             f"[{self.max_draft_len}, {most}], got {self.max_total_draft_tokens}")
        return self

    @property
    def draft_tokens_per_step(self) -> int:
        """Draft tokens one verify step holds: max_draft_len for a chain, the tree's nodes for a dynamic tree
        (max_total_draft_tokens, default dynamic_tree_max_topK * max_draft_len; TensorRT-LLM's tokens per step)."""
        if not self.use_dynamic_tree:
            return self.max_draft_len
        return self.max_total_draft_tokens or self.dynamic_tree_max_topK * self.max_draft_len

    def to_llm_api(self) -> dict[str, Any]:
        config = self.llm_api_fields("max_draft_len", "speculative_model_dir=eagle_model", "eagle3_one_model")
        if self.sa_config is not None:
            config["sa_config"] = self.sa_config.model_dump()
        if self.use_rejection_sampling:
            config["use_rejection_sampling"] = True
        if self.use_dynamic_tree:
            config |= {"use_dynamic_tree": True, "dynamic_tree_max_topK": self.dynamic_tree_max_topK,
                       "max_total_draft_tokens": self.max_total_draft_tokens or self.dynamic_tree_max_topK * self.max_draft_len}
        return config


# --- weights: the head directory -------------------------------------------------------------------


def _locate(loaded: LoadedRecipe) -> CheckpointSource:
    return locate_head(loaded, kind="EAGLE-3")


def check_fit(loaded: LoadedRecipe, target_dir: Path, head_dir: Path) -> None:
    """The head's sizes (as EAGLE's), then the target layers it fuses: TensorRT-LLM's default
    ``(1, L // 2 - 1, L - 4)`` needs ``L > 5`` (config.json only, milliseconds).

    Raises:
        RecipeError: located at ``speculation.eagle_model``.
    """
    from .engine import Eagle3Config, capture_layers_for  # torch: the head's config rules live with the head

    check_sizes(loaded, target_dir, head_dir)
    head, num_layers = read_json(head_dir / "config.json"), target_config(target_dir).get("num_hidden_layers")
    try:
        config = Eagle3Config.from_dict(head, str(head_dir / "config.json"))
        if num_layers is not None:
            capture_layers_for(config, num_layers)
    except ValueError as exc:
        raise loaded.error(("speculation", "eagle_model"), str(exc)) from None


METHOD = SpeculationMethod(
    name="eagle3",
    title="EAGLE-3",
    params=Eagle3Speculation,
    trtllm=TrtllmMapping(
        decoding_type="Eagle3",
        # DecodingBaseConfig.from_dict has no Eagle3 key before 1.3; that PyTorch backend reads Eagle as EAGLE-3.
        renamed=(("0.0", "Eagle"), ("1.3", "Eagle3")),
        speculative_decoding_mode="eagle",
        unavailable={"tensorrt": "EAGLE-3 exists only on TensorRT-LLM's PyTorch backend"},
        one_model=lambda params: params.eagle3_one_model,
    ),
    weights=head_weights("eagle3", field="eagle_model", what="the EAGLE-3 head directory", locate=_locate, check_fit=check_fit,
                         fingerprint_key="eagle"),
    engine="specbuild.methods.eagle3.engine:ENGINE",  # the head loaded once; chains of at most k drafts per request
    training=Training(train="specbuild.methods.eagle3.train:train_for", held_out_config=chain_of, draft_vocabulary=True, soft_labels=True,
                      capture_layers="specbuild.methods.eagle3.train:training_capture_layers"),
    ignored_config_keys=("greedy_sampling",),  # eagle3_one_model is a setting; one process changes nothing here
    unknown_keys_hint=" (the reference engine drafts EAGLE-3 as a chain or, with use_dynamic_tree, EAGLE-2's dynamic tree)",
)
