"""The bundled training mix (``train.prompts: mixed``): six categories, reproducible from its script,
and disjoint from every evaluation set by exact and near-duplicate text."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from specbuild.prompts import BUNDLED_DIR, MIXED_CATEGORIES, SPECBENCH_TASKS, PromptSourceError, load_prompts

ROOT = Path(__file__).resolve().parents[1]
SHINGLE = 3  # words per shingle (short questions need short shingles)
NEAR = 0.5  # more than this share of the shorter text's shingles found in the other: a near duplicate


def normalized(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def shingles(text: str) -> set[tuple[str, ...]]:
    words = normalized(text)
    return {tuple(words[i : i + SHINGLE]) for i in range(max(1, len(words) - SHINGLE + 1))}


def near_duplicates(train: list[tuple[str, str]], evaluation: list[tuple[str, str]]) -> list[tuple[str, str, float]]:
    """``(train id, eval id, overlap)`` for each pair whose normalised texts are equal or share more than
    ``NEAR`` of the shorter one's word 3-grams (an inverted index keeps this linear in practice). A shared
    question frame alone ("what is the difference between A and B?" against C and D) is half: not flagged."""
    index: dict[tuple[str, ...], set[int]] = {}
    evaluated = [(eid, shingles(text), " ".join(normalized(text))) for eid, text in evaluation]
    for k, (_, sh, _) in enumerate(evaluated):
        for s in sh:
            index.setdefault(s, set()).add(k)
    found = []
    for tid, text in train:
        sh, flat = shingles(text), " ".join(normalized(text))
        counts: dict[int, int] = {}
        for s in sh:
            for k in index.get(s, ()):
                counts[k] = counts.get(k, 0) + 1
        for k, shared in counts.items():
            eid, esh, eflat = evaluated[k]
            overlap = shared / min(len(sh), len(esh))
            if flat == eflat or overlap > NEAR:
                found.append((tid, eid, round(overlap, 3)))
    return found


def evaluation_sets() -> list[tuple[str, str]]:
    prompts = load_prompts("humaneval:40") + load_prompts("chat") + load_prompts("summarize")
    prompts += [p for task in SPECBENCH_TASKS for p in load_prompts(f"specbench:{task}")]
    return [(p.id, p.text) for p in prompts]


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
