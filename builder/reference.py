"""Build an engine directory for the reference engine (``build.backend: reference``).

Layout, shaped like a TensorRT-LLM engine directory so tools read both alike::

    engine/
      config.json   {"version", "pretrained_config": {...}, "build_config": {max_batch_size,
                     max_input_len, max_seq_len, max_num_tokens, max_beam_width, max_draft_len,
                     speculative_decoding_mode}, "speculative_config": {...} | null (with the
                     runtime controls draft_len_schedule, max_concurrency, acceptance_window,
                     acceptance_length_threshold when the recipe sets them),
                     "specbuild": {fingerprint, end_id, pad_id, kernels (the recipe's build.kernels),
                     kernel_guarantee: {linear, attention, greedy_equality: "bitwise" | "near-ties",
                     fallback_reason, verify}, ...}}
      target/       Hugging Face checkpoint (config.json, model.safetensors) in the recipe's dtype
      tokenizer/    tokenizer files
      <subdir>/     the method's weights, written by the method (:attr:`specbuild.methods.Weights.reference`):
                    draft/ (draft_target: the draft checkpoint in draft_dtype or the target's dtype),
                    medusa/, eagle/, eagle3/ (the heads in the target's dtype)

``speculative_decoding_mode`` is TensorRT-LLM's IntFlag value (NONE=1, DRAFT_TOKENS_EXTERNAL=2,
MEDUSA=4, LOOKAHEAD=8, EXPLICIT_DRAFT_TOKENS=16, EAGLE=32). The directory is written under a
temporary name and renamed when complete; it is rebuilt only when its fingerprint (recipe target,
speculation and build sections plus the checkpoint's and the method's weights' files) changes, or when
``build.kernels: auto`` now resolves to other kernels than it records (a C compiler installed or removed).

``kernel_guarantee`` is what the target will run (:func:`specbuild.engine.guarantee.plan_kernels`): the
engine's own kernels (``rowgemm`` linears and ``specbuild`` attention, greedy equality ``bitwise``) or a
fallback (``near-ties``, with the reason); the engine loads exactly those linears
(:meth:`~specbuild.runtime.ReferenceEngine.from_engine_dir`), and the build prints the same line.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from specbuild import __version__
from specbuild.util.atomic import staging_dir
from specbuild.util.checkpoints import (
    CheckpointSource,
    locate_checkpoint,
    materialize_checkpoint,
    quiet_transformers,
)
from specbuild.builder.recipe import LoadedRecipe, RecipeError
from specbuild.engine.native import BITWISE, KernelBuildError, KernelChoice, find_compiler
from specbuild.methods import registered

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
    """The recipe's target checkpoint, located without loading it, holding a config, tokenizer files
    and weights (:func:`~specbuild.util.checkpoints.check_checkpoint_files`).

    Raises:
        RecipeError: the checkpoint is missing or incomplete (message has the recipe file, line, what
            is missing and the fix).
    """
    from specbuild.util.checkpoints import CheckpointError, check_checkpoint_files

    target = loaded.recipe.target
    try:
        source = locate_checkpoint(target.checkpoint, base_dir=loaded.path.parent, revision=target.revision)
        return check_checkpoint_files(source)  # config, tokenizer and weights: not a traceback at the build
    except CheckpointError as exc:
        raise loaded.error(("target", "checkpoint"), str(exc)) from None


def locate_weights(loaded: LoadedRecipe) -> CheckpointSource | None:
    """The method's draft / heads (:attr:`~specbuild.methods.Weights.reference`), located without loading
    them; None for a method without any.

    Raises:
        RecipeError: they are missing or incomplete (located at the method's weights field).
    """
    weights = loaded.recipe.speculation.definition.weights
    return None if weights is None or weights.reference is None else weights.reference.locate(loaded)


def check_reference_speculation(loaded: LoadedRecipe) -> None:
    """Refuse a method, or settings of it, the reference engine does not implement (milliseconds).

    Raises:
        RecipeError: the method has no reference engine side (ReDrafter, MTP: the message names the
            backend that runs it), or a setting it does not implement (EAGLE's ``posterior_threshold``).
    """
    spec = loaded.recipe.speculation
    method = spec.definition
    if not method.runs_on_reference:
        from specbuild.builder.trtllm_version import supported_paths

        runs = [name for name, m in registered().items() if m.runs_on_reference]
        raise loaded.error(
            ("speculation", "method"),
            f"method {spec.method!r} is not in the reference engine yet; it runs: {', '.join(runs)}. Pick one of those, "
            f"or build with TensorRT-LLM on a GPU (build.backend: {' or '.join(supported_paths(spec.method))})",
        )
    refusal = method.reference_check(spec) if method.reference_check is not None else None
    if refusal is not None:
        raise loaded.error(("speculation", refusal[0]), refusal[1])


@dataclass(frozen=True)
class ReferenceInputs:
    """What a reference build reads, located and checked by :func:`check_reference_inputs`.

    Attributes:
        target: the target checkpoint.
        weights: the method's draft / heads; None when it has none, or the train stage has yet to write them.
        fit_checked: the weights were checked against the target's config.json; not yet when either is a
            packaged GGUF (its sizes are known once it is converted).
    """

    target: CheckpointSource
    weights: CheckpointSource | None = None
    fit_checked: bool = False


def check_reference_inputs(loaded: LoadedRecipe, *, trained_later: bool = False) -> ReferenceInputs:
    """The files a reference build reads, checked before long work, in milliseconds and without torch:
    the target checkpoint exists, and the method's weights exist and fit the target
    (:attr:`~specbuild.methods.Weights.check_fit`: a draft shares the target's vocabulary, a head its
    hidden and vocabulary sizes, an EAGLE-3 head finds the layers it fuses). Each is checked once:
    :func:`build_reference_engine` takes the result. Call :func:`check_reference_speculation` first.

    Args:
        trained_later: the recipe's ``train:`` section writes the weights; they are located by the build.

    Raises:
        RecipeError: naming the recipe line of the field at fault.
    """
    inputs = ReferenceInputs(locate_target(loaded))
    _check_limits_before_build(loaded, inputs.target)
    locate_token_map(loaded)
    return inputs if trained_later else _with_weights(loaded, inputs)


def locate_token_map(loaded: LoadedRecipe) -> Path | None:
    """The recipe's ``speculation.speculative_token_map`` file (:mod:`specbuild.methods.token_map`),
    located without reading it; None when the recipe names none, or when the train stage writes it
    (``train.token_map_size``) and it is not there yet.

    Raises:
        RecipeError: at ``speculation.speculative_token_map``: no such file (and no train stage to write
            it), or a directory.
    """
    from specbuild.methods.token_map import FIELD, recipe_token_map

    path = recipe_token_map(loaded)
    if path is None:
        return None
    if path.is_dir():
        raise loaded.error(("speculation", FIELD), f"{path} is a directory; point {FIELD} at a token-map file (.json, .safetensors or .pt)")
    if path.is_file():
        if path.suffix.lower() == ".json":  # read now (milliseconds, no torch): a bad list is named before the build
            from specbuild.methods.token_map import read_token_ids

            try:
                read_token_ids(path)
            except ValueError as exc:
                raise loaded.error(("speculation", FIELD), str(exc)) from None
        return path
    train = loaded.recipe.train
    if train is not None and train.token_map_size is not None:
        return None  # the train stage counts the target's tokens in its data and writes it
    raise loaded.error(
        ("speculation", FIELD),
        f"no token map at {path}; give a file of token ids (.json list, .safetensors, SGLang's .pt), or add "
        "train.token_map_size to have the train stage write the target's most frequent tokens there",
    )


def _with_weights(loaded: LoadedRecipe, inputs: ReferenceInputs) -> ReferenceInputs:
    """``inputs`` with the method's weights located and, where both sides are plain directories, checked."""
    weights = loaded.recipe.speculation.definition.weights
    if inputs.weights is not None or weights is None or weights.reference is None:
        return inputs
    source = weights.reference.locate(loaded)
    fit = inputs.target.kind != "packaged" and source.kind != "packaged"
    if fit and weights.check_fit is not None:
        weights.check_fit(loaded, inputs.target.path, source.path)
    return ReferenceInputs(inputs.target, source, fit)


def engine_fingerprint(loaded: LoadedRecipe, source: CheckpointSource, weights: CheckpointSource | None = None) -> str:
    """Hash of everything the engine depends on (not serve/verify settings): the recipe's target,
    speculation and build sections, the target checkpoint's files and the method's weights' files."""
    r = loaded.recipe
    payload = {
        "format": ENGINE_FORMAT,
        "target": r.target.model_dump(),
        "speculation": r.speculation.model_dump(),
        # runtime controls added later count only when set: engines built before stay valid
        "build": {k: v for k, v in r.build.model_dump().items()
                  if v is not None or k not in ("max_concurrency", "acceptance_window", "acceptance_length_threshold")},
        "checkpoint": source.fingerprint(),
        "draft": None,
    }
    if weights is not None:  # under a key of their own ("draft", "medusa", "eagle"): engines built before stay valid
        payload[r.speculation.definition.weights.reference.fingerprint_key] = weights.fingerprint()
    token_map = locate_token_map(loaded)
    if token_map is not None:  # its contents, not only its path (only when set: engines built before stay valid)
        payload["token_map"] = hashlib.sha256(token_map.read_bytes()).hexdigest()
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def read_fingerprint(engine_dir: Path) -> str | None:
    """Fingerprint of a finished engine directory, or None when there is none (or it is unreadable)."""
    try:
        return json.loads((engine_dir / "config.json").read_text())["specbuild"]["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build_reference_engine(
    loaded: LoadedRecipe, engine_dir: Path, *, force: bool = False, log=print, inputs: ReferenceInputs | None = None
) -> EngineBuild:
    """Write (or reuse) the reference engine directory for ``loaded``.

    Args:
        inputs: what :func:`check_reference_inputs` located and checked (None: check them here). Weights
            it could not check yet (the train stage wrote them; a packaged target) are checked here, once.

    Raises:
        RecipeError: missing checkpoint or weights, weights that do not fit the target, or limits the
            checkpoint cannot meet (e.g. ``max_seq_len`` above the model's ``max_position_embeddings``).
    """
    if inputs is None:
        check_reference_speculation(loaded)
        inputs = check_reference_inputs(loaded)
    else:
        inputs = _with_weights(loaded, inputs)
    fingerprint = engine_fingerprint(loaded, inputs.target, inputs.weights)
    if not force and read_fingerprint(engine_dir) == fingerprint and _recorded_kernels_hold(loaded, engine_dir, log=log):
        log(f"engine is up to date: {engine_dir}")
        _log_kernels(read_kernel_guarantee(engine_dir), log)
        return EngineBuild(engine_dir=engine_dir, fingerprint=fingerprint, rebuilt=False)
    checkpoint = materialize_checkpoint(inputs.target, log=log)
    weights = loaded.recipe.speculation.definition.weights
    read = None
    if inputs.weights is not None:
        weights_dir = materialize_checkpoint(inputs.weights, log=log)
        if not inputs.fit_checked and weights.check_fit is not None:  # a packaged checkpoint's sizes are known only now
            weights.check_fit(loaded, checkpoint, weights_dir)
        read = weights.reference.load(loaded, weights_dir, checkpoint)  # seconds; before the target is written
    with staging_dir(engine_dir) as tmp:
        config = _write_engine(loaded, checkpoint, tmp, log=log)
        if read is not None:
            weights.reference.write(loaded, read, tmp / weights.reference.subdir, log=log)
        _write_token_map(loaded, config, tmp, log=log)
        config["specbuild"]["fingerprint"] = fingerprint
        config["specbuild"]["target_checkpoint"] = inputs.target.spec
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    log(f"engine written: {engine_dir}")
    return EngineBuild(engine_dir=engine_dir, fingerprint=fingerprint, rebuilt=True)


def _check_loaded_weights(loaded: LoadedRecipe, checkpoint: Path, info: dict) -> None:
    """Refuse a target whose weights do not match its config: transformers fills a tensor the files lack
    with random values (its load report says "newly initialized") and goes on, and an engine built on
    that would pass verify (speculative equals plain on the same wrong weights) while serving noise.

    ``info``: ``from_pretrained(..., output_loading_info=True)``'s second value (``missing_keys``,
    ``unexpected_keys``, ``mismatched_keys``, ``error_msgs``).

    Raises:
        RecipeError: at ``target.checkpoint``, naming up to 5 tensors of each kind and how many in all.
    """
    problems = []
    for key, what in (("missing_keys", "missing from the weight files (would be random)"),
                      ("mismatched_keys", "of another shape than the config says"),
                      ("unexpected_keys", "in the weight files but not in the model the config describes")):
        names = sorted(str(n[0] if isinstance(n, tuple) else n) for n in (info.get(key) or ()))
        if names:
            shown = ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
            problems.append(f"{len(names)} tensor(s) {what}: {shown}")
    if problems:
        raise loaded.error(("target", "checkpoint"), f"{checkpoint}: the weights do not match config.json: "
                           + "; ".join(problems) + ". Re-download or re-convert the checkpoint, or fix config.json "
                           "(num_hidden_layers, hidden_size, vocab_size) to match its weights")


def _write_engine(loaded: LoadedRecipe, checkpoint: Path, out: Path, *, log) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    r = loaded.recipe
    trust = r.target.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=trust)
    model, info = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=getattr(torch, r.target.dtype), trust_remote_code=trust,
                                                       output_loading_info=True)
    _check_loaded_weights(loaded, checkpoint, info)
    _check_limits(loaded, getattr(model.config, "max_position_embeddings", None))
    log(f"writing {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {r.target.dtype})")
    model.save_pretrained(out / "target", safe_serialization=True)
    tokenizer.save_pretrained(out / "tokenizer")
    end_id = _end_id(tokenizer, model)
    kernels = _plan_kernels(loaded, model)  # after saving: it switches the model to the engine's attention
    _log_kernels(kernels, log)
    return {
        "version": ENGINE_FORMAT,
        "pretrained_config": _pretrained_config(model.config, r.target.dtype),
        "build_config": _build_config(loaded),
        # Paths inside the engine directory are implicit (the draft is engine_dir/draft).
        "speculative_config": engine_speculative_config(r),
        "specbuild": {
            "version": __version__,
            "recipe": r.name,
            "end_id": end_id,
            "pad_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id,
            "trust_remote_code": trust,
            "device": r.build.device,
            "kernels": r.build.kernels,
            "kernel_guarantee": kernels,
            "draft_weights": r.build.draft_weights,
        },
    }


