"""EAGLE-1/2: the head format (load/save), the head forward and its cache, static and dynamic trees,
and greedy equivalence of EAGLE decoding with plain decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import hf_greedy
from drive import generate_alone
from tiny_models import make_pass_through
from specbuild.engine.drafters import MethodContext
from specbuild.methods.eagle.engine import (
    DecoderLayer,
    DraftKV,
    EagleConfig,
    EagleHead,
    EagleProposer,
    EagleTreeConfig,
    FeatureTreeDrafter,
    TreeDraft,
    load_eagle,
    load_eagle_head,
    save_eagle_head,
    tree_config,
)
from specbuild.engine.tree import SpecTree
from specbuild.methods import method_named

VOCAB, HIDDEN = 384, 64
CONFIG = EagleConfig(
    hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
    rms_norm_eps=1e-6, max_position_embeddings=512,
)
USER_CHOICES = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # depth 3
PROMPTS = [[17, 203, 44, 91, 300, 12], [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [42]]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def plain_outputs(model) -> list[list[int]]:
    return hf_greedy(model, PROMPTS, NEW_TOKENS)


def _random_head(config: EagleConfig = CONFIG, seed: int = 0, fc_bias: bool = True) -> EagleHead:
    torch.manual_seed(seed)
    return EagleHead(config, fc_bias=fc_bias).eval()


def _pass_through_head() -> EagleHead:
    """The head's output is its input feature (:func:`tiny_models.make_pass_through`)."""
    return make_pass_through(_random_head())


def _causal(n: int, past: int = 0) -> torch.Tensor:
    return torch.ones(n, past + n, dtype=torch.bool).tril(diagonal=past)


# --- format ------------------------------------------------------------------------------------


def test_state_dict_uses_the_on_disk_names():
    config = EagleConfig(**{**CONFIG.__dict__, "num_hidden_layers": 2})
    state = EagleHead(config).state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == config.expected_shapes(fc_bias=True)
    assert "layers.0.input_layernorm.weight" not in state and "layers.1.input_layernorm.weight" in state
    assert state["fc.weight"].shape == (HIDDEN, 2 * HIDDEN)
    assert not any(k.startswith("norm") for k in state), "EAGLE-1/2 heads have no final norm"


@pytest.mark.parametrize("fc_bias", [True, False])
def test_save_load_round_trip(tmp_path, fc_bias):
    head = _random_head(fc_bias=fc_bias)
    save_eagle_head(tmp_path, head.state_dict(), CONFIG)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((tmp_path / "config.json").read_text())["num_hidden_layers"] == 1
    loaded = load_eagle_head(tmp_path)
    assert loaded.config == CONFIG and (loaded.fc.bias is not None) == fc_bias
    for (name, tensor), (loaded_name, loaded_tensor) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert name == loaded_name and torch.equal(tensor, loaded_tensor)


def test_load_eagle_release_layout(tmp_path):
    """SafeAILab releases: pytorch_model.bin with a frozen embed_tokens copy and extra LlamaConfig keys."""
    head = _random_head()
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG.__dict__, "rope_scaling": None, "vocab_size": VOCAB,
                                                      "architectures": ["LlamaForCausalLM"], "bos_token_id": 1}))
    torch.save({**head.state_dict(), "embed_tokens.weight": torch.zeros(VOCAB, HIDDEN)}, tmp_path / "pytorch_model.bin")
    loaded = load_eagle_head(tmp_path)
    assert loaded.config.vocab_size == VOCAB
    torch.testing.assert_close(loaded.fc.weight, head.fc.weight)


def test_format_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an EAGLE head directory"):
        load_eagle_head(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": HIDDEN}))
    with pytest.raises(ValueError, match=r"missing key\(s\) \['intermediate_size', 'num_attention_heads'"):
        load_eagle_head(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG.__dict__))
    with pytest.raises(FileNotFoundError, match=r"none of \['model.safetensors', 'pytorch_model.bin', 'model.pt'\]"):
        load_eagle_head(tmp_path)
    with pytest.raises(ValueError, match="num_key_value_heads=3"):
        EagleConfig(**{**CONFIG.__dict__, "num_key_value_heads": 3})
    state = _random_head().state_dict()
    with pytest.raises(ValueError, match=r"tensor fc\.weight has shape \(64, 64\), expected \(64, 128\)"):
        save_eagle_head(tmp_path, {**state, "fc.weight": torch.zeros(HIDDEN, HIDDEN)}, CONFIG)
    with pytest.raises(ValueError, match=r"unexpected \['layers\.0\.input_layernorm\.weight'\]"):
        save_eagle_head(tmp_path, {**state, "layers.0.input_layernorm.weight": torch.ones(HIDDEN)}, CONFIG)
    with pytest.raises(ValueError, match=r"missing \['layers\.1\.input_layernorm\.weight'"):
        save_eagle_head(tmp_path, state, EagleConfig(**{**CONFIG.__dict__, "num_hidden_layers": 2}))


