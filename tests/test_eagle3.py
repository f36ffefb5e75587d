"""EAGLE-3 (Li et al. 2025) in the reference engine: the head format, greedy equivalence with a draft
vocabulary, per-request caps, refusals, the builder and the real server.

Target: a tiny random 8-layer Llama (TensorRT-LLM's default captured layers (1, 3, 4)). Heads: "random"
over the full vocabulary (nearly every draft rejected) and "draft_vocab" (lm_head over 96 tokens mapped
by ``d2t``). The "same" draft, a random head, stopping, and the refusals every method shares are in
tests/test_method_equivalence.py (on the shared 2-layer target, layers named by the head's config).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from drive import assert_equals_plain
from conftest import build_with_pt_head, served, verify_lossless, write_recipe
from specbuild.engine import GenerationRequest
from specbuild.runtime import EngineLimits, ReferenceEngine
from specbuild.engine import target as target_model
from specbuild.methods.eagle3.engine import (
    Eagle3Config,
    Eagle3Head,
    Eagle3Proposer,
    default_capture_layers,
    load_eagle3_head,
    save_eagle3_head,
)
from eagle3_tiny import CONFIG, DRAFT_CONFIG, DRAFT_VOCAB, HIDDEN, LAYERS, VOCAB, checkpoint, make_head as _head, model  # noqa: F401

MAX_DRAFT_LEN = 4
LIMITS = EngineLimits(max_batch_size=1, max_input_len=64, max_seq_len=160, max_draft_len=MAX_DRAFT_LEN)
PROMPTS = [[17, 203, 44, 91, 300, 12], [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [42]]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def head_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eagle3_heads")
    configs = {"random": CONFIG, "draft_vocab": DRAFT_CONFIG}
    return {kind: save_eagle3_head(root / kind, _head(kind).state_dict(), c) for kind, c in configs.items()}


def eagle3_config(head_dir: Path | None, **extra) -> dict:
    config = {"decoding_type": "Eagle3", "max_draft_len": MAX_DRAFT_LEN, "eagle3_one_model": True, **extra}
    return config if head_dir is None else {**config, "speculative_model_dir": str(head_dir)}


@pytest.fixture(scope="module")
def engines(model, head_dirs) -> dict[str, ReferenceEngine]:
    return {kind: ReferenceEngine(model, limits=LIMITS, end_id=-1, speculative_config=eagle3_config(path)) for kind, path in head_dirs.items()}


@pytest.fixture(scope="module")
def plain_outputs(engines) -> list[list[int]]:
    return [_run(engines["random"], p, num_draft_tokens=0).output_ids for p in PROMPTS]


def _run(engine, prompt, max_tokens=NEW_TOKENS, **kwargs):
    return engine.generate(GenerationRequest(prompt, max_tokens, **{"end_id": -1, **kwargs}))


# --- format --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["random", "draft_vocab"])
def test_format_round_trip(head_dirs, kind):
    loaded, original = load_eagle3_head(head_dirs[kind]), _head(kind)
    assert loaded.state_dict().keys() == original.state_dict().keys()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in original.state_dict().items())
    raw = json.loads((head_dirs[kind] / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"]
    assert tuple(original.state_dict()["fc.weight"].shape) == (HIDDEN, 3 * HIDDEN)
    assert tuple(original.state_dict()["midlayer.self_attn.q_proj.weight"].shape) == (HIDDEN, 2 * HIDDEN)


def test_pt_is_read_and_extras_are_ignored(tmp_path):
    """(Pickles are read weights_only: tests/test_heads.py, every format.)"""
    state = {**_head("draft_vocab").state_dict(), "t2d": torch.zeros(VOCAB, dtype=torch.bool), "embed_tokens.weight": torch.zeros(VOCAB, HIDDEN)}
    head_dir = save_eagle3_head(tmp_path / "h", _head("draft_vocab").state_dict(), DRAFT_CONFIG)
    (head_dir / "model.safetensors").unlink()
    torch.save(state, head_dir / "model.pt")
    assert torch.equal(load_eagle3_head(head_dir).d2t, _head("draft_vocab").d2t)


def _save_broken(tmp_path: Path, state: dict, config: Eagle3Config = DRAFT_CONFIG) -> Path:
    head_dir = save_eagle3_head(tmp_path / "h", _head("draft_vocab").state_dict(), DRAFT_CONFIG)
    from safetensors.torch import save_file

    save_file(state, str(head_dir / "model.safetensors"))
    (head_dir / "config.json").write_text(json.dumps(config.to_json()))
    return head_dir


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.update({"fc.weight": torch.zeros(HIDDEN, 2 * HIDDEN)}), r"fc.weight has shape \(64, 128\), expected \(64, 192\)"),
        (lambda s: s.update({"midlayer.self_attn.q_proj.weight": torch.zeros(HIDDEN, HIDDEN)}), r"q_proj.weight has shape \(64, 64\), expected \(64, 128\)"),
        (lambda s: s.pop("midlayer.hidden_norm.weight"), r"missing \['midlayer.hidden_norm.weight'\]"),
        (lambda s: s.update({"layers.0.mlp.up_proj.weight": torch.zeros(1)}), r"unexpected \['layers.0.mlp.up_proj.weight'\]"),
        (lambda s: s.update({"d2t": torch.zeros(DRAFT_VOCAB - 1, dtype=torch.long)}), r"d2t must be an integer tensor of length draft_vocab_size=96"),
        (lambda s: s.update({"d2t": torch.full((DRAFT_VOCAB,), VOCAB, dtype=torch.long)}), r"d2t maps draft ids outside the target vocabulary \[0, 384\)"),
        (lambda s: s.pop("d2t"), r"draft_vocab_size=96 != vocab_size=384 needs d2t"),
    ],
)
def test_malformed_heads_are_refused(tmp_path, change, message):
    state = dict(_head("draft_vocab").state_dict())
    change(state)
    with pytest.raises(ValueError, match=message):
        load_eagle3_head(_save_broken(tmp_path, state))


def test_config_refusals():
    with pytest.raises(ValueError, match="missing key"):
        Eagle3Config.from_dict({"hidden_size": 64})
    with pytest.raises(ValueError, match="one midlayer"):
        Eagle3Config(**{**CONFIG.__dict__, "num_hidden_layers": 2})
    raw = {**CONFIG.to_json(), "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 5]}}
    assert Eagle3Config.from_dict(raw).aux_layer_ids == (0, 2, 5)


def test_default_capture_layers_follow_tensorrt_llm():
    assert default_capture_layers(8) == (1, 3, 4) and default_capture_layers(32) == (1, 15, 28)
    with pytest.raises(ValueError, match="Not enough hidden layers for default EAGLE3 capture"):
        default_capture_layers(5)


def test_capture_takes_layer_outputs(model):
    """Layer i's output is transformers' hidden_states[i + 1]; features are [S, 3 H] in layer order."""
    proposer = Eagle3Proposer(model, _head("random"), max_draft_len=2)
    hidden = [torch.full((1, 2, HIDDEN), float(i)) for i in range(LAYERS + 1)]
    assert proposer.capture(hidden)[0].tolist() == [2.0] * HIDDEN + [4.0] * HIDDEN + [5.0] * HIDDEN


def test_a_chain_follows_eagle3s_draft_step(model):
    """Chains written out by hand from the head's forward (EAGLE-3 §3: each further depth feeds the head's
    own output and the previous draft's embedding at the next position, attending to the true cache and
    the chain so far): propose gives the same tokens."""
    proposer = Eagle3Proposer(model, _head("random"), max_draft_len=4)
    head = proposer.head
    with torch.no_grad():  # sharper attention, so that a position off by one changes the drafts
        head.midlayer.self_attn.q_proj.weight.mul_(8.0)
        head.midlayer.self_attn.k_proj.weight.mul_(8.0)
    with torch.inference_mode():
        for prompt in PROMPTS:
            out = model(input_ids=torch.tensor([prompt]), output_hidden_states=True)
            state = proposer.new_state()
            proposer.update(state, [*prompt[1:], int(out.logits[0, -1].argmax())], proposer.capture(out.hidden_states))
            chain, output, cache = [], state.last_output, state.cache.copy()  # a sequential oracle's own cache
            for depth in range(4):
                chain.append(int(head.lm_head(head.norm(output)).argmax()))
                mask = torch.ones(1, cache.length + 1, dtype=torch.bool)
                new_out, _ = head(proposer.embedding(torch.tensor(chain[-1:])), output[None],
                                  torch.tensor([state.length + depth]), mask, cache.view(cache.length, 1))
                cache.commit(1)
                output = new_out[0]
            assert proposer.propose(state, 4) == chain, f"prompt {prompt}"


@pytest.mark.parametrize("kind", ["random", "draft_vocab"])
def test_requests_drafted_together_get_the_chains_they_get_alone(model, kind):
    """update_batch / propose_batch (one head call for every request's features, then one per chain
    depth, as the worker drafts a batch) leave each request's state and chain bit for bit as alone,
    with its own context length and draft length."""
    from specbuild.engine.draft_linear import pack_draft_linears
    from specbuild.methods.eagle3.engine import propose_batch, update_batch

    head = _head(kind)
    proposer = Eagle3Proposer(model, head, max_draft_len=MAX_DRAFT_LEN)
    pack_draft_linears(head)  # as the engine loads it: packed on CPU, after the proposer took its dtypes
    with torch.inference_mode():
        outputs = [model(input_ids=torch.tensor([p]), output_hidden_states=True) for p in PROMPTS]
        feeds = [([*p[1:], int(o.logits[0, -1].argmax())], proposer.capture(o.hidden_states)) for p, o in zip(PROMPTS, outputs)]
        alone, together = [proposer.new_state() for _ in PROMPTS], [proposer.new_state() for _ in PROMPTS]
        for state, (tokens, features) in zip(alone, feeds):
            proposer.update(state, tokens, features)
        update_batch(proposer, together, [t for t, _ in feeds], [f for _, f in feeds])
        for a, t in zip(alone, together):
            assert torch.equal(a.last_output, t.last_output)
            assert torch.equal(a.kv.keys, t.kv.keys) and torch.equal(a.kv.values, t.kv.values)
        for ks in ([MAX_DRAFT_LEN, 1, 3], [0, 2, MAX_DRAFT_LEN + 2]):
            singles = [proposer.propose(state, k) for state, k in zip(alone, ks)]
            assert propose_batch(proposer, together, ks) == singles
            assert [len(c) for c in singles] == [min(k, MAX_DRAFT_LEN) for k in ks]
        # a second feed of different lengths per request (as after steps accepting 1 and 3 tokens)
        more = [([5], feeds[0][1][-1:]), ([7, 8, 9], feeds[1][1][-3:]), ([11, 12], feeds[0][1][:2])]
        for state, (tokens, features) in zip(alone, more):
            proposer.update(state, tokens, features)
        update_batch(proposer, together, [t for t, _ in more], [f for _, f in more])
        ks = [2, MAX_DRAFT_LEN, 1]
        assert propose_batch(proposer, together, ks) == [proposer.propose(s, k) for s, k in zip(alone, ks)]
        with pytest.raises(ValueError, match="2 tokens but 1 feature rows"):
            update_batch(proposer, together[:1], [[1, 2]], [feeds[0][1][:1]])
        with pytest.raises(ValueError, match="no features yet"):
            propose_batch(proposer, [proposer.new_state()], [2])


# --- greedy equivalence --------------------------------------------------------------------------


@pytest.mark.parametrize("num_draft_tokens", [None, 1])
@pytest.mark.parametrize("kind", ["draft_vocab"])  # a random head: tests/test_method_equivalence.py
def test_eagle3_engine_equals_plain_greedy(engines, plain_outputs, kind, num_draft_tokens):
    cap = num_draft_tokens or MAX_DRAFT_LEN
    for prompt, plain in zip(PROMPTS, plain_outputs):
        result = _run(engines[kind], prompt, num_draft_tokens=num_draft_tokens)
        assert_equals_plain(result, plain, prompt)
        assert 0 < result.total_draft_tokens <= cap * result.num_decoding_iterations


def _record_chains(monkeypatch) -> list[list[int]]:
    """Every chain the engine's drafters propose (they draft through the batched ``propose_batch``)."""
    from specbuild.methods.eagle3 import engine as eagle3_module

    chains: list[list[int]] = []
    real = eagle3_module.propose_batch

    def recording(proposer, states, num_draft_tokens):
        chains.extend(result := real(proposer, states, num_draft_tokens))
        return result

    monkeypatch.setattr(eagle3_module, "propose_batch", recording)
    return chains


