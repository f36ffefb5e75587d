"""Checks the draft-head methods (Medusa, EAGLE, EAGLE-3) share, in recipe terms (torch-free).

A head directory holds ``config.json`` and one weight file (safetensors first; PyTorch pickles are read
only with ``torch.load(weights_only=True)``). Before any long work the builder locates it
(:func:`locate_head_dir`) and compares its config.json with the target's (:func:`check_head_sizes`);
the tensors themselves are read when the engine directory is built (:func:`refuse_unreadable`).
:func:`head_weights` declares all of this for a method (its :class:`~specbuild.methods.base.Weights`).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .base import ReferenceWeights, Weights

if TYPE_CHECKING:
    from specbuild.util.checkpoints import CheckpointSource
    from specbuild.builder.recipe import LoadedRecipe

T = TypeVar("T")


def head_weights(
    method: str, *, field: str, what: str, locate: Callable[[LoadedRecipe], CheckpointSource],
    check_fit: Callable[[LoadedRecipe, Path, Path], None], fingerprint_key: str | None = None,
) -> Weights:
    """The :class:`~specbuild.methods.base.Weights` of a draft-head method (Medusa, EAGLE, EAGLE-3): the head
    directory named by ``speculation.<field>``, located by ``locate`` and checked against the target by
    ``check_fit``, downloaded to ``hf/<method>`` on the TensorRT-LLM path and held as ``<method>/`` in a
    reference engine directory, read and written there by ``read_for_build`` / ``write_for_build`` of
    ``specbuild.methods.<method>.engine``. ``fingerprint_key`` (default ``method``): its entry in the
    engine fingerprint.

    Example: ``head_weights("medusa", field="medusa_model", what="the Medusa head directory", locate=...,
    check_fit=...)``.
    """
    engine = f"specbuild.methods.{method}.engine"
    reference = ReferenceWeights(subdir=method, locate=locate, load=f"{engine}:read_for_build", write=f"{engine}:write_for_build",
                                 fingerprint_key=fingerprint_key or method)
    return Weights(field=field, what=what, role=method, check_fit=check_fit, reference=reference)


def locate_head_dir(loaded: LoadedRecipe, *, field: str, weight_files: tuple[str, ...], label: str, hint: str) -> CheckpointSource:
    """The head directory named by ``speculation.<field>`` (relative to the recipe), without loading it.

    Raises:
        RecipeError: at ``speculation.<field>``: ``"{label} 'h': {problem}; {hint}"``, the problem being a
            file instead of a directory, no such directory, no config.json, none of ``weight_files``, or a
            config.json that is not one JSON object.
    """
    from specbuild.util.checkpoints import CheckpointSource

    value = getattr(loaded.recipe.speculation, field)
    path = loaded.resolve_path(value)
    if path.is_file():
        problem = f"{path} is a file, not a directory"
    elif not path.is_dir():
        problem = f"no such directory ({path})"
    elif not (path / "config.json").is_file():
        problem = f"{path} has no config.json"
    elif not any((path / name).is_file() for name in weight_files):
        problem = f"{path} has {_none_of(weight_files)}"
    elif (bad := _config_problem(path)) is not None:
        problem = bad
    else:
        return CheckpointSource(spec=value, kind="local", path=path.resolve())
    raise loaded.error(("speculation", field), f"{label} {value!r}: {problem}; {hint}")


def _none_of(names: tuple[str, ...]) -> str:
    """``"neither a nor b"`` for two names, ``"none of a, b, c"`` for more."""
    return f"neither {names[0]} nor {names[1]}" if len(names) == 2 else f"none of {', '.join(names)}"


def _config_problem(head_dir: Path) -> str | None:
    """What is wrong with ``head_dir/config.json`` (not JSON, not an object), or None."""
    from specbuild.util.checkpoints import CheckpointError, read_config_json

    try:
        read_config_json(head_dir / "config.json")
    except CheckpointError as exc:
        return str(exc)
    return None


def read_json(path: Path) -> dict:
    """A JSON object from ``path``; ``{}`` when unreadable or not an object (callers check what it has)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def target_config(target_dir: Path) -> dict:
    """The target's config.json, ``text_config`` (multimodal checkpoints) merged under the top level."""
    config = read_json(target_dir / "config.json")
    return {**(config.get("text_config") or {}), **config}


def check_head_sizes(loaded: LoadedRecipe, field: str, label: str, head_dir: Path, target_dir: Path) -> None:
    """``hidden_size`` / ``vocab_size`` of a head's config.json against the target's (milliseconds, no
    weights loaded; a size missing on either side is checked when the head is loaded).

    Raises:
        RecipeError: at ``speculation.<field>``, naming both sizes of both.
    """
    head, target = read_json(head_dir / "config.json"), target_config(target_dir)
    differ = [k for k in ("hidden_size", "vocab_size") if k in head and k in target and head[k] != target[k]]
    if differ:
        raise loaded.error(
            ("speculation", field),
            f"{label} {head_dir} has {', '.join(f'{k}={head[k]}' for k in differ)} but the target has "
            f"{', '.join(f'{k}={target[k]}' for k in differ)}; it must be trained on this target",
        )


def refuse_unreadable(loaded: LoadedRecipe, field: str, read: Callable[[], T]) -> T:
    """``read()``, its errors located at ``speculation.<field>``: a malformed head directory, sizes that
    do not fit, or a ``.pt`` / ``.bin`` holding anything but tensors (``weights_only=True`` refuses it).

    Raises:
        RecipeError: with the loader's message.
    """
    try:
        return read()
    except (OSError, ValueError, pickle.UnpicklingError) as exc:
        raise loaded.error(("speculation", field), str(exc)) from None


def torch_dtype(name: str) -> Any:
    """``"float32"`` -> ``torch.float32`` (imports torch)."""
    import torch

    return getattr(torch, name)
