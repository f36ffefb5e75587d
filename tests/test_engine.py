"""Reference engine: greedy equivalence of speculation, stopping, KV rollback, validation, loading."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import make_tiny_llama  # noqa: E402

from specbuild.engine import GenerationRequest, GenerationResult, InvalidRequestError  # noqa: E402
from specbuild.runtime import EngineLimits, ReferenceEngine  # noqa: E402
from specbuild.engine.acceptance import accept_tree_greedy, clip_emitted  # noqa: E402
from specbuild.engine.block import chain_tree  # noqa: E402
from specbuild.engine.forward import RowBlock, forward_blocks  # noqa: E402
from specbuild.engine.kv_pool import KVCache, KVPool, KVShape  # noqa: E402

MAX_DRAFT_LEN = 4
LIMITS = EngineLimits(max_batch_size=1, max_input_len=64, max_seq_len=160, max_draft_len=MAX_DRAFT_LEN)
NGRAM = {"decoding_type": "NGram", "max_draft_len": MAX_DRAFT_LEN, "max_matching_ngram_size": 3, "is_use_oldest": True}
PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7],  # repetition: n-gram drafts get accepted
    [17, 203, 44, 91, 300, 12],
    [101, 102, 103, 101, 102, 104, 101, 102],
    [42],
]
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), seed=0)


@pytest.fixture(scope="module")
def engine(tiny_dir) -> ReferenceEngine:
    return ReferenceEngine.from_pretrained(tiny_dir, speculative_config=NGRAM, limits=LIMITS)


@pytest.fixture(scope="module")
def plain_outputs(engine) -> list[list[int]]:
    return [_run(engine, p, NEW_TOKENS, num_draft_tokens=0).output_ids for p in PROMPTS]


def _run(engine, prompt, max_tokens, *, end_id=-1, num_draft_tokens=None) -> GenerationResult:
    return engine.generate(GenerationRequest(prompt, max_tokens, end_id=end_id, num_draft_tokens=num_draft_tokens))


# --- greedy equivalence --------------------------------------------------------------------------


def test_plain_decoding_matches_hf_generate(engine, plain_outputs):
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None, pad_token_id=0)
    for prompt, plain in zip(PROMPTS, plain_outputs):
        with torch.inference_mode():
            hf = engine._model.generate(torch.tensor([prompt]), generation_config=config)
        assert hf[0, len(prompt) :].tolist() == plain


@pytest.mark.parametrize("num_draft_tokens", [1, 2, MAX_DRAFT_LEN])
def test_ngram_speculation_equals_plain_greedy(engine, plain_outputs, num_draft_tokens):
    results = [_run(engine, p, NEW_TOKENS, num_draft_tokens=num_draft_tokens) for p in PROMPTS]
    for prompt, plain, result in zip(PROMPTS, plain_outputs, results):
        assert result.output_ids == plain, f"prompt {prompt}"
        assert result.finish_reason == "length"
        assert result.num_decoding_iterations >= 2
        assert result.total_accepted_draft_tokens <= result.total_draft_tokens
        assert result.num_decoding_iterations == len(plain) - 1 - result.total_accepted_draft_tokens
    drafted = sum(r.total_draft_tokens for r in results)
    accepted = sum(r.total_accepted_draft_tokens for r in results)
    assert accepted > 0, "no n-gram draft was ever accepted"
    assert accepted < drafted, "no draft was ever rejected"
    assert results[0].acceptance_length > 1.0


# --- stopping ------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 8, 13])
def test_max_tokens_never_exceeded(engine, plain_outputs, max_tokens):
    result = _run(engine, PROMPTS[0], max_tokens)
    assert result.output_ids == plain_outputs[0][:max_tokens]
    assert result.finish_reason == "length"
    assert result.total_accepted_draft_tokens <= max_tokens - 1


def test_end_token_with_ngram_drafts_stops_there(engine, plain_outputs):
    """end_id = a token of the plain output: the result is the plain output cut after its first occurrence
    (real n-gram drafts; a "same" draft inside an accepted chunk, for every method: tests/test_method_equivalence.py)."""
    prompt, plain = PROMPTS[1], plain_outputs[1]
    for end_id in dict.fromkeys(plain):
        first = plain.index(end_id)
        result = _run(engine, prompt, NEW_TOKENS, end_id=end_id)
        assert result.output_ids == plain[: first + 1], f"end_id {end_id}"
        assert result.finish_reason == "stop"
        # every step emits its accepted drafts plus the bonus, except that the last one may end before the bonus
        bonus_tokens = first - result.total_accepted_draft_tokens
        assert bonus_tokens <= result.num_decoding_iterations <= bonus_tokens + 1


def test_default_end_id_is_checkpoint_eos(engine):
    assert engine.end_id == 0


# --- KV cache rollback through the one KV cache interface (KVPool) -------------------------------


def _pool(model) -> KVPool:
    return KVPool(KVShape.of(model), num_slots=1, capacity=64, dtype=model.dtype, device=model.device)


def _argmax(model, pool: KVPool, slot: int, tokens: list[int]) -> list[int]:
    """The target's greedy token after each of ``tokens``, which are then committed to ``slot``."""
    out = forward_blocks(model, pool, [RowBlock(slot, list(tokens))])
    pool.commit(slot, list(range(len(tokens))))
    return out.logits[0].argmax(dim=-1).tolist()


