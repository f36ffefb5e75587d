"""N-gram (prompt lookup) proposer and its TensorRT-LLM-style config."""

from __future__ import annotations

import pytest

from specbuild.engine.methods import NGramConfig, NGramProposer, find_ngram_draft, get_method


@pytest.mark.parametrize(
    ("context", "n", "k", "use_oldest", "expected"),
    [
        ([1, 2, 3, 4, 2, 3], 2, 3, True, [4, 2, 3]),  # the docstring example
        ([1, 2, 3, 4, 2, 3], 2, 1, True, [4]),
        ([1, 2, 3, 4, 2, 3], 2, 8, True, [4, 2, 3]),  # shorter than k near the end
        ([7, 1, 8, 1, 9, 1], 1, 2, True, [8, 1]),  # oldest of two matches
        ([7, 1, 8, 1, 9, 1], 1, 2, False, [9, 1]),  # latest of two matches
        ([5, 6, 1, 9, 6, 7, 5, 6, 7], 3, 2, True, [5, 6]),  # [5, 6, 7] has no earlier match; [6, 7] at i=4
        ([1, 2, 3], 3, 4, True, []),  # no earlier occurrence
        ([1, 2, 3, 1, 2], 2, 0, True, []),  # k=0
        ([4], 3, 2, True, []),  # single token
        ([5, 5, 5], 2, 3, True, [5]),  # overlapping match
    ],
)
def test_find_ngram_draft_examples(context, n, k, use_oldest, expected):
    assert find_ngram_draft(context, max_ngram_size=n, num_draft_tokens=k, use_oldest=use_oldest) == expected


def test_longer_ngram_wins_over_shorter():
    # suffix [2, 3]: the 2-gram matches at i=0 -> [9]; the 1-gram [3] would match later at i=3 -> [2].
    context = [2, 3, 9, 3, 2, 2, 3]
    assert find_ngram_draft(context, max_ngram_size=2, num_draft_tokens=1) == [9]
    assert find_ngram_draft(context, max_ngram_size=1, num_draft_tokens=1, use_oldest=False) == [2]


def test_proposer_caps_at_max_draft_len():
    proposer = NGramProposer(NGramConfig(max_draft_len=2, max_matching_ngram_size=2))
    assert proposer.propose([1, 2, 3, 4, 5, 1, 2], 10) == [3, 4]
    assert proposer.propose([1, 2, 3], 2) == []


def test_config_from_trtllm_dict():
    method = get_method({"decoding_type": "NGram"})
    config = method.parse_config(
        {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3, "is_use_oldest": False}
    )
    assert config == NGramConfig(max_draft_len=4, max_matching_ngram_size=3, is_use_oldest=False)
    assert isinstance(method.make_proposer(config), NGramProposer)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"decoding_type": "NGram", "max_draft_len": 4, "prompt_lookup": 2}, "unknown NGram"),
        ({"decoding_type": "NGram"}, "needs max_draft_len"),
        ({"decoding_type": "NGram", "max_draft_len": 0}, "max_draft_len must be >= 1"),
        ({"decoding_type": "NGram", "max_draft_len": 2, "max_matching_ngram_size": 0}, "max_matching_ngram_size"),
    ],
)
def test_config_errors(config, message):
    with pytest.raises(ValueError, match=message):
        NGramConfig.from_dict(config)


def test_unknown_decoding_type():
    with pytest.raises(ValueError, match="decoding_type 'Medusa2'.*NGram"):
        get_method({"decoding_type": "Medusa2"})
