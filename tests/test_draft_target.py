"""Draft-target speculation: greedy equivalence, speculative sampling through the engine, draft checks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from specbuild.engine import GenerationRequest, InvalidRequestError, worker
from specbuild.runtime import EngineLimits, ReferenceEngine
from specbuild.engine import rowgemm
from specbuild.engine import target as target_model
from specbuild.methods import method_for
from specbuild.methods.draft_target import DraftTargetSpeculation
from specbuild.engine.sampling import sampling_probs
from specbuild.engine.types import SamplingParams
from tiny_models import make_tiny_llama

MAX_DRAFT_LEN = 4
LIMITS = EngineLimits(max_batch_size=1, max_input_len=64, max_seq_len=160, max_draft_len=MAX_DRAFT_LEN)
PROMPTS = [[17, 203, 44, 91, 300, 12], [5, 6, 7, 8, 9, 5, 6, 7], [101, 102, 103], [42]]
NEW_TOKENS = 24
ALPHA = 1e-3


def draft_target(draft_dir: Path | None, max_draft_len: int = MAX_DRAFT_LEN) -> dict:
    config = {"decoding_type": "DraftTarget", "max_draft_len": max_draft_len}
    return config if draft_dir is None else {**config, "speculative_model_dir": str(draft_dir)}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """target; "same" = the target itself; "random" = other seed, 1 layer; "short" = 16 positions."""
    root = tmp_path_factory.mktemp("draft_target")
    target = make_tiny_llama(root / "target", seed=0)
    return {
        "target": target,
        "same": target,
        "random": make_tiny_llama(root / "random", seed=1, num_hidden_layers=1),
        "short": make_tiny_llama(root / "short", seed=2, num_hidden_layers=1, max_position_embeddings=16),
    }


@pytest.fixture(scope="module")
def engines(checkpoints) -> dict[str, ReferenceEngine]:
    target = checkpoints["target"]
    return {
        kind: ReferenceEngine.from_pretrained(target, speculative_config=draft_target(checkpoints[kind]), limits=LIMITS)
        for kind in ("same", "random")
    }


@pytest.fixture(scope="module")
def plain_outputs(engines) -> list[list[int]]:
    return [_run(engines["same"], p, num_draft_tokens=0).output_ids for p in PROMPTS]


def _run(engine, prompt, max_tokens=NEW_TOKENS, *, end_id=-1, **kwargs):
    return engine.generate(GenerationRequest(prompt, max_tokens, end_id=end_id, **kwargs))


# --- greedy equivalence --------------------------------------------------------------------------


@pytest.mark.parametrize("num_draft_tokens", [1, 2, MAX_DRAFT_LEN])
def test_target_as_its_own_draft_gets_everything_accepted(engines, plain_outputs, num_draft_tokens):
    """The real draft model (its own KV cache) identical to the target; a random draft model, and an
    oracle draft for every method: tests/test_method_equivalence.py."""
    results = [_run(engines["same"], p, num_draft_tokens=num_draft_tokens) for p in PROMPTS]
    for prompt, plain, result in zip(PROMPTS, plain_outputs, results):
        assert result.output_ids == plain, f"prompt {prompt}"
        assert result.num_decoding_iterations >= 2
        assert result.num_decoding_iterations == len(plain) - 1 - result.total_accepted_draft_tokens
    assert all(r.acceptance_rate == 1.0 for r in results)
    assert all(r.num_decoding_iterations == -(-(NEW_TOKENS - 1) // (num_draft_tokens + 1)) for r in results)


def _packed_dtypes(module) -> set[torch.dtype]:
    return {m.packed.dtype for m in module.modules() if isinstance(m, rowgemm.RowLinear)}


@pytest.mark.skipif(rowgemm.library() is None, reason=f"rowgemm not built here: {rowgemm.unavailable_reason()}")
def test_draft_weights_round_the_draft_only_and_keep_the_output(checkpoints, engines, plain_outputs):
    """build.draft_weights: "auto" (the default, a float32 CPU target) packs the draft's layers and its
    lm_head projection as bfloat16, "float32" keeps them; the target keeps float32 either way, so the
    output is plain greedy's with both, and the unrounded self-draft is always accepted."""
    auto = engines["random"]
    assert _packed_dtypes(auto._method_state.model) == {torch.bfloat16}
    assert auto._method_state.model.get_output_embeddings().project.packed.packed.dtype == torch.bfloat16  # its lm_head
    assert _packed_dtypes(auto._model) == {torch.float32}
    kept = ReferenceEngine.from_pretrained(checkpoints["target"], speculative_config=draft_target(checkpoints["same"]),
                                           limits=LIMITS, draft_weights="float32")
    assert _packed_dtypes(kept._method_state.model) == {torch.float32}
    assert kept._method_state.model.get_output_embeddings().project.packed.packed.dtype == torch.float32
    for engine in (auto, kept):
        assert [_run(engine, p, num_draft_tokens=2).output_ids for p in PROMPTS] == plain_outputs
    assert all(_run(kept, p, num_draft_tokens=2).acceptance_rate == 1.0 for p in PROMPTS)
    with pytest.raises(ValueError, match=r"draft_weights='half' is not one of \('auto', 'float32', 'bfloat16'\)"):
        ReferenceEngine.from_pretrained(checkpoints["target"], speculative_config=draft_target(checkpoints["random"]),
                                        limits=LIMITS, draft_weights="half")


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 6, 11])
def test_max_tokens_never_exceeded(engines, plain_outputs, max_tokens):
    for engine in engines.values():
        greedy = _run(engine, PROMPTS[0], max_tokens)
        assert greedy.output_ids == plain_outputs[0][:max_tokens]
        sampled = _run(engine, PROMPTS[0], max_tokens, temperature=1.0, seed=max_tokens)
        assert len(sampled.output_ids) == max_tokens and sampled.finish_reason == "length"
        assert sampled.total_accepted_draft_tokens <= max_tokens - 1


