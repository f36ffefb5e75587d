"""Build an engine directory for the reference engine (``build.backend: reference``).

Layout, shaped like a TensorRT-LLM engine directory so tools read both alike::

    engine/
      config.json   {"version", "pretrained_config": {...}, "build_config": {max_batch_size,
                     max_input_len, max_seq_len, max_num_tokens, max_beam_width, max_draft_len,
                     speculative_decoding_mode}, "speculative_config": {...} | null,
                     "specbuild": {fingerprint, end_id, pad_id, ...}}
      target/       Hugging Face checkpoint (config.json, model.safetensors) in the recipe's dtype
      tokenizer/    tokenizer files
      draft/        draft_target: the draft checkpoint (draft_dtype or the target's dtype)
      medusa/       medusa: the heads (config.json + medusa_lm_head.safetensors) in the target's dtype
      eagle/        eagle: the EAGLE-1/2 head (config.json + model.safetensors) in the target's dtype
      eagle3/       eagle3: the EAGLE-3 head (config.json + model.safetensors) in the target's dtype

``speculative_decoding_mode`` is TensorRT-LLM's IntFlag value (NONE=1, DRAFT_TOKENS_EXTERNAL=2,
MEDUSA=4, LOOKAHEAD=8, EXPLICIT_DRAFT_TOKENS=16, EAGLE=32). The directory is written under a
temporary name and renamed when complete; it is rebuilt only when its fingerprint (recipe target,
speculation and build sections plus the checkpoint's, draft's, Medusa heads' and EAGLE / EAGLE-3 head's files) changes.
"""

from __future__ import annotations

import hashlib
import json
import pickle
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


MEDUSA_WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


def locate_medusa(loaded: LoadedRecipe) -> CheckpointSource | None:
    """The Medusa head directory of a ``medusa`` recipe (None for other methods), located without
    loading it; relative paths are relative to the recipe. It needs ``config.json`` and
    ``medusa_lm_head.safetensors`` (or ``.pt``).

    Raises:
        RecipeError: the directory or one of its files is missing (located at ``speculation.medusa_model``).
    """
    spec = getattr(loaded.recipe.speculation, "medusa_model", None)
    if spec is None:
        return None
    path = loaded.resolve_path(spec)
    if path.is_file():
        problem = f"{path} is a file, not a directory"
    elif not path.is_dir():
        problem = f"no such directory ({path})"
    elif not (path / "config.json").is_file():
        problem = f"{path} has no config.json"
    elif not any((path / name).is_file() for name in MEDUSA_WEIGHTS):
        problem = f"{path} has neither {' nor '.join(MEDUSA_WEIGHTS)}"
    elif (bad := _config_problem(path)) is not None:
        problem = bad
    else:
        return CheckpointSource(spec=spec, kind="local", path=path.resolve())
    raise loaded.error(
        ("speculation", "medusa_model"),
        f"Medusa heads {spec!r}: {problem}; point medusa_model at a Medusa head directory "
        "(config.json with medusa_num_heads, medusa_num_layers + medusa_lm_head.safetensors)",
    )


def check_medusa_sizes(loaded: LoadedRecipe, target_dir: Path, medusa_dir: Path) -> None:
    """Refuse heads whose ``hidden_size`` / ``vocab_size`` in config.json differ from the target's
    config.json (milliseconds, no weights loaded). A size missing on either side is checked when the
    heads are loaded (FasterDecoding's configs carry neither).

    Raises:
        RecipeError: a size differs (located at ``speculation.medusa_model``).
    """
    _check_head_sizes(loaded, "medusa_model", f"Medusa heads {medusa_dir}", medusa_dir, target_dir)


EAGLE_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.pt")


def locate_eagle(loaded: LoadedRecipe) -> CheckpointSource | None:
    """The EAGLE head directory of an ``eagle`` or ``eagle3`` recipe (None for other methods), located without
    loading it; relative paths are relative to the recipe. It needs ``config.json`` and
    ``model.safetensors`` (or ``pytorch_model.bin`` / ``model.pt``).

    Raises:
        RecipeError: the directory or one of its files is missing (located at ``speculation.eagle_model``).
    """
    spec = loaded.recipe.speculation
    if spec.method not in ("eagle", "eagle3"):
        return None
    path = loaded.resolve_path(spec.eagle_model)
    if path.is_file():
        problem = f"{path} is a file, not a directory"
    elif not path.is_dir():
        problem = f"no such directory ({path})"
    elif not (path / "config.json").is_file():
        problem = f"{path} has no config.json"
    elif not any((path / name).is_file() for name in EAGLE_WEIGHTS):
        problem = f"{path} has none of {', '.join(EAGLE_WEIGHTS)}"
    elif (bad := _config_problem(path)) is not None:
        problem = bad
    else:
        return CheckpointSource(spec=spec.eagle_model, kind="local", path=path.resolve())
    kind = "EAGLE-3" if spec.method == "eagle3" else "EAGLE-1/2"
    raise loaded.error(
        ("speculation", "eagle_model"),
        f"EAGLE head {spec.eagle_model!r}: {problem}; point eagle_model at an {kind} head directory "
        "(config.json with hidden_size, num_hidden_layers, ... + model.safetensors)",
    )


