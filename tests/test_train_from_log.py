"""``train-draft --from-log``: fine-tuning the existing draft from its own weights on logged traffic."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_train import CPU, prompt_files, quiet, setup, small_config, write_train_recipe  # noqa: F401 - fixtures

from specbuild.builder.recipe import RecipeError, load_recipe
from specbuild.builder.train_stage import fine_tune_config, fine_tune_from_log, train_draft, training_status
from specbuild.methods.draft_target.train import DraftObjective, train_draft as distil_draft
from specbuild.methods.eagle.engine import load_eagle_head
from specbuild.methods.eagle.train import EagleObjective, train_eagle
from specbuild.methods.medusa.engine import load_medusa_heads
from specbuild.methods.medusa.train import MedusaObjective, train_medusa
from specbuild.train.config import TrainConfig
from specbuild.train.loop import INIT_WEIGHTS, load_initial_weights
from specbuild.triton_repo.request_log import RequestLog


def _train(method, model, tokenizer, data, config, out, ckpt, on_step=None):
    options = quiet(on_step=on_step)
    if method == "eagle":
        return train_eagle(model, data, config, out, ckpt, **options)
    if method == "medusa":
        return train_medusa(model, data, config, out, ckpt, **(options | {"num_heads": 2}))
    return distil_draft(model, tokenizer, data, config, out, ckpt, **options)


def _loaded_loss(method, model, data, config, artefact) -> float:
    """The objective's step-0 loss of the draft saved at ``artefact``, loaded as the engine loads it."""
    if method == "eagle":
        objective = EagleObjective(load_eagle_head(artefact), model, data, config, CPU)
    elif method == "medusa":
        objective = MedusaObjective(load_medusa_heads(artefact), data, config, CPU)
    else:
        from transformers import AutoModelForCausalLM

        draft = AutoModelForCausalLM.from_pretrained(str(artefact), torch_dtype=torch.float32,
                                                     attn_implementation=model.config._attn_implementation)
        objective = DraftObjective(draft.train(), model, data, config, CPU)
    with torch.no_grad():
        return float(objective(0).loss)


@pytest.mark.parametrize("method", ["eagle", "medusa", "draft_target"])
def test_fine_tuning_starts_from_the_saved_draft_not_a_fresh_one(setup, prompt_files, tmp_path, method):
    model, tokenizer, data, _ = setup
    config = small_config(prompt_files, steps=20, batch_tokens=128, num_layers=1, learning_rate=1e-2, checkpoint_every=20)
    _train(method, model, tokenizer, data, config, tmp_path / "trained", tmp_path / "ckpt-a")
    tuned = config.model_copy(update={"steps": 2, "checkpoint_every": 2})

    def first_loss(ckpt_dir):
        losses = []
        _train(method, model, tokenizer, data, tuned, tmp_path / f"out-{ckpt_dir.name}", ckpt_dir,
               on_step=lambda step, out: losses.append(float(out.loss.detach())))
        return losses[0]

    init = tmp_path / "ckpt-init"
    init.mkdir()
    tensors = {}
    for f in (tmp_path / "trained").glob("*.safetensors"):
        tensors |= load_file(str(f))
    save_file(tensors, str(init / INIT_WEIGHTS))
    from_saved, fresh = first_loss(init), first_loss(tmp_path / "ckpt-fresh")
    expected = _loaded_loss(method, model, data, tuned, tmp_path / "trained")
    assert from_saved == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert abs(fresh - expected) > 100 * max(1e-6, abs(from_saved - expected)), (fresh, expected)


def test_initial_weights_that_do_not_fit_are_refused_by_name():
    params = {"heads.0.0.linear.weight": torch.nn.Parameter(torch.zeros(4, 4)), "fc.weight": torch.nn.Parameter(torch.zeros(2, 8))}
    load_initial_weights(params, {"0.0.linear.weight": torch.ones(4, 4), "fc.weight": torch.ones(2, 8)}, "w")
    assert bool((params["heads.0.0.linear.weight"] == 1).all())  # Medusa's on-disk names end the parameter's
    with pytest.raises(ValueError, match=r"fc\.weight: saved \[2, 4\], the model has \[2, 8\].*without --from-log"):
        load_initial_weights(params, {"0.0.linear.weight": torch.ones(4, 4), "fc.weight": torch.ones(2, 4)}, "w")
    with pytest.raises(ValueError, match=r"fc\.weight: no tensor"):
        load_initial_weights(params, {"0.0.linear.weight": torch.ones(4, 4)}, "w")