# --- the head forward ----------------------------------------------------------------------------


def test_decoder_layer_equals_transformers_llama(model):
    """Our layer (with input_layernorm) is HF's LlamaDecoderLayer: copy the target's layer 0 and compare."""
    layer = DecoderLayer(CONFIG, index=1)
    layer.load_state_dict(model.model.layers[0].state_dict())
    head = _random_head()  # for its rotary embedding
    tokens = torch.tensor([[17, 203, 44, 91, 300]])
    with torch.inference_mode():
        hf = model(input_ids=tokens, output_hidden_states=True).hidden_states
        rotary = head.rotary(hf[0][0], torch.arange(5)[None])
        ours, _ = layer(hf[0][0], (rotary[0][0], rotary[1][0]), _causal(5), None)
    torch.testing.assert_close(ours, hf[1][0], rtol=1e-5, atol=1e-5)


def test_incremental_updates_equal_one_pass(model):
    """Feeding (feature, next token) pairs in chunks gives the KV and outputs of one causal pass."""
    head, features = _random_head(), torch.randn(7, HIDDEN)
    tokens = [3, 1, 4, 1, 5, 9, 2]
    proposer = EagleProposer(model, head, EagleTreeConfig(num_eagle_layers=3, eagle_choices=tuple(map(tuple, USER_CHOICES))))
    state = proposer.new_state()
    with torch.inference_mode():
        proposer.update(state, tokens[:4], features[:4])
        proposer.update(state, tokens[4:], features[4:])
        out, kv = head(model.get_input_embeddings()(torch.tensor(tokens)), features, torch.arange(7), _causal(7))
    assert state.length == 7
    torch.testing.assert_close(state.last_output, out[-1])
    torch.testing.assert_close(state.kv[0].keys, kv[0].keys)


def _sequential_children(model, head, state, chain: list[int], k: int) -> list[int]:
    """Top-k after drafting ``chain`` one position at a time on a copy of the cache (no tree mask)."""
    feature, cache, length = state.last_output, state.cache.copy(), state.length
    embed = model.get_input_embeddings()
    for i, token in enumerate(chain):
        out, _ = head(embed(torch.tensor([token])), feature[None], torch.tensor([length + i]), _causal(1, length + i),
                      cache.view(length + i, 1))
        cache.commit(1)
        feature = out[0]
    return model.lm_head(feature).topk(k).indices.tolist()


def _ready_state(model, proposer, prompt):
    outputs = model(input_ids=torch.tensor([prompt]), output_hidden_states=True)
    first, features = int(outputs.logits[0, -1].argmax()), outputs.hidden_states[-1][0]  # features [T, H] final norm
    state = proposer.new_state()
    proposer.update(state, [*prompt[1:], first], features)
    return first, state


def test_static_tree_children_are_top_k_of_their_parent(model):
    """Each node's children: the top-k of the head run along that node's own path (siblings unseen)."""
    head = _random_head(seed=5)
    choices = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    proposer = EagleProposer(model, head, EagleTreeConfig(num_eagle_layers=3, eagle_choices=choices))
    with torch.inference_mode():
        root, state = _ready_state(model, proposer, PROMPTS[0])
        draft = proposer.propose(state, root, max_depth=10)
        token = dict(zip([(), *draft.tree.paths], draft.tokens))
        assert token[()] == root and draft.tree.max_depth == 3
        assert [token[(0,)], token[(1,)]] == _sequential_children(model, head, state, [], 2)
        assert [token[(0, 0)], token[(0, 1)]] == _sequential_children(model, head, state, [token[(0,)]], 2)
        assert [token[(1, 0)]] == _sequential_children(model, head, state, [token[(1,)]], 1)
        assert [token[(0, 0, 0)]] == _sequential_children(model, head, state, [token[(0,)], token[(0, 0)]], 1)
        assert proposer.propose(state, root, max_depth=1).tree.max_depth == 1
        assert proposer.propose(state, root, max_depth=0).tokens == [root]
        assert state.length == len(PROMPTS[0]), "drafting must not touch the request's cache"


