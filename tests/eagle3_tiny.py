"""The tiny EAGLE-3 setup the EAGLE-3 test files share: head configs (full vocabulary and a 96-token
draft vocabulary), a seeded head of either kind, the tiny target and its loaded model (module-scoped
fixtures: import them into a test module to use them), and the prompt files a tiny training run reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_models import CORPUS, make_tiny_llama

from specbuild.engine import target as target_model
from specbuild.methods.eagle3.engine import Eagle3Config, Eagle3Head

VOCAB, HIDDEN, LAYERS, DRAFT_VOCAB = 384, 64, 8, 96
CONFIG = Eagle3Config(
    hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
    max_position_embeddings=512, vocab_size=VOCAB,
)
DRAFT_CONFIG = Eagle3Config(**{**CONFIG.__dict__, "draft_vocab_size": DRAFT_VOCAB})


def make_head(kind: str) -> Eagle3Head:
    """A seeded head: "random" (full vocabulary) or a draft-vocabulary head whose draft id d is
    target id 4 * d (d2t offset 3 d)."""
    torch.manual_seed(5)
    if kind == "random":
        return Eagle3Head(CONFIG)
    head = Eagle3Head(DRAFT_CONFIG, d2t=True)
    head.d2t.copy_(torch.arange(DRAFT_VOCAB) * 3)
    return head


def write_prompt_files(root: Path) -> dict[str, str]:
    """train.jsonl (4 corpus texts, 24 chars) and held_out.jsonl (the rest, 16 chars) under ``root``;
    returns the TrainConfig fields that name them."""
    (root / "train.jsonl").write_text("\n".join(json.dumps({"prompt": c[:24]}) for c in CORPUS[:4]) + "\n")
    (root / "held_out.jsonl").write_text("\n".join(json.dumps({"prompt": c[:16]}) for c in CORPUS[4:]) + "\n")
    return {"prompts": str(root / "train.jsonl"), "held_out": str(root / "held_out.jsonl")}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny8") / "ckpt", seed=1, num_hidden_layers=LAYERS)


@pytest.fixture(scope="module")
def model(checkpoint):
    return target_model.load_target(checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