def test_truncate_rolls_back_and_refuses_out_of_range(engine):
    model = engine._model
    with torch.inference_mode():
        pool = _pool(model)
        assert isinstance(pool, KVCache)
        slot = pool.allocate()
        _argmax(model, pool, slot, [3, 4, 5, 6, 7])
        assert pool.length(slot) == 5
        pool.truncate(slot, 5)
        assert pool.length(slot) == 5
        pool.truncate(slot, 2)
        assert pool.length(slot) == 2
        assert all(keys.shape[1] == 2 and values.shape[1] == 2
                   for keys, values in (pool.read(layer, slot, pool.length(slot)) for layer in range(pool.shape.num_layers)))
        with pytest.raises(ValueError, match="roll back"):
            pool.truncate(slot, 3)
        with pytest.raises(ValueError, match="roll back"):
            pool.truncate(slot, -1)


def test_cache_after_rejection_holds_accepted_prefix(engine, plain_outputs):
    model, prompt, plain = engine._model, PROMPTS[1], plain_outputs[1]
    wrong = (plain[3] + 1) % 384
    draft = [plain[1], plain[2], wrong, plain[4]]  # 2 accepted, then a rejection
    with torch.inference_mode():
        pool = _pool(model)
        slot = pool.allocate()
        first = _argmax(model, pool, slot, prompt)[-1]
        context = [*prompt, first]
        acceptance = accept_tree_greedy(chain_tree(len(draft)), [first, *draft], _argmax(model, pool, slot, [first, *draft]))
        assert acceptance.accepted_tokens == plain[1:3]
        assert acceptance.bonus_token == plain[3]
        assert pool.length(slot) == len(context) + len(draft)
        pool.truncate(slot, len(context) + acceptance.num_accepted)
        assert pool.length(slot) == len(prompt) + 3  # prompt, first token, 2 accepted
        # The rolled-back cache continues exactly like a cache that never saw the rejected drafts.
        after_rollback = _argmax(model, pool, slot, [acceptance.bonus_token])
        fresh = _pool(model)
        fresh_slot = fresh.allocate()
        _argmax(model, fresh, fresh_slot, [*prompt, *plain[:3]])
        assert after_rollback == _argmax(model, fresh, fresh_slot, [acceptance.bonus_token]) == [plain[4]]


def test_logit_margins_are_the_targets_top_two_logits(engine, plain_outputs):
    """The teacher-forced margins (one pass through forward_blocks on a one-slot pool) are transformers' own
    forward's top-two gap and runner-up at every output position, and its top-1 is the greedy output."""
    prompt, output = PROMPTS[1], plain_outputs[1]
    margins, runner_up = engine.logit_margins(prompt, output)
    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([[*prompt, *output[:-1]]])).logits[0, len(prompt) - 1 :].float()
    top = logits.topk(2, dim=-1)
    assert top.indices[:, 0].tolist() == output
    assert runner_up == top.indices[:, 1].tolist()
    assert torch.allclose(torch.tensor(margins), top.values[:, 0] - top.values[:, 1], atol=1e-4)
    with pytest.raises(ValueError, match="at least one prompt token and one output token"):
        engine.logit_margins(prompt, [])