def test_a_head_cache_regrown_mid_request_changes_no_tree(model, monkeypatch):
    """A HeadCache regrown at nearly every call (HEAD_CHUNK = 1: the pool is replaced and its committed and
    uncommitted draft positions copied through the KV cache interface, mid-proposal too) gives the same
    trees, state and committed KV as one that never regrows."""
    from specbuild.engine.kv_pool import KVPool
    from specbuild.methods.eagle import engine as eagle_engine

    class PoisonedPool(KVPool):  # fresh memory holds NaN: a position lost in a regrow would show
        @staticmethod
        def _buffer(size, dtype, device):
            return torch.full(size, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(eagle_engine, "KVPool", PoisonedPool)
    head = _random_head(seed=3)
    proposer = EagleProposer(model, head, EagleTreeConfig(num_eagle_layers=4, dynamic_tree_max_topK=3, max_draft_len=20))
    runs = []
    for chunk in (eagle_engine.HEAD_CHUNK, 1):
        monkeypatch.setattr(eagle_engine, "HEAD_CHUNK", chunk)
        with torch.inference_mode():
            root, state = _ready_state(model, proposer, PROMPTS[2][:1] * 2)  # short: trees outgrow 2 x the context
            capacities = [state.cache.pool.capacity]
            trees = []
            for step in range(3):
                draft = proposer.propose(state, root, max_depth=4)
                trees.append(draft.tokens)
                capacities.append(state.cache.pool.capacity)
                root = draft.tokens[1]  # accept the first child; its feature: the head's own output stands in
                proposer.update(state, [root], state.last_output[None])
        runs.append((trees, state.length, [kv.keys.clone() for kv in state.kv], capacities))
    assert runs[0][:2] == runs[1][:2]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][2], runs[1][2]))
    assert len(set(runs[1][3])) > len(set(runs[0][3])), "HEAD_CHUNK = 1 should have regrown the pool"


def test_dynamic_tree_expands_the_best_nodes_and_reranks(model):
    """K=2, depth 3: 2 root children, 2x2 grandchildren, then 2 of them expanded: 2 + 4 + 4 nodes."""
    head = _random_head(seed=5)
    with torch.inference_mode():
        full = EagleProposer(model, head, EagleTreeConfig(num_eagle_layers=3, max_draft_len=63, dynamic_tree_max_topK=2))
        root, state = _ready_state(model, full, PROMPTS[0])
        draft = full.propose(state, root, max_depth=10)
        per_depth = [draft.tree.depths.count(d) for d in (1, 2, 3)]
        assert per_depth == [2, 4, 4]
        token = dict(zip([(), *draft.tree.paths], draft.tokens))
        assert [token[(0,)], token[(1,)]] == _sequential_children(model, head, state, [], 2)
        assert [token[(1, 0)], token[(1, 1)]] == _sequential_children(model, head, state, [token[(1,)]], 2)
        deep = next(p for p in draft.tree.paths if len(p) == 3)
        expected = _sequential_children(model, head, state, [token[deep[:1]], token[deep[:2]]], 2)
        assert token[deep] == expected[deep[2]]
        cut = EagleProposer(model, head, EagleTreeConfig(num_eagle_layers=3, max_draft_len=3, dynamic_tree_max_topK=2))
        small = cut.propose(state, root, max_depth=10)
    assert small.tree.num_nodes == 3
    assert set(small.tree.paths) <= set(draft.tree.paths)


