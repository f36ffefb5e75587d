"""Suffix-automaton (SA) speculation: the automaton against brute force, the proposer's state across
steps without drafting, the global pool, the settings TensorRT-LLM refuses, and greedy / sampled
equality with plain decoding alone and in batches on the tiny target."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from method_engines import NEW_TOKENS, PROMPTS, check_mixed_batch, check_sampled_batch, greedy, limits  # noqa: E402

from specbuild.builder.recipe import RecipeError, load_recipe, parse_recipe  # noqa: E402
from specbuild.runtime import ReferenceEngine  # noqa: E402
from specbuild.engine.drafters import ChainDrafter  # noqa: E402
from specbuild.methods import method_for  # noqa: E402
from specbuild.methods.ngram import find_ngram_draft  # noqa: E402
from specbuild.methods.sa.engine import Match, SAPool, SAProposer, SuffixAutomaton  # noqa: E402
from specbuild.engine.scheduler import Scheduler  # noqa: E402
from specbuild.engine.stream import collect  # noqa: E402
from specbuild.methods.sa import SASpeculation  # noqa: E402


def settings(**kwargs) -> SASpeculation:
    return SASpeculation(method="sa", **{"max_draft_len": 4, **kwargs})


def brute_match(text: list[int], query: list[int]) -> Match | None:
    """The longest suffix of ``query`` occurring in ``text`` with a token after it, at its earliest such
    occurrence (when ``query`` is ``text``'s own suffix, that suffix itself has no token after it)."""
    for size in range(len(query), 0, -1):
        suffix = query[-size:]
        for i in range(len(text) - size):  # i + size <= len(text) - 1: a token follows
            if text[i : i + size] == suffix:
                return Match(size, i + size)
    return None


@pytest.mark.parametrize(
    ("tokens", "max_len", "expected"),
    [
        ([1, 2, 3, 1, 2], -1, Match(2, 2)),  # [1, 2] ended first at 1: draft [3, 1, 2]
        ([7, 1, 8, 1, 9, 1], -1, Match(1, 2)),  # the oldest of two occurrences
        ([5, 5, 5], -1, Match(2, 2)),  # overlapping
        ([5, 5, 5, 5], 1, Match(1, 1)),  # capped at one token
        ([1, 2, 3], -1, None),  # nothing repeats
        ([4], -1, None),
        ([], -1, None),
        ([9, 1, 2, 3, 8, 2, 3, 7, 1, 2, 3], -1, Match(3, 4)),  # [1, 2, 3] beats the later, shorter [2, 3]
        ([9, 1, 2, 3, 8, 2, 3, 7, 1, 2, 3], 2, Match(2, 4)),  # [2, 3] first ended at 3
    ],
)
def test_longest_match_examples(tokens, max_len, expected):
    assert SuffixAutomaton(tokens).longest_match(max_len) == expected


def test_the_automaton_agrees_with_brute_force_on_random_strings_as_it_grows():
    rng = random.Random(0)
    for alphabet in (2, 3, 5):
        text: list[int] = []
        automaton = SuffixAutomaton()
        for _ in range(120):
            token = rng.randrange(alphabet)
            text.append(token)
            automaton.extend(token)
            for cap in (-1, 1, 3):
                query = text if cap == -1 else text[-cap:]
                assert automaton.longest_match(cap) == brute_match(text, query), (text, cap)
        assert len(automaton.length) <= 2 * len(text) - 1


def test_fixed_size_drafts_are_prompt_lookups_of_the_oldest_match():
    rng = random.Random(1)
    for _ in range(200):
        text = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        for n in (1, 2, 3, 5):
            proposer = SAProposer(SAPool(settings(max_matching_ngram_size=n, max_draft_len=6)))
            assert proposer.propose(text, 6) == find_ngram_draft(text, max_ngram_size=n, num_draft_tokens=6, use_oldest=True)


def test_query_matching_agrees_with_brute_force():
    rng = random.Random(2)
    for _ in range(300):
        text = [rng.randrange(3) for _ in range(rng.randrange(0, 30))]
        query = [rng.randrange(3) for _ in range(rng.randrange(1, 12))]
        assert SuffixAutomaton(text).match_query(query) == brute_match(text, query), (text, query)


def test_drafts_follow_the_longest_match_and_the_request_cap():
    proposer = SAProposer(SAPool(settings(max_draft_len=4)))
    context = [9, 1, 2, 3, 4, 5, 6, 8, 2, 3, 7, 1, 2, 3]
    assert proposer.propose(context, 10) == [4, 5, 6, 8]  # [1, 2, 3] first ended at 3; capped at max_draft_len
    assert proposer.propose(context, 2) == [4, 5]  # the request's num_draft_tokens
    assert proposer.propose(context, 0) == []
    assert proposer.propose([*context, 11], 4) == []  # nothing ending in 11 occurred before


def test_steps_without_drafting_still_reach_the_automaton():
    contexts = [list(range(10)) + [0, 1, 2, 3][:i] for i in range(5)]
    every_step = SAProposer(SAPool(settings()))
    skipping = SAProposer(SAPool(settings()))
    for context in contexts:
        expected = every_step.propose(context, 4)
        every_step.update(context, 0)
    drafter = ChainDrafter(skipping, 4)
    skipping.propose(contexts[0], 4)
    for context in contexts[1:-1]:  # k = 0 this iteration: no propose; the step's update may or may not come
        assert drafter.draft(context, max_accept=0, sampler=None).tokens == [context[-1]]
    assert skipping.propose(contexts[-1], 4) == expected == [4, 5, 6, 7]
    assert len(skipping.automaton) == len(contexts[-1])
    with pytest.raises(ValueError, match="context shrank"):
        skipping.propose(contexts[0], 4)


def test_the_global_pool_drafts_from_other_requests_and_keeps_finished_ones():
    pool = SAPool(settings(enable_global_pool=True, global_pool_size=2), max_batch_size=2)
    first, second = SAProposer(pool), SAProposer(pool)
    assert first.propose([1, 2, 3, 4, 5, 6], 4) == []  # nothing else in the pool yet
    assert second.propose([7, 3, 4], 4) == [5, 6]  # [3, 4] from the first request
    assert SAProposer(SAPool(settings())).propose([7, 3, 4], 4) == []  # alone it has no match
    del first  # finished: still searchable
    assert second.propose([7, 3, 4, 9, 5], 4) == [6]
    third = SAProposer(pool)
    assert [id_ for id_, _ in pool.entries()] == [1, 2]  # past global_pool_size the oldest finished left
    assert third.propose([8, 3, 4], 4) == [9, 5]  # the first request's [3, 4] -> [5, 6] (older, as long) is gone


def test_the_global_pool_prefers_the_requests_own_match_on_a_tie():
    pool = SAPool(settings(enable_global_pool=True))
    other, own = SAProposer(pool), SAProposer(pool)
    other.propose([3, 4, 8, 8, 8], 4)
    assert own.propose([3, 4, 9, 3, 4], 4) == [9, 3, 4]  # own [3, 4] -> 9 beats the other's [3, 4] -> 8


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"max_matching_ngram_size": 0}, r"max_matching_ngram_size must be > 0 \(fixed n-gram\) or -1 \(longest match\); got 0"),
        ({"max_matching_ngram_size": -2}, r"max_matching_ngram_size must be an integer >= -1, got -2"),
        ({"max_matching_ngram_size": 65, "enable_global_pool": True}, r"must be -1 \(longest match\) or in \[1, 64\] when enable_global_pool"),
        ({"global_pool_size": 8}, r"global_pool_size requires enable_global_pool: true"),
        ({"max_draft_len": 0}, r"max_draft_len must be an integer >= 1, got 0"),
        ({"threshold": 4}, r"unknown SA speculative_config keys \['threshold'\]"),
    ],
)
def test_bad_settings_are_refused_by_name(config, message):
    with pytest.raises(ValueError, match=message):
        method_for({"decoding_type": "SA"}).parse_speculative_config({"decoding_type": "SA", "max_draft_len": 4, **config})


