"""Draft-target speculation: a separate, smaller draft model proposes; the target verifies.

Leviathan et al. 2023; Chen et al. 2023. TensorRT-LLM: ``DraftTargetDecodingConfig`` (LLM API), or two
engines with ``draft_tokens_external`` on the target (engine path; specbuild's ensemble front runs the
draft -> target loop). Reference engine: :mod:`specbuild.engine.methods.draft_target`. Training:
:mod:`specbuild.train.draft` (distils a few of the target's layers).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from .base import (
    DraftEngine,
    DType,
    ReferenceWeights,
    SpeculationMethod,
    Training,
    TrtllmMapping,
    Weights,
    chain_of,
)
from .heads import torch_dtype
from .token_map import TokenMapParams

if TYPE_CHECKING:
    from specbuild.builder.checkpoints import CheckpointSource
    from specbuild.builder.recipe import LoadedRecipe
    from specbuild.engine.methods.base import EngineMethod


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
        return {"decoding_type": self.decoding_type, "max_draft_len": self.max_draft_len, "speculative_model_dir": self.draft_checkpoint}


# --- weights: the draft checkpoint -----------------------------------------------------------------


def locate_draft(loaded: LoadedRecipe) -> CheckpointSource:
    """The draft checkpoint (a packaged model, a local directory or a cached Hugging Face id, as the
    target), located without loading it; relative paths are relative to the recipe.

    Raises:
        RecipeError: the draft is missing (located at ``speculation.draft_checkpoint``).
    """
    from specbuild.builder.checkpoints import CheckpointError, locate_checkpoint

    try:
        return locate_checkpoint(loaded.recipe.speculation.draft_checkpoint, base_dir=loaded.path.parent)
    except CheckpointError as exc:
        raise loaded.error(("speculation", "draft_checkpoint"), str(exc)) from None


def check_draft_vocabulary(loaded: LoadedRecipe, target_dir: Path, draft_dir: Path) -> None:
    """Refuse a draft whose vocabulary differs from the target's: the ``vocab_size`` of the two
    config.json files, then the tokenizers' id -> token tables
    (:mod:`specbuild.builder.tokenizer_identity`; no weights or tokenizer library loaded).

    Raises:
        RecipeError: the sizes or a token differ (located at ``speculation.draft_checkpoint``).
    """
    from specbuild.builder.tokenizer_identity import read_token_table, token_table_difference
    from specbuild.engine.methods.draft_target import check_draft_vocab, read_vocab_size

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


def _write(loaded: LoadedRecipe, draft_dir: Path, out: Path, *, log) -> None:
    """The draft as a Hugging Face checkpoint in ``draft_dtype`` (or the target's)."""
    from transformers import AutoModelForCausalLM

    r = loaded.recipe
    dtype = r.speculation.draft_dtype or r.target.dtype
    model = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch_dtype(dtype), trust_remote_code=r.target.trust_remote_code)
    log(f"writing draft {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {dtype})")
    model.save_pretrained(out, safe_serialization=True)


# --- reference engine, TensorRT-LLM, training ------------------------------------------------------


def engine() -> EngineMethod:
    """The draft runs with its own KV cache; greedy or speculative sampling on its chain."""
    from specbuild.engine.methods.base import EngineMethod
    from specbuild.engine.methods.draft_target import DraftTargetProposer, check_prompt, load_draft

    return EngineMethod(make_proposer=DraftTargetProposer, load=load_draft, check_prompt=check_prompt, verification="chain")


def _draft_engine(spec: DraftTargetSpeculation) -> DraftEngine:
    return DraftEngine(spec.draft_checkpoint, spec.draft_dtype, gather_generation_logits=spec.use_draft_logits)


def _train(spec: DraftTargetSpeculation, target, tokenizer, data, config, out, ckpt_dir, **common):
    from specbuild.train.draft import train_draft

    del spec
    return train_draft(target, tokenizer, data, config, out, ckpt_dir, **common)


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
        reference=ReferenceWeights(subdir="draft", locate=locate_draft, load=_load, write=_write, fingerprint_key="draft"),
    ),
    engine=engine,
    training=Training(train=_train, held_out_config=chain_of),
)
