"""Draft-target speculation: a separate, smaller draft model proposes; the target verifies.

Leviathan et al. 2023; Chen et al. 2023. TensorRT-LLM: ``DraftTargetDecodingConfig`` (LLM API), or two
engines with ``draft_tokens_external`` on the target (engine path; specbuild's ensemble front runs the
draft -> target loop). Reference engine: :mod:`specbuild.methods.draft_target.engine`. Training:
:mod:`specbuild.methods.draft_target.train` (distils a few of the target's layers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from ..base import (
    DraftEngine,
    DType,
    ReferenceWeights,
    SpeculationMethod,
    Training,
    TrtllmMapping,
    Weights,
    chain_of,
)
from ..token_map import TokenMapParams

if TYPE_CHECKING:
    from specbuild.util.checkpoints import CheckpointSource
    from specbuild.builder.recipe import LoadedRecipe


class DraftTargetSpeculation(TokenMapParams):
    """A separate, smaller draft model proposes; the target verifies (Leviathan et al. 2023; Chen et
    al. 2023). TensorRT-LLM: ``DraftTargetDecodingConfig`` (LLM API), or two engines with
    ``draft_tokens_external`` on the target (engine path). The draft shares the target's vocabulary.
    ``use_draft_logits``: accept by rejection sampling on the draft's logits (sampling) rather than by
    token matching."""

    method: Literal["draft_target"]
    """The speculation method: this section's settings are chosen by it."""
    draft_checkpoint: str = Field(min_length=1)
    """The draft model: packaged, a local Hugging Face folder (relative to the recipe, may start with $SPECBUILD_CACHE) or a cached `org/name`; same vocabulary as the target."""
    draft_dtype: DType | None = None  # None: the target's dtype
    """The draft's dtype; null: the target's."""
    max_draft_len: int = Field(4, ge=1, le=64)  # >= 1: the target needs a draft budget (tensorrtllm_backend#473)
    """Most draft tokens the draft proposes per step."""
    use_draft_logits: bool = False
    """Accept by rejection sampling on the draft's logits (sampling) instead of by token matching."""

    def to_llm_api(self) -> dict[str, Any]:
        return self.llm_api_fields("max_draft_len", "speculative_model_dir=draft_checkpoint")


# --- weights: the draft checkpoint -----------------------------------------------------------------


def locate_draft(loaded: LoadedRecipe) -> CheckpointSource:
    """The draft checkpoint (a packaged model, a local directory or a cached Hugging Face id, as the
    target), located without loading it; relative paths are relative to the recipe.

    Raises:
        RecipeError: the draft is missing, or has no config.json or weights (located at
            ``speculation.draft_checkpoint``).
    """
    from specbuild.util.checkpoints import CheckpointError, check_checkpoint_files, locate_checkpoint

    try:
        source = locate_checkpoint(loaded.recipe.speculation.draft_checkpoint, base_dir=loaded.path.parent)
        return check_checkpoint_files(source, tokenizer=False)  # the draft shares the target's tokenizer
    except CheckpointError as exc:
        raise loaded.error(("speculation", "draft_checkpoint"), str(exc)) from None


def read_vocab_size(checkpoint_dir: str | Path) -> int:
    """``vocab_size`` from a Hugging Face ``config.json`` (top level, else ``text_config``), without torch.

    Raises:
        FileNotFoundError: no ``config.json``.
        ValueError: it names no vocab_size.
    """
    config_path = Path(checkpoint_dir) / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no Hugging Face checkpoint at {checkpoint_dir} (config.json missing)")
    config = json.loads(config_path.read_text())
    vocab_size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    if vocab_size is None:
        raise ValueError(f"{config_path}: no vocab_size")
    return int(vocab_size)


def check_draft_vocab(draft_dir: str | Path, target_vocab_size: int) -> None:
    """Refuse a draft whose vocabulary size differs from the target's (before loading any weights).

    Raises:
        ValueError: the sizes differ; the message names both.
    """
    draft_vocab_size = read_vocab_size(draft_dir)
    if draft_vocab_size != target_vocab_size:
        raise ValueError(
            f"draft model {draft_dir} has vocab_size={draft_vocab_size} but the target has "
            f"vocab_size={target_vocab_size}; draft-target speculation needs a draft that shares the "
            "target's vocabulary"
        )


def check_draft_vocabulary(loaded: LoadedRecipe, target_dir: Path, draft_dir: Path) -> None:
    """Refuse a draft whose vocabulary differs from the target's: the ``vocab_size`` of the two
    config.json files, then the tokenizers' id -> token tables
    (:mod:`specbuild.util.tokenizer_identity`; no weights or tokenizer library loaded).

    Raises:
        RecipeError: the sizes or a token differ (located at ``speculation.draft_checkpoint``).
    """
    from specbuild.util.tokenizer_identity import read_token_table, token_table_difference

    try:
        check_draft_vocab(draft_dir, read_vocab_size(target_dir))
    except ValueError as exc:
        raise loaded.error(("speculation", "draft_checkpoint"), str(exc)) from None
    target, draft = read_token_table(target_dir), read_token_table(draft_dir)
    difference = token_table_difference(target, draft) if target is not None and draft is not None else None
    if difference is not None:
        raise loaded.error(
            ("speculation", "draft_checkpoint"),
            f"the draft's tokenizer differs from the target's: {difference}; draft-target speculation needs a draft "
            "trained with the target's tokenizer (same tokens at the same ids)",
        )


def _load(loaded: LoadedRecipe, draft_dir: Path, target_dir: Path) -> Path:
    """Nothing to read ahead: the vocabulary check is the draft's fit; it is converted when written."""
    del loaded, target_dir
    return draft_dir


def _draft_engine(spec: DraftTargetSpeculation) -> DraftEngine:
    return DraftEngine(spec.draft_checkpoint, spec.draft_dtype, gather_generation_logits=spec.use_draft_logits)


METHOD = SpeculationMethod(
    name="draft_target",
    title="draft-target",
    params=DraftTargetSpeculation,
    trtllm=TrtllmMapping(
        decoding_type="DraftTarget",
        renamed=(("1.3", "Draft_Target"),),  # llm_args.py 1.3 line: DraftTargetDecodingConfig's Literal
        speculative_decoding_mode="draft_tokens_external",
        paged_context_fmha=True,
        draft_engine=_draft_engine,
    ),
    weights=Weights(
        field="draft_checkpoint", what="the draft checkpoint", role="draft", draft_model=True, check_fit=check_draft_vocabulary,
        reference=ReferenceWeights(subdir="draft", locate=locate_draft, load=_load, write="specbuild.methods.draft_target.engine:write_draft",
                                   fingerprint_key="draft"),
    ),
    engine="specbuild.methods.draft_target.engine:ENGINE",  # the draft with its own KV cache; greedy or sampled chains
    training=Training(train="specbuild.methods.draft_target.train:train_for", held_out_config=chain_of),
)