def test_end_token_inside_accepted_chunk_stops_there(engines, plain_outputs):
    """Same draft (everything accepted): each end_id cuts the output right after its first occurrence."""
    plain = plain_outputs[0]
    for end_id in dict.fromkeys(plain[1:]):
        result = _run(engines["same"], PROMPTS[0], end_id=end_id)
        assert result.output_ids == plain[: plain.index(end_id) + 1], f"end_id {end_id}"
        assert result.finish_reason == "stop"
    sampled = _run(engines["same"], PROMPTS[0], temperature=1.0, seed=7).output_ids
    end_id = sampled[NEW_TOKENS // 2]
    stopped = _run(engines["same"], PROMPTS[0], end_id=end_id, temperature=1.0, seed=7)
    assert stopped.output_ids == sampled[: sampled.index(end_id) + 1]


# --- sampling ------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_draft_tokens", [1, MAX_DRAFT_LEN])
def test_sampling_is_seeded(engines, num_draft_tokens):
    for engine in engines.values():
        runs = [_run(engine, PROMPTS[0], num_draft_tokens=num_draft_tokens, temperature=0.9, top_p=0.95, seed=s) for s in (11, 11, 12)]
        assert runs[0].output_ids == runs[1].output_ids
        assert runs[0].output_ids != runs[2].output_ids
    assert _run(engines["same"], PROMPTS[0], temperature=1.0, seed=3).acceptance_rate == 1.0


def test_top_k_one_is_greedy(engines, plain_outputs):
    for engine in engines.values():
        assert _run(engine, PROMPTS[1], temperature=0.7, top_k=1, seed=1).output_ids == plain_outputs[1]


def _sharpened(source: Path, dest: Path, *, noise: float) -> Path:
    """``source`` with its lm_head scaled x10 (peaked distributions) plus ``noise`` x its scale of Gaussian noise."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        weight = model.lm_head.weight
        weight.mul_(10).add_(torch.randn(weight.shape, generator=generator) * noise * weight.std())
    model.save_pretrained(dest)
    return dest


def _engine_fits_the_target(checkpoints: dict[str, Path], tmp_path: Path) -> bool:
    """Joint law of the first two tokens under top_k=3 (9 outcomes) vs the target's exact probabilities.

    Token 1 is the prefill's sample, token 2 comes from a verification step with one draft token
    (max_tokens=3 leaves room for it and its bonus): the accepted draft or the residual sample. A draft
    with perturbed logits makes rejections frequent. Chi-square at ALPHA; an outcome outside the
    target's support fails outright.
    """
    stats = pytest.importorskip("scipy.stats", reason="the chi-square test needs scipy (pip install scipy)")
    target_dir = _sharpened(checkpoints["target"], tmp_path / "target", noise=0.0)
    draft_dir = _sharpened(checkpoints["target"], tmp_path / "draft", noise=0.7)
    engine = ReferenceEngine.from_pretrained(target_dir, speculative_config=draft_target(draft_dir), limits=LIMITS)
    prompt, num_samples = PROMPTS[0], 1200
    expected = _exact_joint(engine._model, prompt, SamplingParams(temperature=1.0, top_k=3))  # {(t0, t1): p}
    counts = dict.fromkeys(expected, 0)
    drafted = accepted = 0
    for seed in range(num_samples):
        result = _run(engine, prompt, 3, temperature=1.0, top_k=3, seed=seed)
        pair = tuple(result.output_ids[:2])
        if pair not in counts:
            return False
        counts[pair] += 1
        drafted, accepted = drafted + result.total_draft_tokens, accepted + result.total_accepted_draft_tokens
    assert drafted >= num_samples and 0.1 < accepted / drafted < 0.9, f"acceptance {accepted}/{drafted}"
    observed = [counts[pair] for pair in expected]
    want = [expected[pair] * num_samples for pair in expected]
    return stats.chisquare(observed, want).pvalue >= ALPHA


def test_speculative_sampling_through_the_engine_follows_the_target(checkpoints, tmp_path):
    assert _engine_fits_the_target(checkpoints, tmp_path)


def test_engine_with_a_wrong_rule_is_detected(checkpoints, tmp_path, monkeypatch):
    from fault_injection import no_residual

    monkeypatch.setattr(worker, "accept_speculative", no_residual)
    assert not _engine_fits_the_target(checkpoints, tmp_path)


def _exact_joint(model, prompt: list[int], params: SamplingParams) -> dict[tuple[int, int], float]:
    """p(t0, t1) = p(t0 | prompt) p(t1 | prompt, t0) over the target's top-k support, from direct forwards."""
    with torch.inference_mode():
        first = _next_probs(model, prompt, params)
        joint = {}
        for t0 in first.nonzero()[:, 0].tolist():
            second = _next_probs(model, [*prompt, t0], params)
            for t1 in second.nonzero()[:, 0].tolist():
                joint[(t0, t1)] = float(first[t0] * second[t1])
    total = sum(joint.values())
    return {pair: p / total for pair, p in joint.items()}


def _next_probs(model, tokens: list[int], params: SamplingParams) -> torch.Tensor:
    """transformers' own forward over ``tokens`` (no cache): the oracle's next-token distribution ``[vocab]``."""
    logits = model(input_ids=torch.tensor([tokens], device=model.device)).logits[0, -1:]  # [1, vocab]
    return sampling_probs(logits, params)[0].double()


# --- draft checks --------------------------------------------------------------------------------


def test_draft_vocab_mismatch_is_refused_before_loading_weights(checkpoints, tmp_path):
    config = json.loads((checkpoints["target"] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": 400}))  # no weights at all
    with pytest.raises(ValueError, match=r"vocab_size=400 but the target has vocab_size=384"):
        ReferenceEngine.from_pretrained(checkpoints["target"], speculative_config=draft_target(tmp_path), limits=LIMITS)


def test_prompt_longer_than_the_drafts_context_is_refused(checkpoints):
    engine = ReferenceEngine.from_pretrained(
        checkpoints["target"], speculative_config=draft_target(checkpoints["short"]), limits=LIMITS
    )
    long_prompt = list(range(1, 21))
    with pytest.raises(InvalidRequestError, match=r"input_ids has 20 tokens but the draft model .* reads at most 16"):
        _run(engine, long_prompt, 4)
    assert len(_run(engine, long_prompt, 4, num_draft_tokens=0).output_ids) == 4
    # Within the draft's context, drafting stops where its positions run out; output stays the plain one.
    prompt = list(range(1, 13))
    plain = _run(engine, prompt, 16, num_draft_tokens=0).output_ids
    result = _run(engine, prompt, 16)
    assert result.output_ids == plain
    assert result.total_draft_tokens > 0


def test_from_engine_dir_finds_the_draft(checkpoints, tmp_path, plain_outputs):
    (tmp_path / "target").symlink_to(checkpoints["target"], target_is_directory=True)
    (tmp_path / "draft").symlink_to(checkpoints["random"], target_is_directory=True)
    config = {
        "build_config": {"max_batch_size": 1, "max_input_len": 64, "max_seq_len": 160, "max_draft_len": 3},
        "speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 3},
        "specbuild": {"end_id": -1},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    engine = ReferenceEngine.from_engine_dir(tmp_path)
    assert _run(engine, PROMPTS[0]).output_ids == plain_outputs[0]
    config["speculative_config"]["speculative_model_dir"] = "draft"  # relative: resolved in engine_dir
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert _run(ReferenceEngine.from_engine_dir(tmp_path), PROMPTS[0]).output_ids == plain_outputs[0]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"decoding_type": "DraftTarget", "max_draft_len": 2, "draft_dir": "x"}, r"unknown DraftTarget speculative_config keys \['draft_dir'\]"),
        ({"decoding_type": "DraftTarget"}, r"needs speculative_model_dir \(the draft checkpoint\)"),
        ({"decoding_type": "DraftTarget", "max_draft_len": 0}, "max_draft_len must be an integer >= 1"),
    ],
)
def test_config_errors(config, message):
    with pytest.raises(ValueError, match=message):
        method_for(config).parse_speculative_config(config)