def check_kernels(loaded: LoadedRecipe, *, compile: bool = False) -> None:
    """``build.kernels: rowgemm`` requires the engine's bitwise kernels: refuse the recipe now, before any long
    work, where they cannot be built. Without ``compile`` only the compiler is looked up (milliseconds, no
    torch); with it the library is compiled into the cache, once per CPU and compiler (a second or so, plus
    importing torch), so a compiler that fails is found here and a serve finds the library built.

    Raises:
        RecipeError: at ``build.kernels``: no compiler, or it failed; the message names it and the fix.
    """
    if loaded.recipe.build.kernels != "rowgemm":
        return
    try:
        find_compiler()
    except KernelBuildError as exc:
        raise loaded.error(("build", "kernels"), _bitwise_required(str(exc))) from None
    if compile:
        from specbuild.engine import rowgemm

        if rowgemm.library() is None:
            raise loaded.error(("build", "kernels"), _bitwise_required(rowgemm.unavailable_reason()))


def kernels_plan_line(loaded: LoadedRecipe) -> str:
    """The plan's line on the target's kernels, from the recipe and the compiler lookup (milliseconds, no torch);
    the build prints and records the final word (:func:`specbuild.engine.guarantee.plan_kernels`)."""
    b, dtype = loaded.recipe.build, loaded.recipe.target.dtype
    near_ties = "greedy equality up to logit near-ties"
    if b.device != "cpu" or dtype != "float32" or b.kernels in ("onednn", "eager"):
        return f"kernels   {b.kernels}: {dtype} on {b.device}, library linears and SDPA: {near_ties}"
    try:
        compiler = find_compiler()
    except KernelBuildError as exc:
        return f"kernels   {b.kernels}: the oneDNN fallback, {near_ties} ({exc})"
    return f"kernels   {b.kernels}: the engine's own, compiled with {compiler}: greedy equality bitwise (Llama-architecture targets)"


