"""EAGLE-1 head training (Li et al. 2024, "EAGLE", §4): feature regression plus token classification.

For every position ``j`` of a target-generated sequence (see :mod:`.data`) the head reads
``[embed(c_{j+1}) ; f_j]`` (target features shifted by one token, as at inference) and is trained on::

    L = SmoothL1(f'_j, f_{j+1})  +  w_cls * CE(lm_head(f'_j), argmax lm_head(f_{j+1}))     (EAGLE §4.1, w_cls = 0.1)

with the target's ``lm_head`` and embeddings frozen. The classification target is the target's greedy
token (a hard label) where the paper uses the full distribution ``softmax(lm_head(f_{j+1}))``: greedy
verification accepts exactly the argmax, and the hard label saves one vocabulary projection per position
(a third of the step on a CPU); ``f_j`` gets uniform noise (EAGLE §4.3) so the head
tolerates its own imperfect features at depth >= 2. Sequences are packed ``batch_tokens`` head
positions per step with a block-diagonal causal mask and their own rotary positions, through the
engine's :class:`~specbuild.methods.eagle.engine.EagleHead` itself, so the trained weights are saved
with :func:`~specbuild.methods.eagle.engine.save_eagle_head` under exactly the names the engine loads.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specbuild.methods.eagle.engine import EagleConfig, EagleHead, save_eagle_head

from specbuild.train.config import TrainConfig
from specbuild.train.data import DistillData
from specbuild.train.loop import PackedBatches, StepOutput, TrainResult, block_causal_mask, settings_free, step_generator, train_beside_target


def eagle_config_for(target_config, *, num_layers: int = 1) -> EagleConfig:
    """An EAGLE head config matching the target's width, attention layout and rotary settings."""
    text = target_config.get_text_config()
    rope = getattr(text, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(text, "rope_theta", 10000.0))
    scaling = getattr(text, "rope_scaling", None)
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = dict(rope)
    return EagleConfig(
        hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size,
        num_attention_heads=text.num_attention_heads,
        num_key_value_heads=text.num_key_value_heads,
        num_hidden_layers=num_layers,
        rms_norm_eps=float(text.rms_norm_eps),
        max_position_embeddings=text.max_position_embeddings,
        rope_theta=float(theta),
        rope_scaling=scaling,
        head_dim=getattr(text, "head_dim", None),
        vocab_size=text.vocab_size,
    )


class EagleObjective:
    """One training step's loss for an EAGLE head over packed windows of ``data``."""

    def __init__(self, head: EagleHead, target, data: DistillData, config: TrainConfig, device: torch.device) -> None:
        self.head, self.data, self.config, self.device = head, data, config, device
        self.embedding = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        head_positions = [int(n) - 1 for n in data.offsets.diff()]  # position j predicts from c_{j+1}: n - 1 per sequence
        self.batches = PackedBatches(head_positions, config.batch_tokens, config.seed)
        self.noise_scale = config.feature_noise * float(data.features.std())

    def __call__(self, step: int) -> StepOutput:
        pieces = self.batches(step)
        index = torch.cat([torch.arange(a, b) + int(self.data.offsets[s]) for s, a, b in pieces])  # [S] global j
        positions = torch.cat([torch.arange(a, b) for _, a, b in pieces]).to(self.device)  # [S]
        mask = block_causal_mask(pieces, self.device)  # [S, S]
        features = self.data.features[index].to(self.device)  # [S, H] f_j
        target = self.data.features[index + 1].to(self.device)  # [S, H] f_{j+1}
        labels = self.data.top1[index + 1].to(self.device)  # [S] greedy c_{j+2}
        if self.noise_scale > 0:
            g = step_generator(self.config.seed, step, self.device)
            features = features + (torch.rand(features.shape, generator=g, device=self.device) * 2 - 1) * self.noise_scale
        with torch.no_grad():
            embeds = self.embedding(self.data.tokens[index + 1].to(self.device))  # [S, H]
        predicted, _ = self.head(embeds, features, positions, mask)  # [S, H]
        regression = nn.functional.smooth_l1_loss(predicted, target)
        logits = self.lm_head(predicted)  # [S, V]
        classification = nn.functional.cross_entropy(logits, labels)
        loss = regression + self.config.token_loss_weight * classification
        accuracy = float((logits.detach().argmax(-1) == labels).float().mean())
        return StepOutput(loss, len(index), {"reg": float(regression.detach()), "ce": float(classification.detach()), "acc": accuracy})


def train_eagle(
    target, data: DistillData, config: TrainConfig, out_dir: Path, ckpt_dir: Path, *, device: torch.device,
    log=print, show_progress: bool = True, on_step=None,
) -> TrainResult:
    """Train an EAGLE-1 head on ``data`` and save it to ``out_dir`` (config.json + model.safetensors).

    Args:
        target: the frozen target (its embeddings and lm_head are used, not trained).
        ckpt_dir: resumable checkpoints (see :func:`specbuild.train.loop.train`).
    """
    head_config = eagle_config_for(target.config, num_layers=config.num_layers or 1)
    head, result = train_beside_target(
        target, lambda: EagleHead(head_config, fc_bias=True).to(device), lambda head: EagleObjective(head, target, data, config, device),
        config, ckpt_dir, description="EAGLE head", log=log, show_progress=show_progress, on_step=on_step)
    save_eagle_head(out_dir, head.state_dict(), head_config)
    return result


train_for = settings_free(train_eagle)
""":attr:`~specbuild.methods.Training.train` of EAGLE: :func:`train_eagle` (the settings choose nothing)."""
