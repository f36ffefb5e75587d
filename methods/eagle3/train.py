"""EAGLE-3 head training (Li et al. 2025, "EAGLE-3", §3): fused low/mid/high target features and
training-time test.

Step 0 is EAGLE's usual alignment with fused features: head position ``j`` reads ``fc([h^a_j ; h^b_j ;
h^c_j])`` and ``embed(c_{j+1})``. Training-time test then unrolls the head on its OWN outputs as at
inference: step ``d`` feeds position ``j`` the step ``d - 1`` output with ``embed(c_{j+1+d})`` at rotary
position ``j + d``; its queries see the true (step 0) keys up to ``j`` and the chain ``(j, 1) .. (j, d)``::

    keys:          step 0 (S)         step 1 (S)   ...  step d (S)
    query (j, d):  causal up to j     only j       ...  only j          (block-diagonal across pieces)

Every step is trained to the target's greedy token: ``CE(lm_head(norm(o_{j,d})), argmax lm_head(f_{j+1+d}))``,
weighted ``loss_decay ** d`` (EAGLE-3's code uses 0.8). The head uses the target's ``lm_head`` (no draft
vocabulary, no ``d2t``), frozen; it is the engine's :class:`~specbuild.methods.eagle3.engine.Eagle3Head`,
saved with :func:`~specbuild.methods.eagle3.engine.save_eagle3_head`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specbuild.methods.eagle3.engine import Eagle3Config, Eagle3Head, capture_layers_for, save_eagle3_head

from specbuild.train.config import TrainConfig
from specbuild.train.data import DistillData, ensure_aux_features
from specbuild.methods.eagle.train import eagle_config_for
from specbuild.train.loop import PackedBatches, StepOutput, TrainResult, block_causal_mask, settings_free, train_beside_target


def eagle3_config_for(target_config) -> Eagle3Config:
    """An EAGLE-3 config matching the target; targets of <= 5 layers (below TensorRT-LLM's default capture)
    name their layers ``(0, L // 2, L - 1)`` in ``eagle_config.eagle_aux_hidden_state_layer_ids``."""
    layer = eagle_config_for(target_config, num_layers=1)
    layers = target_config.get_text_config().num_hidden_layers
    return Eagle3Config(
        hidden_size=layer.hidden_size, intermediate_size=layer.intermediate_size,
        num_attention_heads=layer.num_attention_heads, num_key_value_heads=layer.num_key_value_heads,
        rms_norm_eps=layer.rms_norm_eps, max_position_embeddings=layer.max_position_embeddings,
        rope_theta=layer.rope_theta, rope_scaling=layer.rope_scaling, head_dim=layer.head_dim,
        vocab_size=layer.vocab_size, target_hidden_size=layer.hidden_size,
        aux_layer_ids=None if layers > 5 else (0, layers // 2, layers - 1),
    )


class Eagle3Objective:
    """One step's training-time-test loss over packed windows of ``data``."""

    def __init__(self, head: Eagle3Head, target, data: DistillData, aux: torch.Tensor, config: TrainConfig, device) -> None:
        self.head, self.data, self.aux, self.config, self.device = head, data, aux, config, device
        self.embedding = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        self.batches = PackedBatches([int(n) - 1 for n in data.offsets.diff()], config.batch_tokens, config.seed)

    def __call__(self, step: int) -> StepOutput:
        pieces = self.batches(step)
        index = torch.cat([torch.arange(a, b) + int(self.data.offsets[s]) for s, a, b in pieces])  # [S] global j
        end = torch.cat([torch.full((b - a,), int(self.data.offsets[s + 1])) for s, a, b in pieces])  # [S]
        positions = torch.cat([torch.arange(a, b) for _, a, b in pieces]).to(self.device)  # [S]
        causal = block_causal_mask(pieces, self.device)  # [S, S]
        eye = torch.eye(len(index), dtype=torch.bool, device=self.device)
        last = self.data.num_tokens - 1
        hidden = self.head.fc(self.aux[index].to(self.device))  # [S, H]
        kv, mask = None, causal
        loss, metrics = hidden.new_zeros(()), {}
        for d in range(self.config.ttt_steps):
            token_at = index + 1 + d  # c_{j+1+d}
            valid = (token_at < end).to(self.device)  # [S]
            with torch.no_grad():
                embeds = self.embedding(self.data.tokens[token_at.clamp(max=last)].to(self.device))  # [S, H]
            hidden, new = self.head(embeds, hidden, positions + d, mask, kv)  # [S, H]
            kv = new if kv is None else kv.cat(new)
            mask = torch.cat([causal] + [eye] * (d + 1), dim=1)  # next step: true keys + the chain so far + itself
            labels = self.data.top1[token_at.clamp(max=last)].to(self.device)
            logits = self.lm_head(self.head.norm(hidden[valid]))  # [valid, V]
            ce = nn.functional.cross_entropy(logits, labels[valid])
            loss = loss + self.config.loss_decay**d * ce
            metrics[f"acc{d}"] = float((logits.detach().argmax(-1) == labels[valid]).float().mean())
        return StepOutput(loss, len(index), metrics)


def train_eagle3(
    target, data: DistillData, config: TrainConfig, out_dir: Path, ckpt_dir: Path, *, device: torch.device,
    log=print, show_progress: bool = True, on_step=None,
) -> TrainResult:
    """Train an EAGLE-3 head (target's lm_head, no draft vocabulary) and save it to ``out_dir``."""
    for p in target.parameters():
        p.requires_grad_(False)
    head_config = eagle3_config_for(target.config)
    layers = capture_layers_for(head_config, target.config.get_text_config().num_hidden_layers)
    aux = ensure_aux_features(target, data, layers, batch_size=config.generation_batch_size, log=log)
    head, result = train_beside_target(
        target, lambda: Eagle3Head(head_config, lm_head=False).to(device),
        lambda head: Eagle3Objective(head, target, data, aux, config, device),
        config, ckpt_dir, description="EAGLE-3 head", log=log, show_progress=show_progress, on_step=on_step)
    save_eagle3_head(out_dir, head.state_dict(), head_config)
    return result


train_for = settings_free(train_eagle3)
""":attr:`~specbuild.methods.Training.train` of EAGLE-3: :func:`train_eagle3` (the settings choose nothing)."""