def _config_problem(head_dir: Path) -> str | None:
    """What is wrong with ``head_dir/config.json`` (not JSON, not an object), or None."""
    from specbuild.builder.checkpoints import CheckpointError, read_config_json

    try:
        read_config_json(head_dir / "config.json")
    except CheckpointError as exc:
        return str(exc)
    return None


def check_eagle_sizes(loaded: LoadedRecipe, target_dir: Path, eagle_dir: Path) -> None:
    """Refuse a head whose ``hidden_size`` / ``vocab_size`` in config.json differ from the target's
    config.json (milliseconds, no weights loaded; a size the head's config lacks is checked at load).

    Raises:
        RecipeError: a size differs (located at ``speculation.eagle_model``).
    """
    _check_head_sizes(loaded, "eagle_model", f"EAGLE head {eagle_dir}", eagle_dir, target_dir)


def _check_head_sizes(loaded: LoadedRecipe, field: str, label: str, head_dir: Path, target_dir: Path) -> None:
    """``hidden_size`` / ``vocab_size`` of a head's config.json against the target's (sizes missing on
    either side are checked when the head is loaded). Raises RecipeError at ``speculation.<field>``."""
    head, target = _read_json(head_dir / "config.json"), _read_json(target_dir / "config.json")
    target = {**(target.get("text_config") or {}), **target}
    differ = [k for k in ("hidden_size", "vocab_size") if k in head and k in target and head[k] != target[k]]
    if differ:
        raise loaded.error(
            ("speculation", field),
            f"{label} has {', '.join(f'{k}={head[k]}' for k in differ)} but the target has "
            f"{', '.join(f'{k}={target[k]}' for k in differ)}; it must be trained on this target",
        )


def check_eagle3_layers(loaded: LoadedRecipe, target_dir: Path, eagle_dir: Path) -> None:
    """Refuse an EAGLE-3 head whose captured layers the target lacks: TensorRT-LLM's default
    ``(1, L // 2 - 1, L - 4)`` needs ``L > 5`` (config.json only, milliseconds; no-op for other methods).

    Raises:
        RecipeError: located at ``speculation.eagle_model``.
    """
    if loaded.recipe.speculation.method != "eagle3":
        return
    from specbuild.engine.methods.eagle3 import Eagle3Config, capture_layers_for

    head, target = _read_json(eagle_dir / "config.json"), _read_json(target_dir / "config.json")
    num_layers = {**(target.get("text_config") or {}), **target}.get("num_hidden_layers")
    try:
        config = Eagle3Config.from_dict(head, str(eagle_dir / "config.json"))
        if num_layers is not None:
            capture_layers_for(config, num_layers)
    except ValueError as exc:
        raise loaded.error(("speculation", "eagle_model"), str(exc)) from None


def check_reference_speculation(loaded: LoadedRecipe) -> None:
    """Refuse speculation settings the reference engine does not implement (milliseconds).

    Raises:
        RecipeError: ``speculation.posterior_threshold`` set (EAGLE's typical acceptance).
    """
    if getattr(loaded.recipe.speculation, "posterior_threshold", None) is not None:
        raise loaded.error(
            ("speculation", "posterior_threshold"),
            "typical acceptance (posterior_threshold) is not in the reference engine yet; it decodes greedily "
            "with exact token matching: remove posterior_threshold, or set build.backend: tensorrt (TensorRT-LLM's engine path, GPU)",
        )