def test_config_from_trtllm_dict(checkpoints, tmp_path):
    config = draft_target(checkpoints["random"], 3)
    expected = DraftTargetSpeculation(method="draft_target", draft_checkpoint=str(checkpoints["random"]), max_draft_len=3)
    assert method_for(config).parse_speculative_config(config) == expected
    relative = method_for(config).parse_speculative_config({**config, "speculative_model_dir": "d"}, base_dir=tmp_path)
    assert relative.draft_checkpoint == str(tmp_path / "d")  # against the engine directory
    default = method_for(config).parse_speculative_config(draft_target(None), base_dir=tmp_path)
    assert default.draft_checkpoint == str(tmp_path / "draft")  # where the builder writes it
    with pytest.raises(ValueError, match="needs speculative_model_dir"):
        ReferenceEngine.from_pretrained(checkpoints["target"], speculative_config=draft_target(None), limits=LIMITS)


def _loaded_draft(checkpoints, *, max_batch_size: int | None):
    from specbuild.engine.drafters import MethodContext
    from specbuild.methods.draft_target.engine import load_draft

    target = target_model.load_target(checkpoints["target"], dtype="float32", device="cpu", trust_remote_code=False)
    config = DraftTargetSpeculation.model_validate({"method": "draft_target", "max_draft_len": MAX_DRAFT_LEN,
                                                    "draft_checkpoint": str(checkpoints["random"])})
    return load_draft(config, MethodContext(target, False, max_batch_size, 160 if max_batch_size else None))


