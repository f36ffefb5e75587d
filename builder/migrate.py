"""Migrate an engine-path recipe (``build.backend: tensorrt``) to TensorRT-LLM's PyTorch path.

TensorRT-LLM removed the engine path after 1.2.x (``trtllm-build``, ``convert_checkpoint.py``, the
C++ Triton backend: NVIDIA/TensorRT-LLM PRs #15763, #15767, #15907, #15918, #16369;
docs/source/legacy/tensorrt-backend-removal.md). Its PyTorch backend runs EAGLE-3 among the EAGLE
versions, and no Medusa, lookahead or ReDrafter. The replacements (:data:`REPLACEMENTS`):

- EAGLE-1/2, Medusa, ReDrafter -> EAGLE-3 (``eagle3``) with a head named (``--eagle-model``, or the
  published head for the target, :data:`EAGLE3_HEADS`) or to train; EAGLE's tree becomes EAGLE-3's
  dynamic tree (depth ``num_eagle_layers``, ``dynamic_tree_max_topK`` = ``max_non_leaves_per_layer``,
  at most the old tree's ``max_draft_len`` nodes);
- lookahead -> n-gram (``ngram``: up to N - 1 tokens copied from the context) or suffix automaton
  (``sa``, where specbuild has that method);
- draft-target, n-gram and plain decoding keep their method.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specbuild.builder.recipe import LoadedRecipe, RecipeError

DEFAULT_VERSION = "1.3.0"
# Published EAGLE-3 heads (the EAGLE authors' Hugging Face releases, as llama-eagle3 uses) by target.
EAGLE3_HEADS = {"meta-llama/Llama-3.1-8B-Instruct": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                "meta-llama/Llama-3.3-70B-Instruct": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"}
REPLACEMENTS = {
    "eagle": "EAGLE-3 (method eagle3) with a head to name or train; the tree becomes EAGLE-3's dynamic tree",
    "medusa": "EAGLE-3 (method eagle3) with a head to name or train",
    "redrafter": "EAGLE-3 (method eagle3) with a head to name or train",
    "lookahead": "n-gram (method ngram) or suffix automaton (method sa): drafts from the context, no draft model",
}
BUILD_KEPT = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tp_size", "pp_size", "baseline_engine")


def replacement(method: str) -> str | None:
    """What replaces ``method`` on TensorRT-LLM >= 1.3 (``None``: it runs there as it is)."""
    return REPLACEMENTS.get(method)


@dataclass(frozen=True)
class Migration:
    """The new recipe (a YAML-ready dict) and what the user must know about it."""

    recipe: dict[str, Any]
    notes: tuple[str, ...]

    def yaml_text(self, source: Path) -> str:
        header = [f"# Migrated by `specbuild migrate` from {source.name} (engine path) to TensorRT-LLM's PyTorch path."]
        header += [f"# {note}" for note in self.notes]
        return "\n".join(header) + "\n" + yaml.safe_dump(self.recipe, sort_keys=False)


def _sa_available() -> bool:
    from specbuild.methods import method_named

    try:
        method_named("sa")
    except (KeyError, ValueError):
        return False
    return True


def _eagle3(loaded: LoadedRecipe, eagle_model: str | None, notes: list[str]) -> dict[str, Any]:
    spec = loaded.recipe.speculation
    target = loaded.recipe.target.checkpoint
    head = eagle_model or EAGLE3_HEADS.get(target)
    if head is None:
        head = f"./eagle3-head-{Path(target).name}"
        notes.append(f"no published EAGLE-3 head for {target}: train one into {head} (e.g. TensorRT-LLM's EAGLE-3 training "
                     "recipe), or rerun with --eagle-model ID")
    else:
        notes.append(f"EAGLE-3 head: {head}" + ("" if eagle_model else " (the published head for this target)"))
    out: dict[str, Any] = {"method": "eagle3", "eagle_model": head}
    if spec.method == "eagle":
        depth, top_k = spec.num_eagle_layers, spec.max_non_leaves_per_layer
        out |= {"max_draft_len": depth, "use_dynamic_tree": True, "dynamic_tree_max_topK": top_k,
                "max_total_draft_tokens": max(depth, min(spec.max_draft_len, depth * top_k))}
        notes.append(f"EAGLE's tree ({spec.max_draft_len} nodes, {depth} deep) -> EAGLE-3's dynamic tree: max_draft_len {depth}, "
                     f"dynamic_tree_max_topK {top_k}, max_total_draft_tokens {out['max_total_draft_tokens']}")
    elif spec.method == "medusa":
        out["max_draft_len"] = min(spec.num_medusa_heads, 32)
        notes.append(f"Medusa's {spec.num_medusa_heads} heads -> an EAGLE-3 chain of {out['max_draft_len']} drafts")
    else:  # redrafter
        out["max_draft_len"] = min(spec.redrafter_draft_len_per_beam, 32)
        notes.append(f"ReDrafter's beams -> an EAGLE-3 chain of {out['max_draft_len']} drafts")
    return out


def _context_drafts(loaded: LoadedRecipe, to: str, notes: list[str]) -> dict[str, Any]:
    spec = loaded.recipe.speculation
    k = max(1, spec.max_ngram_size - 1)
    if to == "sa":
        if not _sa_available():
            raise RecipeError("migrate --to sa: this specbuild has no 'sa' method yet; use --to ngram")
        notes.append(f"lookahead (W, N, G) = ({spec.max_window_size}, {spec.max_ngram_size}, {spec.max_verification_set_size}) -> "
                     f"suffix automaton drafting up to {k} tokens (N - 1)")
        return {"method": "sa", "max_draft_len": k}
    notes.append(f"lookahead (W, N, G) = ({spec.max_window_size}, {spec.max_ngram_size}, {spec.max_verification_set_size}) -> "
                 f"n-gram drafting up to {k} tokens (N - 1) copied from the context")
    return {"method": "ngram", "max_draft_len": k, "max_matching_ngram_size": 3}


DRAFT_NAMES = {"eagle3": "EAGLE-3 head", "ngram": "n-gram speculation", "sa": "suffix-automaton speculation",
               "draft_target": "draft model"}


def _description(r, speculation: dict[str, Any]) -> str:
    """The migrated recipe's one line, from what it now runs (the old one named the old method and draft).
    Example: ``"lmsys/vicuna-7b-v1.3 + EAGLE-3 head (./eagle3-head-vicuna-7b-v1.3), TensorRT-LLM PyTorch path;
    migrated from llama-medusa (medusa, engine path)"``."""
    method = speculation["method"]
    draft = next((v for k, v in speculation.items() if k.endswith(("_model", "_checkpoint")) and isinstance(v, str)), None)
    what = DRAFT_NAMES.get(method, method) + (f" ({draft})" if draft else "")
    return f"{r.target.checkpoint} + {what}, TensorRT-LLM PyTorch path; migrated from {r.name} ({r.speculation.method}, engine path)"


