"""What the draft-head methods (Medusa, EAGLE, EAGLE-3) share on their engine side (torch): the head
directory's files, reading and checking its weights, the loaded head an engine keeps, and the
target-attention check of tree methods. (Their torch-free checks before any weights load are
:mod:`specbuild.methods.heads`.)

Each method's ``engine.py`` keeps its own format (config.json keys, tensor names and shapes, the head's forward)
and describes its directory with one :class:`HeadFiles`::

    EAGLE_FILES = HeadFiles(safetensors="model.safetensors", pickles=("pytorch_model.bin", "model.pt"))
    state = EAGLE_FILES.read(path)                                                # name -> tensor
    check_state(state, head_config.expected_shapes(...), path, mismatch="EAGLE weights do not match ...")

Where the directory is (``speculative_model_dir``, by default inside the engine directory) is resolved
before the method loads (:meth:`specbuild.methods.SpeculationMethod.parse_speculative_config`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from safetensors.torch import load_file

from specbuild.engine.forward import MASK_ATTENTION


ConfigT = TypeVar("ConfigT")
ProposerT = TypeVar("ProposerT")


@dataclass(frozen=True)
class HeadFiles:
    """A head directory's weight files (their names come from the method module, e.g.
    :data:`specbuild.methods.medusa.WEIGHT_FILES`).

    Attributes:
        safetensors: the weight file read first, e.g. ``"model.safetensors"``.
        pickles: the PyTorch weight files tried next, in order; read only with
            ``torch.load(weights_only=True)``.
    """

    safetensors: str
    pickles: tuple[str, ...]

    def read(self, head_dir: Path) -> dict[str, torch.Tensor]:
        """Every tensor of the directory's weight file (on CPU), by its on-disk name.

        Raises:
            FileNotFoundError: none of the weight files is there (the message lists them).
            pickle.UnpicklingError: a PyTorch file holding anything but tensors (``weights_only=True``).
        """
        if (head_dir / self.safetensors).is_file():
            return load_file(str(head_dir / self.safetensors))
        for name in self.pickles:
            if (head_dir / name).is_file():
                return torch.load(head_dir / name, map_location="cpu", weights_only=True)
        if len(self.pickles) == 1:
            raise FileNotFoundError(f"{head_dir}: neither {self.safetensors} nor {self.pickles[0]} found")
        raise FileNotFoundError(f"{head_dir}: none of {[self.safetensors, *self.pickles]} found")


def read_config_json(head_dir: Path, *, not_a: str) -> dict[str, Any]:
    """``head_dir/config.json`` as a dict.

    Raises:
        FileNotFoundError: ``"{head_dir}/config.json not found: not {not_a}"``, e.g. not_a = "an EAGLE head directory".
    """
    path = head_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: not {not_a}")
    return json.loads(path.read_text())


def known_keys(cls: type, raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The keys of config.json ``raw`` that dataclass ``cls`` has, None values left out (-> defaults).

    Raises:
        ValueError: ``"{where}: missing key(s) [...]"`` for keys in ``cls.REQUIRED`` that ``raw`` lacks.
    """
    missing = [k for k in cls.REQUIRED if k not in raw]
    if missing:
        raise ValueError(f"{where}: missing key(s) {missing}")
    return {f.name: raw[f.name] for f in fields(cls) if raw.get(f.name) is not None}


def check_state(
    state: Mapping[str, torch.Tensor],
    expected: Mapping[str, tuple[int, ...]],
    where: Path,
    *,
    mismatch: str,
    extra: Collection[str] = (),
) -> None:
    """Refuse weights whose names or shapes differ from ``expected`` (tensor name -> shape).

    Args:
        where: the head directory, first in every message.
        mismatch: what a missing or unexpected name means for this format, e.g. ``"Medusa weights do not
            match medusa_num_heads=4, medusa_num_layers=1 (the weights hold 3 heads)"``.
        extra: names allowed besides ``expected`` that the caller checks itself (EAGLE-3's ``d2t``).

    Raises:
        ValueError: ``"{where}: {mismatch}: missing [...], unexpected [...]"`` (at most four names each),
            or ``"{where}: tensor {name} has shape (..), expected (..)"``.
    """
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected) - set(extra))
    if missing or unexpected:
        raise ValueError(f"{where}: {mismatch}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise ValueError(f"{where}: tensor {name} has shape {tuple(state[name].shape)}, expected {shape}")


@dataclass(frozen=True)
class LoadedHead(Generic[ConfigT, ProposerT]):
    """A head of one engine, loaded once (target dtype and device) and shared by its requests.

    Attributes:
        config: the method's settings (the validated speculative_config).
        proposer: the proposer over the loaded head; stateless itself (each request keeps its own state).
        path: the head directory it came from (for messages).
    """

    config: ConfigT
    proposer: ProposerT
    path: Path


def check_tree_attention(target: Any, method: str) -> None:
    """Refuse a target whose attention cannot take a tree mask (tree verification needs one).

    Raises:
        ValueError: ``"{method} tree verification needs the target's attn_implementation in ('eager',
            'sdpa'), it uses 'flash_attention_2'"``.
    """
    attention = getattr(target.config, "_attn_implementation", None)
    if attention not in MASK_ATTENTION:
        raise ValueError(f"{method} tree verification needs the target's attn_implementation in {MASK_ATTENTION}, it uses {attention!r}")