def test_draft_vocab_proposals_are_mapped_by_d2t(engines, monkeypatch):
    chains = _record_chains(monkeypatch)
    _run(engines["draft_vocab"], PROMPTS[0])
    proposed = [t for chain in chains for t in chain]
    assert proposed and all(t % 4 == 0 and t < 4 * DRAFT_VOCAB for t in proposed)  # d + 3d


def test_num_draft_tokens_caps_the_chain(engines, monkeypatch):
    chains = _record_chains(monkeypatch)
    result = _run(engines["random"], PROMPTS[0], max_tokens=6, num_draft_tokens=2)
    lengths = [len(c) for c in chains]
    assert lengths[0] == 2 and all(0 <= n <= 2 for n in lengths)  # never past remaining - 1 either
    assert result.total_draft_tokens == sum(lengths)


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, limits, message",
    [
        ({"max_draft_len": 5}, LIMITS, r"max_draft_len=5 exceeds the built max_draft_len=4"),
        ({"eagle_choices": [[0]]}, LIMITS, r"unknown Eagle3 speculative_config keys \['eagle_choices'\]"),
        ({"max_draft_len": 0}, LIMITS, r"max_draft_len must be an integer >= 1"),
    ],
)
def test_bad_speculative_config_is_refused(model, head_dirs, extra, limits, message):
    with pytest.raises(ValueError, match=message):
        ReferenceEngine(model, limits=limits, end_id=-1, speculative_config=eagle3_config(head_dirs["random"], **extra))