@pytest.mark.parametrize("top_k,max_draft_len", [(2, 3), (3, 4), (3, 6), (4, 10), (2, 63)])
def test_pruned_dynamic_tree_is_the_unpruned_tree_with_fewer_head_rows(model, top_k, max_draft_len):
    """Skipping nodes outside the best max_draft_len changes no tree (EAGLE-2's reranking keeps the same
    nodes) and, for a small max_draft_len, runs the head on fewer rows."""
    rows = {True: 0, False: 0}
    for seed, sharpness in enumerate((25.0, 60.0, 150.0, 300.0)):
        head = _random_head(seed=seed)
        config = EagleTreeConfig(num_eagle_layers=4, max_draft_len=max_draft_len, dynamic_tree_max_topK=top_k)
        with torch.inference_mode():
            trees = {}
            for prune in (True, False):
                proposer = EagleProposer(model, head, config)
                proposer.prune = prune
                flat = proposer._project  # the tiny model's draft distributions are near uniform: sharpen them,
                proposer._project = lambda x, _flat=flat, _s=sharpness: _flat(x) * _s  # so deep nodes compete
                for prompt in PROMPTS:
                    root, state = _ready_state(model, proposer, prompt)
                    calls = []
                    original = DraftKV.call  # every head call of draft nodes, alone or batched

                    def counting(self, tokens, *args, _calls=calls, _original=original):
                        _calls.append(len(tokens))
                        return _original(self, tokens, *args)

                    DraftKV.call = counting
                    try:
                        draft = proposer.propose(state, root, max_depth=4)
                    finally:
                        DraftKV.call = original
                    rows[prune] += sum(calls)
                    trees.setdefault(prune, []).append((draft.tree.paths, draft.tokens))
            assert trees[True] == trees[False], f"seed {seed}"
    assert rows[True] <= rows[False]
    if max_draft_len < top_k * top_k:
        assert rows[True] < rows[False]


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_requests_drafted_together_get_the_trees_they_get_alone(model, tree):
    """propose_batch / update_batch (one head call per depth for every request, as the worker drafts a
    batch) give each request, with its own cap and context, bit for bit what it gets alone."""
    from specbuild.engine.draft_linear import pack_draft_linears
    from specbuild.methods.eagle.engine import capped_proposer, propose_batch, update_batch

    head = _random_head(seed=9)
    config = (EagleTreeConfig(num_eagle_layers=3, eagle_choices=tuple(map(tuple, USER_CHOICES))) if tree == "static"
              else EagleTreeConfig(num_eagle_layers=4, max_draft_len=8, dynamic_tree_max_topK=3))
    base = EagleProposer(model, head, config)
    pack_draft_linears(head)  # as the engine loads it: packed on CPU, after the proposer took its dtype
    base._project = lambda x, _p=base._project: _p(x) * 40.0  # sharper draft distributions: deeper trees compete
    proposers = [capped_proposer(base, k) for k in (7, 2, 5)]
    for p in proposers:
        p._project = base._project
    with torch.inference_mode():
        alone, together = [], [p.new_state() for p in proposers]
        roots = []
        for p, prompt in zip(proposers, PROMPTS):
            root, state = _ready_state(model, p, prompt)
            alone.append(state)
            roots.append(root)
        outputs = [model(input_ids=torch.tensor([prompt]), output_hidden_states=True) for prompt in PROMPTS]
        update_batch(base, together, [[*prompt[1:], r] for prompt, r in zip(PROMPTS, roots)],
                     [o.hidden_states[-1][0] for o in outputs])
        for a, t in zip(alone, together):
            assert torch.equal(a.last_output, t.last_output)
            assert all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) for x, y in zip(a.kv, t.kv))
        depths = [3, 1, 4]
        batched = propose_batch(proposers, together, roots, depths)
        singles = [p.propose(state, root, depth) for p, state, root, depth in zip(proposers, alone, roots, depths)]
    assert [(d.tree.paths, d.tokens) for d in batched] == [(d.tree.paths, d.tokens) for d in singles]
    assert len({d.tree.num_nodes for d in batched}) > 1  # the caps and depths differ per request
    with pytest.raises(ValueError, match="one EAGLE head"):
        propose_batch([base, EagleProposer(model, _random_head(seed=1), config)], together[:2], roots[:2], [2, 2])


# --- greedy equivalence ------------------------------------------------------------------------

TREES = {
    "mc_sim_7b_63": {"num_eagle_layers": 4},
    "user": {"choices": USER_CHOICES, "num_eagle_layers": 3},
    "dynamic": {"dynamic_top_k": 3, "num_eagle_layers": 4, "max_draft_len": 16},
}


def _generate(model, proposer, prompt, *, max_tokens: int, max_draft_len: int = 63):
    """Greedy decoding of ``prompt`` with a feature-tree ``proposer`` (trees of at most ``max_draft_len``
    nodes), through the worker alone."""
    return generate_alone(model, FeatureTreeDrafter(proposer), prompt, max_tokens=max_tokens, max_block=1 + max_draft_len)