# --- acceptance rule -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("draft", "target", "accepted", "bonus"),
    [([5, 7, 9], [5, 7, 4, 8], [5, 7], 4), ([5, 7], [5, 7, 1], [5, 7], 1), ([2], [3, 1], [], 3), ([], [6], [], 6)],
)
def test_greedy_acceptance_of_a_chain(draft, target, accepted, bonus):
    """A chain is a one-path tree: the longest draft prefix equal to the target's tokens, then its bonus."""
    acceptance = accept_tree_greedy(chain_tree(len(draft)), [0, *draft], target)
    assert (acceptance.accepted_tokens, acceptance.bonus_token) == (accepted, bonus)
    assert acceptance.emitted_tokens == [*accepted, bonus]


def test_greedy_acceptance_needs_a_target_token_per_node():
    with pytest.raises(ValueError, match="need 3 tree tokens and target tokens"):
        accept_tree_greedy(chain_tree(2), [0, 1, 2], [1, 2])


@pytest.mark.parametrize(
    ("tokens", "remaining", "end_id", "expected"),
    [
        ([4, 2, 9, 2], 3, 2, ([4, 2], True)),
        ([4, 2, 9], 1, 2, ([4], False)),
        ([4, 5, 9], 5, -1, ([4, 5, 9], False)),
        ([4, 5, 9], 2, 9, ([4, 5], False)),
    ],
)
def test_clip_emitted(tokens, remaining, end_id, expected):
    assert clip_emitted(tokens, remaining=remaining, end_id=end_id) == expected


def test_result_rates():
    result = GenerationResult([1, 2, 3, 4, 5], "length", 6, 3, 1)
    assert result.acceptance_rate == 0.5
    assert result.acceptance_length == 4.0
    assert GenerationResult([1], "stop", 0, 0, 0).acceptance_rate == 0.0  # the output tensor's value
    assert GenerationResult([1], "stop", 0, 0, 0).acceptance_length is None  # no verification step


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_kwargs", "field"),
    [
        ({"input_ids": [], "max_tokens": 4}, "input_ids is empty"),
        ({"input_ids": [1] * 65, "max_tokens": 4}, r"input_ids has 65 tokens; allowed: 1\.\.64"),
        ({"input_ids": [1, 384], "max_tokens": 4}, r"input_ids contains ids outside \[0, 384\)"),
        ({"input_ids": [1, -3], "max_tokens": 4}, "input_ids contains ids outside"),
        ({"input_ids": [1], "max_tokens": 0}, "max_tokens=0; allowed: >= 1"),
        ({"input_ids": [1] * 10, "max_tokens": 151}, r"exceeds max_seq_len=160; allowed max_tokens .* 1\.\.150"),
        ({"input_ids": [1], "max_tokens": 4, "num_draft_tokens": 5}, r"num_draft_tokens=5 .* 0\.\.4"),
        ({"input_ids": [1], "max_tokens": 4, "num_draft_tokens": -1}, "num_draft_tokens=-1"),
        ({"input_ids": [1], "max_tokens": 4, "end_id": 384}, r"end_id=384 .* \[0, 384\)"),
        ({"input_ids": [1], "max_tokens": 4, "end_id": -2}, "end_id=-2"),
    ],
)
def test_invalid_requests(engine, request_kwargs, field):
    with pytest.raises(InvalidRequestError, match=field):
        engine.generate(GenerationRequest(**request_kwargs))


def test_request_at_the_limits_is_accepted(engine):
    result = _run(engine, [1] * 64, 160 - 64)
    assert len(result.output_ids) == 96