def test_heads_that_do_not_fit_the_target_are_refused(model, head_dirs, tiny_checkpoint, tmp_path):
    config = Eagle3Config(**{**CONFIG.__dict__, "hidden_size": 32, "intermediate_size": 64})
    narrow = save_eagle3_head(tmp_path / "narrow", Eagle3Head(config).state_dict(), config)
    with pytest.raises(ValueError, match="EAGLE-3 head hidden_size 32 .* != target hidden_size 64"):
        ReferenceEngine(model, limits=LIMITS, end_id=-1, speculative_config=eagle3_config(narrow))
    shallow = target_model.load_target(tiny_checkpoint, dtype="float32", device="cpu", trust_remote_code=False)  # 2 layers
    with pytest.raises(ValueError, match="Not enough hidden layers for default EAGLE3 capture"):
        ReferenceEngine(shallow, limits=LIMITS, end_id=-1, speculative_config=eagle3_config(head_dirs["random"]))
    with pytest.raises(ValueError, match="needs speculative_model_dir"):
        ReferenceEngine(model, limits=LIMITS, end_id=-1, speculative_config=eagle3_config(None))


# --- builder and the real server -----------------------------------------------------------------



def eagle3_recipe(tmp_path: Path, checkpoint: Path, head: str) -> Path:
    return write_recipe(tmp_path / "r.yaml", checkpoint, speculation=f"  method: eagle3\n  eagle_model: {head}\n  max_draft_len: 3\n")


