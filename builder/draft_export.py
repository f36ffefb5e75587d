"""``specbuild check-draft --export DIR``: an EAGLE-3 head rewritten in the layout every engine of
:data:`~specbuild.builder.check_draft.EAGLE3_LOADERS` loads (TensorRT-LLM's PyTorch ``Eagle3``, vLLM's
``eagle3``, SGLang's ``EAGLE3`` and the reference engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .draft_files import CheckpointFiles, DraftFileError, config_type_problems


EXPORTED = ("config.json", "model.safetensors")


def export_eagle3(draft: Path, target: Path, out: Path) -> Path:
    """Write ``draft`` (an EAGLE-3 head) to ``out`` in the layout every engine of
    :data:`~specbuild.builder.check_draft.EAGLE3_LOADERS` loads: ``midlayer.*`` names (``layers.0.*`` renamed), an ``lm_head.weight`` of its own (the target's
    ``lm_head``, or its tied ``embed_tokens``, when the head has none: older vLLM lines left a
    missing one unloaded), no ``embed_tokens`` (every engine then shares the target's), ``d2t`` as int64, and a
    config.json with ``architectures: [LlamaForCausalLMEagle3]``, ``vocab_size`` (the target's),
    ``draft_vocab_size`` (lm_head rows), ``tie_word_embeddings: false`` and ``torch_dtype``.

    Returns ``out``. Imports torch.

    Raises:
        DraftFileError: a directory missing or unreadable; ``out`` empty, the draft itself, a file, a
            directory holding other files than an earlier export, or not writable; a config.json value of
            the wrong JSON type.
        ValueError: the draft is not an EAGLE-3 head (:func:`~.check_draft.detect_method`), has no
            safetensors weights, or no lm_head while declaring a draft vocabulary other than the target's.
    """
    import torch
    from safetensors.torch import load_file

    from specbuild.util.atomic import save_safetensors, write_json_atomic

    from .check_draft import detect_method

    draft_files = CheckpointFiles.open(Path(draft), what="draft")
    target_files = CheckpointFiles.open(Path(target), what="target")
    out = Path(out).expanduser()
    if not str(out).strip():
        raise DraftFileError("--export is empty; give a new directory for the exported head")
    if out.resolve() == draft_files.path.resolve():
        raise DraftFileError(f"--export {out} is the draft directory itself; give a new directory")
    if out.exists() and not out.is_dir():
        raise DraftFileError(f"--export {out} is a file; give a new directory")
    others = sorted(p.name for p in out.iterdir() if p.name not in EXPORTED) if out.is_dir() else []
    if others:
        raise DraftFileError(f"--export {out} holds other files ({', '.join(others[:3])}); give a new or empty directory "
                             f"(an earlier export there, {' and '.join(EXPORTED)} only, is replaced)")
    method = detect_method(draft_files)
    if method != "eagle3":
        raise ValueError(f"draft {draft_files.path} is {method} weights, not an EAGLE-3 head: --export writes EAGLE-3 heads only "
                         "(check it without --export)")
    for files, what in ((draft_files, "draft"), (target_files, "target")):
        problems = config_type_problems(files.config)
        if problems:
            raise DraftFileError(f"{what} {files.path / 'config.json'}: {'; '.join(problems)}")
    if not draft_files.tensors:
        raise ValueError(f"draft {draft_files.path} has no *.safetensors weights to export")
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted({t.file for t in draft_files.tensors.values()}):
        for name, value in load_file(str(file)).items():
            tensors["midlayer." + name[len("layers.0."):] if name.startswith("layers.0.") else name] = value
    config = dict(draft_files.config)
    hidden = config.get("hidden_size")
    if config.get("target_hidden_size", hidden) == hidden:
        tensors.pop("embed_tokens.weight", None)
    weight_dtype = tensors["fc.weight"].dtype if "fc.weight" in tensors else torch.float32
    if "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = _target_lm_head(target_files, config).to(weight_dtype)
    if "d2t" in tensors:
        tensors["d2t"] = tensors["d2t"].to(torch.int64)
    config.update({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": config.get("model_type", "llama"),
        "vocab_size": target_files.config.get("vocab_size", config.get("vocab_size")),
        "draft_vocab_size": int(tensors["lm_head.weight"].shape[0]), "tie_word_embeddings": False,
        "torch_dtype": str(weight_dtype).removeprefix("torch."), "num_hidden_layers": config.get("num_hidden_layers", 1),
    })
    try:
        out.mkdir(parents=True, exist_ok=True)
        save_safetensors({k: v.contiguous() for k, v in tensors.items()}, out / "model.safetensors")
        write_json_atomic(out / "config.json", config)  # last: a folder without it is not a checkpoint
    except OSError as exc:
        raise DraftFileError(f"--export {out}: cannot write there ({exc.strerror or exc}); give a writable directory") from None
    return out


def _target_lm_head(target: CheckpointFiles, draft_config: dict[str, Any]):
    """The target's ``[V, H]`` output projection (``lm_head.weight``, else tied ``embed_tokens.weight``) as torch."""
    import torch

    declared = draft_config.get("draft_vocab_size")
    if declared is not None and declared != target.config.get("vocab_size"):
        raise ValueError(f"the draft declares draft_vocab_size={declared} but has no lm_head.weight; the target's "
                         f"lm_head has {target.config.get('vocab_size')} rows")
    name = target.find("lm_head.weight") or target.find("embed_tokens.weight")
    if name is None:
        raise ValueError(f"target {target.path} has neither lm_head.weight nor embed_tokens.weight in safetensors")
    return torch.from_numpy(target.read(name))