def _read_json(path: Path) -> dict:
    """A JSON object from ``path``; ``{}`` when unreadable or not an object (callers check sizes it has)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def engine_fingerprint(
    loaded: LoadedRecipe,
    source: CheckpointSource,
    draft: CheckpointSource | None = None,
    medusa: CheckpointSource | None = None,
    eagle: CheckpointSource | None = None,
) -> str:
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
    if medusa is not None:  # absent for other methods, so their fingerprints (and built engines) stay valid
        payload["medusa"] = medusa.fingerprint()
    if eagle is not None:
        payload["eagle"] = eagle.fingerprint()
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
    check_reference_speculation(loaded)
    source = locate_target(loaded)
    draft_source = locate_draft(loaded)
    medusa_source = locate_medusa(loaded)
    if medusa_source is not None and source.kind != "packaged":
        check_medusa_sizes(loaded, source.path, medusa_source.path)
    eagle_source = locate_eagle(loaded)
    if eagle_source is not None and source.kind != "packaged":
        check_eagle_sizes(loaded, source.path, eagle_source.path)
        check_eagle3_layers(loaded, source.path, eagle_source.path)
    fingerprint = engine_fingerprint(loaded, source, draft_source, medusa_source, eagle_source)
    if not force and read_fingerprint(engine_dir) == fingerprint:
        log(f"engine is up to date: {engine_dir}")
        return EngineBuild(engine_dir=engine_dir, fingerprint=fingerprint, rebuilt=False)
    checkpoint = materialize_checkpoint(source, log=log)
    draft = materialize_checkpoint(draft_source, log=log) if draft_source is not None else None
    if draft is not None:
        check_draft_vocabulary(loaded, checkpoint, draft)
    medusa_heads = _load_medusa_heads(loaded, medusa_source.path, checkpoint) if medusa_source is not None else None
    eagle_head = _load_eagle_head(loaded, eagle_source.path, checkpoint) if eagle_source is not None else None
    with staging_dir(engine_dir) as tmp:
        config = _write_engine(loaded, checkpoint, tmp, log=log)
        if draft is not None:
            _write_draft(loaded, draft, tmp / "draft", log=log)
        if medusa_heads is not None:
            _write_medusa(medusa_heads, tmp, log=log)
        if eagle_head is not None:
            _write_eagle(eagle_head, tmp, log=log)
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
            "kernels": r.build.kernels,
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


def _load_medusa_heads(loaded: LoadedRecipe, medusa_dir: Path, checkpoint: Path):
    """The heads (``MedusaHeads``) in the target's dtype, checked against the target's sizes; a ``.pt``
    is read with ``weights_only=True``. Seconds at most: it runs before the target is written.

    Raises:
        RecipeError: a malformed head directory, a head count other than ``num_medusa_heads``, or sizes
            that differ from the target's (located at ``speculation.medusa_model``).
    """
    import torch

    from specbuild.engine.methods.medusa import check_heads_fit, load_medusa_heads

    r = loaded.recipe
    target = _read_json(checkpoint / "config.json")
    target = {**(target.get("text_config") or {}), **target}
    try:
        heads = load_medusa_heads(medusa_dir, num_heads=r.speculation.num_medusa_heads, dtype=getattr(torch, r.target.dtype))
        check_heads_fit(heads.config, hidden_size=target.get("hidden_size"), vocab_size=target.get("vocab_size"), where=medusa_dir)
    except (OSError, ValueError, pickle.UnpicklingError) as exc:  # UnpicklingError: a .pt that is not plain tensors
        raise loaded.error(("speculation", "medusa_model"), str(exc)) from None
    return heads


def _write_medusa(heads, out: Path, *, log) -> None:
    from specbuild.engine.methods.medusa import MEDUSA_SUBDIR, save_medusa_heads

    c = heads.config
    log(f"writing {c.medusa_num_heads} Medusa heads ({c.medusa_num_layers} layer(s) each)")
    save_medusa_heads(out / MEDUSA_SUBDIR, heads.heads.state_dict(), c)


def _load_eagle_head(loaded: LoadedRecipe, eagle_dir: Path, checkpoint: Path):
    """The head (``EagleHead``, or ``Eagle3Head`` for ``eagle3``) in the target's dtype, checked against
    the target's sizes (EAGLE-3: also its layers and its draft vocabulary's ``d2t``); a ``.pt`` / ``.bin``
    is read with ``weights_only=True``. Seconds at most: it runs before the target is written.

    Raises:
        RecipeError: a malformed head directory or sizes that differ from the target's (located at
            ``speculation.eagle_model``).
    """
    import torch

    from specbuild.engine.methods.eagle import load_eagle_head
    from specbuild.engine.methods.eagle3 import check_vocab_fits, load_eagle3_head

    check_eagle_sizes(loaded, checkpoint, eagle_dir)  # again: a packaged target's sizes are known only now
    check_eagle3_layers(loaded, checkpoint, eagle_dir)
    eagle3 = loaded.recipe.speculation.method == "eagle3"
    target = _read_json(checkpoint / "config.json")
    vocab = {**(target.get("text_config") or {}), **target}.get("vocab_size")
    try:
        head = (load_eagle3_head if eagle3 else load_eagle_head)(eagle_dir, dtype=getattr(torch, loaded.recipe.target.dtype))
        if eagle3 and vocab is not None:
            check_vocab_fits(head, vocab)
    except (OSError, ValueError, pickle.UnpicklingError) as exc:  # UnpicklingError: a .pt that is not plain tensors
        raise loaded.error(("speculation", "eagle_model"), str(exc)) from None
    return head


def _write_eagle(head, out: Path, *, log) -> None:
    from specbuild.engine.methods.eagle import EAGLE_SUBDIR, save_eagle_head
    from specbuild.engine.methods.eagle3 import EAGLE3_SUBDIR, Eagle3Head, save_eagle3_head

    c = head.config
    if isinstance(head, Eagle3Head):
        log(f"writing the EAGLE-3 head (midlayer, hidden_size={c.hidden_size}, draft vocabulary {c.draft_vocab_size or c.vocab_size})")
        save_eagle3_head(out / EAGLE3_SUBDIR, head.state_dict(), c)
        return
    log(f"writing the EAGLE head ({c.num_hidden_layers} decoder layer(s), hidden_size={c.hidden_size})")
    save_eagle_head(out / EAGLE_SUBDIR, head.state_dict(), c)


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
        "max_num_tokens": b.max_num_tokens or max(b.max_input_len, b.max_batch_size * (k + 1)),
        "max_beam_width": 1,
        "max_draft_len": k,
        "speculative_decoding_mode": SPECULATIVE_DECODING_MODE[spec.speculative_decoding_mode],
    }
