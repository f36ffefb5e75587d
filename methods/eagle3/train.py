"""EAGLE-3 head training (Li et al. 2025, "EAGLE-3", §3): fused low/mid/high target features and
training-time test.

Step 0 is EAGLE's usual alignment with fused features: head position ``j`` reads ``fc([h^a_j ; h^b_j ;
h^c_j])`` and ``embed(c_{j+1})``. Training-time test then unrolls the head on its OWN outputs as at
inference: step ``d`` feeds position ``j`` the step ``d - 1`` output with ``embed(c_{j+1+d})`` at rotary
position ``j + d``; its queries see the true (step 0) keys up to ``j`` and the chain ``(j, 1) .. (j, d)``::

    keys:          step 0 (S)         step 1 (S)   ...  step d (S)
    query (j, d):  causal up to j     only j       ...  only j          (block-diagonal across pieces)

Every step is trained to the target's greedy token: ``CE(lm_head(norm(o_{j,d})), argmax lm_head(f_{j+1+d}))``,
weighted ``loss_decay ** d`` (EAGLE-3's code uses 0.8). The head is the engine's
:class:`~specbuild.methods.eagle3.engine.Eagle3Head`, saved with
:func:`~specbuild.methods.eagle3.engine.save_eagle3_head`.

Vocabulary: by default the head projects through the target's ``lm_head`` (frozen; no ``d2t``). With
``train.draft_vocab_size = Vd`` it drafts over a reduced vocabulary, as EAGLE-3's public heads do
(:func:`draft_vocabulary`): the ``Vd`` target ids the target predicts most often in the data, in ascending
id order; its own ``lm_head [Vd, H]`` starts from the target's rows of those ids and is trained; a label
outside the draft vocabulary is left out of the loss (the head can never draft it; EAGLE-3's trainer masks
such positions the same way), and ``d2t`` / ``t2d`` are written beside the weights. Example: the target
predicts ``[5, 2, 5, 7, 2, 5]``, ``Vd = 2`` -> draft vocabulary (target ids) ``[2, 5]``, ``d2t = [2, 4]``,
label 5 -> draft id 1, label 7 -> left out.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from specbuild.methods.eagle3.engine import Eagle3Config, Eagle3Head, capture_layers_for, save_eagle3_head, vocab_mapping
from specbuild.methods.token_map import frequency_order

from specbuild.train.config import TrainConfig
from specbuild.train.data import DistillData, ensure_aux_features
from specbuild.methods.eagle.train import eagle_config_for
from specbuild.train.loop import INIT_WEIGHTS, PackedBatches, StepOutput, TrainResult, block_causal_mask, settings_free, train_beside_target


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


def training_capture_layers(params, target_config) -> tuple[int, ...]:
    """:attr:`~specbuild.methods.Training.capture_layers` of EAGLE-3: the layers the head trained for
    ``target_config`` fuses (:func:`eagle3_config_for`, then
    :func:`~specbuild.methods.eagle3.engine.capture_layers_for`); the settings choose nothing."""
    return capture_layers_for(eagle3_config_for(target_config), target_config.get_text_config().num_hidden_layers)


def draft_vocabulary(top1: torch.Tensor, vocab_size: int, size: int) -> torch.Tensor:
    """The ``size`` target ids the target predicts most often in ``top1`` (its argmax at every training
    position; ranked by :func:`~specbuild.methods.token_map.frequency_order`, unseen ids by id if fewer were
    seen), in ascending id order: draft id ``d`` is the ``d``-th of them (EAGLE-3's trainers sort them so,
    and every ``d2t`` offset is then >= 0).

    Returns:
        ``[size]`` long target ids. Example: ``top1 = [5, 2, 5, 7, 2, 5]``, size 2 -> ``[2, 5]``.

    Raises:
        ValueError: ``size`` above ``vocab_size``, or an id in ``top1`` outside the vocabulary.
    """
    if not 1 <= size <= vocab_size:
        raise ValueError(f"train.draft_vocab_size={size} must be in [1, {vocab_size}] (the target's vocabulary)")
    order, _ = frequency_order(top1, vocab_size)
    return order[:size].sort().values


def draft_head(config: Eagle3Config, target, target_ids: torch.Tensor | None) -> Eagle3Head:
    """A fresh head for training: over the target's ``lm_head`` (``target_ids`` None), or over the draft
    vocabulary ``target_ids [Vd]`` with its own ``lm_head`` started from the target's rows and ``d2t`` set."""
    if target_ids is None:
        return Eagle3Head(config, lm_head=False)
    head = Eagle3Head(config, lm_head=True, d2t=True)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[target_ids.to(head.lm_head.weight.device)])
        head.d2t.copy_(vocab_mapping(target_ids, config.vocab_size)[0])
    return head


