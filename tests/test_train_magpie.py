"""``train.prompts: magpie:N``: user messages the target writes itself from its chat template's user turn
(Magpie), filtered, cached, and trained on like any other prompt; and appending a source to a recipe's
prompts costs only the new prompts' responses."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_train import prompt_files, write_train_recipe  # noqa: F401 - fixture
from transformers import AutoTokenizer

from specbuild.builder.recipe import RecipeError, load_recipe
from specbuild.builder.train_stage import train_draft
from specbuild.prompts import evaluation_prompts
from specbuild.train.config import TrainConfig
from specbuild.train.data import generate_responses
from specbuild.train.magpie import MagpieError, generate_magpie, usable_messages, user_turn_template

# ChatML with a special end-of-turn token, as SmolLM2's and Qwen's templates
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def chat_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny target as an instruct model: a ChatML template whose ``<|im_end|>`` is a special token."""
    checkpoint = tmp_path_factory.mktemp("chat") / "ckpt"
    shutil.copytree(tiny_checkpoint, checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    assert len(tokenizer) <= 384  # the tiny model's embedding rows cover the two new ids
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(checkpoint))
    return checkpoint


@pytest.fixture(scope="module")
def chat_tokenizer(chat_checkpoint):
    return AutoTokenizer.from_pretrained(str(chat_checkpoint))


def test_the_prefix_opens_a_user_turn_and_the_stop_is_the_token_that_ends_it(chat_tokenizer):
    prefix, stop = user_turn_template(chat_tokenizer)
    assert chat_tokenizer.decode(prefix) == "<|im_start|>user\n"
    assert stop == chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    base = AutoTokenizer.from_pretrained(chat_tokenizer.name_or_path)
    base.chat_template = None
    with pytest.raises(MagpieError, match=r"needs an instruct target with a chat template.*\.jsonl"):
        user_turn_template(base)


def test_only_ended_distinct_clean_messages_clear_of_every_evaluation_set_are_kept(chat_tokenizer):
    _, stop = user_turn_template(chat_tokenizer)
    start = chat_tokenizer.convert_tokens_to_ids("<|im_start|>")
    encode = lambda text: chat_tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    evaluation = evaluation_prompts()
    mt_bench = next(p.text for p in evaluation if p.id.startswith("specbench/writing/"))
    good = "Can you suggest a weekend trip near the mountains for a family with two children?"
    rows = [
        encode(good) + [stop],
        encode(good.upper()) + [stop],  # the same message again, case aside
        encode("Plan a picnic for my friends and me") ,  # never ended its turn
        encode("Hi") + [stop],  # too short
        encode("What is the best") + [start] + encode("way to learn to cook rice") + [stop],  # a special token inside
        encode(mt_bench.replace("blog", "article", 1)) + [stop],  # an evaluation prompt, one word changed
        encode("Write a short poem about autumn leaves falling in a quiet park") + [stop],
    ]
    kept = usable_messages(rows, chat_tokenizer, stop, evaluation, set())
    assert kept == [good, "Write a short poem about autumn leaves falling in a quiet park"]