def test_missing_or_unfit_heads_are_refused_before_any_work(checkpoint, tiny_checkpoint, tmp_path):
    from specbuild.builder.recipe import RecipeError, load_recipe
    from specbuild.builder.reference import build_reference_engine
    from specbuild.pipeline import check_inputs, check_runnable

    with pytest.raises(RecipeError, match=r"r.yaml:\d+: speculation.eagle_model: .*no such directory.*EAGLE-3 head"):
        check_inputs(load_recipe(str(eagle3_recipe(tmp_path, checkpoint, "head"))))
    save_eagle3_head(tmp_path / "head", _head("draft_vocab").state_dict(), DRAFT_CONFIG)
    checked = check_runnable(load_recipe(str(eagle3_recipe(tmp_path, checkpoint, "head"))))
    assert checked.reference.weights.path == tmp_path / "head" and checked.reference.fit_checked
    shallow = load_recipe(str(eagle3_recipe(tmp_path, tiny_checkpoint, "head")))  # 2-layer target
    for check in (check_inputs, lambda r: build_reference_engine(r, tmp_path / "engine")):
        with pytest.raises(RecipeError, match=r"speculation.eagle_model: Not enough hidden layers for default EAGLE3 capture"):
            check(shallow)
    assert not (tmp_path / "engine").exists()