class Eagle3Objective:
    """One step's training-time-test loss over packed windows of ``data``; over the head's own draft
    vocabulary when it has one (labels mapped target -> draft id, labels outside it left out)."""

    def __init__(self, head: Eagle3Head, target, data: DistillData, aux: torch.Tensor, config: TrainConfig, device) -> None:
        self.head, self.data, self.aux, self.config, self.device = head, data, aux, config, device
        self.embedding = target.get_input_embeddings()
        self.lm_head = head.lm_head if hasattr(head, "lm_head") else target.get_output_embeddings()
        self.to_draft = None  # [V] long: target id -> draft id, -1 outside the draft vocabulary
        rows = target.get_output_embeddings().weight.detach()  # [V, H]
        if hasattr(head, "d2t"):
            ids = torch.arange(len(head.d2t), device=head.d2t.device) + head.d2t  # [Vd] target ids
            self.to_draft = torch.full((rows.shape[0],), -1, dtype=torch.long, device=device)
            self.to_draft[ids.to(device)] = torch.arange(len(ids), device=device)
            rows = rows[ids.to(rows.device)]  # [Vd, H]
        self.target_rows = rows if config.soft_labels else None  # the target's lm_head rows soft labels are taken over
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
        if self.target_rows is not None:  # every position some step labels, each once
            span = torch.unique(torch.cat([index + 1 + d for d in range(self.config.ttt_steps)]).clamp(max=last))  # [U] sorted
            probs = self.target_probs(span)  # [U, Vd]
        for d in range(self.config.ttt_steps):
            token_at = index + 1 + d  # c_{j+1+d}
            valid = (token_at < end).to(self.device)  # [S]
            with torch.no_grad():
                embeds = self.embedding(self.data.tokens[token_at.clamp(max=last)].to(self.device))  # [S, H]
            hidden, new = self.head(embeds, hidden, positions + d, mask, kv)  # [S, H]
            kv = new if kv is None else kv.cat(new)
            mask = torch.cat([causal] + [eye] * (d + 1), dim=1)  # next step: true keys + the chain so far + itself
            labels = self.data.top1[token_at.clamp(max=last)].to(self.device)[valid]  # [valid] target ids
            logits = self.lm_head(self.head.norm(hidden[valid]))  # [valid, V] (or [valid, Vd])
            drafts = labels if self.to_draft is None else self.to_draft[labels]  # [valid] draft ids, -1 outside the draft vocabulary
            if self.target_rows is not None:
                ce = soft_cross_entropy(logits, probs[torch.searchsorted(span, token_at.clamp(max=last)[valid.cpu()])], drafts >= 0)
            else:
                kept = max(int((drafts >= 0).sum()), 1)
                ce = nn.functional.cross_entropy(logits, drafts, ignore_index=-1, reduction="sum") / kept
            hits = logits.detach().argmax(-1) == drafts  # an out-of-vocabulary label is a miss
            loss = loss + self.config.loss_decay**d * ce
            metrics[f"acc{d}"] = float(hits.float().mean())
        return StepOutput(loss, len(index), metrics)

    @torch.no_grad()
    def target_probs(self, at: torch.Tensor) -> torch.Tensor:
        """``[R, Vd]`` float32: the target's softmax over the draft vocabulary (``[R, V]`` without one) at
        data positions ``at [R]``, its logits recomputed from the stored final-norm features (the ones
        ``top1`` came from). Needs ``train.soft_labels``."""
        feats = self.data.features[at].to(self.device, self.target_rows.dtype)  # [R, H]
        return torch.softmax(nn.functional.linear(feats, self.target_rows).float(), -1)


