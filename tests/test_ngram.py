"""N-gram (prompt lookup) proposer and its TensorRT-LLM-style config (validated by the recipe's model)."""

from __future__ import annotations

import pytest

from specbuild.methods import method_for
from specbuild.methods.ngram import find_ngram_draft
from specbuild.engine.validation import ResolvedRequest
from specbuild.methods.ngram.engine import NGramProposer
from specbuild.methods.ngram import NGramSpeculation


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
    proposer = NGramProposer(NGramSpeculation(method="ngram", max_draft_len=2, max_matching_ngram_size=2))
    assert proposer.propose([1, 2, 3, 4, 5, 1, 2], 10) == [3, 4]
    assert proposer.propose([1, 2, 3], 2) == []


def test_config_from_trtllm_dict():
    method = method_for({"decoding_type": "NGram"})
    config = method.parse_speculative_config(
        {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3, "is_use_oldest": False,
         "is_keep_all": True, "is_public_pool": False}  # TensorRT-LLM keys the engine takes and ignores
    )
    assert config == NGramSpeculation(method="ngram", max_draft_len=4, max_matching_ngram_size=3, is_use_oldest=False)
    request = ResolvedRequest(input_ids=[1, 2], max_tokens=4, end_id=-1, num_draft_tokens=3)
    drafter = method.engine_method().make_drafter(config, request)
    assert isinstance(drafter.proposer, NGramProposer) and drafter.k == 3


def test_omitted_keys_take_the_recipes_defaults():
    """One model for the recipe and the engine: the same defaults (max_draft_len 4, max_matching_ngram_size 3)."""
    assert method_for({"decoding_type": "NGram"}).parse_speculative_config({"decoding_type": "NGram"}) == NGramSpeculation(method="ngram")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"decoding_type": "NGram", "max_draft_len": 4, "prompt_lookup": 2}, r"unknown NGram speculative_config keys \['prompt_lookup'\]; allowed: \["),
        ({"decoding_type": "NGram", "max_draft_len": 0}, r"speculative_config.max_draft_len must be an integer >= 1, got 0"),
        ({"decoding_type": "NGram", "max_draft_len": 2, "max_matching_ngram_size": 0}, "max_matching_ngram_size must be an integer >= 1"),
        ({"decoding_type": "NGram", "max_draft_len": True}, "max_draft_len: expected a number, got the boolean true"),
    ],
)
def test_config_errors(config, message):
    with pytest.raises(ValueError, match=message):
        method_for(config).parse_speculative_config(config)


def test_unknown_decoding_type():
    with pytest.raises(ValueError, match="decoding_type 'Medusa2'.*NGram"):
        method_for({"decoding_type": "Medusa2"})