def _eagle(model, head, prompt, *, max_tokens: int, choices=None, dynamic_top_k=None, num_eagle_layers=4, max_draft_len=63):
    """Greedy EAGLE decoding: a static tree (``choices``, default EAGLE-1's mc_sim_7b_63) or EAGLE-2's dynamic
    tree (``dynamic_top_k``), as the engine builds the proposer from its settings."""
    tree = EagleTreeConfig(num_eagle_layers=num_eagle_layers, max_draft_len=max_draft_len,
                           eagle_choices=None if choices is None else tuple(tuple(c) for c in choices),
                           dynamic_tree_max_topK=dynamic_top_k)
    return _generate(model, EagleProposer(model, head, tree), prompt, max_tokens=max_tokens, max_draft_len=max_draft_len)


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("kind", ["random", "pass_through"])
def test_eagle_equals_plain_greedy(model, plain_outputs, tree, kind):
    head = _random_head(seed=3) if kind == "random" else _pass_through_head()
    accepted = 0
    for prompt, plain in zip(PROMPTS, plain_outputs):
        result = _eagle(model, head, prompt, max_tokens=NEW_TOKENS, **TREES[tree])
        assert result.output_ids == plain, f"prompt {prompt}"
        assert result.finish_reason == "length"
        assert result.num_decoding_iterations >= 2
        assert result.num_decoding_iterations == NEW_TOKENS - 1 - result.total_accepted_draft_tokens
        accepted += result.total_accepted_draft_tokens
    if kind == "pass_through":
        assert accepted > 0


class _OracleProposer:
    """A :class:`FeatureTreeProposer` putting the true continuation on the all-zeros path ("same" draft);
    here under the real head's state (:class:`_OracleOverEagle`)."""

    def __init__(self, prompt: list[int], plain: list[int], tree: SpecTree) -> None:
        self.prompt_len, self.plain, self.tree = len(prompt), plain, tree
        self.fed: list[int] = []

    def new_state(self) -> list[int]:
        return []

    def update(self, state, next_tokens, features):
        assert features.shape == (len(next_tokens), HIDDEN)
        state += next_tokens

    def propose(self, state, root, max_depth):
        tree = self.tree.truncated(max_depth)
        emitted = len(state) - self.prompt_len + 1
        true = [self.plain[min(emitted + d, len(self.plain) - 1)] for d in range(tree.max_depth)]
        return TreeDraft(tree, [root] + [true[len(p) - 1] + (p[-1] != 0) * (1 + p[-1]) for p in tree.paths])


class _OracleOverEagle(_OracleProposer):
    """Oracle drafts (the true path, fully accepted) but the real EAGLE head state, fed by the decode loop."""

    def __init__(self, proposer: EagleProposer, prompt, plain, tree) -> None:
        super().__init__(prompt, plain, tree)
        self.proposer, self.state = proposer, None

    def new_state(self):
        self.state = self.proposer.new_state()
        return self.state

    def update(self, state, next_tokens, features):
        self.proposer.update(state, next_tokens, features)

    def propose(self, state, root, max_depth):
        return super().propose([0] * state.length, root, max_depth)  # emitted = length - prompt + 1


