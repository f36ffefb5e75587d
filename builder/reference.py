"""Build an engine directory for the reference engine (``build.backend: reference``).

Layout, shaped like a TensorRT-LLM engine directory so tools read both alike::

    engine/
      config.json   {"version", "pretrained_config": {...}, "build_config": {max_batch_size,
                     max_input_len, max_seq_len, max_num_tokens, max_beam_width, max_draft_len,
                     speculative_decoding_mode}, "speculative_config": {...} | null,
                     "specbuild": {fingerprint, end_id, pad_id, ...}}
      target/       Hugging Face checkpoint (config.json, model.safetensors) in the recipe's dtype
      tokenizer/    tokenizer files

``speculative_decoding_mode`` is TensorRT-LLM's IntFlag value (NONE=1, DRAFT_TOKENS_EXTERNAL=2,
MEDUSA=4, LOOKAHEAD=8, EXPLICIT_DRAFT_TOKENS=16, EAGLE=32). The directory is written under a
temporary name and renamed when complete; it is rebuilt only when its fingerprint (recipe target,
speculation and build sections plus the checkpoint's files) changes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from specbuild import __version__
from specbuild.builder.atomic import staging_dir
from specbuild.builder.checkpoints import (
    CheckpointSource,
    locate_checkpoint,
    materialize_checkpoint,
    quiet_transformers,
)
from specbuild.builder.recipe import LoadedRecipe, RecipeError

ENGINE_FORMAT = "specbuild-reference-1"
SPECULATIVE_DECODING_MODE = {
    "none": 1,
    "draft_tokens_external": 2,
    "medusa": 4,
    "lookahead_decoding": 8,
    "explicit_draft_tokens": 16,
    "eagle": 32,
}


@dataclass(frozen=True)
class EngineBuild:
    """Result of :func:`build_reference_engine`: where the engine is and whether it was rebuilt."""

    engine_dir: Path
    fingerprint: str
    rebuilt: bool


def locate_target(loaded: LoadedRecipe) -> CheckpointSource:
    """The recipe's target checkpoint, located without loading it.

    Raises:
        RecipeError: the checkpoint is missing (message has the recipe file, line and fix).
    """
    from specbuild.builder.checkpoints import CheckpointError

    target = loaded.recipe.target
    try:
        return locate_checkpoint(target.checkpoint, base_dir=loaded.path.parent, revision=target.revision)
    except CheckpointError as exc:
        raise loaded.error(("target", "checkpoint"), str(exc)) from None


def locate_draft(loaded: LoadedRecipe) -> CheckpointSource | None:
    """The draft checkpoint of a ``draft_target`` recipe (None for other methods), located without
    loading it; relative paths are relative to the recipe.

    Raises:
        RecipeError: the draft is missing (located at ``speculation.draft_checkpoint``).
    """
    from specbuild.builder.checkpoints import CheckpointError

    draft = getattr(loaded.recipe.speculation, "draft_checkpoint", None)
    if draft is None:
        return None
    try:
        return locate_checkpoint(draft, base_dir=loaded.path.parent)
    except CheckpointError as exc:
        raise loaded.error(("speculation", "draft_checkpoint"), str(exc)) from None


def check_draft_vocabulary(loaded: LoadedRecipe, target_dir: Path, draft_dir: Path) -> None:
    """Refuse a draft whose vocabulary differs from the target's, from the two config.json files
    (milliseconds, no weights loaded).

    Raises:
        RecipeError: the sizes differ (located at ``speculation.draft_checkpoint``).
    """
    from specbuild.engine.methods.draft_target import check_draft_vocab, read_vocab_size

    try:
        check_draft_vocab(draft_dir, read_vocab_size(target_dir))
    except ValueError as exc:
        raise loaded.error(("speculation", "draft_checkpoint"), str(exc)) from None


def engine_fingerprint(loaded: LoadedRecipe, source: CheckpointSource, draft: CheckpointSource | None = None) -> str:
    """Hash of everything the engine depends on (not serve/verify settings)."""
    r = loaded.recipe
    payload = {
        "format": ENGINE_FORMAT,
        "target": r.target.model_dump(),
        "speculation": r.speculation.model_dump(),
        "build": r.build.model_dump(),
        "checkpoint": source.fingerprint(),
        "draft": draft.fingerprint() if draft is not None else None,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def read_fingerprint(engine_dir: Path) -> str | None:
    """Fingerprint of a finished engine directory, or None when there is none (or it is unreadable)."""
    try:
        return json.loads((engine_dir / "config.json").read_text())["specbuild"]["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build_reference_engine(loaded: LoadedRecipe, engine_dir: Path, *, force: bool = False, log=print) -> EngineBuild:
    """Write (or reuse) the reference engine directory for ``loaded``.

    Raises:
        RecipeError: missing checkpoint, or limits the checkpoint cannot meet (e.g. ``max_seq_len``
            above the model's ``max_position_embeddings``).
    """
    source = locate_target(loaded)
    draft_source = locate_draft(loaded)
    fingerprint = engine_fingerprint(loaded, source, draft_source)
    if not force and read_fingerprint(engine_dir) == fingerprint:
        log(f"engine is up to date: {engine_dir}")
        return EngineBuild(engine_dir=engine_dir, fingerprint=fingerprint, rebuilt=False)
    checkpoint = materialize_checkpoint(source, log=log)
    draft = materialize_checkpoint(draft_source, log=log) if draft_source is not None else None
    if draft is not None:
        check_draft_vocabulary(loaded, checkpoint, draft)
    with staging_dir(engine_dir) as tmp:
        config = _write_engine(loaded, checkpoint, tmp, log=log)
        if draft is not None:
            _write_draft(loaded, draft, tmp / "draft", log=log)
        config["specbuild"]["fingerprint"] = fingerprint
        config["specbuild"]["target_checkpoint"] = source.spec
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    log(f"engine written: {engine_dir}")
    return EngineBuild(engine_dir=engine_dir, fingerprint=fingerprint, rebuilt=True)


def _write_engine(loaded: LoadedRecipe, checkpoint: Path, out: Path, *, log) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    r = loaded.recipe
    trust = r.target.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=trust)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=getattr(torch, r.target.dtype), trust_remote_code=trust)
    _check_limits(loaded, model.config)
    log(f"writing {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {r.target.dtype})")
    model.save_pretrained(out / "target", safe_serialization=True)
    tokenizer.save_pretrained(out / "tokenizer")
    end_id = _end_id(tokenizer, model)
    return {
        "version": ENGINE_FORMAT,
        "pretrained_config": _pretrained_config(model.config, r.target.dtype),
        "build_config": _build_config(loaded),
        # Paths inside the engine directory are implicit (the draft is engine_dir/draft).
        "speculative_config": _without_paths(r.speculation.to_llm_api()),
        "specbuild": {
            "version": __version__,
            "recipe": r.name,
            "end_id": end_id,
            "pad_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id,
            "trust_remote_code": trust,
            "device": r.build.device,
        },
    }


def _write_draft(loaded: LoadedRecipe, draft: Path, out: Path, *, log) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    r = loaded.recipe
    dtype = r.speculation.draft_dtype or r.target.dtype
    model = AutoModelForCausalLM.from_pretrained(draft, dtype=getattr(torch, dtype), trust_remote_code=r.target.trust_remote_code)
    log(f"writing draft {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {dtype})")
    model.save_pretrained(out, safe_serialization=True)


def _without_paths(config: dict | None) -> dict | None:
    return None if config is None else {k: v for k, v in config.items() if k != "speculative_model_dir"}


def _check_limits(loaded: LoadedRecipe, hf_config) -> None:
    limit = getattr(hf_config, "max_position_embeddings", None)
    need = loaded.recipe.build.max_seq_len + loaded.recipe.speculation.max_draft_len
    if limit is not None and need > limit:
        raise loaded.error(
            ("build", "max_seq_len"),
            f"max_seq_len + max_draft_len = {need} exceeds the model's max_position_embeddings ({limit}); "
            f"lower build.max_seq_len to at most {limit - loaded.recipe.speculation.max_draft_len}",
        )


def _end_id(tokenizer, model) -> int:
    eos = tokenizer.eos_token_id
    if eos is None:
        eos = model.generation_config.eos_token_id
    if isinstance(eos, list):
        eos = eos[0]
    if eos is None:
        raise RecipeError("the tokenizer defines no end token (eos_token_id); set verify.end_id: -1")
    return int(eos)


def _pretrained_config(hf_config, dtype: str) -> dict:
    keys = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_theta",
        "tie_word_embeddings",
    )
    config = {"architecture": (hf_config.architectures or ["?"])[0], "dtype": dtype}
    config.update({k: getattr(hf_config, k) for k in keys if hasattr(hf_config, k)})
    return config


def _build_config(loaded: LoadedRecipe) -> dict:
    b, spec = loaded.recipe.build, loaded.recipe.speculation
    k = spec.max_draft_len
    return {
        "max_batch_size": b.max_batch_size,
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
        "max_num_tokens": max(b.max_input_len, b.max_batch_size * (k + 1)),
        "max_beam_width": 1,
        "max_draft_len": k,
        "speculative_decoding_mode": SPECULATIVE_DECODING_MODE[spec.speculative_decoding_mode],
    }