def soft_cross_entropy(logits: torch.Tensor, target_p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean over the rows where ``keep [R]`` of the cross-entropy of ``logits [R, Vd]`` against
    ``target_p [R, Vd]``: EAGLE-3's loss over the draft vocabulary (rows whose target argmax is outside
    it left out, as its reference trainer masks them); 0 when no row is kept."""
    logp = torch.log_softmax(logits.float(), -1)
    return -(target_p[keep] * logp[keep]).sum() / max(int(keep.sum()), 1)


def initial_vocabulary(ckpt_dir: Path, size: int) -> torch.Tensor | None:
    """The draft vocabulary (``[size]`` target ids) of the head a fine-tune starts from: the ``d2t`` of
    ``<ckpt_dir>/init.safetensors`` (:data:`~specbuild.train.loop.INIT_WEIGHTS`), whose ``lm_head`` rows
    belong to those ids; None without one (a fresh head picks its vocabulary from the data).

    Raises:
        ValueError: the saved head's vocabulary is not ``size`` tokens.
    """
    init = ckpt_dir / INIT_WEIGHTS
    if not init.is_file():
        return None
    with safe_open(str(init), "pt") as f:
        if "d2t" not in f.keys():
            return None
        d2t = f.get_tensor("d2t").long()
    if len(d2t) != size:
        raise ValueError(f"{init}: the saved head drafts over {len(d2t)} tokens, train.draft_vocab_size is {size}: "
                         f"fine-tune with draft_vocab_size: {len(d2t)}, or train a new head without --from-log")
    return torch.arange(size) + d2t


def train_eagle3(
    target, data: DistillData, config: TrainConfig, out_dir: Path, ckpt_dir: Path, *, device: torch.device,
    log=print, show_progress: bool = True, on_step=None,
) -> TrainResult:
    """Train an EAGLE-3 head and save it to ``out_dir``: over the target's lm_head, or with
    ``config.draft_vocab_size`` over that many target ids (:func:`draft_vocabulary`; ``lm_head``, ``d2t`` and
    ``t2d`` written, ``draft_vocab_size`` in config.json).

    Raises:
        ValueError: ``draft_vocab_size`` above the target's vocabulary.
    """
    for p in target.parameters():
        p.requires_grad_(False)
    head_config = eagle3_config_for(target.config)
    target_ids = None
    if config.draft_vocab_size is not None:
        vocab = target.get_output_embeddings().weight.shape[0]
        target_ids = initial_vocabulary(ckpt_dir, config.draft_vocab_size)  # a fine-tune keeps its head's vocabulary
        which = "of the head being fine-tuned (its d2t)"
        if target_ids is None:
            target_ids, which = draft_vocabulary(data.top1, vocab, config.draft_vocab_size), "predicted most often"
        head_config = Eagle3Config(**{**head_config.__dict__, "vocab_size": vocab, "draft_vocab_size": config.draft_vocab_size})
        share = float(torch.isin(data.top1, target_ids).float().mean())
        log(f"EAGLE-3 draft vocabulary: the {len(target_ids)} target tokens {which} ({share:.1%} of "
            f"{data.num_tokens:,} predictions)")
    layers = training_capture_layers(None, target.config)
    aux = ensure_aux_features(target, data, layers, batch_size=config.generation_batch_size, log=log)
    head, result = train_beside_target(
        target, lambda: draft_head(head_config, target, target_ids).to(device),
        lambda head: Eagle3Objective(head, target, data, aux, config, device),
        config, ckpt_dir, description="EAGLE-3 head", log=log, show_progress=show_progress, on_step=on_step)
    save_eagle3_head(out_dir, head.state_dict(), head_config)
    return result


train_for = settings_free(train_eagle3)
""":attr:`~specbuild.methods.Training.train` of EAGLE-3: :func:`train_eagle3` (the settings choose nothing)."""