def test_requests_drafted_together_get_the_drafts_they_get_alone(checkpoints):
    """propose_batch (one draft forward per draft token for every request, a prompt-long first feed run
    apart) gives each request, greedy or sampled, over several steps, the drafts it gets alone."""
    import random

    from specbuild.methods.draft_target.engine import DraftTargetProposer, propose_batch
    from specbuild.engine.sampling import Sampler

    draft = _loaded_draft(checkpoints, max_batch_size=8)
    rng = random.Random(5)
    contexts = [list(p) for p in PROMPTS]
    alone = [DraftTargetProposer(draft) for _ in PROMPTS]
    together = [DraftTargetProposer(draft) for _ in PROMPTS]
    samplers = [None, SamplingParams(temperature=0.9, top_k=20, seed=3), None, SamplingParams(temperature=0.7, seed=4)]
    own = [[None if s is None else Sampler(s) for s in samplers] for _ in range(2)]
    with torch.inference_mode():
        for step in range(6):
            ks = [(step + i) % (MAX_DRAFT_LEN + 1) for i in range(len(PROMPTS))]  # 0 .. 4, differing per row
            single = [p.propose(c, k, s) for p, c, k, s in zip(alone, contexts, ks, own[0])]
            batched = propose_batch(together, contexts, ks, own[1])
            for a, b in zip(single, batched):
                assert a.tokens == b.tokens
                assert (a.probs is None and b.probs is None) or torch.equal(a.probs, b.probs)
            for context, d in zip(contexts, single):  # accept a random prefix of each draft, then a bonus token
                context += d.tokens[: rng.randint(0, len(d.tokens))] + [rng.randrange(384)]
    assert any(len(d.tokens) > 1 for d in single)


