"""The bundled training mix (``train.prompts: mixed``): six categories, reproducible from its script,
and disjoint from every evaluation set by exact and near-duplicate text."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from specbuild.prompts import BUNDLED_DIR, MIXED_CATEGORIES, PromptSourceError, evaluation_prompts, load_prompts, near_duplicates

ROOT = Path(__file__).resolve().parents[1]


def evaluation_sets() -> list[tuple[str, str]]:
    return [(p.id, p.text) for p in evaluation_prompts()]


@pytest.fixture(scope="module")
def mix():
    return load_prompts("mixed")


def test_the_mix_is_disjoint_from_every_evaluation_set(mix):
    evaluation = evaluation_sets()
    assert len(evaluation) == 40 + 80 + 25 + 480
    assert near_duplicates([(p.id, p.text) for p in mix], evaluation) == []


def test_the_near_duplicate_check_catches_lightly_edited_evaluation_prompts():
    evaluation = evaluation_sets()
    picks = [evaluation[0], evaluation[45], evaluation[130], evaluation[400]]  # HumanEval, chat, summarize, Spec-Bench
    edited = []
    for eid, text in picks:
        words = text.split()
        words[len(words) // 2] = "banana"  # one word changed
        edited.append((f"edited {eid}", "Please help. " + " ".join(words).upper()))
    found = {(t, e) for t, e, _ in near_duplicates(edited, evaluation)}
    assert {(f"edited {eid}", eid) for eid, _ in picks} <= found


def test_six_categories_interleaved_with_a_hundred_distinct_prompts_each(mix):
    assert len(mix) == 600 and len({p.text for p in mix}) == 600
    assert [p.id.split("/")[1] for p in mix[:12]] == list(MIXED_CATEGORIES) * 2
    for category in MIXED_CATEGORIES:
        assert len(load_prompts(f"mixed:{category}")) == 100
    assert [p.id for p in load_prompts("mixed:math:3")] == ["mixed/math/0", "mixed/math/1", "mixed/math/2"]
    with pytest.raises(PromptSourceError, match="unknown category 'poetry'"):
        load_prompts("mixed:poetry")


def test_the_bundled_file_is_what_its_script_writes_and_stays_small():
    spec = importlib.util.spec_from_file_location("make_train_mix", ROOT / "benchmarks" / "make_train_mix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.CATEGORIES == MIXED_CATEGORIES
    bundled = BUNDLED_DIR / "train_mix.jsonl"
    assert [json.loads(line) for line in bundled.read_text(encoding="utf-8").splitlines()] == module.make_mix(0, 100)
    assert bundled.stat().st_size < 2_000_000
    assert "train_mix.jsonl" in (BUNDLED_DIR / "SOURCES.md").read_text()