def test_a_pool_smaller_than_the_batch_is_refused_at_load(model):
    config = {"decoding_type": "SA", "max_draft_len": 4, "enable_global_pool": True, "global_pool_size": 2}
    with pytest.raises(ValueError, match=r"global_pool_size=2 is below the build's max_batch_size=4"):
        ReferenceEngine(model, limits=limits("sa"), end_id=-1, speculative_config=config)


def test_the_recipe_validates_and_plans_for_the_pytorch_path_from_1_3(tmp_path):
    from specbuild.builder.trtllm_plan import plan_pytorch

    loaded = load_recipe("smollm2-sa")
    assert loaded.recipe.speculation.to_llm_api() == {"decoding_type": "SA", "max_draft_len": 4, "max_matching_ngram_size": -1, "enable_global_pool": False}
    plan = plan_pytorch(loaded, tmp_path, version="1.3.0", source="build.trtllm_version")
    assert "decoding_type: SA" in plan.files[0].text
    with pytest.raises(RecipeError, match=r"method 'sa' \(LLM API decoding_type SA\) needs TensorRT-LLM >= 1.3; .*1.2.1"):
        plan_pytorch(loaded, tmp_path, version="1.2.1", source="build.trtllm_version")
    text = loaded.path.read_text()
    small_pool = parse_recipe(text.replace("enable_global_pool: false", "enable_global_pool: true\n  global_pool_size: 8"), Path("x.yaml"))
    with pytest.raises(RecipeError, match=r"x.yaml:14: speculation.global_pool_size: global_pool_size 8 is below build.max_batch_size 16"):
        plan_pytorch(small_pool, tmp_path, version="1.3.0", source="build.trtllm_version")
    with pytest.raises(RecipeError, match=r"x.yaml:12: speculation.max_matching_ngram_size: max_matching_ngram_size must be > 0"):
        parse_recipe(text.replace("max_matching_ngram_size: -1", "max_matching_ngram_size: 0"), Path("x.yaml"))


