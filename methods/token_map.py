"""A hot-token map: the draft's vocabulary projection restricted to the target's most frequent tokens.

FR-Spec (Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via Frequency-Ranked
Speculative Sampling", §3) observes that a draft's LM head over a large vocabulary costs as much as the
rest of the draft, and that most accepted draft tokens come from a small set of frequent ones. Projecting
the draft's features onto those rows only is lossless: the target still verifies every draft token over
its full vocabulary, so output is unchanged and only the acceptance rate can drop (a token outside the
map is never drafted). SGLang names the file ``--speculative-token-map``; its files are a
``torch.save``-d 1-D tensor of token ids.

Recipe (methods with a draft-side vocabulary projection: ``eagle``, ``medusa``, ``draft_target``)::

    speculation:
      method: eagle
      eagle_model: $SPECBUILD_CACHE/trained/smollm2-eagle
      speculative_token_map: $SPECBUILD_CACHE/trained/smollm2-eagle/token_map.json
    train:
      token_map_size: 8192      # the train stage writes the map when the file is missing

Files (:func:`read_token_ids`):

- ``.json``: a list of token ids, or an object whose ``token_ids`` is one (what specbuild writes, with
  how it was counted);
- ``.safetensors``: one 1-D integer tensor;
- ``.pt``: SGLang's format, read with ``torch.load(weights_only=True)`` (no arbitrary unpickling).

The reference engine only: TensorRT-LLM's EAGLE, Medusa and draft-target have no such option (EAGLE-3
checkpoints carry their own reduced draft vocabulary, ``d2t``), so its build paths refuse the field.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pydantic import Field

from .base import TOKEN_MAP, MethodParams

FIELD = TOKEN_MAP
ENGINE_FILE = "token_map.json"  # its name inside a reference engine directory
FORMAT = "specbuild-token-map-1"


class TokenMapParams(MethodParams):
    """Settings of a method whose draft projects onto the vocabulary (EAGLE's and Medusa's heads, a
    draft model's lm_head).

    Attributes:
        speculative_token_map: a file of token ids (see :mod:`specbuild.methods.token_map`): the draft's
            vocabulary projection computes only these rows, so it drafts only these tokens. Relative
            paths are relative to the recipe. Reference engine only. None: the full vocabulary.
    """

    speculative_token_map: str | None = Field(None, min_length=1)
    """File of token ids the draft's vocabulary projection computes (FR-Spec); relative to the recipe, may start with $SPECBUILD_CACHE. Reference engine only; null: the full vocabulary."""


def recipe_token_map(loaded) -> Path | None:
    """The path a recipe's ``speculation.speculative_token_map`` names, resolved against the recipe
    (``~`` expanded); None when it names none. Not checked: the file may be the train stage's to write."""
    value = getattr(loaded.recipe.speculation, FIELD, None)
    return None if value is None else loaded.resolve_path(value)


def read_token_ids(path: str | Path, vocab_size: int | None = None) -> list[int]:
    """The token ids in a token-map file, in the file's order.

    Args:
        vocab_size: the target's vocabulary; ids must lie in ``[0, vocab_size)`` (None: not checked).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown suffix, unreadable contents, no ids, an id that is not an integer, out of
            range or repeated (the message names the file, the id and its index).
        pickle.UnpicklingError: a ``.pt`` holding anything but tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no token map at {path}")
    suffix = path.suffix.lower()
    if suffix == ".json":
        ids = _json_ids(path)
    elif suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = list(load_file(str(path)).values())
        if len(tensors) != 1:
            raise ValueError(f"token map {path} holds {len(tensors)} tensors; it must hold one 1-D tensor of token ids")
        ids = _tensor_ids(tensors[0], path)
    elif suffix == ".pt":
        import torch

        ids = _tensor_ids(torch.load(path, map_location="cpu", weights_only=True), path)
    else:
        raise ValueError(f"token map {path}: unknown suffix {path.suffix!r}; give a .json list of token ids, a .safetensors "
                         "with one 1-D integer tensor, or SGLang's .pt")
    return check_token_ids(ids, vocab_size, where=str(path))


def load_token_ids(params: object, vocab_size: int) -> list[int] | None:
    """The hot-token map a method's settings name (``speculative_token_map``), read and checked; None
    without one (what the engine side of a method with a draft vocabulary projection loads).

    Raises:
        FileNotFoundError / ValueError: as :func:`read_token_ids`.
    """
    path = getattr(params, FIELD, None)
    return None if path is None else read_token_ids(path, vocab_size)


def check_token_ids(ids: Sequence[object], vocab_size: int | None, *, where: str) -> list[int]:
    """``ids`` as ints, checked: non-empty, integers, unique, in ``[0, vocab_size)``.

    Raises:
        ValueError: naming ``where``, the first bad id and its index.
    """
    if not ids:
        raise ValueError(f"token map {where} lists no token ids")
    seen: set[int] = set()
    out: list[int] = []
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int):
            raise ValueError(f"token map {where}: entry {i} is {token!r}, not a token id (an integer)")
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise ValueError(f"token map {where}: token id {token} at index {i} is outside the vocabulary {bound}")
        if token in seen:
            raise ValueError(f"token map {where}: token id {token} is listed twice (index {i})")
        seen.add(token)
        out.append(token)
    return out


def _json_ids(path: Path) -> list[object]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"token map {path} is not readable JSON: {'nested too deeply' if isinstance(exc, RecursionError) else exc}") from None
    if isinstance(raw, dict):
        raw = raw.get("token_ids")
    if not isinstance(raw, list):
        raise ValueError(f"token map {path} must be a JSON list of token ids or an object with a token_ids list")
    return raw


def _tensor_ids(tensor: object, path: Path) -> list[object]:
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1 or tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
        raise ValueError(f"token map {path} must hold one 1-D integer tensor of token ids")
    return tensor.tolist()


def frequency_order(predictions, vocab_size: int | None = None):
    """Token ids ordered by how often they occur in ``predictions`` (most frequent first, equal counts by
    id), and the counts: the ranking behind a hot-token map (FR-Spec, Zhao et al. 2025, §3) and an EAGLE-3
    draft vocabulary (:func:`specbuild.methods.eagle3.train.draft_vocabulary`).

    Args:
        predictions: ``[N]`` long token ids (e.g. the target's argmax at every training position).
        vocab_size: count over ``[0, vocab_size)`` so the order lists every id, unseen ones last (by id);
            None: over ``[0, max id]``.

    Returns:
        ``(order [V] long, counts [V] long)``.

    Raises:
        ValueError: an id outside ``[0, vocab_size)``.

    Example: predictions ``[5, 2, 5, 7, 2, 5]``, vocab_size 8 -> order ``[5, 2, 7, 0, 1, 3, 4, 6]``.
    """
    import torch

    predictions = predictions.long().flatten()
    if vocab_size is not None and predictions.numel() and not 0 <= int(predictions.min()) <= int(predictions.max()) < vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size}); got [{int(predictions.min())}, {int(predictions.max())}]")
    size = vocab_size if vocab_size is not None else int(predictions.max()) + 1 if predictions.numel() else 0
    counts = torch.bincount(predictions, minlength=size)
    return torch.argsort(-counts, stable=True), counts  # stable: equal counts keep id order


def write_token_map(path: str | Path, token_ids: Sequence[int], **about: object) -> Path:
    """Write ``{"format", "token_ids", **about}`` as JSON to ``path``, atomically (a reader never sees half).

    ``about`` records how the ids were chosen (e.g. ``counted_over``, ``coverage``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"format": FORMAT, **about, "token_ids": [int(t) for t in token_ids]}) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the map from the server's user
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
