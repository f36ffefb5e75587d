"""Medusa-1 head training (Cai et al. 2024, "Medusa", §2.2.1): frozen target, one loss per head.

Head ``h`` reads the target's final-norm hidden state ``f_p`` and is trained to predict the token at
``p + 2 + h`` of the target-generated sequence (head 0 guesses one token past the target's own
next token), with the loss ``sum_h decay**h * CE(head_h(f_p), c_{p+2+h})`` (decay 0.8 in the paper).
Only positions whose labels are target-generated are used (``p >= prompt_len - 1``).

Initialisation follows the Medusa code: residual blocks start at zero (identity) and each head's vocab
projection starts as a copy of the target's ``lm_head``. By default the projections stay frozen (the
CPU-affordable setting: only the residual blocks train); the saved file still holds every head's
projection, in the FasterDecoding / TensorRT-LLM layout of :mod:`specbuild.methods.medusa.engine`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specbuild.methods.medusa.engine import MedusaConfig, MedusaHeads, save_medusa_heads

from specbuild.train.config import TrainConfig
from specbuild.train.data import DistillData
from specbuild.train.loop import PackedBatches, StepOutput, TrainResult, train_beside_target


def init_medusa_heads(target, num_heads: int, num_layers: int) -> MedusaHeads:
    """Heads with zero residual blocks and the target's lm_head as every projection (frozen, shared)."""
    lm_head = target.get_output_embeddings()
    vocab, hidden = lm_head.weight.shape
    heads = MedusaHeads(MedusaConfig(num_heads, num_layers, hidden, vocab))
    for head in heads.heads:
        for block in head[:-1]:
            nn.init.zeros_(block.linear.weight)
            nn.init.zeros_(block.linear.bias)
        head[-1].weight = lm_head.weight  # shared and frozen; cloned when saved
    return heads


class MedusaObjective:
    """One step's decayed sum of per-head cross-entropies over ``batch_tokens`` positions."""

    def __init__(self, heads: MedusaHeads, data: DistillData, config: TrainConfig, device: torch.device) -> None:
        self.heads, self.data, self.config, self.device = heads, data, config, device
        n = data.offsets.diff()
        self.first = (data.prompt_lens - 1).clamp(min=0)  # first position whose next token is generated
        lengths = [max(0, int(n[i]) - 2 - int(self.first[i])) for i in range(data.num_sequences)]
        self.batches = PackedBatches(lengths, config.batch_tokens, config.seed)
        self.ends = data.offsets[1:]

    def __call__(self, step: int) -> StepOutput:
        pieces = self.batches(step)
        index = torch.cat([torch.arange(a, b) + int(self.data.offsets[s] + self.first[s]) for s, a, b in pieces])
        end = torch.cat([torch.full((b - a,), int(self.ends[s])) for s, a, b in pieces])  # [S] sequence end
        hidden = self.data.features[index].to(self.device)  # [S, H] f_p
        logits = self.heads(hidden)  # [K, S, V]
        loss, metrics = hidden.new_zeros(()), {}
        for h in range(logits.shape[0]):
            target = index + 2 + h
            valid = target < end
            labels = torch.where(valid, self.data.tokens[target.clamp(max=self.data.num_tokens - 1)], -100).to(self.device)
            ce = nn.functional.cross_entropy(logits[h], labels, ignore_index=-100)
            loss = loss + self.config.loss_decay**h * ce
            hit = (logits[h].argmax(-1) == labels)[valid.to(self.device)]
            metrics[f"acc{h}"] = float(hit.float().mean()) if hit.numel() else 0.0
        return StepOutput(loss, len(index), metrics)


def train_medusa(
    target, data: DistillData, config: TrainConfig, out_dir: Path, ckpt_dir: Path, *, num_heads: int, device: torch.device,
    log=print, show_progress: bool = True, on_step=None,
) -> TrainResult:
    """Train ``num_heads`` Medusa-1 heads on ``data`` and save them to ``out_dir``
    (config.json + medusa_lm_head.safetensors)."""
    heads, result = train_beside_target(
        target, lambda: init_medusa_heads(target, num_heads, config.num_layers or 1).to(device),
        lambda heads: MedusaObjective(heads, data, config, device),
        config, ckpt_dir, description="Medusa heads", log=log, show_progress=show_progress, on_step=on_step)
    state = {k: v.detach().clone() for k, v in heads.heads.state_dict().items()}
    save_medusa_heads(out_dir, state, heads.config)
    return result


def train_for(spec, target, tokenizer, data: DistillData, config: TrainConfig, out_dir: Path, ckpt_dir: Path, **common) -> TrainResult:
    """:attr:`~specbuild.methods.Training.train` of Medusa: :func:`train_medusa` with ``num_medusa_heads`` heads."""
    del tokenizer
    return train_medusa(target, data, config, out_dir, ckpt_dir, num_heads=spec.num_medusa_heads, **common)