@pytest.fixture(scope="module")
def engines(model):
    configs = {
        "plain": None,
        "sa": {"decoding_type": "SA", "max_draft_len": 4},
        "sa_ngram": {"decoding_type": "SA", "max_draft_len": 4, "max_matching_ngram_size": 2},
        "sa_global": {"decoding_type": "SA", "max_draft_len": 4, "enable_global_pool": True},
    }
    return {name: ReferenceEngine(model, limits=limits("sa"), end_id=-1, speculative_config=c) for name, c in configs.items()}


@pytest.fixture(scope="module")
def plain(engines) -> dict[tuple[int, ...], list[int]]:
    return {tuple(p): engines["plain"].generate(greedy(p, num_draft_tokens=0)).output_ids for p in PROMPTS}


@pytest.mark.parametrize("name", ["sa", "sa_ngram"])
def test_greedy_output_equals_plain_alone_and_in_a_mixed_batch(engines, plain, name):
    alone = [engines[name].generate(greedy(p)) for p in PROMPTS]
    assert [r.output_ids for r in alone] == [plain[tuple(p)] for p in PROMPTS]
    assert sum(r.total_accepted_draft_tokens for r in alone) > 0
    check_mixed_batch(engines[name], plain, "sa", name)


def test_sampled_requests_give_the_same_tokens_alone_and_in_a_batch(engines):
    check_sampled_batch(engines["sa"])


def test_the_global_pool_keeps_outputs_equal_to_plain_in_a_batch(engines, plain):
    engine = engines["sa_global"]
    first = engine.generate(greedy(PROMPTS[0]))
    again = engine.generate(greedy(PROMPTS[0]))  # drafts from the first run's automaton, kept in the pool
    assert first.output_ids == again.output_ids == plain[tuple(PROMPTS[0])]
    assert again.total_accepted_draft_tokens == again.total_draft_tokens == 4 * again.num_decoding_iterations
    with Scheduler(engine, max_batch_size=4) as scheduler:
        results = [collect(s) for s in [scheduler.stream(greedy(p, num_draft_tokens=k)) for p, k in zip(PROMPTS * 2, [4, 0, 2, 4, 1, 4, 3, 4])]]
    assert [r.output_ids for r in results] == [plain[tuple(p)] for p in PROMPTS * 2]


def test_replaying_a_plain_output_gives_the_engines_own_counters(engines, plain):
    """benchmarks/replay_acceptance.py measures model-free methods from one plain run per prompt."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from replay_acceptance import Replay, replay

    for name, config in (("sa", settings()), ("sa_ngram", settings(max_matching_ngram_size=2))):
        for prompt in PROMPTS:
            ran = engines[name].generate(greedy(prompt))
            replayed = replay(SAProposer(SAPool(config)), prompt, plain[tuple(prompt)], k=4, max_tokens=NEW_TOKENS)
            assert replayed == Replay(ran.num_decoding_iterations, ran.total_draft_tokens, ran.total_accepted_draft_tokens)
