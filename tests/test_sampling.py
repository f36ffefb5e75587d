"""Sampling: TensorRT-LLM's sampling parameters, seeded determinism, and the speculative-sampling rule.

The statistical tests use Pearson's chi-square goodness-of-fit test at significance level ALPHA = 1e-3
on seeded draws (so they are deterministic): a correct rule must fit the target distribution ``p``, and
two deliberately wrong rules must be rejected by the same test with the same number of draws.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from specbuild.engine import GenerationRequest, InvalidRequestError
from specbuild.runtime import EngineLimits, ReferenceEngine
from fault_injection import accept_always, no_residual
from specbuild.engine.acceptance import accept_speculative
from specbuild.engine.sampling import Sampler, sampling_probs
from specbuild.engine.types import SamplingParams
from tiny_models import make_tiny_llama

stats = pytest.importorskip("scipy.stats", reason="the chi-square tests need scipy (pip install scipy)")

ALPHA = 1e-3
NUM_DRAWS = 20_000
MAX_DRAFT_LEN = 4
LIMITS = EngineLimits(max_batch_size=1, max_input_len=64, max_seq_len=160, max_draft_len=MAX_DRAFT_LEN)
NGRAM = {"decoding_type": "NGram", "max_draft_len": MAX_DRAFT_LEN, "max_matching_ngram_size": 3}
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [17, 203, 44, 91, 300, 12]]

# Rows 0..2 of the target p and rows 0..1 of the draft q over a 5-token vocabulary: q favours tokens p
# gives little or no mass (token 4 has p = 0 at position 0), so rejections and residuals matter.
P = torch.tensor(
    [[0.40, 0.30, 0.20, 0.10, 0.00], [0.05, 0.15, 0.50, 0.10, 0.20], [0.25, 0.25, 0.20, 0.20, 0.10]]
)  # [k + 1, vocab], k = 2
Q = torch.tensor([[0.10, 0.10, 0.20, 0.30, 0.30], [0.40, 0.30, 0.10, 0.10, 0.10]])  # [k, vocab]


def fits(samples: list[int], probs: torch.Tensor, *, alpha: float = ALPHA) -> bool:
    """Chi-square goodness of fit of ``samples`` to ``probs`` ([vocab]); a sample where p = 0 fails outright."""
    counts = torch.bincount(torch.tensor(samples), minlength=len(probs)).double()
    support = probs > 0
    if counts[~support].sum() > 0:
        return False
    expected = probs[support].double() / probs[support].double().sum() * len(samples)
    return stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue >= alpha


def emitted_by_position(rule, *, deterministic: bool, num_draws: int = NUM_DRAWS) -> list[list[int]]:
    """Draw ``num_draws`` verification steps with ``rule``; tokens emitted at positions 0, 1, 2.

    A position is reached only when the drafts before it were accepted; given that, its token must
    be distributed as the matching row of P (the drafts are drawn independently of the acceptance tests).
    ``deterministic``: the draft is the fixed guess [0, 2] with ``draft_probs=None`` (n-gram's case).
    """
    sampler = Sampler(SamplingParams(temperature=1.0, seed=1234))
    draft_rng = torch.Generator().manual_seed(99)
    by_position: list[list[int]] = [[], [], []]
    for _ in range(num_draws):
        if deterministic:
            draft, probs = [0, 2], None
        else:
            draft, probs = torch.multinomial(Q, 1, generator=draft_rng)[:, 0].tolist(), Q
        for position, token in enumerate(rule(draft, probs, P, sampler=sampler).emitted_tokens):
            by_position[position].append(token)
    return by_position


# --- the rejection-sampling rule -----------------------------------------------------------------


@pytest.mark.parametrize("deterministic", [False, True], ids=["draft-q", "one-hot-q"])
def test_speculative_sampling_reproduces_the_target_distribution(deterministic):
    by_position = emitted_by_position(accept_speculative, deterministic=deterministic)
    assert len(by_position[0]) == NUM_DRAWS
    for position, tokens in enumerate(by_position):
        assert len(tokens) > 1000, f"position {position} reached only {len(tokens)} times"
        assert fits(tokens, P[position]), f"position {position} does not follow p"


@pytest.mark.parametrize("rule", [accept_always, no_residual])
@pytest.mark.parametrize("deterministic", [False, True], ids=["draft-q", "one-hot-q"])
def test_wrong_acceptance_rules_are_detected(rule, deterministic):
    first_tokens = emitted_by_position(rule, deterministic=deterministic)[0]
    assert not fits(first_tokens, P[0]), f"{rule.__name__} passed the chi-square test"


def test_same_q_as_p_accepts_everything():
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0))
    for _ in range(200):
        draft = torch.multinomial(P[:2], 1)[:, 0].tolist()
        assert accept_speculative(draft, P[:2], P, sampler=sampler).num_accepted == 2


def test_accept_speculative_checks_shapes():
    sampler = Sampler(SamplingParams(temperature=1.0))
    with pytest.raises(ValueError, match=r"need target_probs \[k \+ 1, vocab\]"):
        accept_speculative([1, 2], Q, P[:2], sampler=sampler)
    with pytest.raises(ValueError, match="draft_probs"):
        accept_speculative([1], Q, P[:2], sampler=sampler)


# --- the target distribution ---------------------------------------------------------------------


def test_sampling_probs_examples():
    logits = torch.tensor([[2.0, 1.0, 0.0, -9.0]])
    top_k = sampling_probs(logits, SamplingParams(temperature=1.0, top_k=2))[0]
    assert top_k.tolist() == pytest.approx([0.7311, 0.2689, 0, 0], abs=1e-4)
    assert sampling_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))[0].tolist() == [1, 0, 0, 0]
    nucleus = sampling_probs(torch.tensor([[0.5, 0.3, 0.2]]).log(), SamplingParams(temperature=1.0, top_p=0.6))
    assert nucleus[0].tolist() == pytest.approx([0.625, 0.375, 0.0])
    hot = sampling_probs(logits, SamplingParams(temperature=2.0))[0]
    assert hot.tolist() == pytest.approx(torch.softmax(logits[0] / 2, -1).tolist())
    assert sampling_probs(logits, SamplingParams(temperature=1.0, top_k=1))[0].tolist() == [1, 0, 0, 0]


# --- the engine ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> ReferenceEngine:
    checkpoint = make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), seed=0)
    return ReferenceEngine.from_pretrained(checkpoint, speculative_config=NGRAM, limits=LIMITS)


def _run(engine, prompt, max_tokens=16, **kwargs):
    return engine.generate(GenerationRequest(prompt, max_tokens, end_id=-1, **kwargs))


@pytest.mark.parametrize("num_draft_tokens", [0, 1, MAX_DRAFT_LEN])
def test_temperature_zero_and_top_k_one_are_greedy(engine, num_draft_tokens):
    for prompt in PROMPTS:
        greedy = _run(engine, prompt, num_draft_tokens=0).output_ids
        assert _run(engine, prompt, num_draft_tokens=num_draft_tokens, temperature=0.0, top_k=7, seed=5).output_ids == greedy
        assert _run(engine, prompt, num_draft_tokens=num_draft_tokens, temperature=0.8, top_k=1, seed=5).output_ids == greedy


@pytest.mark.parametrize("num_draft_tokens", [0, 1, MAX_DRAFT_LEN])
def test_same_seed_same_output(engine, num_draft_tokens):
    outputs = {
        seed: [_run(engine, PROMPTS[0], num_draft_tokens=num_draft_tokens, temperature=1.0, seed=seed).output_ids for _ in range(2)]
        for seed in (0, 1, 2**64 - 1)
    }
    for first, second in outputs.values():
        assert first == second
    assert len({tuple(first) for first, _ in outputs.values()}) == 3, "different seeds gave the same output"


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 8])
def test_max_tokens_never_exceeded_with_sampling(engine, max_tokens):
    for seed in range(4):
        result = _run(engine, PROMPTS[0], max_tokens, temperature=0.7, top_p=0.9, seed=seed)
        assert len(result.output_ids) == max_tokens
        assert result.finish_reason == "length"
        assert result.total_accepted_draft_tokens <= max_tokens - 1


def test_sampled_output_stops_at_end_token(engine):
    full = _run(engine, PROMPTS[0], temperature=1.0, seed=3).output_ids
    end_id = full[len(full) // 2]
    result = engine.generate(GenerationRequest(PROMPTS[0], 16, end_id=end_id, temperature=1.0, seed=3))
    assert result.output_ids == full[: full.index(end_id) + 1]
    assert result.finish_reason == "stop"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"temperature": -0.5}, r"temperature=-0.5 is out of range; allowed: >= 0"),
        ({"temperature": float("nan")}, "temperature=nan"),
        ({"temperature": 1.0, "top_k": -1}, r"top_k=-1 is out of range; allowed: >= 0"),
        ({"temperature": 1.0, "top_p": 0.0}, r"top_p=0.0 is out of range; allowed: \(0, 1\]"),
        ({"temperature": 1.0, "top_p": 1.5}, "top_p=1.5"),
        ({"temperature": 1.0, "seed": -1}, r"seed=-1 is out of range; allowed: \[0, 2\*\*64\)"),
        ({"temperature": 1.0, "seed": 2**64}, "seed=18446744073709551616"),
        ({"top_k": 2.5}, "top_k=2.5"),  # checked even for greedy requests
    ],
)
def test_invalid_sampling_fields(engine, fields, message):
    with pytest.raises(InvalidRequestError, match=message):
        engine.generate(GenerationRequest([1, 2, 3], 4, **fields))