@pytest.mark.e2e
def test_eagle3_recipe_is_lossless_through_triton(checkpoint, tmp_path):
    """recipe (head as a .pt, relative path, draft vocabulary) -> engine dir with eagle3/ -> tritonserver -> verify."""
    head_dir = save_eagle3_head(tmp_path / "head", _head("draft_vocab").state_dict(), DRAFT_CONFIG)
    recipe = eagle3_recipe(tmp_path, checkpoint, "head")
    engine_dir, config = build_with_pt_head(recipe, head_dir, _head("draft_vocab").state_dict(), tmp_path, "eagle3")
    assert config["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 3, "eagle3_one_model": True}
    assert config["build_config"]["max_draft_len"] == 3 and config["build_config"]["speculative_decoding_mode"] == 32
    with served(engine_dir, tmp_path) as client:
        verify_lossless(client)


# --- the SA enhancer (sa_config) ------------------------------------------------------------------------


def test_sa_override_takes_the_automatons_chain_from_the_threshold_on():
    """TensorRT-LLM's SADraftEnhancer rule: the whole chain is the automaton's when the context's longest
    earlier-matched suffix is >= threshold tokens, else the head's, untouched."""
    from specbuild.methods.eagle3.engine import SAOverride
    from specbuild.methods.sa import SASpeculation
    from specbuild.methods.sa.engine import SAPool

    pool = SAPool(SASpeculation(method="sa", max_draft_len=MAX_DRAFT_LEN))
    context = [5, 6, 7, 8, 9, 1, 5, 6, 7]  # "5 6 7" (3 tokens) ended first at index 2 -> continues 8 9 1 5
    head_chain = [40, 41, 42, 43]
    at_three, at_four = SAOverride(pool, threshold=3), SAOverride(pool, threshold=4)
    # the draft made with the prefill stays the head's (TensorRT-LLM overrides generation requests only)
    assert at_three.apply(context, head_chain) is None
    at_three.follow(context)  # a verified step: from now on the automaton may replace the chain
    at_four.follow(context)
    assert at_three.apply(context, head_chain) == [8, 9, 1, 5] and at_three.overrides == 1
    assert at_three.apply(context + [2], head_chain[:2]) is None  # "...7 2": no earlier match
    assert at_four.apply(context, head_chain) is None and at_four.overrides == 0
    at_one, at_two = SAOverride(pool, threshold=1), SAOverride(pool, threshold=2)
    at_one.follow(context)
    at_two.follow(context)
    assert at_one.apply(context, []) is None  # no drafting this step: nothing to replace
    assert at_two.apply(context, head_chain[:2]) == [8, 9]  # never longer than the head's chain


def test_a_sampled_requests_sa_chain_is_verified_one_hot(model):
    """With use_rejection_sampling the head's chain carries the q rows it was drawn from; a chain the SA
    enhancer replaced carries none (its tokens are deterministic: exact-match verification, one-hot q)."""
    from specbuild.methods.eagle3.engine import Eagle3Drafter, SAOverride
    from specbuild.methods.sa import SASpeculation
    from specbuild.methods.sa.engine import SAPool

    pool = SAPool(SASpeculation(method="sa", max_draft_len=MAX_DRAFT_LEN))
    proposer = Eagle3Proposer(model, _head("draft_vocab"), max_draft_len=MAX_DRAFT_LEN)
    context = list(PROMPTS[1])  # 5 6 7 8 9 5 6 7 8 9 5 6 7: the suffix matched 8 tokens, continuing 8 9 5
    probs = [torch.full((VOCAB,), 1.0 / VOCAB)] * 3
    for threshold, tokens, has_q in ((2, [8, 9, 5], False), (50, [1, 2, 3], True)):
        drafter = Eagle3Drafter(proposer, MAX_DRAFT_LEN, SAOverride(pool, threshold))
        drafter.rejection_sampling = True
        drafter.sa.follow(context)
        block = drafter._block(context, [1, 2, 3], probs)
        assert block.tokens[1:] == tokens and (block.draft_probs is not None) == has_q


@pytest.mark.parametrize("global_pool", [False, True])
def test_eagle3_with_an_sa_enhancer_equals_plain_greedy_alone_and_in_a_batch(model, head_dirs, monkeypatch, global_pool):
    """With sa_config the reference engine replaces chains where the suffix matched (repetitive prompts
    here, threshold 2) and stays token-for-token plain greedy, alone and with requests in flight together."""
    from specbuild.engine.scheduler import Scheduler
    from specbuild.engine.stream import collect
    from specbuild.methods.eagle3 import engine as eagle3_module

    overridden: list[list[int]] = []
    real_apply = eagle3_module.SAOverride.apply

    def recording(self, context, chain):
        result = real_apply(self, context, chain)
        if result is not None:
            overridden.append(result)
        return result

    monkeypatch.setattr(eagle3_module.SAOverride, "apply", recording)
    limits = EngineLimits(max_batch_size=3, max_input_len=64, max_seq_len=160, max_draft_len=MAX_DRAFT_LEN)
    sa = {"threshold": 2, "enable_global_pool": global_pool}
    engine = ReferenceEngine(model, limits=limits, end_id=-1, speculative_config=eagle3_config(head_dirs["draft_vocab"], sa_config=sa))
    plain = ReferenceEngine(model, limits=limits, end_id=-1)
    prompts = [PROMPTS[1], [3, 4, 3, 4, 3, 4, 3], PROMPTS[0]]
    expected = [_run(plain, p, max_tokens=24).output_ids for p in prompts]
    for prompt, want in zip(prompts, expected):
        assert_equals_plain(_run(engine, prompt, max_tokens=24), want, prompt)
    assert overridden  # the automaton's chains were verified, not only the head's
    requests = [GenerationRequest(list(p), 24, end_id=-1) for p in prompts]
    with Scheduler(engine, max_batch_size=3) as scheduler:
        together = [collect(s) for s in [scheduler.stream(r) for r in requests]]
    assert scheduler.max_active_seen >= 2
    assert [r.output_ids for r in together] == expected


def test_sa_enhancer_is_refused_with_a_dynamic_tree(checkpoint, tmp_path):
    """TensorRT-LLM's dynamic-tree EAGLE-3 worker refuses sa_config; the recipe says so at its line."""
    from specbuild.builder.recipe import RecipeError, load_recipe

    save_eagle3_head(tmp_path / "head", _head("draft_vocab").state_dict(), DRAFT_CONFIG)
    path = write_recipe(tmp_path / "r.yaml", checkpoint, speculation=(
        "  method: eagle3\n  eagle_model: head\n  max_draft_len: 3\n  use_dynamic_tree: true\n  dynamic_tree_max_topK: 2\n"
        "  sa_config: {threshold: 4}\n"))
    with pytest.raises(RecipeError, match=r"r.yaml:\d+: speculation: .*sa_config needs a chain \(use_dynamic_tree: false\)"):
        load_recipe(str(path))


def test_written_heads_are_readable_by_other_users(tmp_path):
    """nc6: safetensors' save_file creates 0600 files, which a serving container running as another user
    cannot read; heads are written as any file is (0666 & ~umask)."""
    import os

    old = os.umask(0o022)
    try:
        head_dir = save_eagle3_head(tmp_path / "h", _head("draft_vocab").state_dict(), DRAFT_CONFIG)
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in head_dir.iterdir() if p.is_file()}
    assert modes and set(modes.values()) == {0o644}, modes