def test_engine_without_speculation(tiny_dir, plain_outputs):
    limits = EngineLimits(max_batch_size=1, max_input_len=64, max_seq_len=160, max_draft_len=0)
    plain_engine = ReferenceEngine.from_pretrained(tiny_dir, speculative_config=None, limits=limits)
    result = _run(plain_engine, PROMPTS[0], NEW_TOKENS)
    assert result.output_ids == plain_outputs[0]
    assert (result.total_draft_tokens, result.num_decoding_iterations) == (0, NEW_TOKENS - 1)
    with pytest.raises(InvalidRequestError, match=r"num_draft_tokens=1 .* 0\.\.0"):
        _run(plain_engine, PROMPTS[0], 4, num_draft_tokens=1)


def test_speculative_config_must_fit_the_build(tiny_dir):
    limits = EngineLimits(max_batch_size=1, max_input_len=64, max_seq_len=160, max_draft_len=2)
    with pytest.raises(ValueError, match="max_draft_len=4 exceeds the built max_draft_len=2"):
        ReferenceEngine.from_pretrained(tiny_dir, speculative_config=NGRAM, limits=limits)
    with pytest.raises(ValueError, match="decoding_type 'Eagle9'"):
        ReferenceEngine.from_pretrained(tiny_dir, speculative_config={"decoding_type": "Eagle9"}, limits=limits)


# --- engine directory ----------------------------------------------------------------------------


def test_from_engine_dir(tiny_dir, tmp_path, plain_outputs):
    (tmp_path / "target").symlink_to(tiny_dir, target_is_directory=True)
    config = {
        "version": "0.1.0",
        "pretrained_config": {"architecture": "LlamaForCausalLM", "dtype": "float32", "vocab_size": 384},
        "build_config": {
            "max_batch_size": 4, "max_input_len": 64, "max_seq_len": 160, "max_num_tokens": 256,
            "max_beam_width": 1, "max_draft_len": 3, "speculative_decoding_mode": 2,
        },
        "speculative_config": {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 2},
        "specbuild": {"end_id": 7, "pad_id": 0, "trust_remote_code": False},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = ReferenceEngine.from_engine_dir(tmp_path)
    assert loaded.limits == EngineLimits(max_batch_size=4, max_input_len=64, max_seq_len=160, max_draft_len=3, max_num_tokens=256)
    assert loaded.end_id == 7
    assert loaded.speculative_config == config["speculative_config"]
    assert _run(loaded, PROMPTS[0], NEW_TOKENS).output_ids == plain_outputs[0]


def test_from_engine_dir_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an engine directory"):
        ReferenceEngine.from_engine_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"build_config": {"max_batch_size": 1}}))
    with pytest.raises(ValueError, match="missing key 'max_input_len'"):
        ReferenceEngine.from_engine_dir(tmp_path)


def test_draft_projection_matches_the_layer_it_copies():
    from torch import nn

    from specbuild.engine.kernels import onednn_supports
    from specbuild.engine.draft_linear import DraftProjection

    torch.manual_seed(0)
    for bias in (False, True):
        layer = nn.Linear(16, 300, bias=bias)
        project = DraftProjection(layer)
        assert project.packed is not None or not onednn_supports(torch.float32)  # CPU with oneDNN: a packed copy
        for rows in ((16,), (1, 16), (3, 16), (1, 5, 16)):
            x = torch.randn(*rows)
            assert torch.allclose(project(x), layer(x), atol=1e-5)
            assert project(x).shape == layer(x).shape


def test_draft_lm_head_computes_the_same_logits_and_keeps_the_weights_tied(tiny_checkpoint):
    from specbuild.engine.target import load_target
    from specbuild.methods.draft_target.engine import DraftLMHead, use_draft_lm_head

    model = load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)
    prompt = torch.tensor([[1, 5, 9, 2, 7]])
    before = model(input_ids=prompt).logits
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    use_draft_lm_head(model)
    head = model.get_output_embeddings()
    assert isinstance(head, DraftLMHead)
    assert (head.weight is model.get_input_embeddings().weight) == tied
    assert torch.allclose(model(input_ids=prompt).logits, before, atol=1e-5)
    assert torch.allclose(model(input_ids=prompt, logits_to_keep=1).logits, before[:, -1:], atol=1e-5)
    assert use_draft_lm_head(model).get_output_embeddings() is head  # a second call changes nothing