def test_default_fine_tuning_settings():
    config = fine_tune_config(TrainConfig(steps=3000, learning_rate=3e-4, warmup_steps=20, texts="python-stdlib"), "/log.jsonl")
    assert (config.steps, config.warmup_steps, config.texts, config.prompts) == (600, 20, None, "/log.jsonl")
    assert config.learning_rate == pytest.approx(1e-4)
    assert fine_tune_config(TrainConfig(steps=100), "/l").steps == 50
    assert fine_tune_config(TrainConfig(steps=100), "/l", steps=7).warmup_steps == 0


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_from_log_replaces_the_draft_keeps_the_old_one_and_the_recipe_keeps_serving_it(tiny_checkpoint, prompt_files, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBUILD_CACHE", str(tmp_path / "cache"))
    checkpoint = tmp_path / "chat-ckpt"  # an instruct target: served chat prompts are logged inside its template
    shutil.copytree(tiny_checkpoint, checkpoint)
    tokenizer_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(tokenizer_config | {"chat_template": CHAT_TEMPLATE}))
    # held out: the plain prompts, and the first once more as a chat log line (messages): rendered, it is held out too
    held_out = [json.loads(line)["prompt"] for line in prompt_files[1].read_text().splitlines()]
    chat_held = tmp_path / "held_out_chat.jsonl"
    chat_held.write_text(json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": held_out[0]}]})
                         + "\n" + prompt_files[1].read_text())
    recipe = write_train_recipe(tmp_path / "r.yaml", checkpoint, prompt_files, held_out=str(chat_held))
    quiet_log = {"log": lambda m: None, "show_progress": False}
    with pytest.raises(RecipeError, match=r"holds no trained weights.*train it first: specbuild train-draft"):
        fine_tune_from_log(load_recipe(str(recipe)), tmp_path / "none.jsonl", **quiet_log)
    first = train_draft(load_recipe(str(recipe)), **quiet_log)
    head = tmp_path / "heads" / "eagle"
    before = (head / "model.safetensors").read_bytes()

    log = RequestLog(tmp_path / "requests.jsonl")
    # a repeat, a held-out prompt as written, another as a chat request renders it (bench/verify of a chat set)
    log.write(["The weather in Oslo", "A recipe for bread", "The weather in Oslo", held_out[0],
               f"<|user|>{held_out[1]}<|assistant|>", f"<|system|>Be brief.<|user|>{held_out[0]}<|assistant|>"])
    log.close()
    outcome = fine_tune_from_log(load_recipe(str(recipe)), tmp_path / "requests.jsonl", steps=3, **quiet_log)

    assert (outcome.prompts_used, outcome.dropped_duplicates, outcome.dropped_held_out) == (2, 1, 3)
    assert outcome.backup == head.with_name("eagle.previous").resolve()
    assert (outcome.backup / "model.safetensors").read_bytes() == before  # the old draft, whole
    assert (head / "model.safetensors").read_bytes() != before
    card = json.loads((head / "model_card.json").read_text())
    assert card["fine_tuned"]["prompts"] == 2 and card["training"]["steps"] == 3
    assert card["held_out_acceptance"]["identical_to_plain"] is True
    assert card["fingerprint"] == first.fingerprint  # `specbuild recipe` serves it: no retraining from scratch
    again = train_draft(load_recipe(str(recipe)), **quiet_log)
    assert again.reused and (head / "model.safetensors").read_bytes() != before
    status = training_status(load_recipe(str(recipe)))  # plan says what it serves
    assert f"fine-tuned on the request log {tmp_path / 'requests.jsonl'}" in status and "reused" in status


def test_from_log_keeps_the_token_map_and_adds_the_traffics_tokens(tiny_checkpoint, prompt_files, tmp_path, monkeypatch):
    """A draft with a hot-token map inside its folder: the fine-tuned draft serves with a map (the old
    map's tokens first, then what the logged traffic needs), so the recipe is not sent back to training
    for a missing map, and the new traffic's tokens can be drafted."""
    from specbuild.methods.token_map import read_token_ids

    monkeypatch.setenv("SPECBUILD_CACHE", str(tmp_path / "cache"))
    recipe = write_train_recipe(tmp_path / "r.yaml", tiny_checkpoint, prompt_files, token_map_size=16)
    quiet_log = {"log": lambda m: None, "show_progress": False}
    first = train_draft(load_recipe(str(recipe)), **quiet_log)
    token_map = tmp_path / "heads" / "eagle" / "token_map.json"
    before = read_token_ids(token_map)
    assert 0 < len(before) <= 16
    log = RequestLog(tmp_path / "requests.jsonl")
    log.write(["zq zq zq xv xv", "Completely different words: jumbled quartz vexing fog"])
    log.close()
    fine_tune_from_log(load_recipe(str(recipe)), tmp_path / "requests.jsonl", steps=2, **quiet_log)

    after = read_token_ids(token_map)
    assert len(after) <= 16 and len(set(after)) == len(after)
    added = after[len(after) - len(set(after) - set(before)):]
    assert set(added) and not set(added) & set(before)  # the traffic's tokens, after the kept ones
    assert after[: len(after) - len(added)] == before[: len(after) - len(added)]  # the old map's head, in order
    assert len(after) - len(added) >= 8  # the traffic takes at most half of a full map
    assert json.loads(token_map.read_text())["token_map_size"] == 16
    again = train_draft(load_recipe(str(recipe)), **quiet_log)
    assert again.reused and again.fingerprint == first.fingerprint  # served as it is, no retraining


def test_cli_from_log_option_errors():
    from click.testing import CliRunner

    from specbuild.cli import main

    result = CliRunner().invoke(main, ["train-draft", "smollm2-eagle", "--steps", "10"])
    assert result.exit_code != 0 and "--steps goes with --from-log" in result.output
    result = CliRunner().invoke(main, ["train-draft", "smollm2-eagle", "--from-log", "missing.jsonl"])
    assert result.exit_code != 0 and "--from-log: no such file missing.jsonl" in result.output
    result = CliRunner().invoke(main, ["train-draft", "smollm2-eagle", "--from-log", "x.jsonl", "--force"])
    assert result.exit_code != 0 and "give one of them" in result.output
