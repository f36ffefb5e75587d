"""Read a checkpoint directory's config.json and safetensors tensors without loading the model: tensor
names, shapes and dtypes from the file headers, values of single tensors (or row ranges of them) on
demand. PyTorch pickles (``.bin``, ``.pt``) are never opened.

Used by :mod:`specbuild.builder.check_draft`; torch-free except for ``BF16`` values (numpy has no
bfloat16: those rows are read through ``safetensors.torch``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PICKLES = ("pytorch_model.bin", "model.pt", "medusa_lm_head.pt", "pytorch_model.bin.index.json")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
INT_DTYPES = ("I64", "I32", "I16", "I8", "U8", "BOOL")


class DraftFileError(ValueError):
    """A directory that cannot be checked: missing, no config.json, a config that is not one JSON object."""


# config.json keys the checks and the engines' loaders read, by the JSON type they must have (null: absent)
POSITIVE_INT_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                     "draft_vocab_size", "num_hidden_layers", "max_position_embeddings", "target_hidden_size",
                     "medusa_num_heads", "medusa_num_layers")
NUMBER_KEYS = ("rope_theta", "rms_norm_eps")
OBJECT_KEYS = ("eagle_config", "rope_scaling", "rope_parameters")
BOOL_KEYS = ("tie_word_embeddings", "norm_before_residual", "attention_bias")
STRING_KEYS = ("model_type", "torch_dtype", "dtype")


def config_type_problems(config: dict[str, Any]) -> list[str]:
    """What in a config.json has the wrong JSON type for the keys specbuild and the engines read: a
    positive integer as a string, a list where an object belongs, ``architectures`` not a list of
    strings, layer ids not a list of integers. Each item names the key, its value and what it must be;
    ``[]`` when every present key is well typed (null counts as absent)."""
    problems = []

    def bad(key: str, value: Any, must: str) -> None:
        problems.append(f"{key} is {json.dumps(value)[:60]}, must be {must}")

    for key in POSITIVE_INT_KEYS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            bad(key, value, "a positive integer")
    for key in NUMBER_KEYS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            bad(key, value, "a positive number")
    for key in OBJECT_KEYS:
        if config.get(key) is not None and not isinstance(config[key], dict):
            bad(key, config[key], "an object")
    for key in BOOL_KEYS:
        if config.get(key) is not None and not isinstance(config[key], bool):
            bad(key, config[key], "true or false")
    for key in STRING_KEYS:
        if config.get(key) is not None and not isinstance(config[key], str):
            bad(key, config[key], "a string")
    names = config.get("architectures")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        bad("architectures", names, 'a list of class names, e.g. ["LlamaForCausalLMEagle3"]')
    nested = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    for key, value in (("eagle_aux_hidden_state_layer_ids", config.get("eagle_aux_hidden_state_layer_ids")),
                       ("eagle_config.eagle_aux_hidden_state_layer_ids", nested.get("eagle_aux_hidden_state_layer_ids"))):
        if value is not None and not (isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)):
            bad(key, value, "a list of layer ids, e.g. [1, 14, 26]")
    return problems


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its file's header describes it: safetensors dtype (``"F32"``, ``"BF16"``, ``"I64"``, ...),
    shape, and the file holding it."""

    dtype: str
    shape: tuple[int, ...]
    file: Path


@dataclass(frozen=True)
class CheckpointFiles:
    """A checkpoint directory: its config.json (``text_config`` merged under the top level), its
    safetensors tensors by name, and the pickled weight files it holds instead (never read).

    Example: ``CheckpointFiles.open(Path("head"))`` -> ``config["hidden_size"] == 64``,
    ``tensors["fc.weight"].shape == (64, 192)``.
    """

    path: Path
    config: dict[str, Any]
    tensors: dict[str, TensorInfo]
    pickles: tuple[str, ...]

    @classmethod
    def open(cls, path: Path, *, what: str = "checkpoint") -> CheckpointFiles:
        """Read config.json and every ``*.safetensors`` header in ``path`` (milliseconds).

        Raises:
            DraftFileError: no such directory, no config.json, a config.json that is not one JSON object, or
                a ``*.safetensors`` file whose header does not parse.
        """
        path = Path(path).expanduser()
        if path.is_file():
            raise DraftFileError(f"{what} {path} is a file; give the checkpoint directory holding config.json and the "
                                 f"*.safetensors weights (here perhaps {path.parent})")
        if not path.is_dir():
            raise DraftFileError(f"{what} {path}: no such directory; give a checkpoint directory (config.json + *.safetensors)")
        config_file = path / "config.json"
        if not config_file.is_file():
            raise DraftFileError(f"{what} {path} has no config.json")
        try:
            raw = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise DraftFileError(f"{what} {config_file} is not readable JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise DraftFileError(f"{what} {config_file} is a JSON {type(raw).__name__}, not an object")
        text = raw.get("text_config")
        config = {**(text if isinstance(text, dict) else {}), **raw}
        pickles = tuple(sorted(p.name for p in path.iterdir() if p.name in PICKLES or p.suffix in (".bin", ".pt", ".pth")))
        return cls(path, config, _headers(sorted(path.glob("*.safetensors"))), pickles)

    def read(self, name: str, rows: slice | None = None) -> np.ndarray:
        """Tensor ``name`` (or ``rows`` of its first dimension) as numpy: floats as float32, integers as int64,
        booleans as bool.

        Raises:
            KeyError: no such tensor.
        """
        info = self.tensors[name]
        if info.dtype == "BF16":
            return _read_bf16(info.file, name, rows)
        from safetensors import safe_open

        with safe_open(str(info.file), framework="numpy") as f:
            view = f.get_slice(name)
            value = view[rows] if rows is not None else view[:]
        if info.dtype in FLOAT_DTYPES:
            return np.asarray(value, dtype=np.float32)
        return np.asarray(value) if info.dtype == "BOOL" else np.asarray(value, dtype=np.int64)

    def find(self, *suffixes: str) -> str | None:
        """The first tensor name equal to, or ending with ``.`` + one of ``suffixes`` (in order), or None."""
        for suffix in suffixes:
            if suffix in self.tensors:
                return suffix
            hits = sorted(n for n in self.tensors if n.endswith("." + suffix))
            if hits:
                return hits[0]
        return None


def _headers(files: list[Path]) -> dict[str, TensorInfo]:
    from safetensors import safe_open

    tensors: dict[str, TensorInfo] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="numpy") as f:
                for name in f.keys():
                    view = f.get_slice(name)
                    tensors[name] = TensorInfo(view.get_dtype(), tuple(view.get_shape()), file)
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError (and OSError)
            raise DraftFileError(f"{file} is not a readable safetensors file ({exc})") from None
    return tensors


def _read_bf16(file: Path, name: str, rows: slice | None) -> np.ndarray:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        view = f.get_slice(name)
        value = view[rows] if rows is not None else view[:]
    return value.float().numpy()


def torch_dtype_name(safetensors_dtype: str) -> str:
    """``"BF16"`` -> ``"bfloat16"`` (config.json's ``torch_dtype`` spelling); unknown names unchanged."""
    return {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
            "BOOL": "bool", "U8": "uint8", "I8": "int8"}.get(safetensors_dtype, safetensors_dtype)