def test_a_private_draft_cache_regrown_mid_request_drafts_the_same(checkpoints, monkeypatch):
    """Outside an engine (no shared slots) a proposer drafts on a private one-slot KVPool; one regrown as the
    context outgrows it (PRIVATE_CHUNK = 4: refilled from the context) drafts what a roomy one drafts."""
    import random

    from specbuild.methods.draft_target import engine as dt_engine

    draft = _loaded_draft(checkpoints, max_batch_size=None)
    assert draft.slots is None
    runs = []
    for chunk in (dt_engine.PRIVATE_CHUNK, 4):
        monkeypatch.setattr(dt_engine, "PRIVATE_CHUNK", chunk)
        proposer, context, rng = dt_engine.DraftTargetProposer(draft), list(PROMPTS[1]), random.Random(7)
        drafts, capacities = [], []
        with torch.inference_mode():
            for _ in range(6):
                tokens = proposer.propose(context, MAX_DRAFT_LEN).tokens
                drafts.append(tokens)
                capacities.append(proposer._slots.pool.capacity)
                context += tokens[: rng.randint(0, len(tokens))] + [rng.randrange(384)]
        assert proposer.batch_key is None  # a private pool never joins a batch
        runs.append((drafts, capacities))
    assert runs[0][0] == runs[1][0]
    assert len(set(runs[1][1])) > 1, "PRIVATE_CHUNK = 4 should have regrown the pool"


def test_draft_slots_are_shared_and_given_back(checkpoints):
    """In an engine the draft's KV lives in one slot per request, taken on first use: a request past the
    slots drafts from a private cache (same drafts), and a dropped proposer's slot goes back to the pool."""
    import gc

    from specbuild.methods.draft_target.engine import DraftTargetProposer

    draft = _loaded_draft(checkpoints, max_batch_size=2)
    held = [DraftTargetProposer(draft) for _ in range(3)]
    assert [p.batch_key is not None for p in held] == [True, True, False]  # the third has a private cache
    with torch.inference_mode():
        drafts = [p.propose(PROMPTS[0], MAX_DRAFT_LEN).tokens for p in held]
    assert drafts[0] == drafts[1] == drafts[2]
    del held, drafts
    gc.collect()
    fresh = [DraftTargetProposer(draft) for _ in range(2)]
    assert all(p.batch_key is not None for p in fresh) and sorted(p._slot for p in fresh) == [0, 1]  # handed back
    assert _loaded_draft(checkpoints, max_batch_size=None).slots is None  # outside an engine: private caches