def _bitwise_required(reason: str) -> str:
    return (f"rowgemm requires the engine's bitwise kernels, which cannot be built here: {reason}. Or set "
            "build.kernels: auto to fall back to oneDNN (greedy equality then only up to logit near-ties)")


def read_kernel_guarantee(engine_dir: Path) -> dict | None:
    """The kernels an engine directory's target runs and the greedy equality they give, as its config.json
    records them (:meth:`specbuild.engine.native.KernelChoice.to_json`); None for an engine built before
    the record, or no engine."""
    try:
        return json.loads((engine_dir / "config.json").read_text())["specbuild"].get("kernel_guarantee")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _plan_kernels(loaded: LoadedRecipe, model) -> dict:
    """What the engine will run for ``model`` (:func:`specbuild.engine.guarantee.plan_kernels`), as JSON.

    Raises:
        RecipeError: at ``build.kernels``: ``rowgemm`` where the bitwise kernels cannot run this target.
    """
    from specbuild.engine.guarantee import plan_kernels

    b = loaded.recipe.build
    try:
        return plan_kernels(model, b.kernels, device=b.device).to_json()
    except ValueError as exc:
        raise loaded.error(("build", "kernels"), str(exc)) from None


def _log_kernels(record: dict | None, log) -> None:
    """The build output's lines on the kernels (nothing for an engine built before they were recorded)."""
    if record is None:
        return
    choice = KernelChoice.from_json(record)
    log(choice.describe())
    if choice.greedy_equality != BITWISE:
        log(f"  {choice.verify_note}; build.kernels: rowgemm requires the bitwise kernels")