def test_the_target_writes_user_messages_deterministically_per_seed(chat_checkpoint, chat_tokenizer):
    from specbuild.engine.target import load_target

    model = load_target(chat_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    config = TrainConfig(generation_batch_size=32, seed=0)
    first = generate_magpie(model, chat_tokenizer, 6, config, log=lambda m: None)
    assert 1 <= len(first) <= 6 and [p.id for p in first] == [f"magpie/{k}" for k in range(len(first))]
    assert all(p.messages == (("user", p.text),) and p.text for p in first)
    assert len({p.text for p in first}) == len(first)
    assert [p.text for p in generate_magpie(model, chat_tokenizer, 6, config, log=lambda m: None)] == [p.text for p in first]
    other = generate_magpie(model, chat_tokenizer, 6, config.model_copy(update={"seed": 1}), log=lambda m: None)
    assert [p.text for p in other] != [p.text for p in first]


def test_magpie_names_are_checked_with_the_recipe():
    for bad in ("magpie", "magpie:0", "magpie:x", "magpie:20001"):
        with pytest.raises(ValueError, match=r"expected 'magpie:N' with N in 1\.\.20000"):
            TrainConfig(prompts=["mixed", bad])
        with pytest.raises(ValueError, match=r"expected 'magpie:N'"):
            TrainConfig(prompts=[{"source": bad, "weight": 2}])
    assert TrainConfig(prompts="magpie:400").prompt_sources[0].source == "magpie:400"


def _magpie_recipe(tmp_path, checkpoint, prompt_files):
    recipe = write_train_recipe(tmp_path / "r.yaml", checkpoint, prompt_files)
    text = recipe.read_text().replace(f"  prompts: {prompt_files[0]}\n",
                                      f"  prompts: [{prompt_files[0]}, 'magpie:4']\n  generation_batch_size: 16\n")
    recipe.write_text(text)
    return recipe


def test_a_recipe_trains_on_magpie_prompts_made_once_and_cached(chat_checkpoint, prompt_files, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBUILD_CACHE", str(tmp_path / "cache"))
    recipe = _magpie_recipe(tmp_path, chat_checkpoint, prompt_files)
    logs: list[str] = []
    first = train_draft(load_recipe(str(recipe)), log=logs.append, show_progress=False)
    assert any("magpie:4: the target writes 4 user messages" in m for m in logs)
    (cached,) = (tmp_path / "cache" / "train-data").glob("magpie-*.jsonl")
    written = [json.loads(line) for line in cached.read_text().splitlines()]
    assert 1 <= len(written) <= 4 and all(r["messages"][0]["role"] == "user" for r in written)
    (meta,) = (tmp_path / "cache" / "train-data").glob("*/meta.json")
    ids = json.loads(meta.read_text())["prompt_ids"]
    assert ids[-len(written):] == [r["id"] for r in written] and len(ids) == 4 + len(written)

    logs.clear()  # the draft and the prompts are cached: nothing is generated, the target is not even loaded
    again = train_draft(load_recipe(str(recipe)), log=logs.append, show_progress=False)
    assert again.reused and again.fingerprint == first.fingerprint
    assert not any("user messages" in m for m in logs)


def test_a_base_target_is_refused_before_any_work(tiny_checkpoint, prompt_files, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBUILD_CACHE", str(tmp_path / "cache"))
    recipe = _magpie_recipe(tmp_path, tiny_checkpoint, prompt_files)
    with pytest.raises(RecipeError, match=r"train\.prompts.*chat template"):
        train_draft(load_recipe(str(recipe)), log=lambda m: None, show_progress=False)
    assert not list((tmp_path / "cache").glob("train-data/*"))


def test_a_bad_other_source_is_reported_before_the_target_writes_anything(chat_checkpoint, prompt_files, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBUILD_CACHE", str(tmp_path / "cache"))
    recipe = _magpie_recipe(tmp_path, chat_checkpoint, prompt_files)
    recipe.write_text(recipe.read_text().replace("'magpie:4'", "'magpie:4', missing.jsonl"))
    with pytest.raises(RecipeError, match=r"train\.prompts.*no such file.*missing\.jsonl"):
        train_draft(load_recipe(str(recipe)), log=lambda m: None, show_progress=False)
    assert not list((tmp_path / "cache").glob("train-data/magpie-*"))


def test_appending_a_source_generates_only_the_new_prompts_responses(chat_checkpoint, tmp_path):
    from specbuild.engine.target import load_target

    model = load_target(chat_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    calls: list[int] = []
    generate = model.generate
    model.generate = lambda **kw: calls.append(kw["input_ids"].shape[0]) or generate(**kw)
    config = TrainConfig(max_new_tokens=6, generation_batch_size=4, samples_per_prompt=2)
    old = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    jobs = [p for p in old for _ in range(2)]
    sampled = [k % 2 == 1 for k in range(len(jobs))]
    partial = tmp_path / "responses.json"
    before = generate_responses(model, jobs, config, eos_id=None, partial=partial, log=lambda m: None, sampled=sampled)
    assert sum(calls) == 8
    calls.clear()
    more = jobs + [[20, 21], [20, 21]]
    after = generate_responses(model, more, config, eos_id=None, partial=partial, log=lambda m: None, sampled=sampled + [False, True])
    assert calls == [1, 1] and after[:8] == before  # one greedy and one sampled row: the new prompt's, nothing else
    assert torch.tensor(after[8]).shape == (6,)


@pytest.mark.parametrize("content", ['{"id": "magpie/0"}\n', "not json\n", '{"id": "m", "messages": []}\n', "null\n",
                                     '{"id": "m", "messages": [{"role": "user", "content": 5}]}\n',
                                     '{"id": "m", "messages": [{"role": "user", "content": "a\\ud800"}]}\n'])
def test_a_damaged_magpie_cache_is_refused_with_the_file_and_the_fix(tmp_path, content):
    """The cache is written atomically; a file damaged by hand is named, with what to do, not a KeyError."""
    from specbuild.train.magpie import load_magpie

    path = tmp_path / "magpie-x.jsonl"
    path.write_text(content)
    with pytest.raises(MagpieError, match=rf"{path}.*cannot be read .*delete the file and the next run writes them again"):
        load_magpie(path)