def migrate(loaded: LoadedRecipe, *, version: str = DEFAULT_VERSION, eagle_model: str | None = None, to: str = "ngram") -> Migration:
    """``loaded`` (an engine-path recipe) as a PyTorch-path recipe for TensorRT-LLM ``version``.

    Raises:
        RecipeError: the recipe is not on the engine path; ``to`` is not ``ngram`` / ``sa``; ``version`` is
            not a TensorRT-LLM version (``--trtllm-version abc``, named as the flag); ``eagle_model`` is empty.
    """
    from specbuild.builder.trtllm_plan import with_trtllm_version

    r = loaded.recipe
    if r.build.backend != "tensorrt":
        raise RecipeError(f"{loaded.path}: build.backend is {r.build.backend!r}; migrate moves engine-path (tensorrt) recipes")
    if to not in ("ngram", "sa"):
        raise RecipeError(f"migrate --to {to!r}: lookahead migrates to ngram or sa")
    with_trtllm_version(loaded, version)  # the flag's value as the recipe field takes it, named as the flag
    if eagle_model is not None and not eagle_model.strip():
        raise RecipeError("--eagle-model is empty: give an EAGLE-3 head (a Hugging Face id or a directory), or leave it out")
    notes: list[str] = []
    spec = r.speculation
    dumped = spec.model_dump(exclude_unset=True)
    if spec.method in ("eagle", "medusa", "redrafter"):
        speculation = _eagle3(loaded, eagle_model, notes)
    elif spec.method == "lookahead":
        speculation = _context_drafts(loaded, to, notes)
    else:
        speculation = dumped
    raw = r.model_dump(exclude_unset=True, exclude_none=True)
    build = {k: v for k, v in raw.get("build", {}).items() if k in BUILD_KEPT}
    recipe = {"name": f"{r.name}-pytorch", "description": _description(r, speculation),
              "target": raw["target"], "speculation": speculation,
              "build": {"backend": "pytorch", **build, "device": "cuda", "trtllm_version": version}}
    for section in ("serve", "verify"):
        if raw.get(section):
            recipe[section] = raw[section]
    return Migration(recipe, tuple(notes))


__all__ = ["EAGLE3_HEADS", "Migration", "REPLACEMENTS", "migrate", "replacement"]