def test_head_state_after_steps_equals_a_fresh_pass(model, plain_outputs):
    """After steps that accept several tokens each, the head's cache is what one pass over sequential
    target features gives: every accepted token's feature went in, aligned with the token it produced."""
    prompt, plain, tree = PROMPTS[1], plain_outputs[1], SpecTree.from_choices(USER_CHOICES)
    head = _random_head(seed=7)
    eagle = EagleProposer(model, head, EagleTreeConfig(num_eagle_layers=3, eagle_choices=tuple(map(tuple, USER_CHOICES))))
    proposer = _OracleOverEagle(eagle, prompt, plain, tree)
    result = _generate(model, proposer, prompt, max_tokens=14)  # steps of 4: 1 + 4 + 4 + 4 + 1
    assert result.output_ids == plain[:14] and result.num_decoding_iterations == 4
    state, sequence = proposer.state, [*prompt, *plain[:14]]
    n = state.length  # updated after steps 1..3: (f_j, c_{j+1}) for j < n
    assert n == len(prompt) + 12
    with torch.inference_mode():
        true_features = model(input_ids=torch.tensor([sequence[:n]]), output_hidden_states=True).hidden_states[-1][0]
        embeds = model.get_input_embeddings()(torch.tensor(sequence[1 : n + 1]))
        out, kv = head(embeds, true_features, torch.arange(n), _causal(n))
    torch.testing.assert_close(state.kv[0].keys, kv[0].keys, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(state.kv[0].values, kv[0].values, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(state.last_output, out[-1], rtol=1e-4, atol=1e-5)


# --- arguments ---------------------------------------------------------------------------------
# (stopping at max_tokens and at an end token inside an accepted chunk, the "same" draft's depth:
# tests/test_method_equivalence.py, every method)


def test_choices_depth_must_equal_num_eagle_layers(model):
    with pytest.raises(ValueError, match=r"eagle_choices are 3 deep but num_eagle_layers is 4.*TensorRT-LLM#2588"):
        _eagle(model, _random_head(), [1, 2], max_tokens=4, choices=USER_CHOICES, num_eagle_layers=4)
    settings = _settings({"decoding_type": "Eagle", "num_eagle_layers": 3, "speculative_model_dir": "h"})
    with pytest.raises(ValueError, match="eagle_choices are 4 deep but num_eagle_layers is 3"):
        tree_config(settings)  # default tree: depth 4


def test_invalid_arguments(model):
    head = _random_head()
    with pytest.raises(ValueError, match="remove eagle_choices"):
        _eagle(model, head, [1], max_tokens=4, choices=USER_CHOICES, num_eagle_layers=3, dynamic_top_k=2)
    with pytest.raises(ValueError, match="7 nodes, more than max_draft_len 5"):
        _eagle(model, head, [1], max_tokens=4, choices=USER_CHOICES, num_eagle_layers=3, max_draft_len=5)
    with pytest.raises(ValueError, match="hidden_size 32 != target hidden_size 64"):
        _eagle(model, EagleHead(EagleConfig(**{**CONFIG.__dict__, "hidden_size": 32})), [1], max_tokens=4)


# --- engine method -------------------------------------------------------------------------------


def _settings(speculative_config: dict, base_dir: Path | None = None):
    """The engine's EAGLE settings: speculative_config validated by the recipe's model."""
    return method_named("eagle").parse_speculative_config(speculative_config, base_dir=base_dir)


def test_speculative_config_and_load_from_engine_dir(model, plain_outputs, tmp_path):
    save_eagle_head(tmp_path / "eagle", _pass_through_head().state_dict(), CONFIG)
    config = _settings(
        {"decoding_type": "Eagle", "max_draft_len": 16, "num_eagle_layers": 4, "use_dynamic_tree": True,
         "dynamic_tree_max_topK": 3, "max_non_leaves_per_layer": 10},
        base_dir=tmp_path,
    )
    loaded = load_eagle(config, MethodContext(target=model))
    assert loaded.path == tmp_path / "eagle"
    result = _generate(model, loaded.proposer, PROMPTS[1], max_tokens=NEW_TOKENS, max_draft_len=16)
    assert result.output_ids == plain_outputs[1]
    with pytest.raises(ValueError, match="use_dynamic_tree needs dynamic_tree_max_topK"):
        _settings({"use_dynamic_tree": True}, base_dir=tmp_path)
    field, message = method_named("eagle").reference_check(_settings({"posterior_threshold": 0.09}, base_dir=tmp_path))
    assert field == "posterior_threshold" and "typical acceptance" in message
    with pytest.raises(ValueError, match=r"unknown Eagle speculative_config keys \['medusa_choices'\]"):
        _settings({"medusa_choices": [[0]]}, base_dir=tmp_path)


def test_draft_nodes_see_their_ancestors_only(model):
    """A depth-2 node's output equals a sequential run over (cache, its parent, itself): the sibling drafted
    beside its parent is masked out, and the request's cache is left as it was."""
    head = _random_head(seed=5)
    proposer = EagleProposer(model, head, EagleTreeConfig(num_eagle_layers=3, eagle_choices=tuple(map(tuple, USER_CHOICES))))
    embed = model.get_input_embeddings()
    with torch.inference_mode():
        _, state = _ready_state(model, proposer, PROMPTS[0])
        drafted = DraftKV(proposer, state)
        siblings = drafted.forward([11, 22], state.last_output[None].expand(2, -1), 1, [[], []], [1, 2])
        child = drafted.forward([33], siblings[:1], 2, [[1]], [3])
        cache, length = state.cache.copy(), state.length  # a sequential oracle on a cache of its own
        first, _ = head(embed(torch.tensor([11])), state.last_output[None], torch.tensor([length]), _causal(1, length),
                        cache.view(length, 1))
        cache.commit(1)
        second, _ = head(embed(torch.tensor([33])), first, torch.tensor([length + 1]), _causal(1, length + 1),
                         cache.view(length + 1, 1))
    torch.testing.assert_close(siblings[:1], first)
    torch.testing.assert_close(child, second)
    assert state.length == len(PROMPTS[0])
