"""A small draft model for draft-target speculation, distilled from the target's logits.

The draft is the target cut down to ``num_layers`` decoder layers, initialised from the target's first
``num_layers - 1`` layers plus its LAST layer (layer dropping keeps the last layer, which shapes the
lm_head's input), with the target's final norm, embeddings and (tied or copied) lm_head, so it shares the
tokenizer and vocabulary by construction. Training minimises ``T**2 * KL(p_target/T || q_draft/T)`` over
every position of the target-generated sequences (Hinton et al. 2015 distillation; the target's logits
are ``lm_head(features)`` from the cached features), with embeddings and lm_head frozen.

Saved as a Hugging Face checkpoint (config.json + model.safetensors + the target's tokenizer files), the
format TensorRT-LLM's ``convert_checkpoint.py`` and the reference engine's DraftTarget method read.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from specbuild.train.config import TrainConfig
from specbuild.train.data import DistillData
from specbuild.train.loop import PackedBatches, StepOutput, TrainResult, train_beside_target


def init_draft(target, num_layers: int):
    """A copy of ``target`` keeping layers ``[0 .. num_layers - 2] + [L - 1]`` (``num_layers`` of ``L``).

    Raises:
        ValueError: ``num_layers`` not below the target's layer count.
    """
    layers = target.model.layers
    total = len(layers)
    if not 1 <= num_layers < total:
        raise ValueError(f"train.num_layers={num_layers}: a draft keeps fewer layers than the target's {total}")
    keep = list(range(num_layers - 1)) + [total - 1]
    draft = copy.deepcopy(target)
    draft.model.layers = nn.ModuleList(draft.model.layers[i] for i in keep)
    for new_index, layer in enumerate(draft.model.layers):
        layer.self_attn.layer_idx = new_index
    draft.config.num_hidden_layers = num_layers
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = [draft.config.layer_types[i] for i in keep]
    for p in draft.parameters():
        p.requires_grad_(True)
    draft.get_input_embeddings().weight.requires_grad_(False)
    draft.get_output_embeddings().weight.requires_grad_(False)
    return draft


class DraftObjective:
    """One step's distillation loss over packed windows (rows padded to the longest window)."""

    def __init__(self, draft, target, data: DistillData, config: TrainConfig, device: torch.device) -> None:
        self.draft, self.data, self.config, self.device = draft, data, config, device
        self.lm_head = target.get_output_embeddings()
        window = min(config.batch_tokens, 256)
        self.batches = PackedBatches([int(n) for n in data.offsets.diff()], config.batch_tokens, config.seed)
        self.batches.pieces = [(s, a, min(a + window, b)) for s, a0, b in self.batches.pieces for a in range(a0, b, window)]

    def __call__(self, step: int) -> StepOutput:
        pieces = self.batches(step)
        width = max(b - a for _, a, b in pieces)
        ids = torch.zeros(len(pieces), width, dtype=torch.long)
        positions = torch.zeros(len(pieces), width, dtype=torch.long)
        mask = torch.zeros(len(pieces), width, dtype=torch.long)
        index = []
        for r, (s, a, b) in enumerate(pieces):
            g = torch.arange(a, b) + int(self.data.offsets[s])
            ids[r, : b - a], positions[r, : b - a], mask[r, : b - a] = self.data.tokens[g], torch.arange(a, b), 1
            index.append(g)
        index = torch.cat(index)
        keep = mask.bool().flatten()
        temperature = self.config.distill_temperature
        with torch.no_grad():
            teacher = torch.log_softmax(self.lm_head(self.data.features[index].to(self.device)) / temperature, -1)  # [N, V]
        logits = self.draft(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                            position_ids=positions.to(self.device)).logits  # [B, W, V]
        student = torch.log_softmax(logits.flatten(0, 1)[keep.to(self.device)] / temperature, -1)  # [N, V]
        kl = nn.functional.kl_div(student, teacher, log_target=True, reduction="batchmean") * temperature**2
        agree = float((student.argmax(-1) == self.data.top1[index].to(self.device)).float().mean())
        return StepOutput(kl, len(index), {"top1": agree})


def train_draft(
    target, tokenizer, data: DistillData, config: TrainConfig, out_dir: Path, ckpt_dir: Path, *, device: torch.device,
    log=print, show_progress: bool = True, on_step=None,
) -> TrainResult:
    """Distil a ``config.num_layers``-layer draft (default 4) from ``target`` and save it to ``out_dir``."""
    draft, result = train_beside_target(
        target, lambda: init_draft(target, config.num_layers or 4).to(device).train(),
        lambda draft: DraftObjective(draft, target, data, config, device),
        config, ckpt_dir, description="draft model", log=log, show_progress=show_progress, on_step=on_step)
    draft.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    draft.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    return result


def train_for(spec, target, tokenizer, data: DistillData, config: TrainConfig, out_dir: Path, ckpt_dir: Path, **common) -> TrainResult:
    """:attr:`~specbuild.methods.Training.train` of draft-target: :func:`train_draft` (the settings choose nothing)."""
    del spec
    return train_draft(target, tokenizer, data, config, out_dir, ckpt_dir, **common)