def _recorded_kernels_hold(loaded: LoadedRecipe, engine_dir: Path, *, log) -> bool:
    """``build.kernels: auto`` resolves now to the linear kernels the engine directory records (a compiler
    installed or removed since: False, and the engine is rebuilt to record what runs now)."""
    b = loaded.recipe.build
    record = read_kernel_guarantee(engine_dir)
    if record is None or b.kernels != "auto" or b.device != "cpu":
        return True
    import torch

    from specbuild.engine.kernels import resolve_kernels_for

    now = resolve_kernels_for("auto", getattr(torch, loaded.recipe.target.dtype), "cpu")
    if now == record.get("linear"):
        return True
    log(f"the engine records {record.get('linear')} kernels, but this machine now gives {now}: rebuilding it")
    return False


def _write_token_map(loaded: LoadedRecipe, config: dict, out: Path, *, log) -> None:
    """Copy the recipe's hot-token map, checked against the target's vocabulary, into ``out`` and name it
    in the engine's ``speculative_config`` (a path relative to the engine directory).

    Raises:
        RecipeError: at ``speculation.speculative_token_map``: missing (the train stage did not write it),
            unreadable, or ids outside the vocabulary or repeated.
    """
    from specbuild.methods.token_map import ENGINE_FILE, FIELD, read_token_ids, recipe_token_map, write_token_map

    path = recipe_token_map(loaded)
    if path is None:
        return
    vocab = config["pretrained_config"].get("vocab_size")
    try:
        ids = read_token_ids(path, vocab)
    except (OSError, ValueError) as exc:
        raise loaded.error(("speculation", FIELD), str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - torch.load(weights_only=True) refusing a pickle, a corrupt file
        raise loaded.error(("speculation", FIELD), f"token map {path} is not readable: {type(exc).__name__}: {exc}") from None
    write_token_map(out / ENGINE_FILE, ids, source=str(path))
    config["speculative_config"][FIELD] = ENGINE_FILE
    log(f"draft vocabulary: {len(ids)} of {vocab} tokens ({path.name})")


def engine_speculative_config(recipe) -> dict | None:
    """The ``speculative_config`` the reference build writes into ``engine_dir/config.json`` for
    ``recipe`` (a :class:`~specbuild.builder.recipe.Recipe`): the method's LLM-API keys without model
    paths (the draft is ``engine_dir/draft``) plus the ``build`` runtime controls that are set; the
    build adds the hot-token map's engine file name when the recipe has one. ``None``: plain decoding."""
    return _with_runtime_controls(_without_paths(recipe.speculation.to_llm_api()), recipe.build)


def _with_runtime_controls(config: dict | None, build) -> dict | None:
    """``config`` plus the recipe's ``build.draft_len_schedule`` / ``max_concurrency`` /
    ``acceptance_window`` / ``acceptance_length_threshold`` that are set, under TensorRT-LLM's names
    (the engine applies them every iteration: engine/spec_controls.py)."""
    from specbuild.builder.recipe import RUNTIME_CONTROLS

    if config is None:
        return None
    return {**config, **{name: getattr(build, name) for name in RUNTIME_CONTROLS if getattr(build, name) is not None}}


def _without_paths(config: dict | None) -> dict | None:
    return None if config is None else {k: v for k, v in config.items() if k != "speculative_model_dir"}


def _check_limits_before_build(loaded: LoadedRecipe, target: CheckpointSource) -> None:
    """:func:`_check_limits` from the target's config.json where it is a local directory already (a
    download or a packaged model's conversion is checked at the build, once its config is there)."""
    config_file = target.path / "config.json" if target.path.is_dir() else None
    if config_file is None or not config_file.is_file():
        return
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return  # the build names an unreadable config
    text = raw.get("text_config") if isinstance(raw, dict) and isinstance(raw.get("text_config"), dict) else raw
    limit = text.get("max_position_embeddings") if isinstance(text, dict) else None
    if isinstance(limit, int) and not isinstance(limit, bool):
        _check_limits(loaded, limit)


def _check_limits(loaded: LoadedRecipe, limit: int | None) -> None:
    """Refuse ``max_seq_len + max_draft_len`` beyond the target's ``max_position_embeddings`` (``limit``)."""
    build, draft = loaded.recipe.build, loaded.recipe.speculation.max_draft_len
    need = build.max_seq_len + draft
    if limit is None or need <= limit:
        return
    if limit - draft <= build.max_input_len:  # lowering max_seq_len alone cannot fit: it must exceed max_input_len
        raise loaded.error(
            ("speculation", "max_draft_len"),
            f"max_draft_len {draft} leaves {max(0, limit - draft)} of the model's {limit} positions "
            f"(max_position_embeddings), not more than build.max_input_len ({build.max_input_len}): lower the draft length "
            "(max_draft_len, or the speculation settings it follows from) or build.max_input_len",
        )
    raise loaded.error(
        ("build", "max_seq_len"),
        f"max_seq_len + max_draft_len = {need} exceeds the model's max_position_embeddings ({limit}); "
        f"lower build.max_seq_len to at most {limit - draft}",
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
    k = spec.draft_tokens_per_step  # the verify block's drafts: a dynamic tree's nodes, not its depth
    return {
        "max_batch_size": b.max_batch_size,
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
        "max_num_tokens": b.max_num_tokens or max(b.max_input_len, b.max_batch_size * (k + 1)),
        "max_beam_width": 1,
        "max_draft_len": k,
        "speculative_decoding_mode": SPECULATIVE_DECODING_MODE[spec.speculative_decoding_mode],
    }
