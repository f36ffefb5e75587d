"""EAGLE-3 under sampling: a sampled request's tokens keep the target's distribution, with the head's argmax
drafts (one-hot q: TensorRT-LLM's exact-match verification) and with drafts drawn from the head's q
(``use_rejection_sampling``: accepted with probability min(1, p/q)); for full and reduced draft
vocabularies, chains and a dynamic-tree engine (whose sampled requests draft its head's chain).

The rule itself is tested against exact distributions in tests/test_sampling.py. Here: the q handed to it
is the distribution each draft was drawn from (mapped through d2t), and the engine's outputs pass a
two-sample chi-square test (client/sampling.py ``homogeneity_test``) against plain sampling per output
position, seeded so they are deterministic; a deliberately wrong rule is rejected by the same test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from eagle3_tiny import CONFIG, DRAFT_CONFIG, checkpoint, make_head, model  # noqa: E402, F401
from fault_injection import accept_always  # noqa: E402

from specbuild.engine import GenerationRequest  # noqa: E402
from specbuild.engine.sampling import Sampler, sampling_probs  # noqa: E402
from specbuild.engine.types import SamplingParams  # noqa: E402
from specbuild.methods.eagle3.engine import Eagle3Proposer, load_eagle3_head, propose_batch, save_eagle3_head  # noqa: E402
from specbuild.runtime import EngineLimits, ReferenceEngine  # noqa: E402

pytest.importorskip("scipy.stats", reason="the sampling tests need scipy")
from specbuild.client.sampling import homogeneity_test  # noqa: E402

MAX_DRAFT_LEN = 3
LIMITS = EngineLimits(max_batch_size=1, max_input_len=64, max_seq_len=96, max_draft_len=6)  # a dynamic tree: 6 nodes
PROMPT = [17, 203, 44, 91, 300, 12]
POSITIONS, SAMPLES, ALPHA = 3, 300, 1e-3
SAMPLING = {"temperature": 1.0}  # the random head's q overlaps p by ~60 %: rejection sampling accepts drafts


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eagle3_sampling")
    return {"full": save_eagle3_head(root / "full", make_head("random").state_dict(), CONFIG),
            "draft_vocab": save_eagle3_head(root / "dv", make_head("draft_vocab").state_dict(), DRAFT_CONFIG)}


def _engine(model, head: Path, **extra) -> ReferenceEngine:
    config = {"decoding_type": "Eagle3", "max_draft_len": MAX_DRAFT_LEN, "speculative_model_dir": str(head), **extra}
    return ReferenceEngine(model, limits=LIMITS, end_id=-1, speculative_config=config)


@pytest.mark.parametrize("kind", ["full", "draft_vocab"])
def test_each_draft_comes_with_the_distribution_it_was_drawn_from(model, heads, kind):
    """q (over the target vocabulary) is the head's sampling distribution under the request's parameters,
    scattered through d2t; it sums to 1, is 0 outside the draft vocabulary, and holds the drawn token."""
    head = load_eagle3_head(heads[kind], dtype=torch.float32)
    proposer = Eagle3Proposer(model, head, max_draft_len=MAX_DRAFT_LEN)
    state = proposer.new_state()
    hidden = model(torch.tensor([PROMPT]), output_hidden_states=True).hidden_states
    proposer.update(state, [*PROMPT[1:], 7], proposer.capture(hidden))
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=3)
    probs: list[list[torch.Tensor]] = [[]]
    (chain,) = propose_batch(proposer, [state], [MAX_DRAFT_LEN], [Sampler(params)], probs)
    assert len(chain) == len(probs[0]) == MAX_DRAFT_LEN
    d2t = getattr(head, "d2t", None)
    allowed = torch.zeros(CONFIG.vocab_size, dtype=torch.bool)
    allowed[torch.arange(len(d2t)) + d2t if d2t is not None else slice(None)] = True
    for token, q in zip(chain, probs[0]):
        assert torch.isclose(q.sum(), torch.tensor(1.0)) and q[token] > 0 and not q[~allowed].any()
        assert (q > 0).sum() <= 20  # top_k applied to the head's distribution, as to the target's
    first = sampling_probs(proposer._project(head.norm(state.last_output[None])).float(), params)[0]  # [Vd]
    assert torch.allclose(probs[0][0][allowed], first)  # depth 1: exactly the head's q, through d2t


def _samples(engine: ReferenceEngine, **request) -> tuple[list[list[int]], int, int]:
    """``SAMPLES`` seeded outputs of ``POSITIONS`` tokens, and the draft tokens drafted and accepted over all."""
    outputs, drafted, accepted = [], 0, 0
    for seed in range(SAMPLES):
        out = engine.generate(GenerationRequest(PROMPT, POSITIONS, end_id=-1, seed=seed, **SAMPLING, **request))
        outputs.append(out.output_ids)
        drafted += out.total_draft_tokens
        accepted += out.total_accepted_draft_tokens
    return outputs, drafted, accepted


def _same_distribution(plain, speculative) -> bool:
    """Each output position's token fits the plain arm's distribution there (a correct rule keeps the
    whole joint distribution, so every marginal)."""
    return all(homogeneity_test([o[i] for o in plain], [o[i] for o in speculative], alpha=ALPHA).p_value >= ALPHA
               for i in range(POSITIONS))


@pytest.fixture(scope="module")
def plain(model, heads) -> list[list[int]]:
    return _samples(_engine(model, heads["full"]), num_draft_tokens=0)[0]


@pytest.mark.slow
@pytest.mark.parametrize(("head", "extra"), [
    ("full", {}),
    ("full", {"use_rejection_sampling": True}),
    ("draft_vocab", {"use_rejection_sampling": True}),
    ("full", {"use_dynamic_tree": True, "dynamic_tree_max_topK": 2, "max_total_draft_tokens": 6, "use_rejection_sampling": True}),
], ids=["argmax-drafts", "rejection-sampling", "draft-vocab", "tree-engine"])
def test_sampled_eagle3_keeps_the_target_distribution(model, heads, plain, head, extra):
    engine = _engine(model, heads[head], **extra)
    speculative, drafted, accepted = _samples(engine)
    assert drafted > 0  # every step verified drafts (a random head's argmax is mostly rejected: the residual path)
    if extra.get("use_rejection_sampling"):  # drafts drawn from q overlap p: accepted too
        assert accepted > 0
    assert _same_distribution(plain, speculative)
    assert _samples(engine)[0] == speculative  # seeded: the same seed gives the same tokens


@pytest.mark.slow
def test_a_wrong_acceptance_rule_is_caught_by_the_same_test(model, heads, plain, monkeypatch):
    import specbuild.engine.worker as worker

    monkeypatch.setattr(worker, "accept_speculative", accept_always)
    wrong, *_ = _samples(_engine(model, heads["full"]))
    assert not _same_distribution(plain, wrong)
